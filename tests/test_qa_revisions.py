"""Agent-R's expert revisions on the generated QA world (configs/agent_r_qa.yaml's settings: two
results a search, four tool calls): the oracle's flags and the solver's continuation on paths
worked out by hand, and the revision rows they give, played for real.

The questions: FOUNDER_AGE searches Courhax Foods (its result shows the company, and Meirdark
Foods), then Gall Follleis (the founder, and the company again), computes 1991 - 1969 in python and
answers 22; BIRTH_TOWN searches the same two and answers Wastdale; BORN_FIRST needs four searches.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents.turns import turns_for
from envs import make_env
from envs.qa_env import QAEnv
from envs.textcraft import TextCraftEnv
from envs.tools import call_action, malformed_action
from flows.agent_r import AgentRConfig
from flywheel.config_files import load_config
from flywheel.records import Message, Trajectory
from flywheel.settings import QASettings
from tasks.expert_revisions import build_rows
from tasks.splice import REVISION_THOUGHTS

ROOT = Path(__file__).resolve().parents[1]
PREFIX = [Message(role="system", content="S")]
FOUNDER_AGE = "founder_age/company-016"
BIRTH_TOWN = "founder_birth_town/company-016"
BORN_FIRST = "founder_born_first/company-033+company-057"


def search(query: str) -> str:
    return call_action("search", {"query": query})


def answer(text: str) -> str:
    return call_action("answer", {"text": text})


COMPANY, FOUNDER, ASIDE = search("Courhax Foods"), search("Gall Follleis"), search("weather report")
ARITHMETIC = call_action(
    "python", {"code": "founded = 1991  # Courhax Foods\nborn = 1969  # Gall Follleis\n"
                       "print(founded - born)"}
)  # fmt: skip
NOOP = search("nothing")


@pytest.fixture(scope="module")
def env() -> QAEnv:
    return make_env(load_config(AgentRConfig, str(ROOT / "configs/agent_r_qa.yaml")).env)


def test_the_configs_world_is_the_one_worked_out_here(env):
    assert (env.settings.search_k, env.settings.max_tool_calls, env.noop_action) == (2, 4, NOOP)
    assert [a for _, a in env.expert_plan(FOUNDER_AGE)] == [
        COMPANY, FOUNDER, ARITHMETIC, answer("22"),
    ]  # fmt: skip
    assert [a for _, a in env.expert_plan(BIRTH_TOWN)] == [COMPANY, FOUNDER, answer("Wastdale")]
    assert len(env.expert_plan(BORN_FIRST)) == 5


def test_the_oracle_passes_the_solvers_own_path(env):
    for task in (FOUNDER_AGE, BIRTH_TOWN, BORN_FIRST):
        plan = [action for _, action in env.expert_plan(task)]
        assert env.mistakes(task, plan) == [False] * len(plan)


def test_the_oracle_flags_a_wrong_answer_as_the_episode_scores_it(env):
    assert env.mistakes(FOUNDER_AGE, [COMPANY, answer("1991")]) == [False, True]
    # Exact match after normalisation, as `QAEpisode.solved`: case does not matter.
    assert env.mistakes(BIRTH_TOWN, [COMPANY, FOUNDER, answer("wastdale")]) == [False] * 3
    # Nothing after the answer counts: the episode is over.
    assert env.mistakes(BIRTH_TOWN, [answer("Wastdale"), COMPANY]) == [False, True]


def test_a_search_is_a_mistake_unless_it_returns_a_supporting_document_not_yet_found(env):
    assert env.mistakes(FOUNDER_AGE, [COMPANY, COMPANY, FOUNDER]) == [False, True, False]
    assert env.mistakes(FOUNDER_AGE, [ASIDE, COMPANY]) == [True, False]
    # The founder's result shows the company too: searching the company after it finds nothing.
    assert env.mistakes(FOUNDER_AGE, [FOUNDER, COMPANY]) == [False, True]


def test_python_is_a_mistake_before_every_supporting_document_or_where_the_solver_needs_none(env):
    path = [COMPANY, ARITHMETIC, FOUNDER, ARITHMETIC, answer("22")]
    assert env.mistakes(FOUNDER_AGE, path) == [False, True, False, False, False]
    assert env.mistakes(BIRTH_TOWN, [COMPANY, FOUNDER, ARITHMETIC]) == [False, False, True]


def test_a_call_past_the_budget_is_refused_so_a_mistake(env):
    path = [ASIDE, ASIDE, ASIDE, ASIDE, COMPANY, answer("22")]
    assert env.mistakes(FOUNDER_AGE, path) == [True] * 5 + [False]


def test_replies_without_a_call_or_with_an_unknown_tool_or_bad_arguments_are_mistakes(env):
    path = [
        None, malformed_action("No call."), call_action("calculator", {"expression": "1+1"}),
        call_action("search", {"q": "Courhax Foods"}), COMPANY,
    ]  # fmt: skip
    assert env.mistakes(FOUNDER_AGE, path) == [True, True, True, True, False]


def test_no_oracle_and_no_continuation_where_the_solver_cannot_answer():
    env = QAEnv(QASettings(tools=["python"]))  # no search: the solver has no plan
    assert env.expert_plan(FOUNDER_AGE) is None
    assert env.mistakes(FOUNDER_AGE, [ARITHMETIC]) is None
    assert env.expert_continuation(FOUNDER_AGE, [NOOP]) == []


def continuation(env, task: str, path: list[str]) -> list[str]:
    return [action for _, action in env.expert_continuation(task, path)]


def test_the_continuation_redoes_the_lookups_the_path_has_not_made_then_answers(env):
    assert continuation(env, FOUNDER_AGE, [NOOP]) == [COMPANY, FOUNDER, ARITHMETIC, answer("22")]
    assert continuation(env, FOUNDER_AGE, [COMPANY, NOOP]) == [FOUNDER, ARITHMETIC, answer("22")]
    assert continuation(env, FOUNDER_AGE, [FOUNDER, NOOP]) == [ARITHMETIC, answer("22")]
    # Both found, and python already run: python again, for its numbers in the row.
    path = [COMPANY, FOUNDER, ARITHMETIC]
    assert continuation(env, FOUNDER_AGE, path) == [ARITHMETIC, answer("22")]


def test_no_continuation_once_answered_or_past_the_tool_call_budget(env):
    assert continuation(env, FOUNDER_AGE, [COMPANY, answer("1991")]) == []
    # Three calls, the no-op and the founder's search: five of four.
    assert continuation(env, FOUNDER_AGE, [COMPANY, ASIDE, ASIDE, NOOP]) == []
    # Four calls and the answer alone: it fits; a fifth call, refused, does not.
    assert continuation(env, BIRTH_TOWN, [COMPANY, FOUNDER, ASIDE, NOOP]) == [answer("Wastdale")]
    assert continuation(env, BIRTH_TOWN, [COMPANY, FOUNDER, ASIDE, ASIDE, NOOP]) == []


def test_textcraft_has_no_continuation_of_its_own():
    assert TextCraftEnv().expert_continuation("acacia_pressure_plate", ["inventory"]) is None


def played(env, task: str, replies: list[str], finish: str | None = None) -> Trajectory:
    """The policy's episode replying `replies` (tags), recorded as the rollout records it:
    agent turns with loss, each answered as the format answers it, the last unanswered."""
    turns, episode = turns_for(env), env.start(task)
    messages = [*PREFIX, Message(role="user", content=episode.instruction)]
    reward, done = 0.0, False
    for text in replies:
        reply = turns.read(text)
        messages.append(Message(role="assistant", content=text, loss=True))
        result = episode.step(reply.action)
        reward, done = reward + result.reward, result.done
        messages.append(turns.observation(result.observation, reply.malformed))
    return Trajectory(
        task_id=task, env=env.name, messages=messages[:-1], episode_start=len(PREFIX),
        reward=reward, success=done and episode.solved(), n_steps=len(replies),
        finish_reason=finish or ("done" if done else "max_steps"),
    )  # fmt: skip


COMPANY_RESULT = (
    "<result>\n[1] Courhax Foods is a food company with its headquarters in Brouston. It was "
    "founded in 1991 by Gall Follleis.\n[2] Meirdark Foods is a food company with its "
    "headquarters in Wastdale. It was founded in 1915 by Dar Sarkvus.\n</result>"
)
FOUNDER_RESULT = (
    "<result>\n[1] Gall Follleis was born in 1969 in Wastdale. Gall worked as an engineer and "
    "later lived in Caexholm.\n[2] Courhax Foods is a food company with its headquarters in "
    "Brouston. It was founded in 1991 by Gall Follleis.\n</result>"
)


def test_a_wrong_answer_after_one_lookup_is_revised_after_the_lookup_by_the_missing_ones(env):
    failed = played(env, FOUNDER_AGE, ["<search>Courhax Foods</search>", "<answer>1991</answer>"])
    (row,), skipped, error_steps = build_rows(env, [failed], PREFIX, seed=0)
    assert not skipped and error_steps == [2]  # the answer: the prefix stops before it
    thought = random.Random(0).choice(REVISION_THOUGHTS)
    assert row.messages == [
        *PREFIX,
        Message(role="user", content="Question: How many years after the birth of its founder "
                                     "was Courhax Foods founded?"),
        Message(role="assistant", content="<search>Courhax Foods</search>"),  # no loss
        Message(role="user", content=COMPANY_RESULT),
        Message(role="assistant", content=f"{thought}\n<search>nothing</search>", loss=True),
        Message(role="user", content="<result>\nNo document matches the query.\n</result>"),
        Message(role="assistant", loss=True,
                content="I need the document about Gall Follleis.\n<search>Gall Follleis</search>"),
        Message(role="user", content=FOUNDER_RESULT),
        Message(role="assistant", loss=True,
                content="I have the numbers; let python do the arithmetic.\n<python>founded = "
                        "1991  # Courhax Foods\nborn = 1969  # Gall Follleis\nprint(founded - "
                        "born)</python>"),
        Message(role="user", content="<result>\n22\n</result>"),
        Message(role="assistant", loss=True,
                content="The results give the answer.\n<answer>22</answer>"),
    ]  # fmt: skip
    assert (row.success, row.reward, row.n_steps) == (True, pytest.approx(1.1), 5)
    assert (row.source, row.finish_reason, row.episode_start) == ("expert-revision", "done", 1)


WRONG = "<answer>1991</answer>"
TAG = {COMPANY: "<search>Courhax Foods</search>", FOUNDER: "<search>Gall Follleis</search>",
       ASIDE: "<search>weather report</search>"}  # fmt: skip


@pytest.mark.parametrize(
    "task, path, error_step, row_path",
    [
        # the founder's result holds the company too: a second search after it is the error
        (FOUNDER_AGE, [FOUNDER, COMPANY, WRONG], 2,
         [FOUNDER, COMPANY, NOOP, ARITHMETIC, answer("22")]),
        (BIRTH_TOWN, [COMPANY, COMPANY, FOUNDER, WRONG], 2,
         [COMPANY, COMPANY, NOOP, FOUNDER, answer("Wastdale")]),
        (BIRTH_TOWN, [COMPANY, "I am not sure.", WRONG], 2,
         [COMPANY, malformed_action("?"), NOOP, FOUNDER, answer("Wastdale")]),
        (BIRTH_TOWN, [COMPANY, FOUNDER, ASIDE, WRONG], 3,  # the fourth call: the no-op
         [COMPANY, FOUNDER, ASIDE, NOOP, answer("Wastdale")]),
        (BIRTH_TOWN, [COMPANY, FOUNDER, WRONG], 3, [COMPANY, FOUNDER, NOOP, answer("Wastdale")]),
    ],
)  # fmt: skip
def test_a_row_replays_the_prefix_then_the_needed_lookups_and_solves(
    env, task, path, error_step, row_path
):
    replies = [TAG.get(step, step) for step in path]
    (row,), _, error_steps = build_rows(env, [played(env, task, replies)], PREFIX, seed=0)
    turns, episode = turns_for(env), env.start(task)
    taken = [turns.read(m.content) for m in row.continuation[::2]]
    assert error_steps == [error_step]
    assert [r.action if not r.malformed else malformed_action("?") for r in taken] == row_path
    for i, reply in enumerate(taken):  # every observation is the environment's own
        result = episode.step(reply.action)
        if 2 * i + 1 < len(row.continuation):
            expected = turns.observation(result.observation, reply.malformed)
            assert row.continuation[2 * i + 1] == expected
    assert result.done and episode.solved() and row.success


def test_failed_episodes_without_a_row_are_counted_by_reason(env):
    episodes = [
        played(env, FOUNDER_AGE, [WRONG]),  # the first turn ended it: nothing to revise
        # three calls, the no-op, the founder's search and python: six of four
        played(env, FOUNDER_AGE, [TAG[COMPANY], TAG[ASIDE], TAG[ASIDE], WRONG]),
        played(env, BORN_FIRST, ["<search>Brindcex Instruments</search>", WRONG]),  # 1 + 1 + 3
        played(env, FOUNDER_AGE, [TAG[COMPANY], TAG[FOUNDER]]),  # ran out of steps, no error
        played(env, BIRTH_TOWN, [TAG[COMPANY], TAG[FOUNDER], "<answer>Wastdale</answer>"]),
    ]
    assert [t.success for t in episodes] == [False] * 4 + [True]
    rows, skipped, _ = build_rows(env, episodes, PREFIX, seed=0)
    assert rows == [] and skipped == {"no_continuation": 3, "no_first_error": 1}
