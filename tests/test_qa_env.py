"""The QA environment on hand-written moves, its settings, and the scripted solver."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agents.rollout import expert_trajectory
from agents.turns import ToolTurns, turns_for
from envs import make_env
from envs.qa_data import Document, QAData, QARecord
from envs.qa_env import QAEnv
from envs.tools import call_action, malformed_action
from flywheel.records import Message
from flywheel.settings import EnvSettings, QASettings

DATA = Path(__file__).parent / "data" / "qa"

ELBONIA = QAData(
    questions=[
        QARecord(
            id="q1",
            question="What is the capital of Elbonia?",
            answer="Mudville",
            type="bridge",
            supporting_ids=["d1"],
            source="hand",
        )
    ],
    corpus=[
        Document(id="d1", title="Elbonia", text="The capital of Elbonia is Mudville."),
        Document(id="d2", title="Mudville", text="Mudville is a town of mud."),
        Document(id="d3", title="Dogbert", text="Dogbert rules nothing."),
    ],
)


def hand_env(**settings) -> QAEnv:
    return QAEnv(QASettings(**settings), data=lambda split: ELBONIA)


def search(query: str) -> str:
    return call_action("search", {"query": query})


def answer(text: str) -> str:
    return call_action("answer", {"text": text})


def test_a_search_shows_the_matching_documents_best_first():
    episode = hand_env().start("q1")
    assert episode.instruction == "Question: What is the capital of Elbonia?"
    result = episode.step(search("capital of Elbonia"))
    # d1 shares "capital" and "elbonia"; d2 and d3 share no word with the query
    assert result.observation == "[1] Elbonia: The capital of Elbonia is Mudville."
    assert (result.reward, result.done) == (0.0, False)


def test_python_runs_in_the_sandbox_and_shows_what_it_printed():
    result = hand_env().start("q1").step(call_action("python", {"code": "print(6 * 7)"}))
    assert (result.observation, result.reward, result.done) == ("42", 0.0, False)


def test_a_right_answer_earns_the_answer_and_the_format_term():
    episode = hand_env().start("q1")
    episode.step(search("Elbonia"))
    result = episode.step(answer("the Mudville"))  # SQuAD normalisation drops the article
    assert result.done and result.reward == pytest.approx(1.0 + 0.1)
    assert result.observation == "Final answer: the Mudville"


def test_a_partly_right_answer_earns_its_f1_and_a_process_reward_per_successful_call():
    episode = hand_env(tool_call_weight=0.05).start("q1")
    episode.step(search("Elbonia"))  # succeeds
    episode.step(call_action("python", {"code": "1/0"}))  # an error: not rewarded
    result = episode.step(answer("Mudville town"))
    f1 = 2 * (1 / 2) * 1 / (1 / 2 + 1)  # precision 1/2, recall 1
    assert result.reward == pytest.approx(0.1 + f1 + 0.05)


def test_a_malformed_reply_is_an_observation_and_costs_the_whole_reward():
    episode = hand_env().start("q1")
    result = episode.step(malformed_action("No call in this reply."))
    assert (result.observation, result.reward, result.done) == (
        "No call in this reply.",
        0.0,
        False,
    )
    final = episode.step(answer("Mudville"))  # right, but the episode broke the format
    assert final.done and final.reward == 0.0
    assert episode.outcome.exact_match == 1.0 and episode.outcome.format == 0.0


@pytest.mark.parametrize(
    "action, says",
    [
        (call_action("browse", {"url": "x"}), "unknown tool 'browse'"),
        ("search Elbonia", "unreadable action"),
        (call_action("answer", {"text": ""}), "bad arguments for answer"),
    ],
)
def test_unknown_tools_and_unreadable_actions_count_as_malformed(action, says):
    episode = hand_env().start("q1")
    result = episode.step(action)
    assert says in result.observation and not result.done
    assert episode.malformed == 1


def test_bad_tool_arguments_are_an_error_observation_not_a_format_violation():
    episode = hand_env().start("q1")
    result = episode.step(call_action("search", {"q": "Elbonia"}))
    assert result.observation.startswith("Error: bad arguments for search")
    assert episode.malformed == 0 and episode.successful_calls == 0


def test_calls_past_the_budget_are_refused_and_the_answer_still_counts():
    episode = hand_env(max_tool_calls=1).start("q1")
    episode.step(search("Elbonia"))
    refused = episode.step(search("Mudville"))
    assert refused.observation.startswith("Error: no tool calls left (at most 1 per question)")
    assert episode.tool_calls == 1
    assert episode.step(answer("Mudville")).reward == pytest.approx(1.1)


def test_step_all_batches_calls_per_tool_and_keeps_each_episodes_order():
    env = hand_env()
    moves = [search("Mudville"), call_action("python", {"code": "print(1)"}), answer("Mudville")]
    alone = [env.start("q1").step(move) for move in moves]
    together = env.step_all([(env.start("q1"), move) for move in moves])
    assert together == alone
    assert [r.done for r in together] == [False, False, True]


# ---- settings --------------------------------------------------------------------------------


def test_make_env_builds_the_qa_environment_from_its_settings():
    env = make_env(EnvSettings(name="qa", qa=QASettings(format="json", tools=["search"])))
    assert isinstance(env, QAEnv) and env.agent_format == "json"
    assert dict(env.tool_arguments) == {"search": "query"}
    assert '"name": "search"' in env.system_prompt and '"name": "python"' not in env.system_prompt
    assert EnvSettings(name="qa").identity()["qa"]["format"] == "tags"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"source": "hotpotqa"}, "needs env.qa.train_path"),
        ({"train_path": "x.json"}, "env.qa.train_path is for benchmark sources"),
        ({"source": "hotpotqa", "train_path": "/none.json", "test_path": "/none.json"}, "no file"),
        ({"source": "nq"}, "unknown QA source 'nq'"),
        ({"format": "react"}, "format"),
    ],
)
def test_settings_that_cannot_run_say_what_to_fix(settings, message):
    with pytest.raises(ValidationError, match=message):
        QASettings(**settings)


def test_bamboogle_needs_a_corpus_file():
    bamboogle = str(DATA / "bamboogle_sample.json")
    with pytest.raises(ValidationError, match="set env.qa.corpus_path"):
        QASettings(source="bamboogle", train_path=bamboogle, test_path=bamboogle)


# ---- the solver ------------------------------------------------------------------------------


def played(env: QAEnv, task_id: str):
    prefix = [Message(role="system", content=env.system_prompt)]
    return expert_trajectory(env, task_id, prefix)


def sample_per_template(task_ids: list[str], per_template: int = 2) -> list[str]:
    seen: dict[str, int] = {}
    sample = []
    for task_id in task_ids:
        template = task_id.split("/")[0]
        if seen.get(template, 0) < per_template:
            seen[template] = seen.get(template, 0) + 1
            sample.append(task_id)
    return sample


def test_the_solver_answers_generated_test_questions_searching_and_computing():
    env = make_env(EnvSettings(name="qa"))
    tasks = sample_per_template(env.task_ids("test"))
    assert len({t.split("/")[0] for t in tasks}) == 7  # every question template
    for task_id in tasks:
        trajectory = played(env, task_id)
        assert trajectory.success and trajectory.reward == pytest.approx(1.1), task_id
        record = env.questions("test")[task_id]
        documents = {d.id: d.text for d in env.data("test").corpus}
        observations = [m for m in trajectory.continuation if m.role == "user"]
        results = [m.content for m in observations]
        # every supporting document was found by a search, and python computed the answer
        for document_id in record.supporting_ids:
            assert any(documents[document_id] in r for r in results), (task_id, document_id)
        if record.type == "arithmetic":
            assert results[-1] == f"<result>\n{record.answer}\n</result>"
        turns = [m for m in trajectory.continuation if m.role == "assistant"]
        assert turns[-1].content.endswith(f"<answer>{record.answer}</answer>")
        assert all(m.loss for m in turns) and not any(m.loss for m in observations)


def test_the_solver_writes_json_tool_calls_in_the_json_format():
    env = make_env(EnvSettings(name="qa", qa=QASettings(format="json")))
    task_id = next(t for t in env.task_ids("test") if t.startswith("founder_age/"))
    trajectory = played(env, task_id)
    assert trajectory.success
    python_turn = trajectory.continuation[-3]  # search, search, python, answer
    assert python_turn.content.startswith("I have the numbers")
    assert '<tool_call>\n{"name": "python", "arguments": {"code": ' in python_turn.content
    assert trajectory.continuation[-2].content.startswith("<tool_response>\n")


def test_the_solver_answers_a_benchmark_by_its_supporting_titles():
    path = str(DATA / "hotpotqa_sample.json")
    env = make_env(
        EnvSettings(name="qa", qa=QASettings(source="hotpotqa", train_path=path, test_path=path))
    )
    env.check()
    for task_id in env.task_ids("test"):
        assert played(env, task_id).success, task_id


def test_the_solver_gives_no_plan_that_breaks_the_tool_budget():
    env = make_env(EnvSettings(name="qa", qa=QASettings(max_tool_calls=2)))
    four_searches = next(t for t in env.task_ids("test") if t.startswith("founder_born_first/"))
    assert env.expert_plan(four_searches) is None


def test_turns_follow_the_environments_format():
    assert isinstance(turns_for(hand_env()), ToolTurns)
    turn = turns_for(hand_env()).written_turn("Look it up.", search("Elbonia"))
    assert turn.content == "Look it up.\n<search>Elbonia</search>" and turn.loss


def test_solved_is_the_exact_match_and_the_episode_reports_its_metrics():
    episode = hand_env(answer_metric="f1").start("q1")
    assert episode.solved() is False and episode.metrics()["answered"] == 0.0
    episode.step("no call at all")  # a format violation: the reward loses its format term
    episode.step(search("Elbonia"))
    episode.step(call_action("python", {"code": "1/0"}))  # runs, and fails
    episode.step(answer("the Mudville"))  # "the" is dropped by the normalisation
    assert episode.solved() is True
    assert episode.metrics() == {
        "answered": 1.0, "exact_match": 1.0, "f1": 1.0, "format_valid": 0.0,
        "tool_calls": 2.0, "failed_tool_calls": 1.0,
    }  # fmt: skip
    partly = hand_env().start("q1")
    partly.step(answer("Mudville town"))  # F1 2/3, no exact match: not solved
    assert partly.solved() is False
    assert partly.metrics()["f1"] == pytest.approx(2 / 3)
    assert partly.metrics()["format_valid"] == 1.0
