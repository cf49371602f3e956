"""ET-Agent's behaviour metrics of an evaluated policy (the five axes of its radar), from
summaries of its episodes. Pure: numbers in, numbers out; plotting and logging live above.

An `EpisodeSummary` says what one episode did: whether it was right, how many tools it called,
how many of their results were errors, what judges said about redundant calls, and how many
tokens it reasoned. `episode_summary` reads one from a `Trajectory` of a tool environment
(`envs.qa_env`). `behaviour_metrics` averages summaries into `BehaviourMetrics`:

- correctness: the mean correctness of the episodes.
- efficiency: correctness per tool call, total correctness / total tool calls over all episodes
  (so a policy that answers 60% of the questions with 1.2 calls each on average has 0.5). With
  no tool call at all it is undefined: None, not infinity, and the plot decides how to show it.
- conciseness: the share of judged episodes where most judge votes say the episode made no
  redundant tool call (a vote is True when the judge found a redundant call). A tie is no
  majority: such an episode is not concise. Episodes without votes are left out of the share;
  with none judged it is None.
- successful execution: the share of tool results that were not errors (results starting with
  "Error:", as `envs.tools` writes them), over all results; None with no result at all.
- reasoning length: the mean number of tokens an episode's agent turns hold (what the model
  wrote; tool results, observations and the prompt are not counted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import BaseModel, Field, model_validator

from agents.formats import AgentFormat, ToolCall
from envs.tools import ERROR
from flywheel.records import Trajectory

RESULT_MARK = "\0result\0"  # stands in for a tool result to find how a format wraps one


class EpisodeSummary(BaseModel):
    """What one episode did, as the behaviour metrics read it."""

    correct: float  # 0..1 (a bool is 0 or 1)
    tool_calls: int = 0
    tool_results: int | None = None  # results the episode saw; None: one per call
    tool_errors: int = 0  # results starting with "Error:"
    # One vote per judge (or judging sample): True when it found a redundant tool call. None:
    # not judged.
    redundancy_votes: list[bool] | None = None
    reasoning_tokens: int = 0

    @model_validator(mode="after")
    def _counts_fit(self) -> EpisodeSummary:
        if not 0.0 <= self.correct <= 1.0:
            raise ValueError(f"correctness {self.correct} outside [0, 1]")
        if min(self.tool_calls, self.tool_errors, self.reasoning_tokens) < 0:
            raise ValueError("a negative count")
        if not self.tool_errors <= self.results <= self.tool_calls:
            raise ValueError(
                f"{self.tool_errors} errors, {self.results} results, {self.tool_calls} calls: "
                "errors <= results <= calls"
            )
        return self

    @property
    def results(self) -> int:
        return self.tool_calls if self.tool_results is None else self.tool_results

    @property
    def concise(self) -> bool | None:
        """Whether most votes say no redundant call; None when not judged."""
        if not self.redundancy_votes:
            return None
        clean = sum(not vote for vote in self.redundancy_votes)
        return clean > len(self.redundancy_votes) / 2


class BehaviourMetrics(BaseModel):
    """The radar of one evaluated policy, and the counts behind it."""

    episodes: int
    correctness: float
    efficiency: float | None  # correctness per tool call
    conciseness: float | None
    successful_execution: float | None
    reasoning_length: float  # mean tokens per episode
    tool_calls: int = 0
    tool_results: int = 0
    tool_errors: int = 0
    judged_episodes: int = 0
    notes: list[str] = Field(default_factory=list)


def correctness(episodes: Sequence[EpisodeSummary]) -> float:
    return sum(e.correct for e in episodes) / len(episodes)


def efficiency(episodes: Sequence[EpisodeSummary]) -> float | None:
    """Total correctness / total tool calls; None when no episode called a tool."""
    calls = sum(e.tool_calls for e in episodes)
    return sum(e.correct for e in episodes) / calls if calls else None


def conciseness(episodes: Sequence[EpisodeSummary]) -> float | None:
    """The share of judged episodes whose majority of votes found no redundant call."""
    verdicts = [e.concise for e in episodes if e.concise is not None]
    return sum(verdicts) / len(verdicts) if verdicts else None


def successful_execution(episodes: Sequence[EpisodeSummary]) -> float | None:
    """The share of tool results without error; None with no result."""
    results = sum(e.results for e in episodes)
    errors = sum(e.tool_errors for e in episodes)
    return (results - errors) / results if results else None


def reasoning_length(episodes: Sequence[EpisodeSummary]) -> float:
    return sum(e.reasoning_tokens for e in episodes) / len(episodes)


def behaviour_metrics(episodes: Sequence[EpisodeSummary]) -> BehaviourMetrics:
    """The five radar metrics over a policy's evaluated episodes."""
    if not episodes:
        raise ValueError("no episodes to measure")
    judged = sum(e.concise is not None for e in episodes)
    notes = []
    if not any(e.tool_calls for e in episodes):
        notes.append("no tool call in any episode: efficiency and execution are undefined")
    if not judged:
        notes.append("no episode was judged: conciseness is undefined")
    return BehaviourMetrics(
        episodes=len(episodes),
        correctness=correctness(episodes),
        efficiency=efficiency(episodes),
        conciseness=conciseness(episodes),
        successful_execution=successful_execution(episodes),
        reasoning_length=reasoning_length(episodes),
        tool_calls=sum(e.tool_calls for e in episodes),
        tool_results=sum(e.results for e in episodes),
        tool_errors=sum(e.tool_errors for e in episodes),
        judged_episodes=judged,
        notes=notes,
    )


# ---- from a trajectory ----------------------------------------------------------------------------


def words(text: str) -> int:
    return len(text.split())


def unwrap_result(agent_format: AgentFormat, content: str) -> str | None:
    """The tool result inside a result message of `agent_format` (``<result>...</result>``,
    ``<tool_response>...``), or None when `content` is not wrapped as one."""
    prefix, _, suffix = agent_format.result_message(RESULT_MARK).content.partition(RESULT_MARK)
    if len(content) < len(prefix) + len(suffix):
        return None
    if not (content.startswith(prefix) and content.endswith(suffix)):
        return None
    return content[len(prefix) : len(content) - len(suffix)]


def episode_summary(
    trajectory: Trajectory,
    agent_format: AgentFormat,
    correct: float | None = None,
    redundancy_votes: list[bool] | None = None,
    count_tokens: Callable[[str], int] = words,
) -> EpisodeSummary:
    """What an episode of a tool environment did, read from its messages.

    A tool call is an agent turn `agent_format` reads as a call of a tool (not the answer,
    not an unparseable reply); its result is the message after it, unwrapped. A call refused by
    the environment (an unknown tool, no calls left) counts as a call whose result is an error:
    the agent did try it; so does a call followed by anything but a result message. A call the
    episode ended on (at `max_steps`) has no result recorded and counts as a call only. Reasoning tokens: each agent turn's `token_ids` where it has them (what
    the model generated), else `count_tokens` of its text (words by default).

    `correct` defaults to the trajectory's success; pass a graded value (token F1, a judge's
    verdict) to use that instead."""
    episode = trajectory.continuation
    calls = results = errors = tokens = 0
    for position, message in enumerate(episode):
        if message.role != "assistant":
            continue
        ids = message.token_ids
        tokens += len(ids) if ids is not None else count_tokens(message.content)
        if not isinstance(agent_format.parse(message.content), ToolCall):
            continue
        calls += 1
        following = episode[position + 1] if position + 1 < len(episode) else None
        if following is None or following.role != "user":
            continue
        result = unwrap_result(agent_format, following.content)
        results += 1
        if result is None or result.startswith(ERROR):
            errors += 1
    return EpisodeSummary(
        correct=float(trajectory.success) if correct is None else correct,
        tool_calls=calls,
        tool_results=results,
        tool_errors=errors,
        redundancy_votes=redundancy_votes,
        reasoning_tokens=tokens,
    )
