"""Token-level training rows built from stored records, with the loss masks the records carry.

Rendering goes through `ChatTokenizer`, the same code that built the rollout prompts, so a
generated turn is trained on exactly the ids that were generated.
"""

from __future__ import annotations

from flywheel.chat import ChatTokenizer
from flywheel.records import Pair, Trajectory


def sft_rows(trajectories: list[Trajectory], chat: ChatTokenizer, max_length: int) -> list[dict]:
    """`input_ids` + `assistant_masks` (1 = learn this token), truncated to `max_length`.

    Rows whose loss tokens all fall beyond `max_length` are dropped: they would teach nothing.
    """
    rows = []
    for trajectory in trajectories:
        ids, mask = chat.encode(trajectory.training_messages)
        ids, mask = ids[:max_length], mask[:max_length]
        if any(mask):
            rows.append({"input_ids": ids, "assistant_masks": mask})
    return rows


def dpo_rows(pairs: list[Pair], chat: ChatTokenizer, max_length: int) -> list[dict]:
    """Prompt ids plus chosen/rejected continuation ids, each with its own loss mask.

    Observations inside a continuation keep mask 0, as ETO's multi-turn DPO does.
    """
    rows = []
    for pair in pairs:
        prompt_ids, _ = chat.encode(pair.prompt)
        if len(prompt_ids) >= max_length:
            continue
        row = {"prompt_ids": prompt_ids}
        for side in ("chosen", "rejected"):
            ids, mask = [], []
            for message in getattr(pair, side):
                chunk, chunk_mask = chat.message_ids(message)
                ids += chunk
                mask += chunk_mask
            row[f"{side}_ids"], row[f"{side}_mask"] = ids, mask
        rows.append(row)
    return rows
