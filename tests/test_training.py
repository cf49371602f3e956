"""What the trainers are handed: frozen layers (every shipped config freezes some), checked by
which parameters one optimizer step changes; the trl arguments each stage passes."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import training.job  # noqa: E402
from flywheel.settings import SFTSettings  # noqa: E402
from training.job import TrainingJob, load_model  # noqa: E402


def job_for(model_dir, **fields) -> TrainingJob:
    """A job that only loads the model: no data, no output."""
    settings = SFTSettings(frozen_layers=fields.pop("frozen_layers", 0))
    return TrainingJob(
        model_dir=str(model_dir), data_file="", output_dir="", settings=settings, seed=0, **fields
    )


def one_step(model, ids: list[int]) -> dict[str, torch.Tensor]:
    """The parameters before a plain SGD step on a language-model loss over `ids`."""
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    x = torch.tensor([ids])
    model(input_ids=x, labels=x).loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    return before


def changed(model, before) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}


def test_frozen_layers_and_embeddings_stay_put_after_a_step(tiny_model_dir, chat):
    ids = chat.tokenizer("craft 4 oak planks using 1 oak logs")["input_ids"]
    job = job_for(tiny_model_dir, frozen_layers=1)
    model = load_model(job)
    before = one_step(model, ids)
    moved = changed(model, before)
    names = set(before)
    layer0 = {n for n in names if n.startswith("model.layers.0.")}
    layer1 = {n for n in names if n.startswith("model.layers.1.")}
    assert layer0 and layer1  # the tiny model has two layers
    # The embeddings (tied to the output layer) and the bottom layer are frozen; everything
    # above them trains.
    assert moved == names - layer0 - {"model.embed_tokens.weight"}
    assert layer1 <= moved and "model.norm.weight" in moved
    assert not any(p.requires_grad for n, p in model.named_parameters() if n in layer0)

    unfrozen = load_model(job_for(tiny_model_dir, frozen_layers=0))
    before = one_step(unfrozen, ids)
    assert changed(unfrozen, before) == names  # frozen_layers=0 trains every parameter


def test_the_lm_head_projects_only_the_loss_positions_on_a_cpu(tiny_model_dir, chat, monkeypatch):
    import trl.trainer.utils as trl_utils
    from trl.kernels.chunked_logprob import _use_triton
    from trl.trainer.utils import add_fused_lm_head

    # trl's own choice (an earlier load_model in this process replaced it), restored afterwards
    monkeypatch.setattr(trl_utils, "_use_triton", _use_triton)
    projected, project = [], trl_utils._ChunkedLogProbFunction.apply

    def count_rows(hidden, *rest):
        projected.append(hidden.shape[0])
        return project(hidden, *rest)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", count_rows)
    ids = torch.tensor([chat.tokenizer("craft 4 oak planks using 1 oak logs")["input_ids"]])
    labels = ids.masked_fill(torch.arange(ids.shape[1]) < ids.shape[1] - 3, -100)
    log_probs = {}
    shipped = training.job.score_loss_positions_only
    for every in (True, False):  # trl's CPU default first (as bench/trl_every_position runs it)
        monkeypatch.setattr(
            training.job, "score_loss_positions_only", (lambda: None) if every else shipped
        )
        model = load_model(job_for(tiny_model_dir))
        add_fused_lm_head(model)
        log_probs[every] = model(input_ids=ids, labels=labels, fused_lm_head=True).log_probs
    # Every position but the last predicts a token; only the 3 with a label are projected, and
    # they get the log-probabilities the full projection gives.
    assert projected == [ids.shape[1] - 1, 3]
    assert (log_probs[False] != 0).sum() == 3
    torch.testing.assert_close(log_probs[False], log_probs[True])


def test_a_share_of_the_layers_freezes_that_share(tiny_model_dir):
    model = load_model(job_for(tiny_model_dir, frozen_layers=0.5))  # 1 of the tiny model's 2
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in model.named_parameters() if n.startswith("model.layers.0.")} | {
        "model.embed_tokens.weight"
    }


def test_freezing_more_layers_than_the_model_has_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="frozen_layers=3 but the model has 2"):
        load_model(job_for(tiny_model_dir, frozen_layers=3))


def test_stage_settings_reach_trls_arguments():
    from flywheel.settings import DPOSettings, SFTSettings
    from tasks.dpo import dpo_trl_args
    from tasks.sft import sft_trl_args

    sft = SFTSettings(epochs=2, learning_rate=3e-4, batch_size=4, num_processes=2,
                      trl_args={"lr_scheduler_type": "constant"})  # fmt: skip
    assert sft_trl_args(sft) == {
        "num_train_epochs": 2, "learning_rate": 3e-4, "gradient_accumulation_steps": 2,
        "lr_scheduler_type": "constant", "warmup_steps": 0.05,
    }  # fmt: skip
    dpo = DPOSettings(beta=0.3, learning_rate=2e-6, epochs=1, batch_size=6, num_processes=3)
    assert dpo_trl_args(dpo) == {
        "beta": 0.3, "learning_rate": 2e-6, "num_train_epochs": 1,
        "gradient_accumulation_steps": 2, "precompute_ref_log_probs": True,
    }  # fmt: skip


# Config checks that need no trainer (they lived in the slow test_distributed_training).
def test_batch_size_must_split_evenly_over_processes():
    from flows.eto import ETOConfig
    from flywheel.config_files import ConfigError, validate_config

    with pytest.raises(ConfigError, match="multiple of num_processes"):
        validate_config(ETOConfig, {"sft": {"batch_size": 3, "num_processes": 2}})


@pytest.mark.parametrize(
    "name, kind, zero_stage",
    [("ddp", "MULTI_GPU", None), ("zero2", "DEEPSPEED", 2), ("zero3", "DEEPSPEED", 3)],
)
def test_shipped_accelerate_configs_load_and_launch_with_the_stage_settings(name, kind, zero_stage):
    from accelerate.commands.config.config_args import load_config_from_file

    from training.launch import accelerate_config_file, command

    config = load_config_from_file(accelerate_config_file(name))  # accelerate's own checks
    assert config.distributed_type.name == kind
    assert (config.deepspeed_config or {}).get("zero_stage") == zero_stage
    launched = command("training.sft", Path("job.json"), 2, name)
    assert launched[1:3] == ["-m", "accelerate.commands.launch"]
    assert launched[launched.index("--config_file") + 1] == accelerate_config_file(name)
    assert launched[launched.index("--num_processes") + 1] == "2"
