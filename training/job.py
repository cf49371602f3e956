"""The job file a trainer entry point reads: what to train, on what, into where, with the stage's
settings whole.

Written by the stage (`training.launch.train_to_store`), read by `python -m training.sft|dpo|rl
--config job.json` on every process of an `accelerate launch`, and validated again there: a job
file that does not fit its trainer's settings model fails naming the field, before any work.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flywheel.settings import TrainerSettings
from training.checkpoint import CheckpointPlan

Settings = TypeVar("Settings", bound=TrainerSettings)


class TrainingJob(BaseModel, Generic[Settings]):
    """One trainer run; `TrainingJob[SFTSettings]` is what `training.sft` reads (DPO, RL alike)."""

    model_config = ConfigDict(extra="forbid")

    model_dir: str  # Hugging Face model folder to start from
    data_file: str  # JSON lines of Trajectory (SFT, RL) or Pair (DPO) records
    output_dir: str  # where the trained model folder is written
    # The stage's SFTSettings / DPOSettings / RLSettings whole: length, frozen layers, LoRA,
    # processes and the trainer's own settings. Their defaults live there only.
    settings: Settings
    seed: int  # the run's: trl's `seed`, training.rl's torch seed
    # trl's SFTConfig / DPOConfig arguments the stage derived from its settings (`sft_trl_args`,
    # `dpo_trl_args`; `settings.trl_args` among them), over the shared `trainer_defaults`.
    trl_args: dict[str, Any] = Field(default_factory=dict)
    checkpoint: CheckpointPlan | None = None  # where and how often to checkpoint; None: never
    # DPO's reference model folder where it is not `model_dir` (`DPOSettings.reference`).
    reference_dir: str | None = None
    # Where to write every optimizer step's logged numbers (JSON list, a resumed run's earlier
    # steps included); None writes none.
    history_file: str | None = None

    def save(self, path: Path) -> Path:
        Path(path).write_text(self.model_dump_json(indent=2))
        return Path(path)

    @classmethod
    def load(cls, path: str) -> TrainingJob:
        """The job in `path`, validated as `cls` (`TrainingJob[SFTSettings]`, ...)."""
        try:
            return cls.model_validate_json(Path(path).read_text())
        except ValidationError as error:
            raise JobFileError(job_problems(path, error)) from None


class JobFileError(ValueError):
    """A job file its trainer cannot run; the message names each field and what is wrong."""


def job_problems(path: str, error: ValidationError) -> str:
    """One line (a failed stage shows its trainer's last error line): each field and its fault."""
    problems = [
        f"{'.'.join(str(part) for part in problem['loc']) or '(top level)'}: {problem['msg']}"
        for problem in error.errors()
    ]
    return f"job file {path} does not fit {error.title}: {'; '.join(problems)}"


def parse_job(
    description: str, settings_class: type[TrainerSettings], argv: list[str] | None = None
) -> TrainingJob:
    """The job named by `--config`, validated with the trainer's settings model; its
    `deterministic` setting is applied to this process before the trainer starts."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="job JSON written by the stage")
    job = TrainingJob[settings_class].load(parser.parse_args(argv).config)
    use_deterministic_kernels(job.settings)
    return job


def use_deterministic_kernels(settings: TrainerSettings) -> None:
    """`settings.deterministic`: torch's deterministic algorithms in this process, before any
    model or CUDA work. Strict, not warn_only: an op without a deterministic kernel raises
    instead of quietly running its other one (warn_only left two GPU runs differing)."""
    if not settings.deterministic:
        return
    import torch

    # cuBLAS picks a reduction split per call unless its workspace is pinned; read at its
    # first use, so it is set before any.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def reporting() -> str:
    """Report trl's metrics to MLflow when the launching stage handed us its run."""
    return "mlflow" if os.environ.get("MLFLOW_RUN_ID") else "none"


def trainer_defaults(job: TrainingJob) -> dict:
    """Settings every Flywheel trainer shares; `job.trl_args` overrides any of them."""
    import torch

    gpu = torch.cuda.is_available()
    return batched_on_gpu({
        "bf16": computes_in_bf16(job.settings),
        "use_cpu": not gpu,
        "output_dir": str(Path(job.output_dir).with_name(Path(job.output_dir).name + "-work")),
        "report_to": reporting(),
        "logging_steps": 1,
        **checkpointing(job),
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        "disable_tqdm": False,
        "seed": job.seed,
        # One sequence at a time: padding a batch to its longest member costs more than it saves
        # on a CPU; accumulate instead (a GPU batches them: `batched_on_gpu`).
        "per_device_train_batch_size": 1,
        # trl turns it on by default to save memory; it recomputes every forward during backward,
        # and a 135M-parameter model needs no saving (measured in bench/train_throughput.py).
        "gradient_checkpointing": False,
        **job.trl_args,
    }, gpu, set_by_user="per_device_train_batch_size" in job.trl_args)  # fmt: skip


def batched_on_gpu(args: dict, gpu: bool, set_by_user: bool) -> dict:
    """On a GPU, a step's accumulated sequences run as one batch instead: the same sequences an
    optimizer step; DPO trained 2.7x the tokens/s of one pair at a time on an H200 (1.7B model,
    bench/results-gpu-checklist.md; SFT's step time did not change). A batch the user set in
    trl_args is kept."""
    if not gpu or set_by_user:
        return args
    accumulated = int(args.get("gradient_accumulation_steps", 1))
    return {**args, "per_device_train_batch_size": accumulated, "gradient_accumulation_steps": 1}


def checkpointing(job: TrainingJob) -> dict:
    """The Trainer's save settings: a checkpoint every `every_steps` optimizer steps (only the
    newest kept on the local disk; `training.checkpoint` mirrors it into the store), or none.
    Saves by time are the mirroring callback's (`every_minutes`)."""
    if job.checkpoint is None:
        return {"save_strategy": "no"}
    if not job.checkpoint.every_steps:
        return {"save_strategy": "no", "save_total_limit": 1}
    return {
        "save_strategy": "steps",
        "save_steps": job.checkpoint.every_steps,
        "save_total_limit": 1,
    }


def computes_in_bf16(settings) -> bool:
    """The one bf16 rule, the trainer settings' resolved `precision` (flywheel/precision.py):
    trl's `bf16`, the launcher's `--mixed_precision`, the RL trainer's autocast and the frozen
    LoRA base's dtype all follow it."""
    return getattr(settings, "precision", "float32") == "bfloat16"


def weights_dtype(job: TrainingJob, bf16: bool) -> str:
    """float32 weights for what trains (the optimizer's master copy under bf16 autocast); under
    LoRA in bf16 the frozen base in bf16: half its memory (6.8 GB of the 13-14 GB a 1.7B
    LoRA step took on an H200 was the fp32 base, bench/results-gpu-checklist.md); peft keeps
    the adapters themselves in float32."""
    return "bfloat16" if bf16 and lora_config(job) is not None else "float32"


def load_model(job: TrainingJob):
    """The model to train (in `weights_dtype`), with the bottom layers `frozen_layers` names
    frozen.
    From a LoRA adapter folder (a stage that published `lora.publish=adapter`): its base with the
    adapter, which goes on training under LoRA and is merged into the base otherwise."""
    from transformers import AutoModelForCausalLM

    from flywheel.model import lora_adapter

    score_loss_positions_only()
    attention_without_cudnn()
    adapter = lora_adapter(job.model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        adapter.base if adapter else job.model_dir,
        dtype=weights_dtype(job, computes_in_bf16(job.settings)),
    )
    if adapter:
        model = with_adapter(model, adapter, job)
    layers = model.base_model.layers if job.settings.frozen_layers else []
    frozen = job.settings.frozen_layer_count(len(layers)) if layers else 0  # a count or a share
    if frozen:
        model.get_input_embeddings().requires_grad_(False)  # tied to the output layer in SmolLM2
        for layer in layers[:frozen]:
            layer.requires_grad_(False)
    return model


def attention_without_cudnn() -> None:
    """On CUDA, attention through torch's flash kernels rather than cuDNN's. cuDNN builds an
    execution plan on the host for every new sequence shape, and a trainer's rows change shape
    every step: on an H200 (1.7B model, torch 2.11) its plans took 44% of the host's time (85%
    in a machine's first process, which also compiles them), and without them a step took
    0.13 s instead of 0.20 s at the same loss, SFT and DPO alike (bench/profile_train_step.py,
    bench/results-gpu-checklist.md)."""
    import torch

    if torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(False)


def with_adapter(model, adapter, job: TrainingJob):
    """`model` (the adapter's base) with the adapter of the stage it starts from: trainable
    under LoRA (the same adapter trained further, its rank and modules kept: the base stays the
    one vLLM serves), else merged into the weights for full training."""
    from peft import PeftModel

    trains = lora_config(job) is not None
    if trains and job.settings.lora.rank != adapter.rank:
        print(f"{adapter.folder}: training its rank-{adapter.rank} adapter further "
              f"(lora.rank={job.settings.lora.rank} applies to new adapters only)")  # fmt: skip
    model = PeftModel.from_pretrained(model, str(adapter.folder), is_trainable=trains)
    return model if trains else model.merge_and_unload()


def lora_config(job: TrainingJob, model=None):
    """peft's LoraConfig for the job's `lora` settings, or None to train the weights themselves.
    Handed to trl's trainers as `peft_config` (DPO's reference is then the base model with the
    adapters disabled, no second copy); `training.rl` wraps the model itself (`with_lora`).
    `model`, the model to wrap, places `lora.top_layers`' adapters."""
    lora = job.settings.lora
    if not lora.enabled:
        return None
    from peft import LoraConfig

    targets, layers = lora.target_modules, None
    if lora.top_layers and model is not None:
        layers = top_layer_indices(lora.top_layers, model.config.num_hidden_layers)
        if targets == "all-linear":  # peft places layers only for modules named in a list
            targets = layer_linear_names(model)
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )


def top_layer_indices(top: int, num_layers: int) -> list[int]:
    if top > num_layers:
        raise ValueError(f"lora.top_layers={top} but the model has {num_layers} layers")
    return list(range(num_layers - top, num_layers))


def layer_linear_names(model) -> list[str]:
    """The names of the linear modules inside the transformer layers (q_proj, ..., down_proj in
    a Llama): what peft's "all-linear" covers, the output layer left out."""
    from torch import nn

    names = sorted({
        name.rsplit(".", 1)[-1] for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and ".layers." in name
    })  # fmt: skip
    if not names:
        raise ValueError(
            "lora.top_layers: no linear modules under `.layers.` in this model; name them in "
            "lora.target_modules (e.g. [c_attn, c_proj])"
        )
    return names


def new_adapters(model, job: TrainingJob):
    """The LoraConfig to wrap `model` with (trl's `peft_config`): None under full training, and
    for a model that carries the adapter it goes on training (`with_adapter`)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return None
    return lora_config(job, model)


def with_lora(model, job: TrainingJob):
    """`model` wrapped with the job's LoRA adapters (base weights frozen), or as it is."""
    config = new_adapters(model, job)
    if config is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, config)


def publishes_adapter(job: TrainingJob) -> bool:
    return lora_config(job) is not None and job.settings.lora.publish == "adapter"


def save_trained(model, job: TrainingJob, output_dir: str) -> None:
    """The stage's model folder. `lora.publish=adapter`: the adapter alone (peft's
    adapter_config.json and adapter_model.safetensors) naming the absolute path of the base it
    applies to; otherwise a plain model folder, any adapters merged in."""
    from peft import PeftModel

    from flywheel.model import lora_adapter

    if not (isinstance(model, PeftModel) and publishes_adapter(job)):
        publishable(model).save_pretrained(output_dir)
        return
    adapter = lora_adapter(job.model_dir)
    base = adapter.base if adapter else Path(job.model_dir).resolve()
    model.peft_config["default"].base_model_name_or_path = str(base)
    # DPO from an adapter adds a frozen copy, "ref", as its reference: not the policy
    model.save_pretrained(output_dir, selected_adapters=["default"])


def publishable(model):
    """The model to save as the stage's model folder: a peft model with its adapters merged into
    the base weights (a plain Hugging Face model that vLLM and the next stage load as they are),
    any other as it is."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return model
    return model.merge_and_unload(adapter_names=["default"])  # not DPO's "ref" copy


def score_loss_positions_only() -> None:
    """Make trl's fused LM head project only the positions that carry a loss, on a CPU too.

    trl does so only where Triton runs its kernel: elsewhere it scores every position so that tile
    shapes stay fixed for compilers (Neuron's). Nothing recompiles on a CPU, and an agent's
    trajectory has a loss on about a quarter of its tokens, so this gives the same log-probabilities
    at 1.8x (SFT) and 2x (DPO) the trained tokens/s (bench/train_throughput.py). The kernel's own
    choice of Triton is left alone.
    """
    import trl.trainer.utils as trl_utils

    chooses = getattr(trl_utils, "_use_triton", None)
    if chooses is None:
        warnings.warn(
            "trl.trainer.utils._use_triton is gone: every position is scored on a CPU", stacklevel=2
        )
        return
    if getattr(chooses, "compacts_on_cpu", False):
        return

    def compact_on_cpu(device) -> bool:
        return device.type == "cpu" or chooses(device)

    compact_on_cpu.compacts_on_cpu = True
    trl_utils._use_triton = compact_on_cpu


def report_metrics(metrics: dict) -> None:
    """Print the final metrics and, when launched by a stage, hand them over in a file."""
    if not metrics:
        return
    print(json.dumps(metrics))
    if target := os.environ.get("FLYWHEEL_METRICS_FILE"):
        Path(target).write_text(json.dumps(metrics))


def train_and_save(trainer, tokenizer, job: TrainingJob, rows: int, measure=None) -> dict:
    """Train (from the stage's newest checkpoint when it has one), write the model folder (all
    ranks take part in saving), return rank 0's metrics; `measure(trainer)`, when given, runs on
    every rank once trained, before saving merges any adapters, and adds its metrics."""
    from training.checkpoint import mirroring_callback

    plan = job.checkpoint
    mirror = mirroring_callback(plan) if plan is not None else None
    if mirror is not None:
        trainer.add_callback(mirror)
    resume = resume_point(plan, Path(trainer.args.output_dir), trainer.is_world_process_zero())
    result = trainer.train(resume_from_checkpoint=resume)
    measured = measure(trainer) if measure is not None else {}
    if lora_config(job) is None:
        trainer.save_model(job.output_dir)
    elif trainer.is_world_process_zero():  # the adapter alone, or merged: a plain model folder
        save_trained(trainer.accelerator.unwrap_model(trainer.model), job, job.output_dir)
    if not trainer.is_world_process_zero():
        return {}
    write_history(job, trainer.state.log_history)
    tokenizer.save_pretrained(job.output_dir)
    # The Trainer pickles its arguments next to the weights: no pickle goes into the store, and
    # their scratch paths would make two identical models differ in content.
    (Path(job.output_dir) / "training_args.bin").unlink(missing_ok=True)
    return {
        "train_loss": result.training_loss,
        "rows": rows,
        "processes": trainer.args.world_size,
        "optimizer_steps": result.global_step,
        "resumed_from_step": resumed_step(resume),
        # what checkpointing cost: saves, and seconds from a step's end to its copy in the store
        "checkpoints_saved": mirror.saves if mirror else 0,
        "checkpoint_seconds": mirror.seconds if mirror else 0.0,
        **result.metrics,
        **measured,
    }


def resume_point(plan, work_dir: Path, is_main: bool) -> str | None:
    """The local checkpoint folder every process resumes from: pulled by the first process,
    its path handed to the others."""
    import torch.distributed as dist

    from training.checkpoint import pull_trainer_checkpoint

    path = pull_trainer_checkpoint(plan, work_dir) if is_main else None
    if dist.is_available() and dist.is_initialized():
        shared = [path]
        dist.broadcast_object_list(shared, src=0)
        path = shared[0]
    return path


def resumed_step(checkpoint_folder: str | None) -> int:
    return int(checkpoint_folder.rsplit("-", 1)[1]) if checkpoint_folder else 0


def mlflow_step_logger():
    """Log one optimizer step's numbers into the stage's MLflow run as training goes (the
    launching stage hands its run over in MLFLOW_RUN_ID); None without one."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return None
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(os.environ.get("MLFLOW_TRACKING_URI"))

    def log_step(entry: dict) -> None:
        now = int(time.time() * 1000)
        numbers = {k: float(v) for k, v in entry.items() if k != "step"}
        client.log_batch(run_id, [Metric(k, v, now, entry["step"]) for k, v in numbers.items()])

    return log_step


def write_history(job: TrainingJob, history: list[dict]) -> None:
    if job.history_file:
        Path(job.history_file).write_text(json.dumps(history))
