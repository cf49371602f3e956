"""Question answering with tools (Agent-R1's environment): search a corpus, run python, answer.

A task is a question of a split (`envs.qa_data`: the generated world, or a benchmark file read
by `envs.qa_benchmarks`). The agent sees the question and, in the system prompt, the tools as its
format calls them. Each step is one move, read from a canonical action (`envs.tools.read_action`;
the rollout turns a reply in the agent's format into it):

- a tool call runs the tool (`search` over the split's corpus, `python` in the sandbox); the
  observation is the tool's result, errors included ("Error: ..."), reward 0;
- the answer ends the episode with `envs.qa_rewards.qa_reward`: answer F1 or EM plus the format
  term, which the episode loses for good once one of its replies could not be parsed;
- a malformed reply (or a call of a tool this environment does not offer) is answered with what
  is wrong, and counts as a format violation;
- tool calls past `max_tool_calls` are refused (the observation says to answer), not run.

`step_all` runs the tool calls of all live episodes batched per tool (one BM25 retrieval for
every search, parallel sandboxes for python).

The expert (`expert_plan`, played by `agents.rollout.expert_trajectory` for the warm start) is a
scripted solver: it searches the title of each of the question's supporting documents, computes
arithmetic answers with python from the numbers those documents hold (generated questions), and
answers with the gold answer.

Agent-R's expert revisions (`tasks.expert_revisions`) use two more pieces, both from a played
path replayed without the sandbox (`PathReplay`): the oracle (`mistakes`), and the solver's steps
still needed from where a path leaves the question (`expert_continuation`): not only its answer,
which would teach the policy to answer without looking anything up.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

from envs.base import Environment, Episode, Split, StepResult
from envs.qa_benchmarks import load_benchmark
from envs.qa_data import Document, QAData, QARecord, World, generated_qa, generated_world
from envs.qa_rewards import QAReward, RewardWeights, qa_reward
from envs.sandbox import SandboxLimits, check_namespaces
from envs.tools import (
    ERROR,
    AnswerTool,
    CallRequest,
    PythonTool,
    SearchTool,
    Tool,
    ToolSettings,
    call_action,
    read_action,
)
from flywheel.settings import QASettings

ANSWER = AnswerTool()  # its spec and its argument check; the episode records the answer itself
TOOL_CLASSES: dict[str, type[Tool]] = {"search": SearchTool, "python": PythonTool}


@dataclass(frozen=True)
class PendingCall:
    """A tool call an episode has accepted and not yet run (`step_all` batches them)."""

    tool: Tool
    arguments: dict


def load_split(settings: QASettings, split: Split) -> QAData:
    if settings.source == "generated":
        return generated_qa(split, settings.seed)
    path = settings.train_path if split == "train" else settings.test_path
    return load_benchmark(settings.source, path, settings.corpus_path)


def searchable_text(document: Document) -> str:
    """What a search result shows: the text, after the title unless the text starts with it."""
    if document.text.startswith(document.title):
        return document.text
    return f"{document.title}: {document.text}"


class QAEpisode(Episode):
    def __init__(self, record: QARecord, tools: dict[str, Tool], env: QAEnv):
        self.task_id, self.record, self.tools = record.id, record, tools
        self.instruction = f"Question: {record.question}"
        self.max_tool_calls, self.weights = env.settings.max_tool_calls, env.weights
        self.tool_calls = 0  # calls run (refused ones are not)
        self.successful_calls = 0  # calls whose result was not an error
        self.malformed = 0  # replies that could not be parsed
        self.outcome: QAReward | None = None  # set by the answer

    def step(self, action: str) -> StepResult:
        move = self.prepare(action)
        if isinstance(move, PendingCall):
            return self.complete(move.tool.execute(move.arguments))
        return move

    def prepare(self, action: str) -> StepResult | PendingCall:
        """The step's result when it runs no tool, else the call to run (then `complete`)."""
        if self.outcome is not None:
            return StepResult("The episode is over: the answer was given.", 0.0, True)
        move = read_action(action)
        if not isinstance(move, CallRequest):
            return self._refuse(move.message)
        if move.name == ANSWER.name:
            return self._answer(move.arguments)
        if move.name not in self.tools:
            return self._refuse(f"{ERROR} unknown tool {move.name!r}; tools: {self._names()}.")
        if self.tool_calls >= self.max_tool_calls:
            return StepResult(
                f"{ERROR} no tool calls left (at most {self.max_tool_calls} per question). "
                "Give your answer now.",
                0.0,
                False,
            )
        self.tool_calls += 1
        return PendingCall(self.tools[move.name], move.arguments)

    def complete(self, result: str) -> StepResult:
        """The step of a call that ran and returned `result`."""
        if not result.startswith(ERROR):
            self.successful_calls += 1
        return StepResult(result, 0.0, False)

    def solved(self) -> bool:
        """Solved: the answer matches a gold answer exactly (after normalisation), the metric
        the benchmarks report, whatever the reward's answer metric and format term."""
        return self.outcome is not None and self.outcome.exact_match == 1.0

    def metrics(self) -> dict[str, float]:
        answered = self.outcome is not None
        return {
            "answered": float(answered),
            "exact_match": self.outcome.exact_match if answered else 0.0,
            "f1": self.outcome.f1 if answered else 0.0,
            "format_valid": float(self.malformed == 0),
            "tool_calls": float(self.tool_calls),
            "failed_tool_calls": float(self.tool_calls - self.successful_calls),
        }

    def _refuse(self, message: str) -> StepResult:
        self.malformed += 1
        return StepResult(message, 0.0, False)

    def _answer(self, arguments: dict) -> StepResult:
        problem = ANSWER.argument_error(arguments)
        if problem:
            return self._refuse(problem)
        text = arguments["text"].strip()
        self.outcome = qa_reward(
            text,
            self.record.answers,
            format_valid=self.malformed == 0,
            successful_tool_calls=self.successful_calls,
            weights=self.weights,
        )
        return StepResult(f"Final answer: {text}", self.outcome.total, True)

    def _names(self) -> str:
        return ", ".join(sorted({*self.tools, ANSWER.name}))


class QAEnv(Environment):
    name = "qa"
    # A search changes nothing (it does use one of the episode's tool calls).
    noop_action = call_action("search", {"query": "nothing"})

    def __init__(
        self,
        settings: QASettings | None = None,
        data: Callable[[Split], QAData] | None = None,
    ):
        self.settings = settings or QASettings()
        self._load = data or functools.partial(load_split, self.settings)
        self.weights = RewardWeights(
            **self.settings.model_dump(include=set(RewardWeights.model_fields))
        )
        # The answer and the format term are the reward of a solved question: success. The
        # process reward can push a reward past it; `normalise` clamps it.
        self.reward_range = (0.0, self.weights.answer_weight + self.weights.format_weight)
        self.agent_format = self.settings.format
        self.tool_arguments = {
            name: TOOL_CLASSES[name].parameters["required"][0] for name in self.settings.tools
        }
        self.system_prompt = system_prompt(self.settings.format, self.settings.tools)
        self.tool_settings = ToolSettings(
            timeout_s=self.settings.tool_timeout_s,
            max_output_chars=self.settings.max_output_chars,
        )
        # Per split, loaded on first use (a benchmark's corpus can be large), under a lock since
        # episodes may start in threads.
        self._lock = threading.RLock()
        self._data: dict[Split, QAData] = {}
        self._questions: dict[Split, dict[str, QARecord]] = {}
        self._tools: dict[Split, dict[str, Tool]] = {}

    def check(self) -> None:
        for split in ("train", "test"):
            if not self.data(split).questions:
                raise ValueError(f"env.qa: the {split} split has no questions")
        if "python" in self.settings.tools and self.settings.python_isolation == "namespaces":
            check_namespaces()  # the kernel's refusal, before any episode starts

    def data(self, split: Split) -> QAData:
        with self._lock:
            if split not in self._data:
                self._data[split] = self._load(split)
            return self._data[split]

    def questions(self, split: Split) -> dict[str, QARecord]:
        with self._lock:
            if split not in self._questions:
                self._questions[split] = {q.id: q for q in self.data(split).questions}
            return self._questions[split]

    def task_ids(self, split: Split) -> list[str]:
        """Test: the test questions; train and validation: the train questions, less or only
        those the run holds out (`Environment.carved`). A held-out question is still played
        with the train split's corpus, as it was written for it."""
        if split == "test":
            return list(self.questions("test"))
        return self.carved(split, list(self.questions("train")))

    def split_of(self, task_id: str) -> Split:
        for split in ("test", "train"):
            if task_id in self.questions(split):
                return split
        raise KeyError(f"no question {task_id!r} in env qa ({self.settings.source})")

    def tools(self, split: Split) -> dict[str, Tool]:
        """The split's tools, built once (the search index over the split's corpus)."""
        with self._lock:
            if split not in self._tools:
                self._tools[split] = {n: self._tool(n, split) for n in self.settings.tools}
            return self._tools[split]

    def _tool(self, name: str, split: Split) -> Tool:
        if name == "python":
            isolation = self.settings.python_isolation
            return PythonTool(self.tool_settings, SandboxLimits(isolation=isolation))
        corpus = [searchable_text(d) for d in self.data(split).corpus]
        return SearchTool(corpus, k=self.settings.search_k, settings=self.tool_settings)

    def start(self, task_id: str) -> QAEpisode:
        split = self.split_of(task_id)
        return QAEpisode(self.questions(split)[task_id], self.tools(split), self)

    def step_all(self, moves: list[tuple[Episode, str]]) -> list[StepResult | Exception]:
        """All episodes' moves; the tool calls among them run batched, one batch per tool."""
        results: list = [episode.prepare(action) for episode, action in moves]
        by_tool: dict[int, list[int]] = {}
        for position, result in enumerate(results):
            if isinstance(result, PendingCall):
                by_tool.setdefault(id(result.tool), []).append(position)
        for positions in by_tool.values():
            calls = [results[p] for p in positions]
            outputs = calls[0].tool.execute_batch([call.arguments for call in calls])
            for position, output in zip(positions, outputs, strict=True):
                results[position] = moves[position][0].complete(output)
        return results

    def mistakes(self, task_id: str, actions: list[str | None]) -> list[bool] | None:
        """A reply without a call, a call of an unknown tool or a refused one; a search that
        returns no supporting document of the question that no earlier search returned; python
        where the solver uses none, or before every supporting document was found (it cannot have
        the numbers); an answer that does not solve the question (`QAEpisode.solved`). None for
        questions the solver cannot answer."""
        plan = self.expert_plan(task_id)
        if plan is None:
            return None
        replay = PathReplay(self, task_id, plan)
        return [replay.step(action) for action in actions]

    def expert_continuation(self, task_id: str, actions: list[str | None]) -> list[tuple[str, str]]:
        """The solver's steps after `actions`: its searches for the supporting documents their
        searches have not returned, its python step (if any), its answer. [] when the question
        was answered, or the tool calls left are too few (the path's calls, run or refused, and
        these must fit `max_tool_calls`)."""
        plan = self.expert_plan(task_id)
        if plan is None:
            return []
        replay = PathReplay(self, task_id, plan)
        for action in actions:
            replay.step(action)
        if replay.episode.outcome is not None:
            return []
        found, steps = set(replay.found), []
        for thought, action in plan:
            move = read_action(action)
            if move.name == "search":
                new = replay.returned(move.arguments) - found
                if not new:  # the path (or an earlier step of the plan) found it already
                    continue
                found |= new
            steps.append((thought, action))
        calls = sum(read_action(action).name != ANSWER.name for _, action in steps)
        if replay.calls_asked + calls > self.settings.max_tool_calls:
            return []
        return steps

    def expert_plan(self, task_id: str) -> list[tuple[str, str]] | None:
        split = self.split_of(task_id)
        record = self.questions(split)[task_id]
        world = generated_world(self.settings.seed) if record.source == "generated" else None
        titles = {d.id: d.title for d in self.data(split).corpus if d.id in record.supporting_ids}
        plan = solver_plan(record, titles, world, self.settings.tools)
        if plan is None or len(plan) - 1 > self.settings.max_tool_calls:
            return None
        return plan


class PathReplay:
    """A played path's effect on a fresh episode, without the sandbox: the episode's own
    bookkeeping (the tool-call budget, refusals, the answer's exact match), searches run on the
    split's index, python not run. Keeps the supporting documents the searches returned."""

    def __init__(self, env: QAEnv, task_id: str, plan: list[tuple[str, str]]):
        self.episode = env.start(task_id)
        corpus = env.data(env.split_of(task_id)).corpus
        wanted = set(self.episode.record.supporting_ids)
        self.supporting = {d.id: searchable_text(d) for d in corpus if d.id in wanted}
        self.solver_uses_python = any(read_action(a).name == "python" for _, a in plan)
        self.found: set[str] = set()
        self.calls_asked = 0  # tool calls the path made, run or refused

    def returned(self, arguments: dict) -> set[str]:
        """The supporting documents a search shows: their text is in its result (as the agent
        reads it, after any truncation)."""
        result = self.episode.tools["search"].execute(arguments)
        return {i for i, text in self.supporting.items() if text in result}

    def step(self, action: str | None) -> bool:
        """Take `action`; whether it was a mistake (`QAEnv.mistakes`)."""
        if action is None or self.episode.outcome is not None:
            return True
        move = read_action(action)
        self.calls_asked += isinstance(move, CallRequest) and move.name in self.episode.tools
        pending = self.episode.prepare(action)
        if isinstance(pending, StepResult):  # an answer, a refusal, a malformed reply
            return not self.episode.solved()
        if pending.tool.name == "python":
            return not (self.solver_uses_python and self.found == set(self.supporting))
        new = self.returned(pending.arguments) - self.found
        self.found |= new
        return not new


# ---- the prompt ---------------------------------------------------------------------------------

_TASK = (
    "Answer the question. The answer is in a document collection you can search; you cannot "
    "know it without searching. Make one call per turn and wait for its result; answer with a "
    "short phrase, a name or a number."
)


def system_prompt(agent_format: str, tool_names: list[str]) -> str:
    tools = [TOOL_CLASSES[name] for name in tool_names]
    if agent_format == "json":
        # `spec` reads only class attributes: no search index is built for the prompt
        specs = [json.dumps(Tool.spec(t), ensure_ascii=False) for t in [*tools, AnswerTool]]
        return (
            f"{_TASK}\nCall a tool as <tool_call>\n"
            '{"name": <tool name>, "arguments": <arguments object>}\n</tool_call>; its result '
            "comes back in <tool_response></tool_response>. Tools:\n" + "\n".join(specs)
        )
    lines = [f"<{t.name}>{t.parameters['required'][0]}</{t.name}>: {t.description}" for t in tools]
    lines.append(f"<answer>text</answer>: {AnswerTool.description}")
    return (
        f"{_TASK} Think first, then write one call:\n"
        + "\n".join(lines)
        + "\nA call's result comes back in <result></result>."
    )


# ---- the scripted solver ------------------------------------------------------------------------


def solver_plan(
    record: QARecord,
    titles: dict[str, str],
    world: World | None,
    tool_names: list[str],
) -> list[tuple[str, str]] | None:
    """(thought, action) steps that answer `record`; None when it has no supporting documents
    to search for (Bamboogle), or there is no search tool. `titles`: document id -> title."""
    if not record.supporting_ids or "search" not in tool_names:
        return None
    steps = [
        (f"I need the document about {title}.", call_action("search", {"query": title}))
        for title in dict.fromkeys(titles[i] for i in record.supporting_ids)
    ]
    code = arithmetic_code(record, world) if world and "python" in tool_names else None
    if code:
        thought = "I have the numbers; let python do the arithmetic."
        steps.append((thought, call_action("python", {"code": code})))
    steps.append(("The results give the answer.", call_action("answer", {"text": record.answer})))
    return steps


def arithmetic_code(record: QARecord, world: World) -> str | None:
    """A script printing the answer of a generated arithmetic question, from the numbers its
    supporting documents hold (None for other questions)."""
    template, subjects = record.id.split("/")
    companies = {c.id: c for c in world.companies}
    towns = {t.id: t for t in world.towns}
    ids = subjects.split("+")
    if template == "founder_age":
        c = companies[ids[0]]
        values = [("founded", c.founded, c.name), ("born", c.founder.born, c.founder.name)]
        return _script(values, "founded - born")
    if template == "years_between":
        first, then = sorted((companies[i] for i in ids), key=lambda c: c.founded)
        values = [("first", first.founded, first.name), ("then", then.founded, then.name)]
        return _script(values, "then - first")
    if template == "combined_population":
        a, b = (towns[i] for i in ids)
        return _script([("a", a.population, a.name), ("b", b.population, b.name)], "a + b")
    return None


def _script(values: list[tuple[str, int, str]], expression: str) -> str:
    lines = [f"{name} = {value}  # {source}" for name, value, source in values]
    return "\n".join([*lines, f"print({expression})"])
