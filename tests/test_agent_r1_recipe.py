"""Which questions Agent-R1's rounds sample from (no model, no flow)."""

from __future__ import annotations

from flows.agent_r1 import AgentR1, AgentR1Config
from flywheel.storage import ArtifactStore


def recipe(tmp_path, **sample) -> AgentR1:
    cfg = AgentR1Config(env={"train_tasks": 12, "test_tasks": 3}, sample=sample)
    return AgentR1(cfg, ArtifactStore(str(tmp_path)), None)


def test_rounds_sample_the_warm_starts_questions_in_a_seeded_mixed_order(tmp_path):
    warm = recipe(tmp_path, tasks_per_round=5, questions="warm-start")
    questions = warm.questions()
    assert sorted(questions) == sorted(warm.train_ids) and questions != warm.train_ids
    assert questions == warm.questions()  # the same order every time: rounds take slices of it
    rounds = [warm.cfg.sample.tasks_for_round(questions, n) for n in (1, 2)]
    assert rounds == [questions[:5], questions[5:10]]


def test_all_train_questions_by_default(tmp_path):
    every = recipe(tmp_path)  # the default
    assert sorted(every.questions()) == sorted(every.env.task_ids("train"))
    assert len(every.questions()) == 330 > len(every.train_ids)


def test_a_round_without_a_mixed_group_trains_nothing_under_mixed_groups(tmp_path, monkeypatch):
    from flywheel.records import Manifest
    from ops.driver import RoundState

    sampled = Manifest(stage="sample", url="u", files={"trajectories": "t", "model": "m"},
                       metrics={"zero_variance_groups": 0.5, "mixed_outcome_groups": 0.0})  # fmt: skip
    trained = []
    for groups in ("mixed", "all"):
        r1 = recipe(tmp_path, tasks_per_round=2)
        r1.cfg.rl.groups = groups
        monkeypatch.setattr(r1, "sample", lambda *a: sampled)
        monkeypatch.setattr(r1, "rl", lambda *a, g=groups: trained.append(g) or sampled)
        result = r1.round(RoundState(round=1, policy="p", start_policy="p"))
        if groups == "mixed":
            assert result.policy is None and "rl.groups=all" in result.notes[0]
    assert trained == ["all"]  # every group with reward variance: the update runs


def test_dynamic_sampling_takes_slices_no_other_round_takes():
    from flows.agent_r1 import SampleSettings

    assert SampleSettings(tasks_per_round=5).slices(3) == [3]  # off: round n's own slice
    dynamic = SampleSettings(tasks_per_round=5, min_mixed_groups=4, max_slices=3)
    assert [dynamic.slices(n) for n in (1, 2)] == [[1, 2, 3], [4, 5, 6]]


def test_dynamic_sampling_is_refused_where_it_cannot_work():
    import pytest
    from pydantic import ValidationError

    from flows.et_agent import ETAgentConfig

    with pytest.raises(ValidationError, match="set sample.tasks_per_round"):
        AgentR1Config(sample={"min_mixed_groups": 4})
    with pytest.raises(ValidationError, match="needs sample.curriculum=none"):
        AgentR1Config(
            sample={"min_mixed_groups": 4, "tasks_per_round": 8, "curriculum": "tool-calls"}
        )
    with pytest.raises(ValidationError, match="min_mixed_groups is Agent-R1's"):
        ETAgentConfig(sample={"min_mixed_groups": 4, "tasks_per_round": 8, "curriculum": "none"})


def played(store, name: str, outcomes: dict[str, list[bool]]):
    """A sample stage's manifest over real trajectory records: question -> its group's outcomes."""
    from agents.episode_metrics import mixed_outcome_share
    from flywheel.records import Manifest, Trajectory

    trajectories = [
        Trajectory(task_id=q, env="qa", messages=[], episode_start=0, reward=float(ok),
                   success=ok, n_steps=1, group_id=q)
        for q, group in outcomes.items() for ok in group
    ]  # fmt: skip
    url = store.write_records(store.url("run", name, "trajectories.jsonl"), trajectories)
    share = mixed_outcome_share(trajectories)
    return Manifest(
        stage="sample", url=store.url("run", name), files={"trajectories": url},
        counts={"episodes": len(trajectories)},
        metrics={"mixed_outcome_groups": share, "zero_variance_groups": 1 - share,
                 "success_rate": sum(t.success for t in trajectories) / len(trajectories)},
    )  # fmt: skip


def updated():
    from flywheel.records import Manifest

    return Manifest(stage="rl", url="file:///rl", files={"model": "file:///rl/model"})


def test_dynamic_sampling_samples_slices_until_enough_groups_mix_and_pools_them(
    tmp_path, monkeypatch
):
    from ops.driver import RoundState

    r1 = recipe(tmp_path, tasks_per_round=2, samples_per_task=2, min_mixed_groups=2)
    questions = r1.questions()
    # Slice 1: no group mixes; slice 2: one; slice 3: one more (2 in all: stop); slice 4 unused.
    slices = iter([
        {questions[0]: [False, False], questions[1]: [True, True]},
        {questions[2]: [True, False], questions[3]: [False, False]},
        {questions[4]: [False, True], questions[5]: [False, False]},
    ])  # fmt: skip
    asked, trained = [], []

    def sample(policy, task_ids, seed, path, label):
        asked.append((task_ids, seed, path))
        return played(r1.store, path, next(slices))

    monkeypatch.setattr(r1, "sample", sample)
    monkeypatch.setattr(r1, "rl", lambda policy, url, *a: trained.append(url) or updated())
    r1.round(RoundState(round=1, policy="p", start_policy="p"))
    assert [a[0] for a in asked] == [questions[0:2], questions[2:4], questions[4:6]]
    assert [a[2] for a in asked] == ["round-1/sample", "round-1/sample-2", "round-1/sample-3"]
    assert [a[1] for a in asked] == [1000, 1001, 1002]
    [pooled_url] = trained
    assert pooled_url.endswith("round-1/pooled/trajectories.jsonl")
    pooled = r1.store.read_manifest(pooled_url.rsplit("/", 1)[0])
    assert pooled.counts == {"episodes": 12, "groups": 6, "mixed_groups": 2}


def test_without_dynamic_sampling_a_round_samples_its_one_slice_unpooled(tmp_path, monkeypatch):
    from ops.driver import RoundState

    r1 = recipe(tmp_path, tasks_per_round=2, samples_per_task=2)
    questions, asked, trained = r1.questions(), [], []

    def sample(policy, task_ids, seed, path, label):
        asked.append(path)
        return played(r1.store, path, {task_ids[0]: [True, False], task_ids[1]: [True, True]})

    monkeypatch.setattr(r1, "sample", sample)
    monkeypatch.setattr(r1, "rl", lambda policy, url, *a: trained.append(url) or updated())
    r1.round(RoundState(round=2, policy="p", start_policy="p"))
    assert asked == ["round-2/sample"] and trained[0].endswith("round-2/sample/trajectories.jsonl")
    assert questions  # the recipe's seeded order
