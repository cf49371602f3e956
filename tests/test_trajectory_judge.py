"""The flywheel's judge: rule verdicts on hand-made trajectories, and the judge model's replies
read, batched, with the rules taking over (and saying so) where the model gives no step."""

from __future__ import annotations

import pytest

from agents.formats import TagFormat
from agents.trajectory_judge import (
    TrajectoryJudge,
    episode_steps,
    parse_step,
    rule_first_flaw,
    rule_redundant_step,
)
from flywheel.records import Message, Trajectory
from tests.scripted_qa import ScriptedJudgeBackend, judged_steps

TAGS = TagFormat()
SEARCH_A = "I need the document about Ada.\n<search>Ada</search>"
SEARCH_B = "<search>Bob</search>"
PYTHON = "<python>print(1 + 1)</python>"
ANSWER = "<answer>2</answer>"


def made(*turns: tuple[str, str | None]) -> Trajectory:
    """A trajectory of agent turns, each answered by its tool result (None: a final answer)."""
    messages = [
        Message(role="system", content="Answer the question."),
        Message(role="user", content="Question: what is 1 + 1?"),
    ]
    for text, result in turns:
        messages.append(Message(role="assistant", content=text, loss=True))
        if result is not None:
            messages.append(TAGS.result_message(result))
    return Trajectory(task_id="q", env="qa", messages=messages, episode_start=1)


REPEATED = made((SEARCH_A, "Ada was born in 1815."), (SEARCH_B, "Bob."), (SEARCH_A, "Ada was born in 1815."), (ANSWER, None))  # fmt: skip
FAILING = made((SEARCH_A, "Ada."), (PYTHON, "Error: NameError: x"), (SEARCH_A, "Ada."), (ANSWER, None))  # fmt: skip
CLEAN = made((SEARCH_A, "Ada."), (PYTHON, "2"), (ANSWER, None))
MALFORMED = made((SEARCH_A, "Ada."), ("I think it is 2.", "No call in this reply."), (ANSWER, None))  # fmt: skip


def test_rules_name_the_repeated_then_the_failed_call_as_redundant():
    assert rule_redundant_step(episode_steps(REPEATED, TAGS)).step == 2
    # the failed python call comes first, but a repeat is what makes a call redundant first
    assert rule_redundant_step(episode_steps(FAILING, TAGS)).step == 2
    only_failed = made((SEARCH_A, "Ada."), (PYTHON, "Error: SyntaxError"), (ANSWER, None))
    verdict = rule_redundant_step(episode_steps(only_failed, TAGS))
    assert (verdict.step, verdict.source) == (1, "rules")
    assert rule_redundant_step(episode_steps(CLEAN, TAGS)).step is None


def test_rules_name_the_failed_step_then_the_repeat_then_the_answer_as_first_flaw():
    assert rule_first_flaw(episode_steps(FAILING, TAGS)).step == 1  # before the repeat at 2
    assert rule_first_flaw(episode_steps(REPEATED, TAGS)).step == 2
    assert rule_first_flaw(episode_steps(CLEAN, TAGS)).step == 2  # the answer
    assert rule_first_flaw(episode_steps(MALFORMED, TAGS)).step == 1  # no call read
    refused = made((SEARCH_A, "Ada."), (SEARCH_B, "Error: no tool calls left"), (ANSWER, None))
    assert rule_first_flaw(episode_steps(refused, TAGS)).step == 1


def test_a_step_is_read_from_the_last_labelled_number_in_range():
    assert parse_step("Step 1 looks fine.\nStep: 3\nReason: a repeat.", 3, True) == (2, "a repeat.")
    assert parse_step("**Step:** 2 (it fails)", 3, True)[0] == 1
    assert parse_step("Step: 2\nReason: it repeats step 1.", 3, True) == (1, "it repeats step 1.")
    assert parse_step("Step: none", 3, allow_none=True) == (None, "Step: none")
    assert parse_step("Step: none", 3, allow_none=False) is None  # a wrong one has a flaw
    assert parse_step("Step: 4", 3, True) is None  # no such step
    assert parse_step("The third one.", 3, True) is None


def judge_of(chat, reply) -> tuple[TrajectoryJudge, ScriptedJudgeBackend]:
    scripted = ScriptedJudgeBackend(chat, reply=reply)
    return TrajectoryJudge(scripted, chat, TAGS, max_tokens=32, timeout_s=5.0), scripted


def test_the_judge_model_is_asked_once_for_all_trajectories_and_its_steps_kept(chat):
    judge, backend = judge_of(chat, lambda prompt: "Step: 1\nReason: Ada twice.")
    verdicts = judge.redundant_step([REPEATED, CLEAN])
    assert backend.calls == [2]
    assert [(v.step, v.source, v.reason) for v in verdicts] == [(0, "judge", "Ada twice.")] * 2
    assert verdicts[0].raw == "Step: 1\nReason: Ada twice." and verdicts[0].error is None
    prompt = backend.prompts[0]  # numbered steps with their results, and the question asked
    assert judged_steps(prompt)[2] == "I need the document about Ada."
    assert (
        "Question: what is 1 + 1?" in prompt and "Step 3: I need the document about Ada." in prompt
    )
    assert "Result 2: Bob." in prompt and "Which step is redundant" in prompt
    assert judge.first_flaw(CLEAN).step == 0  # one trajectory in, one verdict out


def test_an_unparsable_reply_falls_back_to_the_rules_and_is_recorded(chat):
    judge, _ = judge_of(chat, lambda prompt: "They all look fine to me.")
    verdict = judge.first_flaw(FAILING)
    assert (verdict.step, verdict.source) == (1, "rules")
    assert verdict.raw == "They all look fine to me." and "no usable step" in verdict.error
    none_for_a_flaw, _ = judge_of(chat, lambda prompt: "Step: none")
    assert none_for_a_flaw.first_flaw(CLEAN).source == "rules"


@pytest.mark.parametrize(
    ("backend", "error"),
    [({"hang": True}, "timeout"), ({"fail": True}, "error: ConnectionError")],
)
def test_a_timed_out_or_failed_call_falls_back_to_the_rules_without_raising(chat, backend, error):
    scripted = ScriptedJudgeBackend(chat, **backend)
    judge = TrajectoryJudge(scripted, chat, TAGS, timeout_s=0.1)
    verdicts = judge.redundant_step([REPEATED, CLEAN])
    scripted.release()
    assert [(v.step, v.source) for v in verdicts] == [(2, "rules"), (None, "rules")]
    assert all(v.error.startswith(error) for v in verdicts)
