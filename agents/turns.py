"""How the rollout reads an agent's reply into an environment action, and what it appends after.

The environment names its agent format (`Environment.agent_format`):

- "react" (`ReActTurns`): the reply's ``Action:`` line is the action; a reply without one takes
  no step and is answered with the format hint. Messages are `flywheel.chat`'s own, byte for
  byte, as ETO and Agent-R have always stored them.
- a tool format, "tags" or "json" (`ToolTurns`): the format (`agents.formats`) parses the reply
  into a tool call or the final answer, which goes to the environment as a canonical action
  (`envs.tools.call_action`); a reply that cannot be parsed goes as `malformed_action`, so the
  environment scores the format, and its answer comes back as the format's error message. Tool
  results come back wrapped as the format wraps them (``<result>``, ``<tool_response>``).

Every message appended after a turn is a user message without loss; written (expert) turns
carry loss, like ETO's expert trajectories.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from agents.formats import (
    ANSWER,
    ANSWER_ARGUMENT,
    AgentFormat,
    FinalAnswer,
    ParseError,
    ToolCall,
    make_format,
)
from envs.base import Environment
from envs.tools import CallRequest, call_action, malformed_action, read_action
from flywheel.chat import format_observation, format_reply, parse_reply
from flywheel.records import Message


@dataclass(frozen=True)
class Reply:
    """A reply, read: the environment action it takes, or the hint it gets instead."""

    thought: str
    action: str | None  # None: the reply takes no step and is answered with `error`
    error: str | None = None
    malformed: bool = False  # `action` reports an unparseable reply to the environment


class Turns(ABC):
    @abstractmethod
    def read(self, text: str) -> Reply:
        """What a generated reply does."""

    @abstractmethod
    def observation(self, text: str, malformed: bool = False) -> Message:
        """The message answering a turn: the step's observation, or a hint (`malformed`: the
        environment's answer to an unparseable reply)."""

    @abstractmethod
    def written_turn(self, thought: str, action: str) -> Message:
        """An expert's turn taking `action` (an environment action), as a trajectory holds it."""

    @abstractmethod
    def shown_move(self, action: str | None, reply: str | None = None) -> str:
        """A turn's move as a reader of the episode is shown it (the critique), without its
        thought: `action` as this format writes it; where no move could be read from the reply
        (`action` None, or a malformed one), `reply` itself when given."""


class ReActTurns(Turns):
    def read(self, text: str) -> Reply:
        parsed = parse_reply(text)
        return Reply(parsed.thought, parsed.action, parsed.error)

    def observation(self, text: str, malformed: bool = False) -> Message:
        return Message(role="user", content=format_observation(text))

    def written_turn(self, thought: str, action: str) -> Message:
        return Message(role="assistant", content=format_reply(thought, action), loss=True)

    def shown_move(self, action: str | None, reply: str | None = None) -> str:
        return f"Action: {action if action is not None else reply}"


class ToolTurns(Turns):
    def __init__(self, agent_format: AgentFormat):
        self.format = agent_format

    def read(self, text: str) -> Reply:
        move = self.format.parse(text)
        if isinstance(move, ParseError):
            return Reply("", malformed_action(move.message), malformed=True)
        if isinstance(move, FinalAnswer):
            return Reply(move.thought, call_action(ANSWER, {ANSWER_ARGUMENT: move.text}))
        if isinstance(move, ToolCall):
            return Reply(move.thought, call_action(move.name, move.arguments))
        raise TypeError(f"a tool format read an environment action: {move!r}")

    def observation(self, text: str, malformed: bool = False) -> Message:
        if malformed:
            return self.format.error_message(ParseError(text))
        return self.format.result_message(text)

    def written_turn(self, thought: str, action: str) -> Message:
        call = read_action(action)
        if not isinstance(call, CallRequest):
            raise ValueError(f"an expert's action must be a tool call or answer: {action!r}")
        if call.name == ANSWER:
            return self.format.agent_message(FinalAnswer(call.arguments[ANSWER_ARGUMENT], thought))
        return self.format.agent_message(ToolCall(call.name, call.arguments, thought))

    def shown_move(self, action: str | None, reply: str | None = None) -> str:
        if action is not None and isinstance(read_action(action), CallRequest):
            return self.written_turn("", action).content
        return reply if reply is not None else "(a reply no call could be read from)"


def turns_for(env: Environment) -> Turns:
    """How `env`'s agent turns are read and answered."""
    return format_turns(env.agent_format, env.tool_arguments)


def format_turns(agent_format: str, tool_arguments: Mapping[str, str]) -> Turns:
    """The turns of the agent format called `agent_format`, with these tools (name -> the
    argument a tag call's body fills): for records that name their format (a search tree)."""
    if agent_format == "react":
        return ReActTurns()
    return ToolTurns(make_format(agent_format, tool_arguments))
