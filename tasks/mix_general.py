"""Stage: Agent-R's revision SFT data with general instruction data mixed in (eta).

Agent-R trains on revision trajectories plus a share eta of general chat examples, so that the
policy keeps answering in general while it learns to revise. A set of n trajectories gets
round(n * eta / (1 - eta)) general examples, drawn without replacement while they last.
"""

from __future__ import annotations

import json
import random

from flywheel.records import Manifest, Message, Trajectory
from flywheel.settings import GeneralDataSettings
from flywheel.stage import stage_task, store_for

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


def mix(
    trajectories: list[Trajectory], general: list[Trajectory], eta: float, seed: int
) -> list[Trajectory]:
    wanted = general_share(len(trajectories), eta)
    rng = random.Random(seed)
    drawn = []
    while general and len(drawn) < wanted:  # without replacement, then again from the top
        drawn += rng.sample(general, min(len(general), wanted - len(drawn)))
    mixed = trajectories + drawn
    rng.shuffle(mixed)
    return mixed


@stage_task("mix-general")
def mix_general_stage(
    store_url: str, data_url: str, general: GeneralDataSettings, seed: int, out_url: str
) -> Manifest:
    store = store_for(store_url)
    inputs = {"data": data_url, "general": general.url, "eta": general.eta, "seed": seed}
    if (done := store.manifest(out_url, inputs)) is not None:
        return done
    trajectories = store.read_records(data_url, Trajectory)
    examples = read_general(store.read_text(general.url), general.url)
    mixed = mix(trajectories, examples, general.eta, seed)
    url = store.write_records(f"{out_url}/trajectories.jsonl", mixed)
    return store.publish(
        Manifest(
            stage="mix-general",
            url=out_url,
            files={"trajectories": url},
            counts={"trajectories": len(trajectories), "general": len(mixed) - len(trajectories)},
        ),
        inputs,
    )
