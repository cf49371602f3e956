"""Tools an agent calls: one interface, and `search` (BM25), `python` (sandboxed) and `answer`.

A tool has a name, a description and JSON-schema parameters (`spec()` is the entry a chat
template's `tools=` takes). `execute(arguments)` validates the arguments, runs the call under the
tool's timeout and truncates what it returns; anything wrong (bad arguments, a timeout, the tool
failing) comes back as an observation starting with "Error:", never as an exception, since the
agent reads it and tries again. `execute_batch` runs many calls (one per live episode) and keeps
their order; a tool batches them its own way (one BM25 retrieval, parallel sandboxes).
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import jsonschema

from envs.sandbox import SandboxLimits, check_namespaces, run_python

ERROR = "Error:"


@dataclass(frozen=True)
class ToolSettings:
    timeout_s: float = 10.0  # per call
    max_output_chars: int = 2000  # longer results keep their head and tail
    workers: int = 2  # calls of one batch run at once (tools that run calls in parallel)


class ToolTimeout(Exception):
    pass


def truncate(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, keeping its head and its tail (where a
    traceback's last line, or a result's end, is) around a note of how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit - 40  # room for the note
    if keep <= 0:
        return text[:limit]
    tail = keep // 4
    head = keep - tail
    note = f"\n[... {len(text) - keep} characters cut ...]\n"
    return text[:head] + note + text[len(text) - tail :]


def _object_schema(properties: dict, required: list[str]) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


class Tool(ABC):
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object

    def __init__(self, settings: ToolSettings = ToolSettings()):
        self.settings = settings
        jsonschema.Draft202012Validator.check_schema(self.parameters)  # a tool author's mistake
        self._validator = jsonschema.Draft202012Validator(self.parameters)

    def spec(self) -> dict:
        """The tool as chat templates (`apply_chat_template(tools=...)`) and OpenAI take it."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": function | {"parameters": self.parameters}}

    def argument_error(self, arguments: Any) -> str | None:
        """What is wrong with `arguments`, worded for the agent; None when they are valid."""
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{ERROR} bad arguments for {self.name}{f' ({where})' if where else ''}: {error.message}"

    def execute(self, arguments: Any) -> str:
        problem = self.argument_error(arguments)
        if problem:
            return problem
        return self._finish(self._guarded(lambda: self.run(arguments)))

    def execute_batch(self, calls: list[Any]) -> list[str]:
        """The calls' results in the calls' order."""
        return [self.execute(arguments) for arguments in calls]

    @abstractmethod
    def run(self, arguments: dict) -> str:
        """The result of a call with valid arguments; may raise."""

    def _guarded(self, call: Callable[[], str]) -> str:
        """`call()` in a thread under the timeout; an in-process call cannot be killed, so on a
        timeout its thread is left to finish and its result is dropped."""
        box: dict[str, Any] = {}

        def target():
            try:
                box["result"] = call()
            except Exception as error:  # the agent reads it; the caller never sees it raised
                box["result"] = f"{ERROR} {self.name} failed: {type(error).__name__}: {error}"

        thread = threading.Thread(target=target, name=f"tool-{self.name}", daemon=True)
        thread.start()
        thread.join(self.settings.timeout_s)
        if thread.is_alive():
            return f"{ERROR} {self.name} timed out after {self.settings.timeout_s:g} s."
        return box["result"]

    def _finish(self, result: str) -> str:
        return truncate(result, self.settings.max_output_chars)


def _bm25s():
    """bm25s, imported when a search index is built: it loads numba's llvmlite, and a process
    that has llvmlite loaded before vLLM's CPU worker starts breaks the worker's kernel scan
    (`'_lib_fn_wrapper' object has no attribute 'get'`), so every rollout would fail."""
    import bm25s

    return bm25s


class SearchTool(Tool):
    """BM25 (bm25s, Lucene's scoring) over a fixed list of documents."""

    name = "search"
    description = "Search the document collection; returns the best-matching documents."
    parameters = _object_schema(
        {
            "query": {"type": "string", "minLength": 1, "description": "What to look for."},
            "k": {"type": "integer", "minimum": 1, "maximum": 20, "description": "How many."},
        },
        ["query"],
    )

    def __init__(self, documents: list[str], k: int = 3, settings: ToolSettings = ToolSettings()):
        super().__init__(settings)
        if not documents:
            raise ValueError("search needs at least one document")
        self.documents, self.k = list(documents), k
        self.index = _bm25s().BM25()
        self.index.index(self._tokens(self.documents), show_progress=False)

    def _tokens(self, texts: list[str]):
        return _bm25s().tokenize(texts, stopwords="en", show_progress=False)

    def ranking(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """Per query, up to `k` (document index, score), best first; documents sharing no
        word with the query are left out."""
        words = _bm25s().tokenize(queries, stopwords="en", show_progress=False, return_ids=False)
        k = min(k, len(self.documents))
        found, scores = self.index.retrieve(words, k=k, show_progress=False)
        return [
            [(int(d), float(s)) for d, s in zip(docs, row, strict=True) if s > 0]
            for docs, row in zip(found, scores, strict=True)
        ]

    def run(self, arguments: dict) -> str:
        return self._render(self.ranking([arguments["query"]], arguments.get("k", self.k))[0])

    def execute_batch(self, calls: list[Any]) -> list[str]:
        """One retrieval for all valid calls (under one timeout), errors in their places."""
        results: list[str | None] = [self.argument_error(a) for a in calls]
        valid = [i for i, problem in enumerate(results) if problem is None]
        if not valid:
            return results
        k = max(calls[i].get("k", self.k) for i in valid)
        queries = [calls[i]["query"] for i in valid]
        rankings = self._guarded(lambda: self.ranking(queries, k))
        for n, i in enumerate(valid):
            if isinstance(rankings, str):  # the batch timed out or failed
                results[i] = rankings
            else:
                results[i] = self._finish(self._render(rankings[n][: calls[i].get("k", self.k)]))
        return results

    def _render(self, ranking: list[tuple[int, float]]) -> str:
        if not ranking:
            return "No document matches the query."
        return "\n".join(f"[{n}] {self.documents[d]}" for n, (d, _) in enumerate(ranking, 1))


class PythonTool(Tool):
    """Runs code in a sandboxed subprocess (`envs.sandbox`); returns what it printed. With the
    namespace box (the default), building the tool tries the box once and raises
    `envs.sandbox.SandboxUnavailable` where the kernel refuses it: never a silent fallback to
    the weaker audit-hook box, which only `limits.isolation="audit-hooks"` selects."""

    name = "python"
    description = (
        "Run a Python script and see what it prints (print the values you need). Each call "
        "starts fresh: nothing is kept between calls; no network, no files outside its folder."
    )
    parameters = _object_schema(
        {"code": {"type": "string", "minLength": 1, "description": "A Python script."}},
        ["code"],
    )

    def __init__(
        self, settings: ToolSettings = ToolSettings(), limits: SandboxLimits | None = None
    ):
        super().__init__(settings)
        # The sandbox's wall time is the tool's timeout: the process is killed, not abandoned.
        self.limits = replace(limits or SandboxLimits(), wall_s=settings.timeout_s)
        if self.limits.isolation == "namespaces":
            check_namespaces()

    def run(self, arguments: dict) -> str:
        result = run_python(arguments["code"], self.limits)
        output = result.stdout.rstrip("\n")
        if result.error:
            return f"{output}\n{ERROR} {result.error}" if output else f"{ERROR} {result.error}"
        return output or "(no output: print what you want to see)"

    def _guarded(self, call: Callable[[], str]) -> str:
        try:  # the sandbox enforces the timeout itself
            return call()
        except Exception as error:  # the sandbox could not start (disk full, ...)
            return f"{ERROR} {self.name} failed: {type(error).__name__}: {error}"

    def execute_batch(self, calls: list[Any]) -> list[str]:
        with ThreadPoolExecutor(max_workers=self.settings.workers) as pool:
            return list(pool.map(self.execute, calls))


class AnswerTool(Tool):
    """Records the agent's final answer; the episode ends on it."""

    name = "answer"
    description = "Give your final answer. Call it once, when you are sure."
    parameters = _object_schema(
        {"text": {"type": "string", "minLength": 1, "description": "The final answer."}},
        ["text"],
    )

    def __init__(self, settings: ToolSettings = ToolSettings()):
        super().__init__(settings)
        self.answers: list[str] = []  # every answer recorded, in the order given

    def run(self, arguments: dict) -> str:
        self.answers.append(arguments["text"].strip())
        return f"Final answer recorded: {self.answers[-1]}"


# ---- a tool-using environment's actions ----------------------------------------------------------
#
# `Episode.step` takes a string (remote episodes go over HTTP), so a tool-using environment reads
# one canonical action: the agent's parsed move as JSON. The agent's format (tags, JSON tool
# calls) is the rollout's business; the environment sees the same action whichever it is. A
# reply that could not be parsed is stepped too, as a `malformed_action`: the environment
# answers it with the parse error and counts it against the episode's format reward.


@dataclass(frozen=True)
class CallRequest:
    """A tool call (or the final answer, a call of `answer`) read from an action."""

    name: str
    arguments: dict


@dataclass(frozen=True)
class MalformedReply:
    """The agent's reply could not be parsed; `message` says why, worded for the agent."""

    message: str


def call_action(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def malformed_action(message: str) -> str:
    return json.dumps({"malformed": message}, ensure_ascii=False)


def read_action(action: str) -> CallRequest | MalformedReply:
    """The move an action string holds; an action that is neither kind reads as malformed."""
    try:
        move = json.loads(action)
    except json.JSONDecodeError:
        move = None
    if isinstance(move, dict) and isinstance(move.get("malformed"), str):
        return MalformedReply(move["malformed"])
    if (
        isinstance(move, dict)
        and isinstance(move.get("name"), str)
        and isinstance(move.get("arguments"), dict)
    ):
        return CallRequest(move["name"], move["arguments"])
    return MalformedReply(f"{ERROR} unreadable action {action[:80]!r}.")
