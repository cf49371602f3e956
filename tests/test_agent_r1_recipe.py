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
