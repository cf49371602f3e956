"""Stage: Agent-R's revision SFT data with general instruction data mixed in (eta).

Agent-R trains on revision trajectories plus a share eta of general chat examples, so that the
policy keeps answering in general while it learns to revise. A set of n trajectories gets
round(n * eta / (1 - eta)) general examples, drawn without replacement while they last.
"""

from __future__ import annotations

import json
import random

from pydantic import BaseModel

from flywheel.records import Message, Trajectory
from flywheel.stage import StageResult, StageRun, stage

GENERAL_SYSTEM_PROMPT = "You are a helpful assistant."


def general_trajectory(index: int, instruction: str, response: str) -> Trajectory:
    return Trajectory(
        task_id=f"general-{index}",
        env="general",
        messages=[
            Message(role="system", content=GENERAL_SYSTEM_PROMPT),
            Message(role="user", content=instruction),
            Message(role="assistant", content=response, loss=True),
        ],
        episode_start=1,
        success=True,
        n_steps=1,
        source="general",
        finish_reason="done",
    )


def read_general(text: str, where: str) -> list[Trajectory]:
    examples = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            examples.append(general_trajectory(number, row["instruction"], row["response"]))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{where}, line {number}: not an instruction/response row ({error!r})"
            ) from None
    return examples


def general_share(count: int, eta: float) -> int:
    """How many general examples make them a share `eta` of the mixed set."""
    return round(count * eta / (1 - eta))


def draw_cycling(items: list, wanted: int, rng: random.Random) -> list:
    """`wanted` of `items` drawn with `rng`: without replacement while they last, then again
    from all of them (none from an empty list)."""
    drawn = []
    while items and len(drawn) < wanted:
        drawn += rng.sample(items, min(len(items), wanted - len(drawn)))
    return drawn


def mix(
    trajectories: list[Trajectory], general: list[Trajectory], eta: float, seed: int
) -> list[Trajectory]:
    rng = random.Random(seed)
    mixed = trajectories + draw_cycling(general, general_share(len(trajectories), eta), rng)
    rng.shuffle(mixed)
    return mixed


class MixGeneralInputs(BaseModel):
    """Revision trajectories and a file of general instruction/response rows to mix in."""

    data_url: str
    general_url: str  # a URL, so the cache keys on the file's content (`GeneralDataSettings.url`)
    eta: float
    seed: int


@stage("mix-general")
def mix_general_stage(inputs: MixGeneralInputs, run: StageRun) -> StageResult:
    store = run.store
    trajectories = store.read_records(inputs.data_url, Trajectory)
    examples = read_general(store.read_text(inputs.general_url), inputs.general_url)
    mixed = mix(trajectories, examples, inputs.eta, inputs.seed)
    return StageResult(
        files={"trajectories": store.write_records(run.file("trajectories.jsonl"), mixed)},
        counts={"trajectories": len(trajectories), "general": len(mixed) - len(trajectories)},
    )
