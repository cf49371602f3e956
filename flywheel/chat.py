"""The agent's chat format: the ReAct reply parser and exact token rendering of a conversation.

Replies look like ``Thought: ...\\nAction: ...``. Token rendering concatenates one chunk per
message, so a conversation can grow turn by turn without re-tokenising its past, and an assistant
turn the model generated is rendered from the very token ids it produced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flywheel.records import Message

MAX_ACTION_CHARS = 200
_ACTION = re.compile(r"^\s*action\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_THOUGHT = re.compile(r"^\s*thought\s*:\s*(.*?)(?=^\s*action\s*:|\Z)", re.IGNORECASE | re.S | re.M)

FORMAT_HINT = (
    "Invalid reply. Answer with one line 'Thought: <reasoning>' then one line 'Action: <action>'."
)


@dataclass(frozen=True)
class ParsedReply:
    thought: str
    action: str | None  # None when the reply holds no usable action
    error: str | None = None


def parse_reply(text: str) -> ParsedReply:
    """Read the action from a ReAct reply; the first `Action:` line wins.

    Malformed replies yield `action=None` and an `error` the environment shows the agent.
    """
    thought_match = _THOUGHT.search(text)
    thought = thought_match.group(1).strip() if thought_match else ""
    action_match = _ACTION.search(text)
    if action_match is None:
        return ParsedReply(thought, None, FORMAT_HINT)
    action = action_match.group(1).strip().strip("`\"'").strip()
    if not action:
        return ParsedReply(thought, None, FORMAT_HINT)
    if len(action) > MAX_ACTION_CHARS:
        return ParsedReply(thought, None, f"Action too long ({len(action)} characters).")
    return ParsedReply(thought, action)


def format_reply(thought: str, action: str) -> str:
    return f"Thought: {thought}\nAction: {action}"


def format_observation(observation: str) -> str:
    return f"Observation: {observation}"


class ChatTokenizer:
    """Renders messages to token ids and a per-token loss mask with the model's chat template.

    Assumes the template renders each message on its own once the first message is a system
    message (true of ChatML templates such as SmolLM2's); the constructor checks it and refuses
    templates that are not. A conversation that opens with a user turn instead (AgentGym's
    layout) is rendered with the template's own opening before it, where the template allows.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._system = {"role": "system", "content": "S"}
        base = self._render([self._system])
        with_prompt = self._render([self._system], add_generation_prompt=True)
        self.generation_header = with_prompt[len(base) :]
        turn = self._render([self._system, {"role": "assistant", "content": "X"}])[len(base) :]
        if not turn.startswith(self.generation_header + "X"):
            raise ValueError(
                "chat template: assistant turn does not start with the generation prompt"
            )
        self.turn_end = turn[len(self.generation_header) + 1 :]
        sample = [
            self._system,
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ]
        if self._render(sample) != base + "".join(self._chunk_text(m) for m in sample[1:]):
            raise ValueError("chat template does not render messages independently")
        # A conversation may also open with a user turn (AgentGym's layout: the task prompt as the
        # first user turn): the template then renders its own default opening (ChatML templates:
        # their default system message) before it, and the later turns as they would anyway.
        opened = self._render(sample[1:2])
        self.user_first = self._render(sample[1:]) == opened + self._chunk_text(sample[2])
        self.header_ids = self._encode(self.generation_header)
        self.turn_end_ids = self._encode(self.turn_end)
        self.eos_ids = {
            i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None
        }
        self.eos_ids.update(self._encode(self.turn_end.strip()))

    def _render(self, messages, add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _chunk_text(self, message: dict) -> str:
        base = self._render([self._system])
        return self._render([self._system, message])[len(base) :]

    def message_ids(self, message: Message, first: bool = False) -> tuple[list[int], list[int]]:
        """Token ids of one message and its loss mask (1 on the reply and its end marker; on a
        generated turn, on the end marker only if the model generated it)."""
        if message.role == "assistant" and message.token_ids is not None:
            body = self.strip_end(message.token_ids)
            ids = self.header_ids + body + self.turn_end_ids
            flag = int(message.loss)
            end_flag = flag if message.end_generated else 0
            mask = [0] * len(self.header_ids) + [flag] * len(body)
            return ids, mask + [end_flag] * len(self.turn_end_ids)
        as_dict = {"role": message.role, "content": message.content}
        text = self._render([as_dict]) if first else self._chunk_text(as_dict)
        if first and message.role == "assistant":
            raise ValueError("a conversation must start with a system or user message")
        if first and message.role == "user" and not self.user_first:
            raise ValueError(
                "this chat template does not render a conversation that opens with a user turn "
                "message by message; start it with a system message"
            )
        ids = self._encode(text)
        if message.role != "assistant" or not message.loss:
            return ids, [0] * len(ids)
        n_header = len(self.header_ids)
        return ids, [0] * n_header + [1] * (len(ids) - n_header)

    def encode(self, messages: list[Message]) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        mask: list[int] = []
        for i, message in enumerate(messages):
            chunk, chunk_mask = self.message_ids(message, first=i == 0)
            ids += chunk
            mask += chunk_mask
        return ids, mask

    def strip_end(self, token_ids: list[int]) -> list[int]:
        body = list(token_ids)
        while body and body[-1] in self.eos_ids:
            body.pop()
        return body

    def generated_message(
        self,
        text: str,
        token_ids: list[int],
        loss: bool = True,
        logprobs: list[float] | None = None,
    ) -> Message:
        """An assistant turn as the model generated it: its ids without the end token, and
        whether the model generated that end itself (it did not when it stopped on a stop string
        or at max_tokens); `logprobs` (one per generated id) are kept for the ids kept."""
        body = self.strip_end(token_ids)
        return Message(
            role="assistant",
            content=text,
            loss=loss,
            token_ids=body,
            end_generated=len(body) < len(token_ids),
            logprobs=logprobs[: len(body)] if logprobs is not None else None,
        )
