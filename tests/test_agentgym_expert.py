"""Recipes on AgentGym servers: expert trajectories, task prompts and the oracle of the
`agentgym-*` environments, against `flywheel serve-env --compat agentgym` (which answers as
AgentGym's own TextCraft and SciWorld servers do) on loopback."""

from __future__ import annotations

import gzip
import http.server
import json
import threading
from pathlib import Path

import pytest

from agents.rollout import agent_prefix
from envs import make_env
from envs.agentgym_expert import (
    SCIWORLD_PROMPT,
    TEXTCRAFT_PROMPT,
    readable_items,
    sciworld_plan,
    textcraft_goal,
    textcraft_plan,
)
from envs.serve import LocalServer
from flywheel.records import Trajectory
from flywheel.settings import EnvSettings, ETOConfig
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from ops.runner import check_task_lists
from tasks.expert_data import ExpertDataInputs, expert_data_stage

# AgentGym's TextCraft indices: the first and last of its list, and some in between (0 and 12:
# depth 1, which the project's own TextCraft does not pose; 300, 543: deeper).
TEXTCRAFT_TASKS = ["0", "12", "300", "543"]
RECORDINGS = Path(__file__).parent / "data" / "agentgym"


@pytest.fixture(scope="module")
def textcraft_server():
    server = LocalServer("--env", "textcraft", "--compat", "agentgym")
    try:
        yield server
    finally:
        server.kill()


def agentgym_textcraft(server, stop: int = 544) -> EnvSettings:
    return EnvSettings(
        name="agentgym-textcraft",
        servers=[server.url],
        agentgym={"train": (0, stop), "test": (0, 1)},
    )


def replay(env, trajectory: Trajectory) -> list:
    """The trajectory's actions played again on the server: its results."""
    episode = env.start(trajectory.task_id)
    actions = [m.content.rpartition("Action: ")[2] for m in trajectory.continuation]
    results = [episode.step(action) for action in actions[::2]]  # replies, not observations
    episode.close()
    return results


def test_expert_stage_on_agentgym_textcraft_reaches_every_goal(textcraft_server, tmp_path):
    settings = agentgym_textcraft(textcraft_server)
    env = make_env(settings)
    prefix = agent_prefix(env, [])
    store = ArtifactStore(str(tmp_path / "store"))
    out = StageOutput(store_url=store.root, url=store.url("run/expert"))
    inputs = ExpertDataInputs(env=settings, task_ids=TEXTCRAFT_TASKS, prefix=prefix)
    manifest = expert_data_stage.fn(inputs, out)
    assert manifest.counts == {"trajectories": 4, "unsolved": 0}
    trajectories = store.read_records(manifest.files["trajectories"], Trajectory)
    assert [t.task_id for t in trajectories] == TEXTCRAFT_TASKS
    for trajectory in trajectories:
        assert trajectory.messages[0].content == TEXTCRAFT_PROMPT  # AgentGym's own prompt
        assert trajectory.reward == 1.0 and trajectory.success
        results = replay(env, trajectory)  # the server accepts the actions to the goal
        assert results[-1].done and results[-1].reward == 1.0
        assert not any(r.done for r in results[:-1])


def test_recipes_start_on_agentgym_textcraft(textcraft_server):
    check_task_lists(ETOConfig(env=agentgym_textcraft(textcraft_server, stop=3)))


def test_the_planner_reads_minecraft_ids_in_task_text():
    text = (
        "Crafting commands:\ncraft 4 minecraft:oak_planks using 1 minecraft:oak_log\n"
        "craft 1 minecraft:crafting_table using 4 minecraft:planks\n\n"
        "Goal: craft minecraft:crafting_table."
    )
    assert readable_items(text).endswith("Goal: craft crafting table.")
    assert textcraft_goal(text) == "crafting_table"
    assert [action for _, action in textcraft_plan(text)] == [
        "get 1 oak log",
        "craft 4 oak planks using 1 oak log",
        "craft 1 crafting table using 4 oak planks",
    ]


def test_agentgym_textcraft_oracle_flags_wasted_steps(textcraft_server):
    env = make_env(agentgym_textcraft(textcraft_server))
    plan = [action for _, action in env.expert_plan("300")]
    assert env.mistakes("300", plan) == [False] * len(plan)
    played = [plan[0], "inventory", "get 1 dirt", None, *plan[1:]]
    assert env.mistakes("300", played) == [False, True, True, True] + [False] * (len(plan) - 1)


def recorded_sciworld_reset(data_idx: int) -> dict:
    """AgentGym's real SciWorld server's `/reset` answer for `data_idx` (tests/data/agentgym)."""
    with gzip.open(RECORDINGS / "sciworld.json.gz", "rt", encoding="utf-8") as file:
        entries = json.load(file)["sequences"]["answers"]
    return next(e["body"] for e in entries if e["request"].get("json") == {"data_idx": data_idx})


def test_agentgym_sciworld_expert_is_the_gold_path_of_the_task_the_server_reset_to():
    from envs.scienceworld import ScienceWorldEpisode

    answer = recorded_sciworld_reset(4638)
    assert (answer["task_name"], answer["var_num"]) == ("identify-life-stages-2", 9)
    plan = sciworld_plan(answer)
    episode = ScienceWorldEpisode("identify-life-stages-2/9", simplification="")  # AgentGym's
    assert episode.instruction == f"{answer['task_description']}\n{answer['observation']}"
    results = [episode.step(action) for _, action in plan]
    episode.close()
    assert results[-1].done and sum(r.reward for r in results) == 100.0
    assert sciworld_plan({"task_name": "boil"}) is None  # no variation: no plan


def test_agentgym_environments_send_agentgyms_own_prompts():
    servers = {"servers": ["http://127.0.0.1:9"], "agentgym": {"train": (0, 1)}}
    textcraft = make_env(EnvSettings(name="agentgym-textcraft", **servers))
    sciworld = make_env(EnvSettings(name="agentgym-sciworld", **servers))
    assert textcraft.system_prompt == TEXTCRAFT_PROMPT and sciworld.system_prompt == SCIWORLD_PROMPT
    assert TEXTCRAFT_PROMPT.startswith("You are given few useful crafting recipes")
    assert SCIWORLD_PROMPT.endswith("Thought:\nyour thoughts.\n\nAction:\nyour next action")


class RecordedSciWorld:
    """A SciWorld server on loopback that answers `/create` and `/reset` as AgentGym's real one
    did (the recorded answer for `data_idx` 4638), and `/close` with `true`."""

    def __init__(self) -> None:
        reset = json.dumps(recorded_sciworld_reset(4638)).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                body = {"/create": b'{"id": 0}', "/reset": reset}.get(self.path, b"true")
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_agentgym_sciworld_plans_the_task_its_server_reports():
    server = RecordedSciWorld()
    try:
        env = make_env(
            EnvSettings(name="agentgym-sciworld", servers=[server.url], agentgym={"train": (0, 1)})
        )
        plan = env.expert_plan("0")
    finally:
        server.close()
    assert plan == sciworld_plan(recorded_sciworld_reset(4638)) and plan
    assert env.mistakes("0", [action for _, action in plan]) is None  # no SciWorld oracle
