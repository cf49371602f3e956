"""Does the same training job give the same weights twice? Runs prepared trainer jobs
(`bench/gpu_checklist.py --prepare`) twice each on one model and compares the saved weights
tensor by tensor, and the same again with torch's deterministic algorithms asked for.

    python -m bench.gpu_checklist --prepare .gpu-prep5 --tasks 64 --pairs 32   # where the stack is
    python -m bench.train_repeat .gpu-prep5 --work /tmp/repeat --jobs sft rl-step --out repeat.md

Modes: `default`, the jobs as prepared (the trainers' `deterministic` setting off, as
shipped); `setting`, the same jobs with `deterministic: true` (what a user turns on:
training.job.use_deterministic_kernels). The others reach torch through a sitecustomize on the
children's PYTHONPATH, with `CUBLAS_WORKSPACE_CONFIG=:4096:8` and no trainer setting:
`deterministic`: `torch.use_deterministic_algorithms(True, warn_only=True)`, which still runs
nondeterministic kernels but names them (the table's last column); `deterministic-strict`: the
same without warn_only, so kernels with a deterministic variant run it and the others raise
(what the setting does); `deterministic-math`: warn_only, with flash and memory-efficient
attention turned off. On a CPU (`FLYWHEEL_CHECKLIST_TINY=1`, a tiny model) the two default
modes take about 4 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.gpu_checklist import PREPARED_TIMEOUT_S, Step, run_step

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SITECUSTOMIZE = """\
import os
if os.environ.get("FLYWHEEL_BENCH_DETERMINISTIC"):
    import torch
    torch.use_deterministic_algorithms(True, warn_only=not os.environ.get("FLYWHEEL_BENCH_STRICT"))
if os.environ.get("FLYWHEEL_BENCH_MATH_ATTENTION"):
    import torch
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
"""
MODE_ENV = {
    "default": {},
    "deterministic": {"FLYWHEEL_BENCH_DETERMINISTIC": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
}
# warn_only runs an op's nondeterministic kernel and warns; strict runs its deterministic one
# (flash and memory-efficient attention's backward have one) or raises where there is none.
MODE_ENV["deterministic-strict"] = MODE_ENV["deterministic"] | {"FLYWHEEL_BENCH_STRICT": "1"}
MODE_ENV["deterministic-math"] = MODE_ENV["deterministic"] | {"FLYWHEEL_BENCH_MATH_ATTENTION": "1"}
MODE_ENV["setting"] = {}  # the job files' own `deterministic: true` (`with_setting`)
# torch's two wordings: "<op> does not have a deterministic implementation, but you set ..." and
# "<kernel> defaults to a non-deterministic algorithm" (flash and memory-efficient attention).
WARNING = re.compile(
    r"UserWarning: (.+?) (?:does not have a deterministic implementation|defaults to a non-det)"
)


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    if not tensors:
        raise SystemExit(f"{folder} holds no *.safetensors: the job did not save a model")
    return tensors


def compare(first: Path, second: Path) -> dict:
    """Tensors that differ between two saved models, and the largest difference."""
    a, b = weights(first), weights(second)
    differing, largest = 0, 0.0
    for name, tensor in a.items():
        if not tensor.equal(b[name]):
            differing += 1
            largest = max(largest, (tensor.float() - b[name].float()).abs().max().item())
    return {"tensors": len(a), "differing": differing, "max_abs_diff": largest}


def with_setting(prepared: Path, folder: Path) -> Path:
    """A copy of `prepared` whose jobs ask for `deterministic: true` in their settings."""
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(prepared, folder)
    for job_file in (folder / "jobs").glob("*.json"):
        job = json.loads(job_file.read_text())
        job["settings"]["deterministic"] = True
        job_file.write_text(json.dumps(job, indent=2))
    return folder


def run_job(prepared: Path, name: str, work: Path, model: Path, env: dict) -> dict:
    """One prepared job into `work`/`name`, on the shared `model`, as the checklist runs a step
    (its log, timeout and peak GPU memory); the metrics the job printed."""
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "model").exists():
        (work / "model").symlink_to(model)
    command = [PY, "-m", "bench.gpu_checklist", "--internal", "train", str(prepared), name,
               str(work)]  # fmt: skip
    step = Step(name, command, PREPARED_TIMEOUT_S, env=env)
    run_step(step, work)
    text = (work / f"{name}.log").read_text(errors="replace")
    if step.status != "ok":
        raise SystemExit(f"{name}: {step.status}\n{text[-2000:]}")
    metrics = json.loads(text.strip().splitlines()[-1])
    metrics["wall_s"] = round(step.seconds, 1)
    metrics["peak_gpu_gb"] = round(step.peak_gpu_gb, 1) if step.peak_gpu_gb else None
    metrics["nondeterministic_ops"] = sorted(set(WARNING.findall(text)))
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prepared", type=Path, help="a folder written by gpu_checklist --prepare")
    parser.add_argument("--work", type=Path, help="folder for the model and the runs")
    parser.add_argument("--jobs", nargs="+", default=["sft", "rl-step"])
    parser.add_argument("--modes", nargs="+", choices=list(MODE_ENV),
                        default=["default", "setting"])  # fmt: skip
    parser.add_argument("--out", type=Path, help="write the table here as well")
    args = parser.parse_args(argv)
    prepared = args.prepared.resolve()
    plan = json.loads((prepared / "plan.json").read_text())
    missing = [job for job in args.jobs if job not in plan]
    if missing:
        parser.error(f"{prepared} has no job {missing}: prepared are {sorted(plan)}")
    work = (args.work or Path(tempfile.mkdtemp(prefix="train-repeat-"))).resolve()
    model = work / "model"
    if not (model / "config.json").is_file():
        subprocess.run([PY, "-m", "bench.gpu_checklist", "--internal", "build-model", str(model),
                        str(prepared / "tokenizer")], cwd=ROOT, check=True)  # fmt: skip
    hook = work / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in [str(hook), os.environ.get("PYTHONPATH", "")] if p)
    rows = []
    for mode in args.modes:
        env = MODE_ENV[mode] | {"PYTHONPATH": path}
        jobs = with_setting(prepared, work / "prepared-setting") if mode == "setting" else prepared
        for job in args.jobs:
            runs = [run_job(jobs, job, work / f"{mode}-{i}", model, env) for i in (1, 2)]
            saved = [work / f"{mode}-{i}" / job / "model" for i in (1, 2)]
            same = compare(*saved)
            for folder in saved:  # a 1.7B model's weights are 7 GB: 8 of them filled a lent disk
                shutil.rmtree(folder)
            rows.append((job, mode, runs, same))
            print(json.dumps({"job": job, "mode": mode, "runs": runs, "weights": same}), flush=True)
            if args.out:  # after every job: a call cut at its time limit keeps the rows done
                args.out.write_text(table(rows) + "\n")
    print(table(rows))
    return 0


def table(rows: list) -> str:
    lines = [
        "| job | mode | train s (run 1, 2) | peak GPU GB | final loss (run 1, 2) | tensors differing | max abs diff | ops torch warned of |",
        "|---|---|---|---|---|---:|---:|---|",
    ]  # fmt: skip
    for job, mode, runs, same in rows:
        ops = ", ".join(sorted({op for r in runs for op in r["nondeterministic_ops"]})) or "-"
        lines.append(
            f"| {job} | {mode} | {runs[0]['train_s']:.2f}, {runs[1]['train_s']:.2f} | "
            f"{runs[0]['peak_gpu_gb']}, {runs[1]['peak_gpu_gb']} | "
            f"{runs[0]['train_loss']!r}, {runs[1]['train_loss']!r} | "
            f"{same['differing']} of {same['tensors']} | {same['max_abs_diff']:.3g} | {ops} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
