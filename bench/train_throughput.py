"""Training throughput: SFT and DPO trained tokens/s, padding, and FLOP/s against this machine's
matmul bound, measured in the same run.

Both trainers run exactly as a stage runs them (`python -m training.sft|dpo --config job.json`
in their own process, `training.launch.launch`), on data built the way the recipes build it:

- SFT: expert trajectories of TextCraft train tasks (the demo's tasks: those the expert solves in
  at most `--max-expert-steps` steps), rendered by `training.datasets.sft_rows`;
- DPO: pairs whose chosen side is a task's expert continuation and whose rejected side is a
  failed-looking continuation (the expert's first reply, then another task's replies), rendered
  by `training.datasets.dpo_rows`.

Every variant trains one epoch over the same rows, so trained tokens are the loss-carrying and
context tokens of those rows. What is reported per variant:

- trained tokens/s: real (non-padding) tokens of the rows / trl's `train_runtime`;
- padding: tokens processed that are padding (a DPO pair's shorter side is padded to the longer);
- model FLOP/s: forward 2 x layer parameters a token, backward 4 x trainable layer parameters a
  token (frozen bottom layers and embeddings get no backward), and 4 x lm_head parameters for each
  position the LM head projects (forward, and backward to the hidden states): the loss-carrying
  positions as shipped, every position in the "every position" variants (trl's way on a CPU).
  DPO adds the reference model's forward unless it is precomputed. Attention over the context is
  left out, so the fractions are conservative;
- fraction of the matmul bound on all threads in the precision the trainers ran in, and of the
  fastest precision's bound (float32 and bfloat16, both timed in this run).

    python -m bench.train_throughput                       # SmolLM2-135M, the shipped settings
    python -m bench.train_throughput --model tiny --frozen-layers 1 --tasks 4 --pairs 4  # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.rollout_throughput import (
    PRECISIONS,
    ModelShape,
    bound_lines,
    matmul_bounds,
    model_shape,
    resolve_model,
)
from bench.trl_every_position import TRAINER_VARIABLE
from flywheel.precision import resolve_precision

# Variants: name -> (trainer, trl_args on top of the shipped settings, job fields). The one job
# field that is not the TrainingJob's: `every_position`, trl's own CPU behaviour (the trainer run
# through bench/trl_every_position.py).
EVERY_POSITION = {"every_position": True}
LORA_R16 = {"enabled": True, "rank": 16, "alpha": 32.0, "dropout": 0.0,
            "target_modules": "all-linear", "publish": "merged"}  # fmt: skip
VARIANTS = {
    "sft": ("sft", {}, {}),
    "sft, rows packed to max_length (bfd, padding-free)": (
        "sft",
        {"packing": True, "packing_strategy": "bfd", "gradient_accumulation_steps": 1},
        {},
    ),
    "sft, gradient checkpointing (trl's default)": ("sft", {"gradient_checkpointing": True}, {}),
    "sft, every position through the LM head (trl on a CPU)": ("sft", {}, EVERY_POSITION),
    "sft, as at issue 13 (checkpointing, every position)": (
        "sft",
        {"gradient_checkpointing": True},
        EVERY_POSITION,
    ),
    # A checkpoint every 2 optimizer steps into a store in the work folder (training/checkpoint.py):
    # what a save costs, in seconds and in share of the training time.
    "sft, checkpoint every 2 steps": ("sft", {}, {"checkpoint_every": 2}),
    "dpo": ("dpo", {}, {}),  # as shipped: reference log-probs computed once, before training
    "dpo, reference forward every step": ("dpo", {"precompute_ref_log_probs": False}, {}),
    "dpo, gradient checkpointing (trl's default)": ("dpo", {"gradient_checkpointing": True}, {}),
    "dpo, every position through the LM head (trl on a CPU)": ("dpo", {}, EVERY_POSITION),
    "dpo, as at issue 13 (reference every step, checkpointing, every position)": (
        "dpo",
        {"precompute_ref_log_probs": False, "gradient_checkpointing": True},
        EVERY_POSITION,
    ),
    "dpo, checkpoint every 2 steps": ("dpo", {}, {"checkpoint_every": 2}),
    # LoRA (docs/lora.md) against full training of every layer (frozen_layers 0) and the
    # shipped variants above (--frozen-layers): r=16 adapters on every linear layer.
    "sft, all layers trained": ("sft", {}, {"frozen_layers": 0}),
    "sft, lora r=16": ("sft", {}, {"frozen_layers": 0, "lora": LORA_R16}),
    "dpo, all layers trained": ("dpo", {}, {"frozen_layers": 0}),
    "dpo, lora r=16": ("dpo", {}, {"frozen_layers": 0, "lora": LORA_R16}),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", choices=("smollm2-135m", "tiny"), default="smollm2-135m")
    parser.add_argument("--model-dir", help="a Hugging Face model folder instead of --model")
    parser.add_argument("--tasks", type=int, default=32, help="expert trajectories for SFT")
    parser.add_argument("--pairs", type=int, default=16, help="preference pairs for DPO")
    parser.add_argument("--max-expert-steps", type=int, default=4, help="as the demo's config")
    parser.add_argument("--max-length", type=int, default=1024, help="tokens a row, as shipped")
    parser.add_argument("--frozen-layers", type=int, default=20, help="as the shipped configs")
    parser.add_argument(
        "--precision", choices=("auto", "float32", "bfloat16"), default="auto",
        help="the trainers' precision setting (auto: bfloat16 on AMX/avx512_bf16 CPUs, else float32)",
    )  # fmt: skip
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=list(VARIANTS),
        metavar="NAME",
        help=f"which to run, of: {'; '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--out", type=Path, help="also append the table (markdown) to this file, keeping its runs"
    )
    return parser.parse_args(argv)


@dataclass
class Measured:
    variant: str
    trainer: str
    rows: int
    real_tokens: int  # tokens of the rows, no padding
    processed_tokens: int  # with padding
    seconds: float  # trl's train_runtime
    steps: int
    final_loss: float
    flops: float
    checkpoints: int = 0  # saved into the store
    checkpoint_seconds: float = 0.0  # from each step's end to its copy in the store, summed
    peak_rss_mb: float = 0.0  # the trainer process's peak resident memory

    @property
    def tokens_per_s(self) -> float:
        return self.real_tokens / self.seconds

    @property
    def padding(self) -> float:
        return 1 - self.real_tokens / self.processed_tokens if self.processed_tokens else 0.0


def trainable_layer_parameters(shape: ModelShape, frozen_layers: int) -> int:
    per_layer = shape.non_embedding // shape.layers  # norms are a rounding error
    return per_layer * max(0, shape.layers - frozen_layers)


def training_flops(
    shape: ModelShape, tokens: int, projected: int, frozen_layers: int, lora: bool = False
) -> float:
    """Forward and backward matmul FLOPs of `tokens` tokens, `projected` of them through the LM
    head (see the module docstring). With LoRA the backward carries the gradient to every
    layer's input (2 x layer parameters) but computes no weight gradient but the adapters'
    (left out, as small as the rank)."""
    backward = (
        2 * shape.non_embedding if lora else 4 * trainable_layer_parameters(shape, frozen_layers)
    )
    layers = (2 * shape.non_embedding + backward) * tokens
    return float(layers + 4 * shape.lm_head * projected)


def expert_data(count: int, max_expert_steps: int):
    from agents.rollout import agent_prefix
    from envs import make_env
    from envs.task_selection import task_list
    from flywheel.records import Pair
    from flywheel.settings import EnvSettings
    from tasks.expert_data import collect_expert

    settings = EnvSettings(max_expert_steps=max_expert_steps, train_tasks=count)
    env = make_env(settings)
    trajectories, _ = collect_expert(
        env, task_list(env, "train", settings, 0), agent_prefix(env, [])
    )
    pairs = []
    for i, good in enumerate(trajectories):
        other = trajectories[(i + 1) % len(trajectories)]
        rejected = good.continuation[:1] + other.continuation[1:]  # right start, wrong ending
        if len(rejected) % 2 == 0:
            rejected = rejected[:-1]  # end on an agent turn, as pairs do
        pairs.append(
            Pair(task_id=good.task_id, prompt=good.prompt, chosen=good.continuation,
                 rejected=rejected, chosen_reward=1.0, rejected_reward=0.0)
        )  # fmt: skip
    return trajectories, pairs


def token_counts(trainer: str, records, model_dir: Path, max_length: int) -> tuple[int, int, int]:
    """(rows, real tokens, tokens processed with padding) of the rows the trainer builds."""
    from transformers import AutoTokenizer

    from flywheel.chat import ChatTokenizer
    from training.datasets import dpo_rows, sft_rows

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    if trainer == "sft":
        rows, _ = sft_rows(records, chat, max_length)
        real = sum(len(r["input_ids"]) for r in rows)
        return len(rows), real, real  # one sequence at a time or packed: no padding
    rows, _ = dpo_rows(records, chat, max_length)
    real = processed = 0
    for row in rows:
        sides = [min(max_length, len(row["prompt_ids"]) + len(row[f"{s}_ids"])) for s in ("chosen", "rejected")]  # fmt: skip
        real += sum(sides)
        processed += 2 * max(sides)  # both sides padded to the longer one
    return len(rows), real, processed


def run_variant(name, records, model_dir, args, shape, folder: Path) -> Measured:
    from flywheel.settings import DPOSettings, SFTSettings
    from tasks.dpo import dpo_trl_args
    from tasks.sft import sft_trl_args
    from training.job import TrainingJob

    trainer, extra, job_fields = VARIANTS[name]
    job_fields = dict(job_fields)
    every_position = job_fields.pop("every_position", False)
    sizes = {"max_length": args.max_length, "lora": job_fields.pop("lora", {}),
             "frozen_layers": job_fields.pop("frozen_layers", args.frozen_layers),
             "precision": args.precision}  # fmt: skip
    if trainer == "sft":
        settings = SFTSettings(epochs=1, learning_rate=1e-4, **sizes)
        trl_args = sft_trl_args(settings)
    else:
        settings = DPOSettings(epochs=1, **sizes)
        trl_args = dpo_trl_args(settings)
    work = folder / name.replace(" ", "_").replace(",", "")
    work.mkdir()
    data = work / "data.jsonl"
    data.write_text("".join(r.model_dump_json() + "\n" for r in records))
    if every := job_fields.pop("checkpoint_every", 0):
        store = f"file://{work / 'store'}"
        job_fields["checkpoint"] = {"store_url": store, "url": f"{store}/sft/checkpoint",
                                    "key": "bench", "every_steps": every}  # fmt: skip
    job = TrainingJob(
        model_dir=str(model_dir), data_file=str(data), output_dir=str(work / "model"),
        settings=settings, seed=0,
        trl_args={**trl_args, **extra, "output_dir": str(work / "trl"), "report_to": "none"},
        **job_fields,
    )  # fmt: skip
    metrics_file = work / "metrics.json"
    print(f"training: {name} ...", file=sys.stderr)
    module, env = f"training.{trainer}", {"FLYWHEEL_METRICS_FILE": str(metrics_file)}
    if every_position:
        module, env = "bench.trl_every_position", env | {TRAINER_VARIABLE: module}
    peak_kb = launch_measuring_peak(module, job.save(work / "job.json"), work / "train.log", env)
    metrics = json.loads(metrics_file.read_text())
    rows, real, processed = token_counts(trainer, records, model_dir, args.max_length)
    projected = processed if every_position else int(metrics["loss_tokens_per_epoch"])
    flops = training_flops(
        shape, processed, projected, settings.frozen_layers, settings.lora.enabled
    )
    if trainer == "dpo":  # the reference model's forward: once before training, or every step
        flops += 2 * shape.non_embedding * processed + 2 * shape.lm_head * projected
    return Measured(
        variant=name, trainer=trainer, rows=rows, real_tokens=real, processed_tokens=processed,
        seconds=float(metrics["train_runtime"]), steps=int(metrics["optimizer_steps"]),
        final_loss=float(metrics["train_loss"]), flops=flops,
        checkpoints=int(metrics.get("checkpoints_saved", 0)),
        checkpoint_seconds=float(metrics.get("checkpoint_seconds", 0.0)),
        peak_rss_mb=peak_kb / 1024,
    )  # fmt: skip


def launch_measuring_peak(module: str, job_file: Path, log_file: Path, extra_env: dict) -> int:
    """`training.launch.launch` in a forked child of its own, so that the trainer is that
    child's only child and `RUSAGE_CHILDREN`'s ru_maxrss is the trainer's peak resident memory
    (KiB on Linux), not the largest of every variant so far."""
    import resource

    from training.launch import launch

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of torch runs here, only the launch
        code = 1
        try:
            launch(module, job_file, log_file, extra_env=extra_env)
            code = 0
        finally:
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            os.write(write, str(peak).encode())
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as answer:
        peak = int(answer.read() or 0)
    if os.waitpid(pid, 0)[1] != 0:
        raise RuntimeError(f"{module} failed: see {log_file}")
    return peak


def report(results: list[Measured], info: dict) -> str:
    bounds, ran_in = info["matmul_bounds"], info["precision"]
    bound, fastest = bounds[ran_in], max(bounds.values())
    lines = [
        f"### Training throughput: {info['model']}, {info['frozen_layers']} of "
        f"{info['layers']} layers frozen, max_length {info['max_length']}",
        "",
        "| variant | rows | trained tokens | padding | steps | train s | trained tok/s "
        f"| model GFLOP/s | of the {ran_in} bound | of the fastest bound | train loss "
        "| peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in results:
        lines.append(
            f"| {m.variant} | {m.rows} | {m.real_tokens:,} | {m.padding:.1%} | {m.steps} "
            f"| {m.seconds:.1f} | {m.tokens_per_s:.1f} | {m.flops / m.seconds / 1e9:.1f} "
            f"| {m.flops / m.seconds / bound:.1%} | {m.flops / m.seconds / fastest:.1%} "
            f"| {m.final_loss:.4f} | {m.peak_rss_mb:,.0f} |"
        )
    base = {m.trainer: m for m in results if m.variant == m.trainer}
    lines += ["", "| variant | trained tok/s vs the shipped trainer |", "|---|---:|"]
    for m in results:
        if m.trainer in base and m.variant != m.trainer:
            lines.append(f"| {m.variant} | {m.tokens_per_s / base[m.trainer].tokens_per_s:.2f}x |")
    lines += checkpoint_lines(results)
    lines += lora_lines(results)
    lines += ["", *bound_lines(bounds, ran_in, info["threads"])]
    lines += [
        "",
        f"The trainers ran in {ran_in}; the bounds were timed in this run. {info['cpus']} CPUs, load "
        f"average {info['load']:.2f} at the start; torch {info['torch']}, trl {info['trl']}; "
        f"{info['date']}. Command: `{info['command']}`.",
    ]
    return "\n".join(lines)


def lora_lines(results: list[Measured]) -> list[str]:
    """LoRA against training every layer of the same trainer, measured in the same run: the
    ratio of trained tokens/s and of the trainer's peak memory."""
    full = {m.trainer: m for m in results if m.variant == f"{m.trainer}, all layers trained"}
    pairs = [(m, full[m.trainer]) for m in results if "lora" in m.variant and m.trainer in full]
    if not pairs:
        return []
    lines = [
        "",
        "| variant | tok/s vs all layers trained | peak RSS vs all layers |",
        "|---|---:|---:|",
    ]
    for lora, whole in pairs:
        lines.append(
            f"| {lora.variant} | {lora.tokens_per_s / whole.tokens_per_s:.2f}x "
            f"| {lora.peak_rss_mb / whole.peak_rss_mb:.2f}x |"
        )
    return lines


def checkpoint_lines(results: list[Measured]) -> list[str]:
    """What checkpointing cost where it was on: seconds a save (the Trainer's local save, the
    pickles turned into safetensors + JSON, the copy into the store) and their share of the
    training time."""
    saved = [m for m in results if m.checkpoints]
    if not saved:
        return []
    lines = [
        "",
        "| variant | checkpoints | s per checkpoint | share of train s |",
        "|---|---:|---:|---:|",
    ]
    for m in saved:
        lines.append(
            f"| {m.variant} | {m.checkpoints} | {m.checkpoint_seconds / m.checkpoints:.2f} "
            f"| {m.checkpoint_seconds / m.seconds:.1%} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import trl

    load = os.getloadavg()[0]
    label, model_dir = resolve_model(args)
    shape = model_shape(model_dir)
    if args.frozen_layers > shape.layers:
        sys.exit(f"--frozen-layers {args.frozen_layers}: {label} has {shape.layers} layers")
    cpus = len(os.sched_getaffinity(0))
    print(f"timing matmuls in {', '.join(PRECISIONS)} on {cpus} threads ...", file=sys.stderr)
    bounds = matmul_bounds(cpus)
    trajectories, pairs = expert_data(args.tasks, args.max_expert_steps)
    pairs = pairs[: args.pairs]
    results = []
    with tempfile.TemporaryDirectory(prefix="flywheel-train-bench-") as folder:
        for name in args.variants:
            records = trajectories if VARIANTS[name][0] == "sft" else pairs
            started = time.perf_counter()
            results.append(run_variant(name, records, model_dir, args, shape, Path(folder)))
            print(f"  {time.perf_counter() - started:.0f} s", file=sys.stderr)
    info = {
        "model": label, "layers": shape.layers, "frozen_layers": args.frozen_layers,
        "max_length": args.max_length, "matmul_bounds": bounds, "matmul_size": 1024,
        "precision": resolve_precision(args.precision),
        "threads": cpus, "cpus": cpus, "load": load, "torch": torch.__version__,
        "trl": trl.__version__, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(["python", "bench/train_throughput.py", *(argv or sys.argv[1:])]),
    }  # fmt: skip
    table = report(results, info)
    print(table)
    if args.out:
        with args.out.open("a") as out:
            out.write("\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
