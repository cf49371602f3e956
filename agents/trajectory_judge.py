"""ET-Agent's trajectory judge: which step of a tool-using trajectory is redundant, which is its
first flaw. It reads the whole trajectory at once and names one step by its number; Agent-R's
critique (`tasks/critique.py`) is the other kind, a step verifier: it judges each step in turn
(Good, Bad or Uncertain) and the first Bad one ends the bad prefix.

A `TrajectoryJudge` asks a model (the policy itself, a local model, or a served one: any
`flywheel.inference` backend), batched over trajectories, for a step number. The trajectory is
shown as numbered steps (the agent's turn and the tool's result); the reply is read for its last
"Step: <n>" ("Step: none" where nothing is redundant). Where the model gives no usable number, or
the call fails or outlasts its timeout, the rules decide (`rule_redundant_step`,
`rule_first_flaw`) and the `Verdict` says so (`source` "rules", with the reply or the error kept):
a small model rarely answers in the format, and a flywheel round must not stop for it.

Rules, from the steps alone:
- redundant: the first tool call identical (tool and arguments) to an earlier one, else the first
  call whose result was an error; else none.
- first flaw: the first failed step (a call whose result was an error, or a reply that could not
  be read as a call), else the first repeated call, else the final answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from agents.behaviour import unwrap_result
from agents.formats import AgentFormat, FinalAnswer, ParseError, ToolCall
from envs.tools import ERROR
from flywheel.chat import ChatTokenizer
from flywheel.inference import InferenceBackend, SamplingSettings
from flywheel.records import Message, Trajectory

Question = Literal["redundant", "flaw"]
MAX_RESULT_CHARS = 400  # of a tool result shown to the judge

JUDGE_SYSTEM = "You review how an agent used tools to answer a question, one numbered step each."
ASK = {
    "redundant": (
        "Which step is redundant: a tool call that repeats an earlier one or does not help "
        "answer the question? Reply with 'Step: <number>' (or 'Step: none') and then "
        "'Reason: <one sentence>'."
    ),
    "flaw": (
        "The final answer is wrong. Which step is the first flawed one (a bad search, a wrong "
        "computation, a wrong conclusion)? Reply with 'Step: <number>' and then "
        "'Reason: <one sentence>'."
    ),
}
# The last labelled step number ("Step: 3", "**Step:** 3") before the reason: a judge that
# reasons first names other steps on the way ("Step 1 is fine"), and its reason may name the
# step the redundant one repeats ("Reason: it repeats step 1").
_STEP = re.compile(r"\bstep\s*(?:number\s*)?[:#]\s*\**\s*(\d+|none)\b", re.IGNORECASE)
_REASON = re.compile(r"\breason\s*:\s*(.+)", re.IGNORECASE | re.S)


class Verdict(BaseModel):
    """What the judge found: the step (its 0-based position among the episode's agent turns;
    None: no such step), why, and whether the judge model or the rules decided."""

    step: int | None
    reason: str
    source: Literal["judge", "rules"]
    raw: str = ""  # the judge model's reply, when it gave one
    error: str | None = None  # why the judge model gave none (a failure, a timeout)


@dataclass(frozen=True)
class Step:
    """One agent turn of an episode and what answered it."""

    text: str
    move: ToolCall | FinalAnswer | ParseError
    result: str | None  # the tool's result, unwrapped; None where no result followed

    @property
    def failed(self) -> bool:
        """A reply that was no call, or a call whose result was an error (or was refused)."""
        if isinstance(self.move, ParseError):
            return True
        return isinstance(self.move, ToolCall) and (
            self.result is None or self.result.startswith(ERROR)
        )

    @property
    def call(self) -> tuple[str, str] | None:
        """The call as compared for repeats: tool and arguments."""
        if not isinstance(self.move, ToolCall):
            return None
        return self.move.name, repr(sorted(self.move.arguments.items()))


def episode_steps(trajectory: Trajectory, agent_format: AgentFormat) -> list[Step]:
    episode = trajectory.continuation
    steps = []
    for position, message in enumerate(episode):
        if message.role != "assistant":
            continue
        following = episode[position + 1] if position + 1 < len(episode) else None
        result = None
        if following is not None and following.role == "user":
            unwrapped = unwrap_result(agent_format, following.content)
            result = following.content if unwrapped is None else unwrapped
        steps.append(Step(message.content, agent_format.parse(message.content), result))
    return steps


def first_repeat(steps: list[Step]) -> int | None:
    seen = set()
    for index, step in enumerate(steps):
        if step.call is None:
            continue
        if step.call in seen:
            return index
        seen.add(step.call)
    return None


def rule_redundant_step(steps: list[Step], error: str | None = None, raw: str = "") -> Verdict:
    repeat = first_repeat(steps)
    if repeat is not None:
        return Verdict(step=repeat, reason="it repeats an earlier call", source="rules",
                       raw=raw, error=error)  # fmt: skip
    failed = next((i for i, s in enumerate(steps) if s.call and s.failed), None)
    if failed is not None:
        return Verdict(step=failed, reason="its result was an error", source="rules",
                       raw=raw, error=error)  # fmt: skip
    return Verdict(step=None, reason="no repeated or failed call", source="rules", raw=raw,
                   error=error)  # fmt: skip


def rule_first_flaw(steps: list[Step], error: str | None = None, raw: str = "") -> Verdict:
    failed = next((i for i, s in enumerate(steps) if s.failed), None)
    if failed is not None:
        step, reason = failed, "the step failed (an error, or no call could be read)"
    elif (repeat := first_repeat(steps)) is not None:
        step, reason = repeat, "it repeats an earlier call instead of trying something new"
    else:
        answers = [i for i, s in enumerate(steps) if isinstance(s.move, FinalAnswer)]
        step = answers[-1] if answers else (len(steps) - 1 if steps else None)
        reason = "the answer does not follow from the results"
    return Verdict(step=step, reason=reason, source="rules", raw=raw, error=error)


RULES = {"redundant": rule_redundant_step, "flaw": rule_first_flaw}


def parse_step(text: str, steps: int, allow_none: bool) -> tuple[int | None, str] | None:
    """(0-based step or None, reason) from a judge's reply; None when it names no usable step
    (no number, a number outside 1..steps, or "none" where a step must be named)."""
    reason_match = _REASON.search(text)
    found = _STEP.findall(text[: reason_match.start()] if reason_match else text)
    if not found:
        return None
    named = found[-1].lower()
    reason = (reason_match.group(1) if reason_match else text).strip().splitlines()[0][:300]
    if named == "none":
        return (None, reason) if allow_none else None
    number = int(named)
    if not 1 <= number <= steps:
        return None
    return number - 1, reason


class TrajectoryJudge:
    """Asks `backend` (through `chat`, its model's chat tokenizer) about trajectories in the
    agent format `agent_format`; a call past `timeout_s` is abandoned (its thread may finish
    later) and the rules decide."""

    def __init__(
        self,
        backend: InferenceBackend,
        chat: ChatTokenizer,
        agent_format: AgentFormat,
        max_tokens: int = 64,
        timeout_s: float = 120.0,
    ):
        self.backend, self.chat, self.format = backend, chat, agent_format
        self.sampling = SamplingSettings(temperature=0.0, max_tokens=max_tokens)
        self.timeout_s = timeout_s

    def redundant_step(self, trajectories: Trajectory | Sequence[Trajectory]):
        """The redundant step of each trajectory (a `Verdict`; a list for a list)."""
        return self._judge("redundant", trajectories)

    def first_flaw(self, trajectories: Trajectory | Sequence[Trajectory]):
        """The first flawed step of each (wrong) trajectory (a `Verdict`; a list for a list)."""
        return self._judge("flaw", trajectories)

    def _judge(self, question: Question, trajectories):
        if isinstance(trajectories, Trajectory):
            return self._judge(question, [trajectories])[0]
        all_steps = [episode_steps(t, self.format) for t in trajectories]
        if not trajectories:
            return []
        prompts = [
            self.prompt_ids(question, t, s) for t, s in zip(trajectories, all_steps, strict=True)
        ]
        replies, error = self._generate(prompts)
        if replies is None:
            return [RULES[question](steps, error=error) for steps in all_steps]
        return [
            self._verdict(question, steps, reply)
            for steps, reply in zip(all_steps, replies, strict=True)
        ]

    def _verdict(self, question: Question, steps: list[Step], reply: str) -> Verdict:
        parsed = parse_step(reply, len(steps), allow_none=question == "redundant")
        if parsed is None:
            return RULES[question](steps, error="no usable step number in the reply", raw=reply)
        step, reason = parsed
        return Verdict(step=step, reason=reason, source="judge", raw=reply)

    def _generate(self, prompts: list[list[int]]) -> tuple[list[str] | None, str | None]:
        """The replies, or None and why there are none."""
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            future = pool.submit(self.backend.generate, prompts, self.sampling)
            generations = future.result(timeout=self.timeout_s)
            return [g.text for g in generations], None
        except FutureTimeout:
            return None, f"timeout: no reply within {self.timeout_s:g} s"
        except Exception as error:  # recorded on every verdict; the rules decide
            return None, f"error: {type(error).__name__}: {str(error)[:300]}"
        finally:
            pool.shutdown(wait=False)

    def prompt_ids(
        self, question: Question, trajectory: Trajectory, steps: list[Step]
    ) -> list[int]:
        messages = [
            Message(role="system", content=JUDGE_SYSTEM),
            Message(role="user", content=judge_text(question, trajectory, steps)),
        ]
        return self.chat.encode(messages)[0] + self.chat.header_ids


def judge_text(question: Question, trajectory: Trajectory, steps: list[Step]) -> str:
    """The trajectory as the judge reads it: the question, numbered steps, what to answer."""
    instruction = trajectory.messages[trajectory.episode_start].content
    lines = [instruction, ""]
    for number, step in enumerate(steps, 1):
        lines.append(f"Step {number}: {step.text.strip()}")
        if step.result is not None:
            lines.append(f"Result {number}: {step.result.strip()[:MAX_RESULT_CHARS]}")
    return "\n".join([*lines, "", ASK[question]])
