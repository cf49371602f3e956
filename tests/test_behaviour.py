"""The radar metrics on hand-made episode summaries, and summaries read from trajectories of the
QA environment (written by hand in both tool formats, and played by its expert)."""

from __future__ import annotations

import pytest

from agents.behaviour import (
    BehaviourMetrics,
    EpisodeSummary,
    behaviour_metrics,
    conciseness,
    correctness,
    efficiency,
    episode_summary,
    reasoning_length,
    successful_execution,
    unwrap_result,
)
from agents.formats import make_format
from agents.rollout import agent_prefix, expert_trajectory
from envs import make_env
from flywheel.records import Message, Trajectory
from flywheel.settings import EnvSettings


def summary(correct, calls=0, errors=0, votes=None, tokens=0, results=None):
    return EpisodeSummary(
        correct=correct,
        tool_calls=calls,
        tool_errors=errors,
        redundancy_votes=votes,
        reasoning_tokens=tokens,
        tool_results=results,
    )


# Four episodes of one policy:
#   correct  calls  errors  votes (True: a redundant call)   tokens
#   1        2      0       [F, F, T]  -> concise (2 of 3)  100
#   0        4      2       [T, T, F]  -> not concise       300
#   1        0      0       None       -> not judged        50
#   0.5      2      1       [F, T]     -> a tie: not concise 150
EPISODES = [
    summary(1.0, 2, 0, [False, False, True], 100),
    summary(0.0, 4, 2, [True, True, False], 300),
    summary(1.0, 0, 0, None, 50),
    summary(0.5, 2, 1, [False, True], 150),
]


def test_correctness_is_the_mean():
    assert correctness(EPISODES) == 2.5 / 4


def test_efficiency_is_total_correctness_per_tool_call():
    # (1 + 0 + 1 + 0.5) / (2 + 4 + 0 + 2) = 2.5 / 8; not the mean of per-episode ratios
    assert efficiency(EPISODES) == 2.5 / 8


def test_efficiency_without_any_tool_call_is_undefined():
    assert efficiency([summary(1.0), summary(0.0)]) is None
    assert efficiency([summary(0.0, 3)]) == 0.0


def test_conciseness_is_the_share_of_judged_episodes_with_a_clean_majority():
    # judged: episodes 1, 2, 4; concise: episode 1 only (episode 4 is a 1-1 tie)
    assert conciseness(EPISODES) == 1 / 3
    assert EPISODES[0].concise is True and EPISODES[3].concise is False
    assert EPISODES[2].concise is None
    assert summary(1.0, 1, votes=[]).concise is None  # no votes: not judged
    assert conciseness([summary(1.0), summary(0.0)]) is None
    assert conciseness([summary(1.0, 1, votes=[False])]) == 1.0


def test_successful_execution_is_the_share_of_results_without_error():
    # results 2 + 4 + 0 + 2 = 8, errors 3: 5 / 8
    assert successful_execution(EPISODES) == 5 / 8
    assert successful_execution([summary(1.0)]) is None
    # a call without a recorded result (the episode ended on it) is no result
    assert successful_execution([summary(1.0, 3, 1, results=2)]) == 1 / 2


def test_reasoning_length_is_the_mean_tokens():
    assert reasoning_length(EPISODES) == (100 + 300 + 50 + 150) / 4


def test_behaviour_metrics_gathers_the_five_axes():
    metrics = behaviour_metrics(EPISODES)
    assert metrics == BehaviourMetrics(
        episodes=4,
        correctness=0.625,
        efficiency=0.3125,
        conciseness=1 / 3,
        successful_execution=0.625,
        reasoning_length=150.0,
        tool_calls=8,
        tool_results=8,
        tool_errors=3,
        judged_episodes=3,
    )
    bare = behaviour_metrics([summary(1.0, tokens=7)])
    assert bare.efficiency is None and bare.conciseness is None
    assert len(bare.notes) == 2
    with pytest.raises(ValueError):
        behaviour_metrics([])


def test_summaries_refuse_counts_that_do_not_fit():
    with pytest.raises(ValueError):
        summary(1.0, calls=1, errors=2)
    with pytest.raises(ValueError):
        summary(1.0, calls=1, results=2)
    with pytest.raises(ValueError):
        summary(1.5)
    assert summary(True, 1).correct == 1.0


# ---- from trajectories ----------------------------------------------------------------------------


def user(text):
    return Message(role="user", content=text)


def agent(text, ids=None):
    return Message(role="assistant", content=text, token_ids=ids)


def tagged(result):
    return user(f"<result>\n{result}\n</result>")


def test_a_tag_format_trajectory():
    messages = [
        Message(role="system", content="tools: search, python <search> <python> <answer>"),
        agent("<search>an example the summary must not count</search>", [9] * 50),
        tagged("Error: in the worked example"),
        user("Question: how old was the founder?"),  # episode_start = 3
        agent("First the founder. <search>founder</search>", [1, 2, 3, 4]),  # 4 tokens
        tagged("Ada founded it in 1901. Its manual: Error: see page 2."),  # no error
        agent("<python>1/0</python>", [5, 6]),  # 2 tokens
        tagged("Error: ZeroDivisionError: division by zero"),
        agent("I think it is 7."),  # no ids: 5 words; no call (malformed)
        user("No call in this reply. Call one tool (<search>...</search>, ...) of: answer."),
        agent("<search>again</search>", [7]),  # refused: no calls left
        tagged("Error: no tool calls left (at most 2 per question). Give your answer now."),
        agent("<answer>42</answer>", [8, 9]),
    ]
    trajectory = Trajectory(task_id="q", env="qa", messages=messages, episode_start=3, success=True)
    got = episode_summary(trajectory, make_format("tags"), redundancy_votes=[True])
    assert got == EpisodeSummary(
        correct=1.0,
        tool_calls=3,
        tool_results=3,
        tool_errors=2,
        redundancy_votes=[True],
        reasoning_tokens=4 + 2 + 5 + 1 + 2,
    )
    # a graded correctness overrides the trajectory's success; tokens by another counter
    graded = episode_summary(trajectory, make_format("tags"), correct=0.6, count_tokens=len)
    assert graded.correct == 0.6
    assert graded.reasoning_tokens == 4 + 2 + len("I think it is 7.") + 1 + 2


def test_a_json_format_trajectory_that_ended_on_a_call():
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "%s"}}\n</tool_call>'
    messages = [
        Message(role="system", content="tools"),
        user("Question: where?"),
        agent(call % "a", [1, 2]),
        user("<tool_response>\nError: the search timed out\n</tool_response>"),
        agent(call % "b", [3, 4]),
        user("<tool_response>\nParis is in France.\n</tool_response>"),
        agent(call % "c", [5]),  # max_steps: no result recorded
    ]
    trajectory = Trajectory(task_id="q", env="qa", messages=messages, episode_start=1)
    got = episode_summary(trajectory, make_format("json", {"search": "query"}))
    assert (got.correct, got.tool_calls, got.tool_results, got.tool_errors) == (0.0, 3, 2, 1)
    assert got.reasoning_tokens == 5
    # the tag format reads no calls in these replies
    assert episode_summary(trajectory, make_format("tags")).tool_calls == 0


def test_unwrap_result():
    tags, json_format = make_format("tags"), make_format("json")
    assert unwrap_result(tags, "<result>\nError: x\n</result>") == "Error: x"
    assert unwrap_result(tags, "<result>\n\n</result>") == ""
    assert unwrap_result(tags, "No call in this reply.") is None
    assert unwrap_result(json_format, "<tool_response>\nok\n</tool_response>") == "ok"
    assert unwrap_result(json_format, "<result>\nok\n</result>") is None


@pytest.fixture(scope="module")
def env():
    return make_env(EnvSettings(name="qa"))


def test_an_expert_episode_of_the_qa_environment(env):
    task = next(t for t in env.task_ids("test") if t.startswith("founder_age/"))
    calls = [a for _, a in env.expert_plan(task)][:-1]  # every step but the answer
    trajectory = expert_trajectory(env, task, agent_prefix(env, []))
    assert trajectory is not None and trajectory.success
    agent_format = make_format(env.agent_format, env.tool_arguments)
    got = episode_summary(trajectory, agent_format)
    assert got.correct == 1.0
    assert got.tool_calls == got.tool_results == len(calls) == 3  # search, search, python
    assert got.tool_errors == 0
    written = [m for m in trajectory.continuation if m.role == "assistant"]
    assert got.reasoning_tokens == sum(len(m.content.split()) for m in written)
    metrics = behaviour_metrics([got])
    assert metrics.efficiency == 1 / 3 and metrics.successful_execution == 1.0
