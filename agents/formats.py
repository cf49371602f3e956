"""Agent formats: how an agent's turn is written and read, and how what comes back is appended.

A format turns a move (an environment action, a tool call, a final answer) into the text of an
assistant turn, parses a generated turn back into a typed move (or a `ParseError` whose message
the agent reads next), and wraps an observation or a tool result as the next message.

Three formats:

- `ReActFormat`: today's ``Thought: ...\\nAction: ...`` (delegates to `flywheel.chat`, so ETO's
  and Agent-R's messages are byte-identical to the rollout's own). Observations and format hints
  come back as ``Observation: ...`` user messages. The first ``Action:`` line wins.
- `TagFormat`: ``<search>query</search>``, ``<python>code</python>``, ``<answer>text</answer>``
  after free-text reasoning; a result comes back as ``<result>\\n...\\n</result>``.
- `JSONFormat`: one ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` as the
  Hermes/Qwen chat templates write them; a result comes back as
  ``<tool_response>\\n...\\n</tool_response>``. Records have no "tool" role, so a result is a user
  message whose content carries the wrapper: Qwen2.5's template renders a lone tool message
  exactly so (``<|im_start|>user\\n<tool_response>\\n...``). The final answer is a call of the
  `answer` tool; a reply without a call is a parse error, never a silent answer.

Loss: only assistant turns the model generated carry loss (`ChatTokenizer.generated_message`
keeps their token ids and masks the template's header, and the turn end when the model did not
sample it). Every message a format appends (observations, tool results, parse errors) is a user
message with `loss=False`; `agent_message` (expert or solver turns, written not sampled) has
`loss=True` like the expert trajectories of ETO.

Decisions on malformed tool calls (tag and JSON formats; ReAct keeps its own rules):

- Two calls in one reply are refused: the second would be made without seeing the first's
  result. A rollout with stop strings at the closing tags never produces them.
- An unclosed call (``<search>query`` without ``</search>``) is refused, not run: a reply cut at
  max_tokens ends that way, and a partial query or half a program must not run. (A backend that
  stops on a closing tag must keep the stop string in the output.)
- Opening tags are counted over the whole reply, so a call's body cannot hold another call's
  opening tag (``<python>print("<search>")</python>`` reads as two calls).
- Text after the call's closing tag is ignored by the parser (it stays in the turn as
  generated); text before it is the move's `thought`.
- An unknown tool name is refused with the list of available tools. The arguments themselves are
  checked by the tool (`envs.tools`), not here; only `answer`'s text is checked here, since a
  final answer is not a tool call.
"""

from __future__ import annotations

import json
import re
import textwrap
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flywheel.chat import format_observation, format_reply, parse_reply
from flywheel.records import Message

ANSWER = "answer"
ANSWER_ARGUMENT = "text"
# Tool name -> the argument a tag's body fills (the tag format has one argument per tool).
DEFAULT_TOOLS: Mapping[str, str] = {"search": "query", "python": "code"}


@dataclass(frozen=True)
class Action:
    """An environment action (ReAct)."""

    text: str
    thought: str = ""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    thought: str = ""


@dataclass(frozen=True)
class FinalAnswer:
    text: str
    thought: str = ""


@dataclass(frozen=True)
class ParseError:
    """What is wrong with a reply, worded for the agent that reads it next."""

    message: str


Move = Action | ToolCall | FinalAnswer
Parsed = Move | ParseError


class AgentFormat(ABC):
    name: str

    @abstractmethod
    def render_turn(self, move: Move) -> str:
        """The text of an assistant turn that makes `move`."""

    @abstractmethod
    def parse(self, text: str) -> Parsed:
        """The move a generated turn makes, or what is wrong with it."""

    @abstractmethod
    def result_message(self, result: str) -> Message:
        """An observation or a tool result, as the message that follows the agent's turn."""

    def error_message(self, problem: ParseError) -> Message:
        """The message that answers an unparseable turn."""
        return Message(role="user", content=problem.message)

    def agent_message(self, move: Move) -> Message:
        """A written (not sampled) agent turn, as expert and solver trajectories hold it."""
        return Message(role="assistant", content=self.render_turn(move), loss=True)


class ReActFormat(AgentFormat):
    """``Thought: ...\\nAction: ...``, exactly as `flywheel.chat` writes and reads it."""

    name = "react"

    def render_turn(self, move: Move) -> str:
        if not isinstance(move, Action):
            raise TypeError(f"the ReAct format writes environment actions, not {move!r}")
        return format_reply(move.thought, move.text)

    def parse(self, text: str) -> Parsed:
        reply = parse_reply(text)
        if reply.action is None:
            return ParseError(reply.error)
        return Action(reply.action, reply.thought)

    def result_message(self, result: str) -> Message:
        return Message(role="user", content=format_observation(result))

    def error_message(self, problem: ParseError) -> Message:
        return self.result_message(problem.message)  # the rollout shows format hints so


def _tool_list(names) -> str:
    return ", ".join(sorted({*names, ANSWER}))


class TagFormat(AgentFormat):
    """``<search>query</search>``, ``<python>code</python>``, ``<answer>text</answer>``."""

    name = "tags"
    # Tags a model writes that are not calls (reasoning, or a result it echoes).
    NOT_CALLS = frozenset({"think", "result"})

    def __init__(self, tools: Mapping[str, str] = DEFAULT_TOOLS):
        self.tools = dict(tools)  # tool name -> the argument its tag's body fills
        names = "|".join(re.escape(n) for n in sorted({*self.tools, ANSWER}))
        self._open = re.compile(rf"<({names})>")
        self._call = re.compile(rf"<({names})>(.*?)</\1>", re.S)

    def render_turn(self, move: Move) -> str:
        if isinstance(move, FinalAnswer):
            tag, body = ANSWER, move.text
        elif isinstance(move, ToolCall):
            tag, body = move.name, move.arguments[self.tools[move.name]]
        else:
            raise TypeError(f"the tag format writes tool calls and answers, not {move!r}")
        call = f"<{tag}>{body}</{tag}>"
        return f"{move.thought}\n{call}" if move.thought else call

    def parse(self, text: str) -> Parsed:
        opened = self._open.findall(text)
        if not opened:
            return ParseError(self._no_call(text))
        if len(opened) > 1:
            return ParseError(
                f"One call per turn: this reply makes {len(opened)} ({', '.join(opened)}). "
                "Make one call and wait for its result."
            )
        match = self._call.search(text)
        if match is None:
            return ParseError(f"Unclosed <{opened[0]}>: end the call with </{opened[0]}>.")
        tag, body = match.group(1), textwrap.dedent(match.group(2)).strip()
        if not body:
            return ParseError(f"Empty <{tag}></{tag}>: put the {self._argument(tag)} inside.")
        thought = text[: match.start()].strip()
        if tag == ANSWER:
            return FinalAnswer(body, thought)
        return ToolCall(tag, {self.tools[tag]: body}, thought)

    def _argument(self, tag: str) -> str:
        return ANSWER_ARGUMENT if tag == ANSWER else self.tools[tag]

    def _no_call(self, text: str) -> str:
        others = [t for t in re.findall(r"<([A-Za-z_]\w*)>", text) if t not in self.NOT_CALLS]
        available = _tool_list(self.tools)
        if others:
            return f"Unknown tool <{others[0]}>. Available: {available}."
        return f"No call in this reply. Call one tool (<search>...</search>, ...) of: {available}."

    def result_message(self, result: str) -> Message:
        return Message(role="user", content=f"<result>\n{result}\n</result>")


class JSONFormat(AgentFormat):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes, Qwen)."""

    name = "json"
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def __init__(self, tools=tuple(DEFAULT_TOOLS)):
        self.tools = frozenset(tools)

    def render_turn(self, move: Move) -> str:
        if isinstance(move, FinalAnswer):
            name, arguments = ANSWER, {ANSWER_ARGUMENT: move.text}
        elif isinstance(move, ToolCall):
            name, arguments = move.name, move.arguments
        else:
            raise TypeError(f"the JSON format writes tool calls and answers, not {move!r}")
        # As the templates' `tojson` writes it: json.dumps' separators, non-ASCII kept.
        payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        call = f"{self._OPEN}\n{payload}\n{self._CLOSE}"
        return f"{move.thought}\n{call}" if move.thought else call

    def parse(self, text: str) -> Parsed:
        opened = text.count(self._OPEN)
        if opened == 0:
            return ParseError(
                f'No call in this reply. Call one tool as {self._OPEN}{{"name": ..., '
                f'"arguments": {{...}}}}{self._CLOSE}; tools: {_tool_list(self.tools)}.'
            )
        if opened > 1:
            return ParseError(
                f"One call per turn: this reply makes {opened}. Make one call and wait for "
                "its result."
            )
        match = self._CALL.search(text)
        if match is None:
            return ParseError(f"Unclosed {self._OPEN}: end the call with {self._CLOSE}.")
        call = self._read_call(match.group(1))
        if isinstance(call, ParseError):
            return call
        name, arguments = call
        thought = text[: match.start()].strip()
        if name == ANSWER:
            return self._answer(arguments, thought)
        return ToolCall(name, arguments, thought)

    def _read_call(self, body: str) -> tuple[str, dict] | ParseError:
        try:
            call = json.loads(body)
        except json.JSONDecodeError as error:
            return ParseError(f"Bad JSON in the tool call: {error.msg} (character {error.pos}).")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ParseError('A tool call is an object with a "name" and "arguments".')
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # OpenAI's API sends arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as error:
                return ParseError(f'Bad JSON in "arguments": {error.msg}.')
        if not isinstance(arguments, dict):
            return ParseError('"arguments" must be an object.')
        if call["name"] not in self.tools | {ANSWER}:
            available = _tool_list(self.tools)
            return ParseError(f"Unknown tool {call['name']!r}. Available: {available}.")
        return call["name"], arguments

    @staticmethod
    def _answer(arguments: dict, thought: str) -> Parsed:
        text = arguments.get(ANSWER_ARGUMENT)
        if not isinstance(text, str) or not text.strip():
            return ParseError(f'The answer tool needs a non-empty "{ANSWER_ARGUMENT}" string.')
        return FinalAnswer(text.strip(), thought)

    def result_message(self, result: str) -> Message:
        return Message(role="user", content=f"<tool_response>\n{result}\n</tool_response>")


def tag_arguments(tools) -> dict[str, str]:
    """Tool name -> the argument a tag's body fills, for tools with JSON-schema `parameters`
    (`envs.tools`): each tool's first required parameter. `answer` is built in."""
    return {t.name: t.parameters["required"][0] for t in tools if t.name != ANSWER}


FORMATS: dict[str, type[AgentFormat]] = {f.name: f for f in (ReActFormat, TagFormat, JSONFormat)}


def make_format(name: str, tools: Mapping[str, str] = DEFAULT_TOOLS) -> AgentFormat:
    """The format called `name`; the tool formats know `tools` (name -> tag argument)."""
    if name not in FORMATS:
        raise ValueError(f"unknown agent format {name!r}; known: {', '.join(FORMATS)}")
    if name == ReActFormat.name:
        return ReActFormat()
    return FORMATS[name](tools)
