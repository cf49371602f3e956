"""ET-Agent's data evolution on the QA environment, with a scripted policy (the solver plan with
planted mistakes, `tests.scripted_qa`) and a scripted judge: the rollout continuation it rests
on, then the stage, called directly on a local store."""

from __future__ import annotations

import pytest

from agents.formats import make_format
from agents.rollout import Resume, RolloutSettings, agent_prefix, continue_batched, run_batched
from agents.trajectory_judge import TrajectoryJudge
from envs import make_env
from flywheel.inference import SamplingSettings
from flywheel.records import Message, Trajectory
from flywheel.settings import EnvSettings, InferenceSettings
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from tasks.evolve import (
    EvolveInputs,
    EvolveRecord,
    EvolveSettings,
    JudgeSettings,
    evolve_stage,
)
from tests.scripted_qa import NO_CALL, PlannedQABackend, ScriptedJudgeBackend

HINT = Message(role="user", content="Your previous step was wrong: try again.")


@pytest.fixture(scope="module")
def env():
    return make_env(EnvSettings(name="qa"))


@pytest.fixture(scope="module")
def questions(env):
    """Two train questions: search, search, python, answer (to repeat a search in), and one
    the policy first answers wrongly."""
    ids = env.task_ids("train")
    return next(t for t in ids if t.startswith("founder_age/")), ids[0]


def first_rollout(env, chat, questions) -> tuple[list[Trajectory], PlannedQABackend]:
    repeat, wrong = questions
    policy = PlannedQABackend(env, chat, {repeat: "repeat", wrong: "wrong-answer"})
    settings = RolloutSettings(max_steps=8)
    return run_batched(env, list(questions), policy, chat, agent_prefix(env, []), settings, False), policy  # fmt: skip


def test_a_continuation_replays_the_kept_turns_then_goes_on_after_the_hint(env, chat, questions):
    (repeated, _), policy = first_rollout(env, chat, questions)
    assert repeated.success and repeated.metrics["tool_calls"] == 4  # the repeat is a call
    settings = RolloutSettings(max_steps=8, sampling=SamplingSettings(seed=1))  # no mistakes
    [continued] = continue_batched(env, [Resume(repeated, 2, (HINT,))], policy, chat, settings)
    cut = repeated.episode_start + 1 + 4  # two agent turns and their results
    assert continued.messages[:cut] == repeated.messages[:cut]  # token ids as generated
    assert continued.messages[cut] == HINT
    assert continued.success and continued.finish_reason == "done"
    # replayed calls count: search, search (repeat), then search, python, answer
    assert continued.metrics["tool_calls"] == 4 and continued.n_steps == 5
    assert policy.calls[-3:] == [1, 1, 1]  # only the continuation was generated
    # one episode from a kept prefix, not one of the task's sampled group: no group advantage
    assert continued.group_id is None


def test_a_malformed_call_in_the_kept_turns_is_answered_again_with_the_formats_error(
    env, chat, questions
):
    repeat, _ = questions
    policy = PlannedQABackend(env, chat, {repeat: "malformed"})
    [first] = run_batched(env, [repeat], policy, chat, agent_prefix(env, []),
                          RolloutSettings(max_steps=8), False)  # fmt: skip
    start = first.episode_start
    assert first.messages[start + 3].content == NO_CALL and first.success
    error = first.messages[start + 4].content
    assert "No call in this reply" in error  # the format's error, not a tool's result
    [continued] = continue_batched(env, [Resume(first, 2)], policy, chat, RolloutSettings(8))
    assert continued.messages[: start + 5] == first.messages[: start + 5]
    assert (continued.finish_reason, continued.success) == ("done", True)


def test_a_replay_that_differs_from_the_record_ends_that_episode_only(env, chat, questions):
    (repeated, wrong), policy = first_rollout(env, chat, questions)
    tampered = repeated.model_copy(deep=True)
    observation = tampered.messages[tampered.episode_start + 2]
    tampered.messages[tampered.episode_start + 2] = observation.model_copy(
        update={"content": "<result>\nsomething else\n</result>"}
    )
    calls = len(policy.calls)
    broken, fine = continue_batched(
        env, [Resume(tampered, 2), Resume(wrong, 0)], policy, chat, RolloutSettings(8)
    )
    assert broken.finish_reason.startswith("replay-mismatch") and not broken.success
    assert fine.finish_reason == "done"
    assert set(policy.calls[calls:]) == {1}  # the broken one never reached the policy
    whole = continue_batched(env, [Resume(repeated, 99)], policy, chat, RolloutSettings(8))
    assert whole[0].finish_reason.startswith("replay-mismatch")  # it ended in the prefix


def run_stage(env, chat, questions, tmp_path, monkeypatch, rounds=3, rewrite=True, **judge_backend):
    repeat, wrong = questions
    policy = PlannedQABackend(env, chat, {repeat: "repeat", wrong: "wrong-answer"})
    timeout_s = judge_backend.pop("timeout_s", 5.0)
    judge_model = ScriptedJudgeBackend(chat, **judge_backend)
    agent_format = make_format(env.agent_format, env.tool_arguments)
    judge = TrajectoryJudge(judge_model, chat, agent_format, timeout_s=timeout_s)
    monkeypatch.setattr("tasks.evolve.open_models", lambda inputs, store: (chat, policy, judge))
    store = ArtifactStore(str(tmp_path / "store"))
    inputs = EvolveInputs(
        model_url=store.url("models/policy"), env=EnvSettings(name="qa"), task_ids=list(questions),
        prefix=agent_prefix(env, []), inference=InferenceSettings(),
        settings=EvolveSettings(rounds=rounds, rewrite=rewrite, judge=JudgeSettings()),
        max_steps=8, seed=0,
    )  # fmt: skip
    manifest = evolve_stage.fn(inputs, StageOutput(store_url=store.root, url=store.url("fw")))
    judge_model.release()  # a hung judge's abandoned thread ends
    kept = store.read_records(manifest.files["trajectories"], Trajectory)
    records = store.read_records(manifest.files["records"], EvolveRecord)
    return manifest, kept, records


def test_a_correct_trajectory_is_enhanced_and_a_wrong_one_reflected(
    env, chat, questions, tmp_path, monkeypatch
):
    manifest, kept, records = run_stage(env, chat, questions, tmp_path, monkeypatch)
    repeat, wrong = questions
    by_id = {r.id: r for r in records}
    cut = next(r for r in records if r.operator == "redundant-cut")
    assert cut.parent == f"{repeat}#0" and cut.verdict.step == 1 and cut.verdict.source == "judge"
    assert cut.correct and cut.kept and cut.tool_calls == 3 < by_id[f"{repeat}#0"].tool_calls

    reflected = next(r for r in records if r.operator == "reflect-answer")
    assert reflected.parent == f"{wrong}#0" and not by_id[f"{wrong}#0"].correct
    assert reflected.hint.startswith("Your answer was wrong: the answer is not in the results.")
    assert reflected.correct and reflected.kept
    trained = next(t for t in kept if t.task_id == wrong and t.source == "reflect-answer")
    assert all(m.content != reflected.hint for m in trained.messages)  # the hint is dropped
    assert all(m.role == "assistant" for m in trained.continuation[-1:])
    assert [m.role for m in trained.continuation].count("user") == trained.n_steps - 1

    rewrites = [t for t in kept if t.source == "rewrite"]
    assert rewrites and all(
        m.token_ids is None and m.content.startswith("<")
        for t in rewrites
        for m in t.continuation
        if m.role == "assistant"
    )
    assert {t.source for t in kept} >= {"rollout", "redundant-cut", "rewrite", "reflect-answer"}
    assert all(r.correct for r in records if r.kept) and len(kept) == sum(r.kept for r in records)
    assert manifest.metrics["solved_before"] == 0.5 and manifest.metrics["solved_after"] == 1.0
    assert manifest.counts["kept_reflect-answer"] == 1 and manifest.counts["verdicts_rules"] == 0


def test_a_question_stops_when_a_round_brings_nothing_new(
    env, chat, questions, tmp_path, monkeypatch
):
    manifest, _, records = run_stage(env, chat, questions, tmp_path, monkeypatch, rounds=6)
    for question in questions:  # cut/reflect, rewrite, then a fresh rollout that repeats the plan
        mine = [r for r in records if r.question == question]
        assert [r.round for r in mine] == [0, 1, 2, 3]
        assert mine[-1].operator == "fresh-rollout" and mine[-1].why.startswith("duplicate of")
        assert not mine[-1].kept
    assert manifest.counts["rounds"] == 3 and manifest.counts["rollouts"] == 2 + 2 + 2


def test_without_rewrite_a_correct_trajectory_with_nothing_redundant_is_rolled_out_afresh(
    env, chat, questions, tmp_path, monkeypatch
):
    _, kept, records = run_stage(env, chat, questions, tmp_path, monkeypatch, rewrite=False)
    assert not any(r.operator == "rewrite" for r in records)
    assert all(m.token_ids for t in kept for m in t.continuation if m.role == "assistant")
    repeat, _ = questions  # round 1 cuts its redundant step; round 2 would have rewritten it
    assert [r.operator for r in records if r.question == repeat][2] == "fresh-rollout"


def test_judge_timeouts_fall_back_to_the_rules_and_are_recorded(
    env, chat, questions, tmp_path, monkeypatch
):
    manifest, kept, records = run_stage(
        env, chat, questions, tmp_path, monkeypatch, rounds=1, hang=True, timeout_s=0.1
    )
    verdicts = [r.verdict for r in records if r.verdict]
    assert len(verdicts) == 2 and all(v.source == "rules" for v in verdicts)
    assert all(v.error.startswith("timeout") for v in verdicts)
    repeat, wrong = questions
    # the rules: the repeated search is redundant; the wrong answer is the first flaw
    assert {(r.question, r.operator, r.verdict.step) for r in records if r.verdict} == {
        (repeat, "redundant-cut", 1),
        (wrong, "reflect-answer", len(env.expert_plan(wrong)) - 1),
    }
    assert manifest.counts["judge_failures"] == 2 and manifest.counts["verdicts_judge"] == 0
