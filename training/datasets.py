"""Token-level training rows built from stored records, with the loss masks the records carry.

Rendering goes through `ChatTokenizer`, the same code that built the rollout prompts, so a
generated turn is trained on exactly the ids that were generated.

Rows longer than `max_length` keep what teaches: the prompt (system message and task) and the
latest agent turns, the ending a trajectory is learned for (its successful final replies). The
oldest whole turns (an agent reply with the observation that answered it) are dropped to make
room, so a row never ends mid-turn and never loses its last reply to a cut. A row that does not
fit even with its last turn alone, or that has no loss token left, is dropped; the counts say how
many were shortened and dropped, and the trainers report them in the stage's metrics.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from flywheel.chat import ChatTokenizer
from flywheel.records import Message, Pair, Trajectory

SIDES = ("chosen", "rejected")


@dataclass
class RowCounts:
    rows: int = 0  # rows kept
    rows_shortened: int = 0  # kept without their oldest turns, to fit max_length
    rows_dropped_too_long: int = 0  # the prompt and the last turn alone exceed max_length
    rows_dropped_no_loss: int = 0  # nothing left to learn from

    def as_metrics(self) -> dict[str, int]:
        return asdict(self)


def token_counts(rows: list[dict]) -> dict[str, int]:
    """Tokens one epoch over `rows` forwards, and those of them that carry loss. A DPO row's
    prompt is forwarded with each side, so it counts twice."""
    sides = {
        "input_ids": "assistant_masks",
        "chosen_ids": "chosen_mask",
        "rejected_ids": "rejected_mask",
    }
    tokens = loss_tokens = 0
    for row in rows:
        for ids, mask in sides.items():
            if ids in row:
                tokens += len(row[ids]) + len(row.get("prompt_ids", []))
                loss_tokens += sum(row[mask])
    return {"tokens_per_epoch": tokens, "loss_tokens_per_epoch": loss_tokens}


def turns(messages: list[Message]) -> list[list[Message]]:
    """Messages grouped into turns: each agent reply with the observation(s) that follow it.

    Messages before the first agent reply form a turn of their own.
    """
    grouped: list[list[Message]] = []
    for message in messages:
        if message.role == "assistant" or not grouped:
            grouped.append([message])
        else:
            grouped[-1].append(message)
    return grouped


def _encode(chat: ChatTokenizer, messages: list[Message]) -> tuple[list[int], list[int]]:
    ids, mask = [], []
    for message in messages:
        chunk, chunk_mask = chat.message_ids(message)
        ids += chunk
        mask += chunk_mask
    return ids, mask


def latest_turns(
    chat: ChatTokenizer, continuation: list[Message], room: int
) -> tuple[list[int], list[int], int] | None:
    """Ids and mask of the longest run of final turns of `continuation` within `room` tokens,
    and how many turns were left out at its start; None when not even the last turn fits."""
    encoded = [_encode(chat, turn) for turn in turns(continuation)]
    ids: list[int] = []
    mask: list[int] = []
    kept = 0
    for turn_ids, turn_mask in reversed(encoded):
        if len(ids) + len(turn_ids) > room:
            break
        ids, mask = turn_ids + ids, turn_mask + mask
        kept += 1
    if kept == 0 and encoded:
        return None
    return ids, mask, len(encoded) - kept


def sft_rows(
    trajectories: list[Trajectory], chat: ChatTokenizer, max_length: int
) -> tuple[list[dict], RowCounts]:
    """`input_ids` + `assistant_masks` (1 = learn this token), each at most `max_length` long.

    See the module docstring for what a long row keeps.
    """
    rows, counts = [], RowCounts()
    for trajectory in trajectories:
        prompt_ids, prompt_mask = chat.encode(trajectory.prompt)
        fitted = latest_turns(chat, trajectory.continuation, max_length - len(prompt_ids))
        if fitted is None:
            counts.rows_dropped_too_long += 1
            continue
        ids, mask, left_out = fitted
        if not any(mask):
            counts.rows_dropped_no_loss += 1
            continue
        counts.rows_shortened += left_out > 0
        counts.rows += 1
        rows.append({"input_ids": prompt_ids + ids, "assistant_masks": prompt_mask + mask})
    return rows, counts


def dpo_rows(
    pairs: list[Pair], chat: ChatTokenizer, max_length: int
) -> tuple[list[dict], RowCounts]:
    """Prompt ids plus chosen/rejected continuation ids, each with its own loss mask.

    Observations inside a continuation keep mask 0, as ETO's multi-turn DPO does. Each side
    keeps its latest turns within `max_length` together with the prompt (see the module
    docstring), so trl never has to cut a row, from either end.
    """
    rows, counts = [], RowCounts()
    for pair in pairs:
        prompt_ids, _ = chat.encode(pair.prompt)
        room = max_length - len(prompt_ids)
        sides = {side: latest_turns(chat, getattr(pair, side), room) for side in SIDES}
        if any(fitted is None for fitted in sides.values()):
            counts.rows_dropped_too_long += 1
            continue
        if not all(any(mask) for _, mask, _ in sides.values()):
            counts.rows_dropped_no_loss += 1
            continue
        row = {"prompt_ids": prompt_ids}
        for side, (ids, mask, _) in sides.items():
            row[f"{side}_ids"], row[f"{side}_mask"] = ids, mask
        counts.rows_shortened += any(left_out for _, _, left_out in sides.values())
        counts.rows += 1
        rows.append(row)
    return rows, counts


def sampled_message_ids(
    chat: ChatTokenizer, message: Message, first: bool = False
) -> tuple[list[int], list[int], list[float | None]]:
    """One message's ids, its RL loss mask and the sampler's log-probability of each id (None
    where not recorded).

    Only tokens the policy sampled carry loss: the ids of a generated turn (one with
    `token_ids`, flagged `loss`) and the first token of its end marker when the model sampled
    it (`end_generated`). The rest of the marker (ChatML's newline after <|im_end|>), the
    header, observations, tool results and turns without ids (expert or revised text, which no
    policy sampled) are context.
    """
    if message.role != "assistant" or message.token_ids is None:
        ids, _ = chat.message_ids(message, first=first)
        return ids, [0] * len(ids), [None] * len(ids)
    body = chat.strip_end(message.token_ids)
    learn = int(message.loss)
    end = [learn if message.end_generated else 0] + [0] * (len(chat.turn_end_ids) - 1)
    recorded = message.logprobs if len(message.logprobs or ()) == len(body) else None
    ids = chat.header_ids + body + chat.turn_end_ids
    mask = [0] * len(chat.header_ids) + [learn] * len(body) + end
    # The end token's probability is not recorded (the sampler's log-probabilities stop with the
    # body): the trainer takes the starting model's for it.
    logprobs = [None] * len(chat.header_ids) + list(recorded or [None] * len(body))
    return ids, mask, logprobs + [None] * len(chat.turn_end_ids)


def rl_rows(
    trajectories: list[Trajectory], chat: ChatTokenizer, max_length: int
) -> tuple[list[dict], RowCounts]:
    """`input_ids`, `assistant_masks` (1 = a token the policy sampled), `logprobs` (the
    sampler's, None where not recorded), `reward` and `group_id`, one row per trajectory; for
    GiGPO, `turn_of_token` (the index of the sampled turn each id belongs to, -1 for context) and
    `turn_anchors` (per sampled turn, a digest of every environment message before it: the state
    the turn acted from. Not the last observation alone: TextCraft's "Got 1 oak log" is met in
    many states, as is a search result at different points of a QA episode).

    A row holds the whole chat as it was sampled (worked examples included): the importance
    ratio compares probabilities in the context the tokens were drawn in, so nothing is cut.
    A trajectory longer than `max_length` is left out, as is one with nothing sampled in it.
    """
    rows, counts = [], RowCounts()
    for trajectory in trajectories:
        ids, mask, logprobs, turn_of_token, anchors = [], [], [], [], []
        seen = hashlib.sha256()  # what the environment has shown so far: the state acted from
        for position, message in enumerate(trajectory.messages):
            chunk = sampled_message_ids(chat, message, first=position == 0)
            ids, mask, logprobs = ids + chunk[0], mask + chunk[1], logprobs + chunk[2]
            sampled = any(chunk[1])
            turn_of_token += [len(anchors) if m else -1 for m in chunk[1]]
            if sampled:
                anchors.append(seen.hexdigest())
            elif message.role != "assistant":
                seen.update(json.dumps([message.role, message.content]).encode())
        if len(ids) > max_length:
            counts.rows_dropped_too_long += 1
        elif not any(mask):
            counts.rows_dropped_no_loss += 1
        else:
            counts.rows += 1
            rows.append({
                "input_ids": ids, "assistant_masks": mask, "logprobs": logprobs,
                "reward": trajectory.reward, "group_id": trajectory.group_id,
                "turn_of_token": turn_of_token, "turn_anchors": anchors,
            })  # fmt: skip
    return rows, counts
