import pytest

from flywheel.chat import FORMAT_HINT, parse_reply
from flywheel.records import Message


def test_parse_reply_reads_thought_and_action():
    reply = parse_reply("Thought: I need planks.\nAction: get 1 oak log")
    assert reply.thought == "I need planks."
    assert reply.action == "get 1 oak log"
    assert reply.error is None


def test_parse_reply_first_action_wins_and_is_case_insensitive():
    reply = parse_reply(
        "thought: a\nACTION:  craft 4 oak planks using 1 oak log \nAction: inventory"
    )
    assert reply.action == "craft 4 oak planks using 1 oak log"


def test_parse_reply_strips_quotes_and_backticks():
    assert parse_reply("Action: `inventory`").action == "inventory"
    assert parse_reply("Action: 'craft 1 X'").action == "craft 1 X"  # only quotes are stripped


def test_parse_reply_malformed_or_empty_gives_format_hint():
    for text in ["", "I will get a log", "Thought: hmm", "Action:", "Action:   \n"]:
        reply = parse_reply(text)
        assert reply.action is None
        assert reply.error == FORMAT_HINT


def test_parse_reply_very_long_action_is_refused_not_truncated():
    reply = parse_reply("Action: get " + "1" * 5000)
    assert reply.action is None
    assert "too long" in reply.error


def test_encode_matches_chat_template_and_masks_only_agent_turns(chat):
    messages = [
        Message(role="system", content="sys"),
        Message(role="user", content="Goal: craft x."),
        Message(role="assistant", content="Thought: t\nAction: get 1 a", loss=True),
        Message(role="user", content="Observation: Got 1 a"),
        Message(role="assistant", content="Thought: u\nAction: inventory", loss=False),
    ]
    ids, mask = chat.encode(messages)
    template = chat.tokenizer.apply_chat_template(
        [m.model_dump(include={"role", "content"}) for m in messages], tokenize=False
    )
    assert chat.tokenizer.decode(ids) == template
    learned = chat.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert learned == "Thought: t\nAction: get 1 a<|im_end|>\n"


def test_generated_token_ids_are_used_verbatim(chat):
    # Ids that decode to the same text but are not what the tokenizer would produce.
    odd = [chat.tokenizer.convert_tokens_to_ids(c) for c in ["T", "h", "o"]]
    message = Message(role="assistant", content="Tho", loss=True, token_ids=odd + [2])
    ids, mask = chat.message_ids(message)
    assert ids == chat.header_ids + odd + chat.turn_end_ids
    assert mask == [0] * len(chat.header_ids) + [1] * (len(odd) + len(chat.turn_end_ids))


def test_a_turn_end_the_model_did_not_generate_carries_no_loss(chat):
    reply = chat.tokenizer("Thought: t\nAction: inventory", add_special_tokens=False)["input_ids"]
    # Stopped on its end token: the end is the model's own, and learned.
    ended = chat.generated_message(
        "Thought: t\nAction: inventory", reply + [chat.tokenizer.eos_token_id]
    )
    # Stopped on a stop string (or max_tokens): the end marker is added for it, not learned.
    cut = chat.generated_message("Thought: t\nAction: inventory", reply)
    assert ended.token_ids == cut.token_ids == reply
    assert (ended.end_generated, cut.end_generated) == (True, False)
    header, end = len(chat.header_ids), len(chat.turn_end_ids)
    ids, mask = chat.message_ids(ended)
    assert ids == chat.header_ids + reply + chat.turn_end_ids
    assert mask == [0] * header + [1] * len(reply) + [1] * end
    ids, mask = chat.message_ids(cut)
    assert ids == chat.header_ids + reply + chat.turn_end_ids  # the prompt still closes the turn
    assert mask == [0] * header + [1] * len(reply) + [0] * end
    # A turn without loss learns nothing, its end included.
    quiet = ended.model_copy(update={"loss": False})
    assert chat.message_ids(quiet)[1] == [0] * (header + len(reply) + end)


class CharTokenizer:
    """One token per character (its code point) and a ChatML-like template written out here,
    so every id ChatTokenizer derives from the template can be worked out by hand."""

    eos_token_id = 2

    def __init__(self, template=None, pad_token_id=None):
        self.template = template or chatml
        self.pad_token_id = pad_token_id

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False
        return self.template(messages, add_generation_prompt)

    def __call__(self, text, add_special_tokens):
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}


def chatml(messages, add_generation_prompt):
    text = "".join(f"<{m['role']}>{m['content']}</s>\n" for m in messages)
    return text + ("<assistant>" if add_generation_prompt is True else "")


def codes(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_the_turn_header_and_end_are_read_from_the_template():
    from flywheel.chat import ChatTokenizer

    chat = ChatTokenizer(CharTokenizer())
    assert (chat.generation_header, chat.turn_end) == ("<assistant>", "</s>\n")
    assert chat.header_ids == codes("<assistant>") and chat.turn_end_ids == codes("</s>\n")
    # The end-of-sequence token and the turn end without its newline end a generated reply.
    assert chat.eos_ids == {2, *codes("</s>")}
    padded = ChatTokenizer(CharTokenizer(pad_token_id=7))
    assert padded.eos_ids == {2, 7, *codes("</s>")}
    assert padded.strip_end(codes("ab") + [7, 2, ord(">")]) == codes("ab")
    assert padded.strip_end([7, 2]) == [] and padded.strip_end([]) == []
    assert padded.strip_end(codes("a>b")) == codes("a>b")  # only a trailing end is cut


def test_every_message_is_rendered_exactly_and_masked_by_hand():
    from flywheel.chat import ChatTokenizer

    chat = ChatTokenizer(CharTokenizer())
    messages = [
        Message(role="system", content="S1"),
        Message(role="user", content="go"),
        Message(role="assistant", content="ok", loss=True),
        Message(role="assistant", content="no", loss=False),
        Message(role="assistant", content="hi", loss=True, token_ids=codes("hi") + [2]),
    ]
    ids, mask = chat.encode(messages)
    assert ids == codes(
        "<system>S1</s>\n<user>go</s>\n<assistant>ok</s>\n<assistant>no</s>\n<assistant>hi</s>\n"
    )
    header = len("<assistant>")
    assert mask == (
        [0] * len("<system>S1</s>\n<user>go</s>\n")
        + [0] * header + [1] * len("ok</s>\n")
        + [0] * len("<assistant>no</s>\n")
        + [0] * header + [1] * len("hi") + [1] * len("</s>\n")
    )  # fmt: skip
    assert chat.message_ids(messages[0], first=True) == (codes("<system>S1</s>\n"), [0] * 15)
    # A conversation may open with a user turn (AgentGym's layout: the task prompt, then "OK"),
    # rendered as the template renders it; never with an assistant turn.
    assert chat.encode(messages[1:3]) == (
        codes("<user>go</s>\n<assistant>ok</s>\n"),
        [0] * len("<user>go</s>\n<assistant>") + [1] * len("ok</s>\n"),
    )
    opening = "^a conversation must start with a system or user message$"
    with pytest.raises(ValueError, match=opening):
        chat.message_ids(messages[2], first=True)
    with pytest.raises(ValueError, match=opening):
        chat.encode(messages[2:])
    generated = chat.generated_message("hi", codes("hi"), loss=False)
    assert (generated.role, generated.content, generated.loss) == ("assistant", "hi", False)
    assert (generated.token_ids, generated.end_generated) == (codes("hi"), False)
    assert chat.generated_message("hi", codes("hi") + [2]).loss is True


def test_templates_it_cannot_render_turn_by_turn_are_refused():
    from flywheel.chat import ChatTokenizer

    def other_header(messages, add_generation_prompt):  # the prompt is not the turn's start
        text = "".join(f"<{m['role']}>{m['content']}</s>\n" for m in messages)
        return text + ("<bot>" if add_generation_prompt else "")

    with pytest.raises(ValueError) as error:
        ChatTokenizer(CharTokenizer(other_header))
    assert str(error.value) == (
        "chat template: assistant turn does not start with the generation prompt"
    )

    def numbered(messages, add_generation_prompt):  # each message's text depends on its place
        text = "".join(f"<{m['role']} {i}>{m['content']}</s>\n" for i, m in enumerate(messages))
        return text + (f"<assistant {len(messages)}>" if add_generation_prompt else "")

    with pytest.raises(ValueError) as error:
        ChatTokenizer(CharTokenizer(numbered))
    assert str(error.value) == "chat template does not render messages independently"


def test_a_user_first_conversation_is_refused_where_the_template_merges_its_opening():
    from flywheel.chat import ChatTokenizer

    def merged(messages, add_generation_prompt):  # no system message: the first two share a block
        if len(messages) > 1 and messages[0]["role"] != "system":
            first, second, *rest = messages
            messages = [{"role": "pair", "content": f"{first['content']}|{second['content']}"}]
            messages += rest
        return chatml(messages, add_generation_prompt)

    chat = ChatTokenizer(CharTokenizer(merged))
    assert not chat.user_first and ChatTokenizer(CharTokenizer()).user_first
    assert chat.encode([Message(role="system", content="S"), Message(role="user", content="go")])
    with pytest.raises(ValueError, match="opens with a user turn"):
        chat.encode([Message(role="user", content="go"), Message(role="assistant", content="ok")])


def test_parse_reply_limits_actions_to_200_characters_and_names_the_length():
    from flywheel.chat import MAX_ACTION_CHARS, ParsedReply

    assert MAX_ACTION_CHARS == 200
    longest = "get " + "1" * 196
    assert parse_reply(f"Thought: t\nAction: {longest}") == ParsedReply("t", longest, None)
    assert parse_reply(f"Thought: t\nAction: {longest}1") == ParsedReply(
        "t", None, "Action too long (201 characters)."
    )


def test_parse_reply_keeps_a_thought_over_lines_and_strips_quotes_inside_spaces():
    from flywheel.chat import ParsedReply

    text = "  Thought:  first line\nsecond line \n  action : \"` craft 1 x '  \nAction: get"
    assert parse_reply(text) == ParsedReply("first line\nsecond line", "craft 1 x", None)
    assert parse_reply("Action: inventory") == ParsedReply("", "inventory", None)
    assert parse_reply("THOUGHT: only thinking") == ParsedReply("only thinking", None, FORMAT_HINT)
    assert parse_reply("Thought: a\nAction: '' ") == ParsedReply("a", None, FORMAT_HINT)


def test_replies_and_observations_are_formatted_as_the_agent_reads_them():
    from flywheel.chat import format_observation, format_reply

    assert format_reply("t", "get 1 a") == "Thought: t\nAction: get 1 a"
    assert format_observation("Got 1 a") == "Observation: Got 1 a"
