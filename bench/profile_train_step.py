"""Where a trainer's optimizer step spends its time: torch.profiler over a prepared job's steps.

Runs one job that `bench/gpu_checklist.py --prepare` wrote (the model built by its `build-model`
step) through the real trainer (training.sft / training.dpo), times every optimizer step (wall,
from one step's start to the next, device synchronised) and profiles a window of steps after a
warm-up. Prints the step times and the operators that took the most device and host time in the
window, and writes both to `--out`.

Asked by the H200 run (bench/results-gpu-checklist.md): SFT's optimizer step cost ~0.9 s
whatever its batch, DPO's 0.27 s, on the same 1.7B model. `--no-triton` runs trl's fused
LM head without its Triton kernels (the torch tiles a CPU uses), to tell the kernels from the rest;
`--cudnn-attention` attends through cuDNN's kernels, which the trainers no longer use on CUDA
(its per-shape plans took 44-85% of the host's time: `training.job.attention_without_cudnn`).

    python -m bench.gpu_checklist --from-prepared .gpu-prep --work /tmp/gpu --steps build-model
    python -m bench.profile_train_step .gpu-prep sft --work /tmp/gpu --out /tmp/sft-profile.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.gpu_checklist import prepared_job_file


def job_for(prepared: Path, name: str, work: Path):
    """Prepared job `name`, writing into work/<name>-profile, without checkpoints."""
    from flywheel.settings import DPOSettings, SFTSettings
    from training.job import TrainingJob, use_deterministic_kernels

    trainer = json.loads((prepared / "plan.json").read_text())[name]["trainer"]
    settings_class = {"sft": SFTSettings, "dpo": DPOSettings}[trainer]
    out = work / f"{name}-profile"
    job = TrainingJob[settings_class].load(str(prepared_job_file(prepared, name, work, out)))
    trl_args = {**job.trl_args, "output_dir": str(out / "trl"), "save_strategy": "no"}
    use_deterministic_kernels(job.settings)  # as `parse_job` in a trainer process: in process here
    return job.model_copy(update={"output_dir": str(out / "model"), "trl_args": trl_args})


def step_profiler(warmup: int, active: int, report: dict):
    """A TrainerCallback: step wall times, and a torch.profiler window over steps
    [warmup, warmup + active)."""
    import torch
    from transformers import TrainerCallback

    def sync() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    class StepProfiler(TrainerCallback):
        def __init__(self):
            self.started = None
            self.profile = None

        def on_step_begin(self, args, state, control, **kwargs):
            now = sync()
            if self.started is not None:
                report["step_s"].append(now - self.started)
            self.started = now
            if state.global_step == warmup:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.profile = torch.profiler.profile(activities=activities)
                self.profile.__enter__()
                report["window_started"] = now
            elif state.global_step == warmup + active and self.profile is not None:
                self.finish(now)

        def on_train_end(self, args, state, control, **kwargs):
            now = sync()
            if self.started is not None:
                report["step_s"].append(now - self.started)
            if self.profile is not None:
                self.finish(now)

        def finish(self, now: float) -> None:
            self.profile.__exit__(None, None, None)
            report["window_s"] = now - report["window_started"]
            report["profile"] = self.profile
            self.profile = None

    return StepProfiler()


def profile_job(
    prepared: Path, name: str, work: Path, warmup: int, active: int, triton: bool, cudnn: bool
):
    import training.dpo
    import training.job
    import training.sft

    if cudnn:  # the trainers turn cuDNN's attention off on CUDA (training.job); keep it on
        training.job.attention_without_cudnn = lambda: None

    if not triton:
        import trl.kernels.chunked_logprob as chunked

        chunked._TRITON_AVAILABLE = False  # `_use_triton` reads it at every call
    job = job_for(prepared, name, work)
    trainer_module = training.dpo if "beta" in job.trl_args else training.sft
    report: dict = {"step_s": []}
    plain_train_and_save = trainer_module.train_and_save

    def train_and_save(trainer, tokenizer, job, rows):
        trainer.add_callback(step_profiler(warmup, active, report))
        return plain_train_and_save(trainer, tokenizer, job, rows)

    trainer_module.train_and_save = train_and_save
    metrics = trainer_module.train(job)
    return report, metrics


def operator_table(profile, sort_by: str, rows: int) -> str:
    return profile.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60)


def device_busy_s(profile) -> float:
    """Seconds of device kernel time in the window: the kernels' own rows (an operator's row
    repeats its kernels' time), as torch's "Self CUDA time total" counts them."""
    kernels = [e for e in profile.key_averages() if e.device_type.name != "CPU"]
    return sum(e.self_device_time_total for e in kernels) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prepared", type=Path, help="a folder `gpu_checklist.py --prepare` wrote")
    parser.add_argument("job", help="one of its jobs (its jobs/<job>.json)")
    parser.add_argument("--work", type=Path, required=True, help="holds model/ (build-model)")
    parser.add_argument("--warmup", type=int, default=3, help="optimizer steps before the window")
    parser.add_argument("--active", type=int, default=4, help="optimizer steps profiled")
    parser.add_argument("--no-triton", action="store_true", help="trl's torch tiles, no Triton")
    parser.add_argument(
        "--cudnn-attention",
        action="store_true",
        help="attention through cuDNN's kernels, as the trainers ran before they turned it off",
    )
    parser.add_argument("--rows", type=int, default=25, help="operators listed per table")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    report, metrics = profile_job(
        args.prepared,
        args.job,
        args.work,
        args.warmup,
        args.active,
        not args.no_triton,
        args.cudnn_attention,
    )
    steps = report["step_s"]
    median = statistics.median(steps[args.warmup :] or steps)
    lines = [
        f"# {args.job}{' (no Triton)' if args.no_triton else ''}"
        f"{' (cuDNN attention)' if args.cudnn_attention else ''}: {len(steps)} optimizer steps",
        "",
        "step wall s: " + " ".join(f"{s:.3f}" for s in steps),
        f"median after warm-up: {median:.3f} s",
        f"train_runtime {metrics.get('train_runtime')} s, loss {metrics.get('train_loss')}",
    ]
    profile = report.get("profile")
    if profile is not None:
        window = report["window_s"]
        busy = device_busy_s(profile)
        lines += [
            f"profiled window: {window:.3f} s over {args.active} steps; device kernels busy "
            f"{busy:.3f} s ({100 * busy / window:.0f}%)",
            "",
            "## by device time",
            "",
            operator_table(profile, "self_device_time_total", args.rows),
            "## by host time",
            "",
            operator_table(profile, "self_cpu_time_total", args.rows),
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    print(json.dumps({"median_step_s": median}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
