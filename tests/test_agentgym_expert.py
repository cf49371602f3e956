"""Recipes on AgentGym servers: expert trajectories, task prompts and the oracle of the
`agentgym-*` environments, against `flywheel serve-env --compat agentgym` (which answers as
AgentGym's own TextCraft and SciWorld servers do) on loopback."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from json_server import ScriptedJSONServer

from agents.eto_format import write_eto_sft
from agents.rollout import (
    RolloutSettings,
    agent_prefix,
    expert_trajectory,
    few_shot_examples,
    instruction_part,
    run_batched,
)
from envs import make_env
from envs.agentgym.expert import (
    PROMPT_ACKNOWLEDGEMENT,
    SCIWORLD_PROMPT,
    TEXTCRAFT_PROMPT,
    readable_items,
    sciworld_plan,
    textcraft_goal,
    textcraft_plan,
)
from envs.agentgym.server import LocalServer
from flows.eto import ETOConfig
from flywheel.chat import format_reply
from flywheel.inference import Generation
from flywheel.records import Message, Trajectory
from flywheel.settings import EnvSettings
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from ops.runner import check_task_lists
from tasks.expert_data import ExpertDataInputs, expert_data_stage
from training.datasets import sft_rows

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
    assert manifest.counts == {"trajectories": 4, "unsolved": 0, "retried": 0, "recoveries": 0}
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


class RecordedSciWorld(ScriptedJSONServer):
    """A SciWorld server on loopback that answers `/create` and `/reset` as AgentGym's real one
    did (the recorded answer for `data_idx` 4638), and `/close` with `true`."""

    def __init__(self) -> None:
        self.reset = recorded_sciworld_reset(4638)
        super().__init__()

    def answer(self, path: str, body: dict) -> object:
        return {"/create": {"id": 0}, "/reset": self.reset}.get(path, True)


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


# ---- The first turns, as AgentGym's clients lay them out ---------------------------------------


class ScriptedReplies:
    """A backend that answers every prompt with the next of `replies` (one episode at a time)."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, list(replies)

    def generate(self, prompts, sampling):
        out = []
        for _ in prompts:
            reply = self.replies.pop(0)
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
            out.append(Generation(reply, ids + [self.tokenizer.eos_token_id], "stop"))
        return out


def opens_as_agentgyms_client(trajectory: Trajectory, prompt: str, instruction: str) -> None:
    """[user: task prompt, assistant: "OK. ...", user: first observation, ...], no system turn,
    and no loss on the "OK"."""
    opening = [(m.role, m.content, m.loss) for m in trajectory.messages[:3]]
    assert opening == [
        ("user", prompt, False),
        ("assistant", PROMPT_ACKNOWLEDGEMENT, False),
        ("user", instruction, False),
    ]
    assert trajectory.episode_start == 2 and trajectory.prompt == trajectory.messages[:3]
    assert all(m.role != "system" for m in trajectory.messages)


def test_agentgym_trajectories_open_as_agentgyms_client_does(textcraft_server, chat):
    """AgentGym's TextCraftEnvClient sends its task prompt as the first user turn, answered "OK.
    I'll follow your instructions ...", then the observation: expert and policy trajectories on
    agentgym-textcraft open the same way, and SFT learns nothing of the "OK"."""
    env = make_env(agentgym_textcraft(textcraft_server))
    prefix = agent_prefix(env, [])
    assert prefix == instruction_part(env) and [m.role for m in prefix] == ["user", "assistant"]
    instruction = env.opening("12")[0]
    expert = expert_trajectory(env, "12", prefix)
    opens_as_agentgyms_client(expert, TEXTCRAFT_PROMPT, instruction)
    assert expert.success and expert.messages[3].loss  # the expert's own turns carry loss

    replies = [format_reply(thought, action) for thought, action in env.expert_plan("12")]
    backend = ScriptedReplies(chat.tokenizer, replies)
    [played] = run_batched(env, ["12"], backend, chat, prefix, RolloutSettings(8), False)
    opens_as_agentgyms_client(played, TEXTCRAFT_PROMPT, instruction)
    assert played.success and played.finish_reason == "done"

    # Rendered with the model's template as that conversation, message by message; in SFT rows the
    # prompt, "OK" included, has no loss.
    [row], _ = sft_rows([expert], chat, 4096)
    as_dicts = [{"role": m.role, "content": m.content} for m in expert.messages]
    whole = chat.tokenizer.apply_chat_template(as_dicts, tokenize=False)
    assert chat.tokenizer.decode(chat.encode(expert.messages)[0]) == whole
    prompt_ids, prompt_mask = chat.encode(expert.prompt)
    assert row["input_ids"][: len(prompt_ids)] == prompt_ids and not any(prompt_mask)
    assert not any(row["assistant_masks"][: len(prompt_ids)]) and any(row["assistant_masks"])
    ok_text = chat.tokenizer.decode(prompt_ids)
    assert f"assistant\n{PROMPT_ACKNOWLEDGEMENT}" in ok_text  # the OK turn is in the prompt

    # ETO's export writes the opening as it is (not a second "OK").
    conversations = write_eto_sft([expert])[0]["conversations"]
    assert [t["value"] for t in conversations[:3]] == [
        TEXTCRAFT_PROMPT, PROMPT_ACKNOWLEDGEMENT, instruction
    ]  # fmt: skip


def test_agentgym_few_shot_examples_follow_the_opening(textcraft_server):
    env = make_env(agentgym_textcraft(textcraft_server, stop=20))
    [example] = few_shot_examples(env, 1)
    prefix = agent_prefix(env, [example])
    assert prefix[:2] == instruction_part(env)
    assert prefix[2:] == [m.model_copy(update={"loss": False}) for m in example.messages[2:]]
    assert prefix[2].role == "user" and prefix[2].content == env.opening(example.task_id)[0]


def test_other_environments_keep_the_system_prompt():
    textcraft = make_env("textcraft")
    assert textcraft.prompt_acknowledgement is None
    assert agent_prefix(textcraft, []) == [Message(role="system", content=textcraft.system_prompt)]
    [example] = few_shot_examples(textcraft, 1)
    prefix = agent_prefix(textcraft, [example])
    assert prefix[0].role == "system" and prefix[1:] == [
        m.model_copy(update={"loss": False}) for m in example.messages[1:]
    ]
    assert example.prompt == example.messages[:2]
    servers = {"servers": ["http://127.0.0.1:9"], "agentgym": {"train": (0, 1)}}
    webshop = make_env(EnvSettings(name="agentgym-webshop", **servers))
    assert webshop.prompt_acknowledgement is None
    assert [m.role for m in agent_prefix(webshop, [])] == ["system"]
