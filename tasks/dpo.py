"""Stage: DPO on preference pairs (trl DPOTrainer in its own process), ETO's β and lr."""

from __future__ import annotations

from pydantic import BaseModel

from flywheel.records import Pair
from flywheel.settings import DPOSettings
from flywheel.stage import StageResult, StageRun, stage
from tasks.expert_pairs import is_self_pair
from training.launch import trained_model


def dpo_trl_args(settings: DPOSettings) -> dict:
    """trl's DPOConfig arguments from the round's settings (the seed is the job's own field)."""
    return {
        "beta": settings.beta,
        "learning_rate": settings.learning_rate,
        "num_train_epochs": settings.epochs,
        "gradient_accumulation_steps": settings.accumulation_steps,
        # The reference model's log-probabilities, once per round before the first step instead
        # of a reference forward every step: same losses, 1.2-1.4x the trained tokens/s on 2
        # cores (bench/results-train-throughput.md).
        "precompute_ref_log_probs": True,
        **nll_term(settings.nll_weight),
        **settings.trl_args,
    }


def nll_term(weight: float) -> dict:
    """trl's arguments for DPO's loss plus `weight` x the chosen side's NLL (none for 0)."""
    return {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, weight]} if weight else {}


class DPOInputs(BaseModel):
    """The policy to improve, its preference pairs, and DPO's reference model."""

    model_url: str
    # `Pair` records: chosen and rejected continuations of one prompt (trajectory pairs, then
    # step pairs and expert trajectories paired with themselves where the round makes them).
    pairs_urls: list[str]
    settings: DPOSettings  # the round's: `DPOSettings.for_round`
    seed: int
    reference_url: str | None = None  # None: the policy itself (`DPOSettings.reference`)


@stage("dpo", launches=("training.dpo",))
def dpo_stage(inputs: DPOInputs, run: StageRun) -> StageResult:
    """The DPO'd policy in `model/`, trl's log in `train.log`, its last metrics (among them the
    chosen and rejected sides' log-probability margins over the pairs once trained)."""
    pairs = [p for url in inputs.pairs_urls for p in run.store.read_records(url, Pair)]
    data_url = run.store.write_records(run.file("pairs.jsonl"), pairs)
    result = trained_model(
        run, "training.dpo", inputs.model_url, data_url, inputs.settings, inputs.seed,
        dpo_trl_args(inputs.settings), reference_url=inputs.reference_url,
    )  # fmt: skip
    step_pairs = sum(p.step is not None for p in pairs)
    expert = sum(map(is_self_pair, pairs))  # IPR's SFT rows (`tasks.expert_pairs`)
    result.counts |= {
        "trajectory_pairs": len(pairs) - step_pairs - expert, "step_pairs": step_pairs,
        "expert_pairs": expert,
    }  # fmt: skip
    return result
