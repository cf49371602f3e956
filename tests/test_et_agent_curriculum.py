"""ET-Agent's curriculum: which train questions each stage samples (no model, no vLLM)."""

from __future__ import annotations

import pytest
from conftest import tiny_tool_recipe

from envs.qa_data import QARecord
from flows.et_agent import ETAgent, reference_tool_calls
from flywheel.settings import ETAgentConfig
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
    assert reference_tool_calls(record(type_, documents)) == calls


def recipe(tmp_path, **settings) -> ETAgent:
    raw = tiny_tool_recipe("curriculum", tmp_path, flywheel_tasks=40, **settings)
    raw["sample"] = {"tasks_per_round": 16, "samples_per_task": 8}
    raw["env"] = {**raw["env"], "train_tasks": 64}
    cfg = ETAgentConfig.model_validate(raw)
    return ETAgent(cfg, ArtifactStore(str(tmp_path / "store")), tracking=None)


def test_stages_admit_harder_questions_one_level_at_a_time(tmp_path):
    et = recipe(tmp_path)
    records = et.env.questions("train")
    calls = {q: reference_tool_calls(r) for q, r in records.items()}
    stages = [et.stage_questions(n) for n in (1, 2, 3, 4)]
    assert [len(s) for s in stages] == [16, 16, 16, 16]
    # the generated world's levels are 2 (bridge), 3 (arithmetic, comparison) and 4
    assert {calls[q] for q in stages[0]} == {2}
    assert max(calls[q] for q in stages[1]) == 3
    assert max(calls[q] for q in stages[2]) == 4
    # no question twice, none the flywheel evolved (RFT trained on those)
    chosen = [q for s in stages for q in s]
    assert len(set(chosen)) == len(chosen)
    assert not set(chosen) & set(et.questions()[:40])
    # each stage takes its level's questions in the seeded order; past the last level, any
    pool = et.questions()[40:]
    assert stages[0] == [q for q in pool if calls[q] == 2][:16]
    earlier = set(stages[0] + stages[1] + stages[2])
    assert stages[3] == [q for q in pool if q not in earlier][:16]


def test_without_a_curriculum_stages_take_seeded_slices_after_the_flywheels(tmp_path):
    et = recipe(tmp_path, curriculum="none")
    pool = et.questions()[40:]
    assert et.stage_questions(1) == pool[:16]
    assert et.stage_questions(2) == pool[16:32]
