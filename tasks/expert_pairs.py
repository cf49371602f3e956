"""Stage: IPR's SFT term for the DPO stage, as pairs: expert trajectories paired with themselves.

IPR (Xiong et al., 2024) trains on trajectory DPO + step DPO + SFT on the expert's trajectories;
without the SFT term it fell below SFT. trl's DPO loss with an NLL term (`dpo.nll_weight`) puts
the NLL on a pair's chosen side only, so the expert's behaviour on tasks no pair is about has no
anchor: on the QA world, step pairs that all said "call python after two lookups" taught the
policy to call python on every two-lookup question (docs/notebook.md, candidate 4).

An expert trajectory enters DPO as a pair whose two sides are the same: its preference term is
log 2 whatever the policy, so its gradient is zero, and its NLL term is SFT on the expert's turns.
The training log scores only the true pairs' margins (`training.dpo.pair_margins`).
"""

from __future__ import annotations

import random

from pydantic import BaseModel, Field

from flywheel.records import Pair, Trajectory
from flywheel.stage import StageResult, StageRun, stage
from tasks.build_pairs import ends_on_agent
from tasks.mix_general import draw_cycling


def self_pair(trajectory: Trajectory) -> Pair | None:
    """`trajectory` as a pair with itself (None when it has no agent turn to learn)."""
    side = ends_on_agent(trajectory.continuation)
    if not any(m.role == "assistant" for m in side):
        return None
    return Pair(
        task_id=trajectory.task_id,
        prompt=trajectory.prompt,
        chosen=side,
        rejected=side,
        chosen_reward=trajectory.reward,
        rejected_reward=trajectory.reward,
    )


def is_self_pair(pair: Pair) -> bool:
    return pair.chosen == pair.rejected


def expert_pairs(expert: list[Trajectory], wanted: int, seed: int) -> list[Pair]:
    """`wanted` self-pairs of successful expert trajectories, drawn with `seed` without
    replacement while they last (the order is the expert file's, so the draw is the seed's)."""
    usable = [p for t in expert if t.success and (p := self_pair(t)) is not None]
    return draw_cycling(usable, wanted, random.Random(f"expert-pairs:{seed}"))


class ExpertPairsInputs(BaseModel):
    """How many expert trajectories join the round's DPO, and from where."""

    expert_url: str
    count: int = Field(ge=0)  # the round's preference pairs x `explore.expert_sft_ratio`
    seed: int


@stage("expert-pairs")
def expert_pairs_stage(inputs: ExpertPairsInputs, run: StageRun) -> StageResult:
    expert = run.store.read_records(inputs.expert_url, Trajectory)
    pairs = expert_pairs(expert, inputs.count, inputs.seed)
    return StageResult(
        files={"pairs": run.store.write_records(run.file("pairs.jsonl"), pairs)},
        counts={"pairs": len(pairs), "expert_trajectories": len(expert)},
    )
