"""Which train questions each RL round samples (Agent-R1's rounds, ET-Agent's curriculum stages):
in a seeded order, a slice a round, or easy first by the tool calls a reference solution needs.
No model and no vLLM: the recipes are built on the tiny config and asked for their questions."""

from __future__ import annotations

import pytest
from conftest import tiny_tool_recipe

from envs.qa_data import QARecord
from flows.agent_r1 import AgentR1, AgentR1Config, easy_first_slice
from flows.et_agent import ETAgent, ETAgentConfig
from flywheel.settings import round_slice
from flywheel.storage import ArtifactStore


def record(type_: str, documents: int) -> QARecord:
    ids = [f"doc-{i}" for i in range(documents)]
    return QARecord(id="q", question="?", answer="a", type=type_, supporting_ids=ids, source="x")


@pytest.mark.parametrize(
    ("type_", "documents", "calls"),
    [("bridge", 2, 2), ("arithmetic", 2, 3), ("comparison", 3, 3), ("bridge_comparison", 4, 4),
     ("bridge", 0, 0)],
)  # fmt: skip
def test_a_reference_solution_searches_each_document_and_computes_arithmetic(
    type_, documents, calls
):
    assert record(type_, documents).reference_tool_calls == calls


def test_easy_first_takes_each_level_in_order_and_never_a_question_twice():
    calls = {"a": 3, "b": 2, "c": 4, "d": 2, "e": 3, "f": 2, "g": 4}
    order = list("abcdefg")
    # level 2: b d (of b d f); level 3: a e (of a e f, in order); level 4: c f (of c f g)
    assert easy_first_slice(order, calls, 2, 1) == ["b", "d"]
    assert easy_first_slice(order, calls, 2, 2) == ["a", "e"]
    assert easy_first_slice(order, calls, 2, 3) == ["c", "f"]
    assert easy_first_slice(order, calls, 2, 4) == ["g"]  # past the last level: what is left
    assert easy_first_slice(order, calls, 2, 5) == []


def recipe(recipe_class, config_class, tmp_path, **sample):
    raw = tiny_tool_recipe("curriculum", tmp_path, evolve_tasks=40)
    raw["sample"] = {"tasks_per_round": 16, **sample}
    raw["env"] = {**raw["env"], "train_tasks": 64}
    if recipe_class is AgentR1:
        del raw["evolve_tasks"]
    cfg = config_class.model_validate(raw)
    return recipe_class(cfg, ArtifactStore(str(tmp_path / "store")), tracking=None)


def test_et_agent_stages_admit_harder_questions_one_level_at_a_time(tmp_path):
    et = recipe(ETAgent, ETAgentConfig, tmp_path)
    assert (et.cfg.sample.curriculum, et.cfg.sample.samples_per_task) == ("tool-calls", 8)
    records = et.env.questions("train")
    calls = {q: r.reference_tool_calls for q, r in records.items()}
    stages = [et.round_questions(n, skip=40) for n in (1, 2, 3, 4)]
    assert [len(s) for s in stages] == [16, 16, 16, 16]
    # the generated world's levels are 2 (bridge), 3 (arithmetic, comparison) and 4
    assert {calls[q] for q in stages[0]} == {2}
    assert max(calls[q] for q in stages[1]) == 3
    assert max(calls[q] for q in stages[2]) == 4
    # no question twice, none the evolve stage evolved (RFT trained on those)
    chosen = [q for s in stages for q in s]
    assert len(set(chosen)) == len(chosen)
    assert not set(chosen) & set(et.questions()[:40])
    # each stage takes its level's questions in the seeded order; past the last level, any
    pool = et.questions()[40:]
    assert stages[0] == [q for q in pool if calls[q] == 2][:16]
    earlier = set(stages[0] + stages[1] + stages[2])
    assert stages[3] == [q for q in pool if q not in earlier][:16]


def test_without_a_curriculum_rounds_take_seeded_slices(tmp_path):
    et = recipe(ETAgent, ETAgentConfig, tmp_path / "et", curriculum="none")
    pool = et.questions()[40:]
    assert et.round_questions(1, skip=40) == pool[:16]
    assert et.round_questions(2, skip=40) == pool[16:32]
    # Agent-R1 samples without a curriculum unless asked, from the head of the seeded order
    r1 = recipe(AgentR1, AgentR1Config, tmp_path / "r1")
    assert r1.cfg.sample.curriculum == "none"
    assert r1.round_questions(3) == round_slice(r1.questions(), 16, 3)
    easy = recipe(AgentR1, AgentR1Config, tmp_path / "easy", curriculum="tool-calls")
    records = easy.env.questions("train")
    assert {records[q].reference_tool_calls for q in easy.round_questions(1)} == {2}


def test_a_curriculum_that_ran_out_of_questions_says_what_to_change(tmp_path):
    et = recipe(ETAgent, ETAgentConfig, tmp_path, tasks_per_round=200)
    # each level's questions, fewer than 200, then the rest: every one of the 290 by stage 3
    assert sum(len(et.round_questions(n, skip=40)) for n in (1, 2, 3)) == 290
    with pytest.raises(ValueError, match="round 4: the tool-call curriculum has used all 290"):
        et.round_questions(4, skip=40)


def test_an_et_agent_sample_section_keeps_the_paper_defaults_it_does_not_name(tmp_path):
    raw = tiny_tool_recipe("defaults", tmp_path)
    raw["sample"] = {"tasks_per_round": 4}
    sample = ETAgentConfig.model_validate(raw).sample
    assert (sample.tasks_per_round, sample.samples_per_task, sample.curriculum) == (
        4, 8, "tool-calls"
    )  # fmt: skip
    assert (
        ETAgentConfig.model_validate({**raw, "sample": {"curriculum": "none"}}).sample.curriculum
        == "none"
    )
