"""Training rows: what a row keeps when it is longer than max_length, the loss masks of SFT and
DPO rows position by position, and the DPO collator's completion mask under trl's truncation."""

from __future__ import annotations

import pytest

from flywheel.records import Message, Pair, Trajectory
from training.datasets import RowCounts, dpo_rows, rl_rows, sft_rows, turns

SYSTEM = Message(role="system", content="You craft items.")
TASK = Message(role="user", content="Goal: craft x.")


def reply(i: int, loss: bool = True) -> Message:
    return Message(role="assistant", content=f"Thought: step {i}\nAction: get {i} a", loss=loss)


def seen(i: int) -> Message:
    return Message(role="user", content=f"Observation: Got {i} a")


def episode(steps: int, loss: bool = True, final: str = "craft 1 x using 1 a") -> Trajectory:
    """`steps` agent turns; the last one is the successful craft."""
    messages = [SYSTEM, TASK]
    for i in range(steps - 1):
        messages += [reply(i, loss), seen(i)]
    messages.append(Message(role="assistant", content=f"Action: {final}", loss=loss))
    return Trajectory(task_id="x", env="e", messages=messages, episode_start=1, reward=1.0,
                      success=True, n_steps=steps)  # fmt: skip


def lengths(chat, messages: list[Message]) -> list[int]:
    return [len(chat.message_ids(m)[0]) for m in messages]


def test_turns_group_each_reply_with_what_answered_it():
    messages = [reply(0), seen(0), reply(1), seen(1), seen(2), reply(2)]
    assert turns(messages) == [[reply(0), seen(0)], [reply(1), seen(1), seen(2)], [reply(2)]]
    assert turns([seen(0), reply(1)]) == [[seen(0)], [reply(1)]]
    assert turns([]) == []


def test_a_row_that_fits_is_the_whole_rendered_conversation(chat):
    trajectory = episode(4)
    ids, mask = chat.encode(trajectory.training_messages)
    rows, counts = sft_rows([trajectory], chat, max_length=len(ids))  # exactly at the limit
    assert rows == [{"input_ids": ids, "assistant_masks": mask}]
    assert counts == RowCounts(rows=1)


def test_a_long_row_keeps_its_prompt_and_latest_turns_and_drops_the_oldest(chat):
    trajectory = episode(12)
    prompt_ids, prompt_mask = chat.encode(trajectory.prompt)
    continuation = trajectory.continuation
    per_message = lengths(chat, continuation)
    # Room for the last three turns (2 + 2 + 1 messages) and one token less than four.
    last_three = sum(per_message[-5:])
    max_length = len(prompt_ids) + sum(per_message[-7:]) - 1
    (row,), counts = sft_rows([trajectory], chat, max_length)
    assert counts == RowCounts(rows=1, rows_shortened=1)
    kept = [*trajectory.prompt, *continuation[-5:]]
    assert row["input_ids"] == chat.encode(kept)[0]
    assert row["assistant_masks"] == chat.encode(kept)[1]
    assert len(row["input_ids"]) == len(prompt_ids) + last_three <= max_length
    assert row["input_ids"][: len(prompt_ids)] == prompt_ids  # system message and task kept
    assert row["assistant_masks"][: len(prompt_mask)] == [0] * len(prompt_mask)
    learned = chat.tokenizer.decode(
        [i for i, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
    )
    # The successful ending is what the row teaches; the dropped turns are gone entirely.
    assert learned.endswith("Action: craft 1 x using 1 a<|im_end|>\n")
    assert "step 9" in learned and "step 8" not in learned


def test_rows_too_long_for_their_last_turn_or_with_nothing_to_learn_are_dropped_and_counted(chat):
    trajectory = episode(3)
    prompt_len = len(chat.encode(trajectory.prompt)[0])
    last_turn = lengths(chat, trajectory.continuation)[-1]
    rows, counts = sft_rows([trajectory], chat, prompt_len + last_turn - 1)
    assert rows == [] and counts == RowCounts(rows_dropped_too_long=1)
    rows, counts = sft_rows([trajectory], chat, prompt_len + last_turn)
    assert len(rows) == 1 and counts == RowCounts(rows=1, rows_shortened=1)
    rows, counts = sft_rows([episode(3, loss=False), trajectory], chat, 4096)
    assert len(rows) == 1 and counts == RowCounts(rows=1, rows_dropped_no_loss=1)
    assert counts.as_metrics() == {
        "rows": 1, "rows_shortened": 0, "rows_dropped_too_long": 0, "rows_dropped_no_loss": 1,
    }  # fmt: skip


def test_a_row_missing_only_its_oldest_turn_counts_as_shortened(chat):
    trajectory = episode(3)  # turns: (reply, observation) twice, then the final reply
    prompt_len = len(chat.encode(trajectory.prompt)[0])
    per_message = lengths(chat, trajectory.continuation)
    (row,), counts = sft_rows([trajectory], chat, prompt_len + sum(per_message[-3:]))
    assert counts == RowCounts(rows=1, rows_shortened=1)
    assert row["input_ids"] == chat.encode([*trajectory.prompt, *trajectory.continuation[-3:]])[0]


def pair(chosen_turns: int, rejected_turns: int) -> Pair:
    chosen = episode(chosen_turns).continuation
    rejected = [m.model_copy(update={"content": m.content.replace("get", "fetch")})
                for m in episode(rejected_turns, final="inventory").continuation]  # fmt: skip
    return Pair(task_id="x", prompt=[SYSTEM, TASK], chosen=chosen, rejected=rejected,
                chosen_reward=1.0, rejected_reward=0.0)  # fmt: skip


def expected_mask(chat, messages: list[Message]) -> list[int]:
    """1 on every token of an agent turn after its header, 0 on observations: built from the
    message boundaries, independently of ChatTokenizer's own masks."""
    mask = []
    for message, n in zip(messages, lengths(chat, messages), strict=True):
        if message.role == "assistant":
            header = len(chat.header_ids)
            mask += [0] * header + [1] * (n - header)
        else:
            mask += [0] * n
    return mask


def test_dpo_rows_mask_observations_position_by_position(chat):
    p = pair(3, 4)
    (row,), counts = dpo_rows([p], chat, max_length=4096)
    assert counts == RowCounts(rows=1)
    assert row["prompt_ids"] == chat.encode(p.prompt)[0]
    for side in ("chosen", "rejected"):
        messages = getattr(p, side)
        assert row[f"{side}_ids"] == [i for m in messages for i in chat.message_ids(m)[0]]
        assert row[f"{side}_mask"] == expected_mask(chat, messages)
    observation = chat.message_ids(p.chosen[1])[0]
    start = len(chat.message_ids(p.chosen[0])[0])
    assert row["chosen_ids"][start : start + len(observation)] == observation
    assert row["chosen_mask"][start : start + len(observation)] == [0] * len(observation)


def test_long_dpo_sides_keep_their_latest_turns_and_hopeless_pairs_are_counted(chat):
    p = pair(10, 1)  # a one-turn rejected side: short, kept whole
    prompt_len = len(chat.encode(p.prompt)[0])
    chosen_lengths = lengths(chat, p.chosen)
    max_length = prompt_len + sum(chosen_lengths[-3:])  # the chosen side's last two turns
    (row,), counts = dpo_rows([p], chat, max_length)
    assert counts == RowCounts(rows=1, rows_shortened=1)
    assert row["chosen_ids"] == [i for m in p.chosen[-3:] for i in chat.message_ids(m)[0]]
    assert row["chosen_mask"] == expected_mask(chat, p.chosen[-3:])
    assert row["rejected_ids"] == [i for m in p.rejected for i in chat.message_ids(m)[0]]
    assert max(len(row["chosen_ids"]), len(row["rejected_ids"])) + prompt_len <= max_length
    rows, counts = dpo_rows([p], chat, prompt_len + chosen_lengths[-1] - 1)
    assert rows == [] and counts == RowCounts(rows_dropped_too_long=1)
    silent = p.model_copy(update={"rejected": [m.model_copy(update={"loss": False})
                                               for m in p.rejected]})  # fmt: skip
    rows, counts = dpo_rows([silent], chat, 4096)
    assert rows == [] and counts == RowCounts(rows_dropped_no_loss=1)


def torch_int64():
    import torch

    return torch.int64


@pytest.fixture(scope="module")
def collator_rows(chat):
    rows, _ = dpo_rows([pair(3, 2), pair(2, 4)], chat, max_length=4096)
    return rows


@pytest.mark.parametrize("truncation_mode", ["keep_start", "keep_end"])
def test_the_collator_masks_follow_the_tokens_trl_keeps(chat, collator_rows, truncation_mode):
    from training.dpo import MaskedPreferenceCollator

    cut = 40  # shorter than every sequence: trl cuts each one
    collator = MaskedPreferenceCollator(
        pad_token_id=chat.tokenizer.pad_token_id, max_length=cut, truncation_mode=truncation_mode
    )
    batch = collator.torch_call(collator_rows)
    kept = slice(None, cut) if truncation_mode == "keep_start" else slice(-cut, None)
    sequences = [(r["prompt_ids"], r["chosen_ids"], r["chosen_mask"]) for r in collator_rows]
    sequences += [(r["prompt_ids"], r["rejected_ids"], r["rejected_mask"]) for r in collator_rows]
    for index, (prompt, ids, mask) in enumerate(sequences):
        want_ids = (prompt + ids)[kept]
        want_mask = ([0] * len(prompt) + mask)[kept]
        assert batch["input_ids"][index].tolist() == want_ids
        assert batch["completion_mask"][index].tolist() == want_mask


def test_the_collator_masks_observations_and_padding(chat, collator_rows):
    from training.dpo import MaskedPreferenceCollator

    collator = MaskedPreferenceCollator(pad_token_id=chat.tokenizer.pad_token_id)
    batch = collator.torch_call(collator_rows)
    width = batch["input_ids"].shape[1]
    # trl's own dtype: the loss multiplies and indexes with it (a float mask would not index).
    assert batch["completion_mask"].dtype == batch["attention_mask"].dtype == torch_int64()
    sides = [(r["prompt_ids"], r["chosen_mask"]) for r in collator_rows]
    sides += [(r["prompt_ids"], r["rejected_mask"]) for r in collator_rows]
    for index, (prompt, mask) in enumerate(sides):
        row = [0] * len(prompt) + mask
        assert batch["completion_mask"][index].tolist() == row + [0] * (width - len(row))
        assert batch["attention_mask"][index].tolist() == [1] * len(row) + [0] * (width - len(row))
    # trl alone would mark the whole continuation, observations included.
    completions = sum(
        len(r[f"{side}_ids"]) for r in collator_rows for side in ("chosen", "rejected")
    )
    assert 0 < batch["completion_mask"].sum() < completions


def test_row_counts_add_up_over_many_rows(chat):
    fits, long = episode(2), episode(12)
    silent = episode(2, loss=False)
    prompt_len = len(chat.encode(fits.prompt)[0])
    room = sum(lengths(chat, fits.continuation))  # all of `fits`, part of `long`
    huge = episode(2, final="craft 1 x using " + "1 a, " * 400 + "1 a")
    rows, counts = sft_rows([huge, silent, long, fits, huge, silent, long, fits], chat,
                            prompt_len + room)  # fmt: skip
    assert counts == RowCounts(rows=4, rows_shortened=2, rows_dropped_too_long=2,
                               rows_dropped_no_loss=2)  # fmt: skip
    assert len(rows) == 4 and rows[1] == rows[3]  # `fits`, whole, twice


def test_token_counts_forward_a_dpo_prompt_with_each_side():
    from training.datasets import token_counts

    sft = [{"input_ids": [1, 2, 3, 4], "assistant_masks": [0, 0, 1, 1]}]
    assert token_counts(sft) == {"tokens_per_epoch": 4, "loss_tokens_per_epoch": 2}
    dpo = [
        {
            "prompt_ids": [1, 2],
            "chosen_ids": [3, 4, 5],
            "chosen_mask": [1, 0, 1],
            "rejected_ids": [6],
            "rejected_mask": [1],
        }
    ]
    assert token_counts(dpo) == {"tokens_per_epoch": 2 + 3 + 2 + 1, "loss_tokens_per_epoch": 3}


def test_dpo_row_counts_add_up_over_many_pairs(chat):
    p = pair(10, 1)
    prompt_len = len(chat.encode(p.prompt)[0])
    max_length = prompt_len + sum(lengths(chat, p.chosen)[-3:])  # p's chosen side is shortened
    silent = p.model_copy(update={"rejected": [m.model_copy(update={"loss": False})
                                               for m in p.rejected]})  # fmt: skip
    rows, counts = dpo_rows([silent, p, silent, p], chat, max_length)
    assert counts == RowCounts(rows=2, rows_shortened=2, rows_dropped_no_loss=2)
    assert len(rows) == 2 and rows[0] == rows[1]


def sampled_answer(chat, text: str = "<answer>blue</answer>") -> Message:
    ids = chat.tokenizer(text, add_special_tokens=False)["input_ids"]
    return Message(role="assistant", content=text, loss=True, token_ids=ids, end_generated=True)


def rl_episode(messages: list[Message]) -> Trajectory:
    return Trajectory(task_id="q", env="qa", messages=messages, episode_start=1, reward=1.0)


def test_an_rl_row_opens_as_the_template_renders_a_chat_that_starts_with_the_user(chat):
    question, answer = Message(role="user", content="Which colour?"), sampled_answer(chat)
    (row,), _ = rl_rows([rl_episode([question, answer])], chat, 512)
    opening, _ = chat.encode([question])  # SmolLM2's template adds its default system prompt
    assert chat.tokenizer.decode(opening).startswith("<|im_start|>system\nYou are a helpful")
    body = chat.header_ids + answer.token_ids + chat.turn_end_ids
    assert row["input_ids"] == opening + body


def test_sampler_logprobs_of_another_length_than_the_reply_are_not_used(chat):
    answer = sampled_answer(chat)
    answer.logprobs = [-0.5] * (len(answer.token_ids) + 1)  # one for the end token as well
    (row,), _ = rl_rows([rl_episode([SYSTEM, TASK, answer])], chat, 512)
    assert row["logprobs"] == [None] * len(row["input_ids"])


def test_an_rl_row_of_exactly_max_length_is_kept_and_every_longer_one_counted(chat):
    trajectory = rl_episode([SYSTEM, TASK, sampled_answer(chat)])
    (row,), _ = rl_rows([trajectory], chat, 512)
    exact = len(row["input_ids"])
    rows, counts = rl_rows([trajectory, trajectory, trajectory], chat, exact)
    assert len(rows) == 3 and counts == RowCounts(rows=3)
    rows, counts = rl_rows([trajectory, trajectory, trajectory], chat, exact - 1)
    assert rows == [] and counts == RowCounts(rows_dropped_too_long=3)
