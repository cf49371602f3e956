"""Agent-R's revisions with the expert's continuation: rows built by hand on real TextCraft
episodes, the skipped episodes and their counts, the expert mix, the stage, and the round."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents.rollout import agent_prefix, expert_trajectory
from agents.turns import ReActTurns
from envs.textcraft import TextCraftEnv
from flows.agent_r import AgentR, AgentRConfig
from flywheel.chat import format_observation, format_reply
from flywheel.config_files import ConfigError, load_config
from flywheel.records import Manifest, Message, Trajectory
from flywheel.settings import EnvSettings
from flywheel.stage import StageOutput, planning
from flywheel.storage import ArtifactStore
from ops.driver import RoundState
from tasks.expert_revisions import (
    ExpertRevisionsInputs,
    build_rows,
    expert_revisions_stage,
    mix_expert,
)
from tasks.splice import REVISION_THOUGHTS, revision_reply
from training.datasets import sft_rows

ROOT = Path(__file__).resolve().parents[1]
EXPERT_CONFIG = str(ROOT / "configs/agent_r_textcraft_expert.yaml")
PREFIX = [Message(role="system", content="S")]
TASK = "acacia_pressure_plate"  # the expert: get 1 acacia logs, craft planks, craft the plate
LOGS, PLANKS = "get 1 acacia logs", "craft 4 acacia planks using 1 acacia logs"
PLATE = "craft 1 acacia pressure plate using 2 acacia planks"
SLABS = "craft 6 acacia slab using 3 acacia planks"  # a distractor recipe, leaves 1 plank


@pytest.fixture(scope="module")
def env() -> TextCraftEnv:
    return TextCraftEnv()


def played(env, actions: list[str], task_id: str = TASK, finish: str = "max_steps") -> Trajectory:
    """The policy's episode taking `actions`, recorded as the rollout records it (agent turns
    with loss, no observation after the last turn)."""
    episode = env.start(task_id)
    messages = [*PREFIX, Message(role="user", content=episode.instruction)]
    reward = 0.0
    for action in actions:
        messages.append(Message(role="assistant", content=format_reply("mine", action), loss=True))
        result = episode.step(action)
        reward += result.reward
        messages.append(Message(role="user", content=format_observation(result.observation)))
    return Trajectory(
        task_id=task_id, env=env.name, messages=messages[:-1], episode_start=len(PREFIX),
        reward=reward, success=reward >= 1.0, n_steps=len(actions), finish_reason=finish,
    )  # fmt: skip


def test_a_row_is_the_bad_prefix_unlearned_then_revision_and_expert_learned(env, chat):
    # Step 2 fetches a distractor (oak logs): the oracle's first error; step 3 is cut off.
    failed = played(env, [LOGS, "get 1 oak logs", PLANKS])
    (row,), skipped, error_steps = build_rows(env, [failed], PREFIX, seed=0)
    assert not skipped and error_steps == [2]
    recorded = failed.continuation
    revision = Message(role="assistant", content=revision_reply("inventory", random.Random(0)))
    assert row.messages == [
        *PREFIX,
        failed.messages[1],  # the instruction
        recorded[0].model_copy(update={"loss": False}),
        Message(role="user", content="Observation: Got 1 acacia logs"),
        recorded[2].model_copy(update={"loss": False}),  # the first error
        Message(role="user", content="Observation: Got 1 oak logs"),
        revision.model_copy(update={"loss": True}),  # the no-op, and the inventory it shows
        Message(role="user", content="Observation: Inventory: [acacia logs] (1) [oak logs] (1)"),
        Message(  # the expert goes on from the logs it has: the shortest suffix that solves
            role="assistant", loss=True,
            content=format_reply(env.expert_plan(TASK)[1][0], PLANKS),
        ),
        Message(role="user", content="Observation: Crafted 4 acacia planks"),
        Message(
            role="assistant", loss=True, content=format_reply(env.expert_plan(TASK)[2][0], PLATE)
        ),
    ]  # fmt: skip
    assert (row.success, row.reward, row.n_steps) == (True, 1.0, 5)
    assert (row.source, row.finish_reason, row.episode_start) == ("expert-revision", "done", 1)
    # The loss flags reach the SFT rows: the revision and the expert's crafts are learned.
    (sft_row,), _ = sft_rows([row], chat, max_length=4096)
    ids, mask = sft_row["input_ids"], sft_row["assistant_masks"]
    learned = chat.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert "Action: inventory" in learned and PLANKS in learned and PLATE in learned
    assert "oak logs" not in learned and LOGS not in learned


def test_every_observation_of_a_row_is_the_environments_and_its_replay_solves_the_task(env):
    rows, _, _ = build_rows(env, [played(env, ["inventory", LOGS, "get 1 stick"])], PREFIX, 0)
    (row,) = rows
    episode, turns = env.start(TASK), ReActTurns()
    assert row.messages[1].content == episode.instruction
    steps = row.continuation
    for i, turn in enumerate(steps[::2]):
        result = episode.step(turns.read(turn.content).action)
        if 2 * i + 1 < len(steps):
            assert steps[2 * i + 1].content == format_observation(result.observation)
    assert result.done and result.reward == 1.0
    # The first error is step 1 (an inventory query wastes it): the prefix is that turn alone.
    assert [m.loss for m in steps if m.role == "assistant"] == [False, True, True, True, True]


@pytest.mark.parametrize(
    "actions, error_step, expert_actions",
    [
        (["get 1 oak logs"], 1, [LOGS, PLANKS, PLATE]),  # nothing useful done: the whole plan
        ([LOGS, PLANKS, "get 1 stick"], 3, [PLATE]),  # planks in hand: the last craft only
        ([LOGS, PLANKS, PLANKS], 3, [PLATE]),  # a failed craft: the planks are still there
        ([LOGS, PLANKS, SLABS], 3, [LOGS, PLANKS, PLATE]),  # slabs used the planks up
    ],
)
def test_the_expert_continuation_is_the_shortest_suffix_of_its_plan_that_solves(
    env, actions, error_step, expert_actions
):
    (row,), _, error_steps = build_rows(env, [played(env, actions)], PREFIX, seed=0)
    agent = [ReActTurns().read(m.content).action for m in row.continuation[::2]]
    assert error_steps == [error_step]
    assert agent == [*actions[:error_step], "inventory", *expert_actions]


class NoOracle(TextCraftEnv):
    def mistakes(self, task_id, actions):
        return None


class NoExpert(TextCraftEnv):
    def expert_plan(self, task_id):
        return None


class WrongExpert(TextCraftEnv):
    def expert_plan(self, task_id):
        return [("wrong", "get 1 oak logs")] * 3


def test_failed_episodes_without_a_row_are_skipped_by_reason_and_others_not_counted(env):
    error_at_1 = played(env, ["get 1 oak logs"])
    episodes = [
        error_at_1,
        played(env, [LOGS, PLANKS, PLATE], finish="done"),  # solved
        played(env, [LOGS], finish="lost: EnvironmentUnavailable: gone"),  # not the policy's
        played(env, [LOGS], finish="error: ValueError: bad"),
        played(env, [LOGS, PLANKS]),  # ran out of steps without a wasted one
    ]
    rows, skipped, error_steps = build_rows(env, episodes, PREFIX, seed=0)
    assert len(rows) == 1 and error_steps == [1] and skipped == {"no_first_error": 1}
    # An environment without an oracle gives no first error; without an expert (or with one
    # that does not solve the task) no continuation.
    assert build_rows(NoOracle(), [error_at_1], PREFIX, 0)[1] == {"no_first_error": 1}
    assert build_rows(NoExpert(), [error_at_1], PREFIX, 0)[1] == {"no_continuation": 1}
    assert build_rows(WrongExpert(), [error_at_1], PREFIX, 0)[1] == {"no_continuation": 1}
    # A recorded observation the environment does not give again: the row would hold it.
    changed = error_at_1.model_copy(deep=True)
    changed.messages.append(Message(role="user", content="Observation: Got 1 diamond"))
    changed.messages.append(Message(role="assistant", content=format_reply("x", "inventory")))
    assert build_rows(env, [changed], PREFIX, 0)[1] == {"replay_mismatch": 1}


def test_a_skipped_episode_leaves_the_others_revision_thoughts_as_they_were(env):
    good = played(env, ["get 1 oak logs"])
    alone, _, _ = build_rows(env, [played(env, [LOGS, PLANKS]), good], PREFIX, seed=3)
    rng = random.Random(3)
    rng.choice(REVISION_THOUGHTS)  # the skipped episode's draw
    assert alone[0].continuation[2].content == revision_reply("inventory", rng)


def records(n: int, source: str) -> list[Trajectory]:
    return [
        Trajectory(task_id=f"{source}-{i}", env="textcraft", messages=PREFIX, episode_start=0,
                   source=source)
        for i in range(n)
    ]  # fmt: skip


def test_expert_trajectories_are_mixed_in_at_the_ratio_per_row_seeded():
    rows, expert = records(4, "expert-revision"), records(3, "expert")
    mixed = mix_expert(rows, expert, 0.5, seed=0)
    assert mixed[:4] == rows and len(mixed) == 6  # one per two rows
    assert len({t.task_id for t in mixed[4:]}) == 2  # drawn without replacement
    assert mix_expert(rows, expert, 0.5, seed=0) == mixed
    assert any(mix_expert(rows, expert, 0.5, seed)[4:] != mixed[4:] for seed in range(1, 9))
    assert mix_expert(rows, expert, 0.0, seed=0) == rows
    assert mix_expert(rows, [], 0.5, seed=0) == rows
    # More wanted than there are: every one of them once, then again.
    twice = [t.task_id for t in mix_expert(rows, expert, 2.0, seed=0)[4:]]
    assert len(twice) == 8 and sorted(twice[:3]) == ["expert-0", "expert-1", "expert-2"]
    assert mix_expert([], expert, 0.5, seed=0) == []
    with pytest.raises(ValueError, match="needs expert_url"):
        ExpertRevisionsInputs(explored_urls=[], env=EnvSettings(), prefix=[], seed=0,
                              expert_sft_ratio=0.5)  # fmt: skip


def test_the_stage_writes_rows_and_expert_trajectories_with_its_counts(env, tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    prefix = agent_prefix(env, [])
    episodes = [
        played(env, ["get 1 oak logs"]), played(env, [LOGS, "inventory"]),
        played(env, [LOGS, PLANKS, PLATE], finish="done"), played(env, [LOGS, PLANKS]),
    ]  # fmt: skip
    explored = store.write_records(store.url("run/explore/trajectories.jsonl"), episodes)
    expert = [expert_trajectory(env, t, prefix) for t in ("acacia_boat", "birch_slab")]
    expert_url = store.write_records(store.url("run/expert/expert.jsonl"), expert)
    inputs = ExpertRevisionsInputs(
        explored_urls=[explored], env=EnvSettings(), prefix=prefix, seed=0, expert_url=expert_url,
        expert_sft_ratio=0.5,
    )  # fmt: skip
    out = StageOutput(store_url=store.root, url=store.url("run/expert-revisions"))
    done = expert_revisions_stage.fn(inputs, out)
    assert done.counts == {
        "episodes": 4, "failed": 3, "rows": 2, "skipped_no_first_error": 1,
        "skipped_no_continuation": 0, "skipped_replay_mismatch": 0, "expert_trajectories": 1,
        "trajectories": 3, "first_error_step_1": 1, "first_error_step_2": 1,
    }  # fmt: skip
    assert done.metrics == {"first_error_step_mean": 1.5}
    data = store.read_records(done.files["trajectories"], Trajectory)
    assert [t.source for t in data] == ["expert-revision", "expert-revision", "expert"]
    assert all(t.messages[: len(prefix)] == prefix for t in data)
    assert expert_revisions_stage.fn(inputs, out).served_from_store


def test_the_source_setting_defaults_to_mcts_and_the_shipped_config_chooses_expert(tmp_path):
    assert AgentRConfig().revisions.source == "mcts"
    cfg = load_config(AgentRConfig, EXPERT_CONFIG)
    assert cfg.revisions.source == "expert" and cfg.revisions.expert_sft_ratio == 0.5
    assert not cfg.baselines
    with pytest.raises(ConfigError, match="revisions.source"):
        load_config(AgentRConfig, None, ["revisions.source=trees"])
    with pytest.raises(ConfigError, match="revisions.expert_sft_ratio"):
        load_config(AgentRConfig, None, ["revisions.expert_sft_ratio=-1"])


class Stopped(Exception):
    pass


class FakeStages:
    """Answers every stage with a manifest of its own making, recording what it was asked;
    stops the round at stage `stop_at`."""

    def __init__(self, rows: int, stop_at: str | None = None):
        self.rows, self.stop_at, self.asked = rows, stop_at, []

    def __call__(self, name, keyed, code, out) -> Manifest:
        self.asked.append((name, keyed))
        if name == self.stop_at:
            raise Stopped(name)
        files = {"trajectories": f"{out.url}/trajectories.jsonl", "model": f"{out.url}/model"}
        counts, metrics = {}, {}
        if name == "expert-revisions":
            counts = {
                "episodes": 8, "failed": 6, "rows": self.rows, "skipped_no_first_error": 1,
                "skipped_no_continuation": 1, "skipped_replay_mismatch": 0,
                "expert_trajectories": self.rows // 2, "trajectories": self.rows * 3 // 2,
            }  # fmt: skip
            metrics = {"first_error_step_mean": 1.5}
        return Manifest(stage=name, url=out.url, files=files, counts=counts, metrics=metrics)


ROUND_1 = RoundState(
    round=1, policy="file:///p", start_policy="file:///s", carry={"expert": "file:///e.jsonl"}
)


def round_1(tmp_path, config: str, stages: FakeStages, *overrides: str):
    cfg = load_config(AgentRConfig, config, [f"storage_url={tmp_path}", *overrides])
    with planning(stages):
        recipe = AgentR(cfg, ArtifactStore(str(tmp_path)), None)
        return recipe, recipe.round(ROUND_1)


def expert_round(tmp_path, rows: int, *overrides: str):
    stages = FakeStages(rows)
    recipe, result = round_1(
        tmp_path, EXPERT_CONFIG, stages, "revisions.tasks_per_round=5",
        *overrides,
    )  # fmt: skip
    return recipe, stages.asked, result


def test_an_expert_round_explores_revises_with_the_expert_and_trains_the_policy(tmp_path):
    recipe, asked, result = expert_round(tmp_path, rows=4)
    assert [name for name, _ in asked] == [
        "explore-shard",
        "expert-revisions",
        "mix-general",
        "sft",
    ]
    explore, revise, _, sft = (keyed for _, keyed in asked)
    assert explore["task_ids"] == recipe.train_ids[:5] and explore["temperature"] == 0.0
    assert explore["model_url"] == "file:///p" and explore["seed"] == 1
    assert revise["explored_urls"] == [f"{recipe.run_url}/round-1/explore/trajectories.jsonl"]
    assert (revise["expert_url"], revise["expert_sft_ratio"]) == ("file:///e.jsonl", 0.5)
    assert sft["model_url"] == "file:///p"
    assert result.policy == f"{recipe.run_url}/round-1/sft/model"
    assert result.notes[0].startswith("round 1: 6/8 explored episodes failed, 4 revisions")
    # No rows: nothing trained, and the note says why; no ratio: no expert file read.
    _, asked, result = expert_round(tmp_path, 0, "revisions.expert_sft_ratio=0")
    assert [name for name, _ in asked] == ["explore-shard", "expert-revisions"]
    assert asked[1][1]["expert_url"] is None
    assert result.policy is None and "no training data" in result.notes[-1]


def test_the_mcts_source_still_searches_trees(tmp_path):
    stages = FakeStages(0, stop_at="mcts")
    with pytest.raises(Stopped):
        round_1(tmp_path, str(ROOT / "configs/agent_r_textcraft.yaml"), stages)
    assert [name for name, _ in stages.asked] == ["mcts"]
