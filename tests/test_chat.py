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
