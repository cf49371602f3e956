"""What the trainers do differently on a GPU (training/job.py): a step's accumulated sequences
run as one batch (`batched_on_gpu`), and a LoRA step loads its frozen base in bf16."""

from __future__ import annotations

from training.job import batched_on_gpu


def test_a_gpu_runs_the_accumulated_sequences_as_one_batch():
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "seed": 0}
    assert batched_on_gpu(args, gpu=True, set_by_user=False) == {
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "seed": 0,
    }  # fmt: skip


def test_a_cpu_keeps_one_sequence_at_a_time():
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}
    assert batched_on_gpu(args, gpu=False, set_by_user=False) == args


def test_a_batch_the_user_set_is_kept():
    args = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}
    assert batched_on_gpu(args, gpu=True, set_by_user=True) == args


def test_lora_on_a_bf16_gpu_loads_the_frozen_base_in_bf16_and_full_training_in_fp32():
    from flywheel.settings import LoRASettings, SFTSettings
    from training.job import TrainingJob, weights_dtype

    def job(settings: SFTSettings) -> TrainingJob:
        return TrainingJob(model_dir="m", data_file="d", output_dir="o", settings=settings, seed=0)

    with_lora = job(SFTSettings(lora=LoRASettings(enabled=True, rank=8, alpha=16.0)))
    full = job(SFTSettings())
    assert weights_dtype(with_lora, bf16=True) == "bfloat16"
    assert weights_dtype(with_lora, bf16=False) == "float32"  # a CPU trains in float32
    assert weights_dtype(full, bf16=True) == "float32"  # the optimizer's master weights


def test_on_cuda_attention_leaves_cudnn_for_flash_and_a_cpu_is_left_alone(monkeypatch):
    """cuDNN's per-shape attention plans took 44-85% of an H200's host time in a training step."""
    import torch

    from training.job import attention_without_cudnn

    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        attention_without_cudnn()
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        attention_without_cudnn()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_loading_a_model_to_train_sets_the_attention_kernels_first(monkeypatch, tmp_path):
    import pytest

    import training.job

    called = []
    monkeypatch.setattr(training.job, "attention_without_cudnn", lambda: called.append(1))
    from flywheel.settings import SFTSettings

    job = training.job.TrainingJob(
        model_dir=str(tmp_path), data_file="d", output_dir="o", settings=SFTSettings(), seed=0
    )
    with pytest.raises(
        ValueError, match="Unrecognized model"
    ):  # an empty folder: no model to load, after the kernels are set
        training.job.load_model(job)
    assert called == [1]


def test_every_trainer_computes_in_the_jobs_resolved_precision(tmp_path):
    """trl's bf16, the launcher's --mixed_precision and the LoRA base follow `precision`, which
    the settings resolve when read: `auto` never reaches a trainer."""
    import json

    from flywheel.settings import SFTSettings
    from training.job import TrainingJob, computes_in_bf16, trainer_defaults
    from training.launch import command

    assert SFTSettings().precision in ("float32", "bfloat16")  # auto, resolved here
    for precision, bf16, mixed in (("bfloat16", True, "bf16"), ("float32", False, "no")):
        settings = SFTSettings(precision=precision)
        job = TrainingJob(model_dir="m", data_file="d", output_dir=str(tmp_path / "o"),
                          settings=settings, seed=0)  # fmt: skip
        assert computes_in_bf16(settings) is bf16
        assert trainer_defaults(job)["bf16"] is bf16
        job_file = job.save(tmp_path / f"{precision}.json")
        assert json.loads(job_file.read_text())["settings"]["precision"] == precision
        launched = command("training.sft", job_file, 2, "ddp")
        assert launched[launched.index("--mixed_precision") + 1] == mixed
