"""Which questions Agent-R1's rounds sample from (no model, no flow)."""

from __future__ import annotations

from flows.agent_r1 import AgentR1
from flywheel.settings import AgentR1Config
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
