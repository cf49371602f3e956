"""DPO against a reference that is not the policy (`DPOSettings.reference: start`, IPR's frozen
SFT model), and the pairs' margins the trained policy reports: real trl runs on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

import training.dpo as dpo  # noqa: E402
from flywheel.settings import DPOSettings  # noqa: E402
from tasks.dpo import dpo_trl_args  # noqa: E402
from training.job import TrainingJob  # noqa: E402


def perturbed_copy(model_dir: Path, folder: Path) -> Path:
    """The model with its last layer's MLP scaled: another model with the same tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight.mul_(3.0)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(folder)
    return folder


def job(tmp_path: Path, model_dir: Path, reference: Path | None, **settings) -> TrainingJob:
    from test_dpo_entry import make_pair, write_pairs

    tmp_path.mkdir(parents=True, exist_ok=True)
    data = write_pairs(tmp_path / "pairs.jsonl", [make_pair(3, 2), make_pair(2, 4)])
    chosen = DPOSettings(max_length=512, epochs=1, learning_rate=1e-3, **settings)
    trl_args = {**dpo_trl_args(chosen), "output_dir": str(tmp_path / "work"),
                "report_to": "none", "disable_tqdm": True}  # fmt: skip
    return TrainingJob[DPOSettings](
        model_dir=str(model_dir), data_file=data, output_dir=str(tmp_path / "model"),
        settings=chosen, seed=3, trl_args=trl_args,
        reference_dir=str(reference) if reference else None,
    )  # fmt: skip


def first_step(history_of: list) -> dict:
    return next(e for e in json.loads(json.dumps(history_of)) if "loss" in e)


def test_a_reference_other_than_the_policy_scores_the_first_step(
    tmp_path, tiny_model_dir, monkeypatch
):
    from test_lora import built_dpo_trainers

    built = built_dpo_trainers(monkeypatch)
    reference = perturbed_copy(tiny_model_dir, tmp_path / "reference")
    metrics = dpo.train(job(tmp_path / "a", tiny_model_dir, reference))
    trainer = built[0]
    assert trainer.ref_model is None  # its log-probabilities precomputed, the model let go
    # the policy before its first step is not the reference: DPO's rewards are not zero
    assert first_step(trainer.state.log_history)["rewards/chosen"] != 0.0
    for name in ("logps/chosen", "logps/rejected", "rewards/margins", "rewards/accuracies"):
        assert isinstance(metrics[f"pairs_{name}"], float)
    assert metrics["pairs_rewards/margins"] == pytest.approx(
        metrics["pairs_rewards/chosen"] - metrics["pairs_rewards/rejected"], abs=1e-4
    )
    # the policy as its own reference: the first step's rewards are zero
    dpo.train(job(tmp_path / "b", tiny_model_dir, None))
    assert first_step(built[1].state.log_history)["rewards/chosen"] == 0.0


def test_an_nll_weight_adds_trls_sft_loss_on_the_chosen_side():
    assert dpo_trl_args(DPOSettings(nll_weight=0.5))["loss_type"] == ["sigmoid", "sft"]
    assert dpo_trl_args(DPOSettings(nll_weight=0.5))["loss_weights"] == [1.0, 0.5]
    assert "loss_type" not in dpo_trl_args(DPOSettings())
    with pytest.raises(ValueError, match="nll_weight adds trl's loss_type"):
        DPOSettings(nll_weight=1.0, trl_args={"loss_type": ["ipo"]})
