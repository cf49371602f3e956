"""GPU checklist: the CUDA path measured in one go, measured beside predicted (bench/sizing.py).

Run it first on any machine with a GPU (`make gpu-checklist`); it needs no network. In order,
each step a process of its own with its own timeout, so one failure does not stop the rest:

1. `bandwidth`: device-to-device copy of a 2 GiB tensor, bytes read + written / seconds: the
   memory bandwidth the decode bound divides by (and a bf16 matmul: the FLOP/s bound).
2. `build-model`: a SmolLM2-1.7B-shaped Llama (1.7B parameters, the built-in model's tokenizer
   and vocabulary) with random weights in bf16: time and memory do not depend on the weights.
3. `rollout`: bench/rollout_throughput.py with vLLM on CUDA: generated tokens/s against the
   decode bound at the measured bandwidth (weights and KV bytes read per step).
4. `sft`, `dpo`: bench/train_throughput.py, full fine-tuning in bf16, no layer frozen: step time,
   trained tokens/s, peak GPU memory (nvidia-smi, sampled every 0.5 s).
5. `sft-lora`, `dpo-lora`: the same with LoRA, skipped with a note until peft and `sft.lora`
   exist.
6. `zero2`, `zero3`: ETO's SFT on every visible GPU under configs/accelerate/zero2|3.yaml.
7. `rl`: one Agent-R1 round (samples, RL update, evaluation) on the built model; where the flows
   are not installed, `rl-step` and `rl-step-lora` time the RL update alone (training.rl, GRPO,
   on prepared groups of sampled-like trajectories).
8. `eto-round`: one whole ETO round at the GPU budget (bench/efficacy.py --gpu, one seed).

`--dry-run` (CI, no GPU): builds every command, parses every config and override the steps
use (the recipes' configs, configs/accelerate/*.yaml), constructs the model's config, computes
the predicted numbers, and launches nothing.

    python -m bench.gpu_checklist                      # writes bench/results-gpu-checklist.md
    python -m bench.gpu_checklist --dry-run --out /tmp/checklist.md

A GPU machine that has torch but not Flywheel's whole stack (no network, no vLLM, no Prefect:
the machine of bench/results-gpu-checklist.md) runs what it can from data built beforehand where
the stack is: `--prepare DIR` writes the trainers' rows, tokenizer and job files;
`--from-prepared DIR` on the GPU machine needs only torch, transformers, trl, peft, datasets (and
deepspeed for ZeRO), and marks the steps it cannot run with the package they need; where the
`sft` job is prepared it ends with `profile-sft` (bench/profile_train_step.py: step times and
where the time goes, in the work folder's profile-sft.md). `--steps ... repeat` adds
`bench/train_repeat.py` on the prepared SFT job and the LoRA jobs: does each give the same
weights twice with the trainers' `deterministic` setting on (the work folder's repeat.md; as
shipped they do not, results sections 7-8).

    python -m bench.gpu_checklist --prepare .gpu-prep             # here, the whole stack
    python -m bench.gpu_checklist --from-prepared .gpu-prep       # there, torch and the trainers
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.sizing import (
    H100,
    Hardware,
    Shape,
    decode_bound,
    train_seconds,
    training_flops,
    training_memory,
)

ROOT = Path(__file__).resolve().parent.parent

PY = sys.executable
# SmolLM2-1.7B-Instruct's config.json: the built-in tokenizer's vocabulary fits it as is.
MODEL_SHAPE = Shape("SmolLM2-1.7B-like", 2048, 8192, 24, 32, 32, 64, 49152)
if os.environ.get("FLYWHEEL_CHECKLIST_TINY"):  # the same steps in seconds on a CPU, for trying them
    MODEL_SHAPE = Shape("tiny", 64, 128, 2, 4, 4, 16, 49152)
ROLLOUT_EPISODES, ROLLOUT_CONTEXT = 64, 1000
TRAIN_TOKENS = {"sft": (8_032, 2_075), "dpo": (7_745, 2_164)}  # the train bench's rows, 16 / 8
ACCELERATE = ("zero2", "zero3")


@dataclass
class Step:
    name: str
    command: list[str]
    timeout_s: int
    predicted: str = ""
    skip: str = ""  # why it does not run here
    status: str = "not run"
    seconds: float = 0.0
    peak_gpu_gb: float | None = None
    measured: str = ""
    env: dict[str, str] = field(default_factory=dict)


def flow_overrides(store: Path, model_dir: Path, name: str) -> list[str]:
    return [f"storage_url={store}", f"run_name={name}", f"model.base={model_dir}"]


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def lora_missing() -> str:
    """Why LoRA cannot run here yet, or ''."""
    from flywheel.settings import SFTSettings

    if importlib.util.find_spec("peft") is None:
        return "peft is not installed"
    if "lora" not in SFTSettings.model_fields:
        return "no sft.lora setting yet (issue 37, item 2)"
    return ""


def plan(work: Path, model_dir: Path, gpus: int, hardware: Hardware) -> list[Step]:
    """Every step's command and its prediction (from `hardware`: measured when known)."""
    me = [PY, "-m", "bench.gpu_checklist"]  # every step runs with cwd=ROOT
    shape = MODEL_SHAPE
    steps = [
        Step("bandwidth", [*me, "--internal", "bandwidth"], 120,
             f"{H100.bandwidth / 1e12:.2f} TB/s, {H100.flops / 1e12:.0f} TFLOP/s (H100 SXM sheet)"),
        Step("build-model", [*me, "--internal", "build-model", str(model_dir)], 600,
             f"{shape.parameters / 1e9:.2f}B parameters, {shape.parameters * 2 / 1e9:.1f} GB bf16"),
    ]  # fmt: skip
    bound = decode_bound(shape, hardware, ROLLOUT_EPISODES, ROLLOUT_CONTEXT)
    steps.append(Step(
        "rollout",
        [PY, "-m", "bench.rollout_throughput", "--model-dir", str(model_dir),
         "--episodes", str(ROLLOUT_EPISODES), "--max-steps", "6", "--max-tokens", "48",
         "--json", str(work / "rollout.json")],
        900, f"decode bound {bound:,.0f} generated tok/s at batch {ROLLOUT_EPISODES}, context "
        f"{ROLLOUT_CONTEXT} ({hardware.bandwidth / 1e12:.2f} TB/s)",
    ))  # fmt: skip
    missing = lora_missing()
    for lora in (False, True):
        for trainer in ("sft", "dpo"):
            tokens, projected = TRAIN_TOKENS[trainer]
            flops = training_flops(shape, tokens, projected, lora=lora)
            flops += shape.flops_per_token * tokens if trainer == "dpo" else 0
            seconds = train_seconds(flops, hardware.flops, 0.4)
            memory = training_memory(shape, 1, 0, lora, 1024, 256).total / 1e9
            command = [PY, "-m", "bench.train_throughput", "--model-dir", str(model_dir),
                       "--tasks", "16", "--pairs", "8", "--frozen-layers", "0",
                       "--variants", trainer]  # fmt: skip
            steps.append(Step(
                f"{trainer}-lora" if lora else trainer, command, 900,
                f"{tokens / seconds:,.0f} trained tok/s at 40% of the matmul bound, "
                f"~{memory:.0f} GB",
                skip=missing if lora else "",
            ))  # fmt: skip
    store = work / "runs"
    for config in ACCELERATE:
        overrides = flow_overrides(store, model_dir, f"gpu-{config}") + [
            "rounds=0", f"sft.accelerate_config={config}", f"sft.num_processes={max(gpus, 1)}",
            "sft.frozen_layers=0", "env.test_tasks=4",
        ]  # fmt: skip
        memory = training_memory(shape, max(gpus, 1), int(config[-1]), False, 1024, 256)
        steps.append(Step(
            config, [PY, "-m", "flows.eto", "--config", "configs/eto_textcraft.yaml", *overrides],
            1200, f"{memory.total / 1e9:.1f} GB a GPU on {max(gpus, 1)} GPU(s)",
            skip="" if gpus >= 1 else "no GPU",
        ))  # fmt: skip
    rl = flow_overrides(store, model_dir, "gpu-rl") + [
        "rounds=1", "sft.frozen_layers=0", "rl.frozen_layers=0",
    ]  # fmt: skip
    steps.append(Step("rl", [PY, "-m", "flows.agent_r1", "--config",
                             "configs/agent_r1_qa.yaml", *rl], 1800, "see docs/sizing.md"))  # fmt: skip
    steps += shipped_gpu_config_steps(store, model_dir, gpus)
    steps.append(Step(
        "eto-round",
        [PY, "-m", "bench.efficacy", "--gpu", "--seeds", "0", "--recipes", "eto", "--rounds", "1",
         "--store", str(work / "runs-efficacy"), "--out", str(work / "efficacy.md"),
         "--set", f"model.base={model_dir}"],
        3600, "docs/sizing.md: ETO round rows",
    ))  # fmt: skip
    return steps


def shipped_gpu_config_steps(store: Path, model_dir: Path, gpus: int) -> list[Step]:
    """Round 0 (SFT and its evaluation) of every config in configs/gpu/, on the checklist's model
    (this machine reaches no Hub), skipped where it asks for more GPUs than are here."""
    import yaml

    steps = []
    for path in sorted((ROOT / "configs" / "gpu").glob("*.yaml")):
        settings = yaml.safe_load(path.read_text())
        wanted = max(
            [int(section.get("num_processes", 1)) for section in settings.values()
             if isinstance(section, dict)] + [1]
        )  # fmt: skip
        flow = "flows.agent_r1" if path.stem.startswith("agent_r1") else "flows.eto"
        overrides = flow_overrides(store, model_dir, f"gpu-config-{path.stem}") + [
            "rounds=0", "env.test_tasks=4", "env.train_tasks=16",
        ]  # fmt: skip
        steps.append(Step(
            f"config-{path.stem}",
            [PY, "-m", flow, "--config", str(path.relative_to(ROOT)), *overrides], 1800,
            f"SFT and an evaluation at the shipped config's settings on {wanted} GPU(s)",
            skip="" if gpus >= wanted else f"needs {wanted} GPUs, {gpus} here",
        ))  # fmt: skip
    return steps


# --- checks without launching ------------------------------------------------------------------


def check_configs(steps: list[Step], model_dir: Path) -> list[str]:
    """Parse every config and override the flow steps use; a problem raises."""
    import yaml

    from flows.agent_r1 import AgentR1Config
    from flows.eto import ETOConfig
    from flywheel.config_files import load_config
    from flywheel.settings import accelerate_config_file

    checked = []
    for name in ACCELERATE:
        data = yaml.safe_load(Path(accelerate_config_file(name)).read_text())
        assert data["deepspeed_config"]["zero_stage"] == int(name[-1]), name
        checked.append(f"configs/accelerate/{name}.yaml (zero_stage {name[-1]})")
    for step in steps:
        if "--config" not in step.command:
            continue
        at = step.command.index("--config")
        config, overrides = step.command[at + 1], step.command[at + 2 :]
        model = AgentR1Config if "agent_r1" in config else ETOConfig
        load_config(model, str(ROOT / config), overrides)
        checked.append(f"{config} + {len(overrides)} overrides ({step.name})")
    return checked


def model_config() -> dict:
    """config.json of the checklist's model, as transformers' LlamaConfig reads it (written
    without importing transformers, so a dry run stays fast)."""
    shape = MODEL_SHAPE
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": shape.vocab, "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim, "max_position_embeddings": 8192, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 130000.0, "tie_word_embeddings": shape.tied,
        "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16",
    }  # fmt: skip


def write_model_config(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model_config(), indent=2) + "\n")


# --- internal steps (run as processes of their own) --------------------------------------------


def measure_bandwidth() -> dict:
    import torch

    source = torch.empty(2**30, dtype=torch.float16, device="cuda")  # 2 GiB
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize()
    repeats, started = 20, time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    torch.cuda.synchronize()
    bandwidth = 2 * source.numel() * 2 * repeats / (time.perf_counter() - started)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    a @ a
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 10 / (time.perf_counter() - started)
    name = torch.cuda.get_device_name()
    memory = torch.cuda.get_device_properties(0).total_memory
    return {"bandwidth": bandwidth, "flops": flops, "device": name, "memory": memory}


def builtin_model() -> Path:
    """The built-in model's folder (converted once into the cache): its tokenizer and generation
    config go with the checklist's model."""
    from flywheel.model import convert_base_model
    from flywheel.storage import cache_root

    return convert_base_model(cache_root() / "models" / "smollm2-135m")


def build_model(folder: Path, tokenizer: Path | None = None) -> None:
    """The checklist's model with random weights, and the built-in model's tokenizer (from
    `tokenizer`, a folder `--prepare` wrote, where the built-in model is not at hand)."""
    import torch
    import transformers

    base = tokenizer or builtin_model()
    config = transformers.LlamaConfig(**model_config())
    torch.manual_seed(0)
    # Initialised on the GPU where there is one: minutes on a CPU for 1.7B parameters.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = transformers.GenerationConfig.from_pretrained(base)
    model.save_pretrained(folder, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(folder)


# --- running -----------------------------------------------------------------------------------


def peak_memory_gb(stop: threading.Event, peak: list[float]) -> None:
    while not stop.wait(0.5):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=5,
            ).stdout  # fmt: skip
            peak[0] = max(peak[0], max(float(x) / 1024 for x in out.split()))
        except (OSError, ValueError, subprocess.SubprocessError):
            return


def run_step(step: Step, log_dir: Path) -> None:
    if step.skip:
        step.status = f"skipped: {step.skip}"
        return
    stop, peak = threading.Event(), [0.0]
    watcher = threading.Thread(target=peak_memory_gb, args=(stop, peak), daemon=True)
    watcher.start()
    started = time.monotonic()
    log = log_dir / f"{step.name}.log"
    try:
        with open(log, "w") as out:
            done = subprocess.run(step.command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=step.timeout_s, env=os.environ | step.env)  # fmt: skip
        step.status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode}, {log})"
    except subprocess.TimeoutExpired:
        step.status = f"timed out after {step.timeout_s} s ({log})"
    finally:
        stop.set()
        step.seconds = time.monotonic() - started
        step.peak_gpu_gb = peak[0] or None
    lines = log.read_text(errors="replace").strip().splitlines()
    step.measured = lines[-1][:300] if lines else ""


def report(steps: list[Step], header: str, checked: list[str]) -> str:
    lines = [f"# GPU checklist (`bench/gpu_checklist.py`)\n\n{header}\n",
             "| step | status | wall s | peak GPU GB | predicted | measured (last line) |",
             "|---|---|---:|---:|---|---|"]  # fmt: skip
    for s in steps:
        peak = f"{s.peak_gpu_gb:.1f}" if s.peak_gpu_gb else ""
        measured = s.measured.replace("|", "/")
        lines.append(f"| {s.name} | {s.status} | {s.seconds:.0f} | {peak} | {s.predicted} "
                     f"| {measured} |")  # fmt: skip
    lines += ["", "Commands:", ""] + [f"- {s.name}: `{shlex.join(s.command)}`" for s in steps]
    if checked:
        lines += ["", "Configs parsed: " + "; ".join(checked)]
    return "\n".join(lines) + "\n"


# --- a GPU machine without the flows' packages (--prepare here, --from-prepared there) ----------

# Job name -> (trainer, LoRA, accelerate config, trl_args on top of the shipped ones): the train
# steps of `plan`, as jobs, and GPU-sized batches beside the shipped one sequence a step.
GPU_BATCH = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}
PACKED = {"packing": True, "packing_strategy": "bfd", **GPU_BATCH}  # padding-free, 8 rows a step
PREPARED_JOBS = {
    "sft": ("sft", False, None, {}), "dpo": ("dpo", False, None, {}),
    "sft-lora": ("sft", True, None, {}), "dpo-lora": ("dpo", True, None, {}),
    "zero2": ("sft", False, "zero2", {}), "zero3": ("sft", False, "zero3", {}),
    "sft-packed": ("sft", False, None, PACKED), "sft-lora-packed": ("sft", True, None, PACKED),
    "dpo-batch8": ("dpo", False, None, GPU_BATCH),
    "rl-step": ("rl", False, None, {}), "rl-step-lora": ("rl", True, None, {}),
}  # fmt: skip
CHECKLIST_JOBS = ("sft", "dpo", "sft-lora", "dpo-lora", "zero2", "zero3", "rl-step", "rl-step-lora")
RL_GROUP = 4  # samples per task in the RL step's groups, rewards 1, 0, 1, 0: every row has signal
ROOT_MARK, PREP_MARK = "@WORK@", "@PREPARED@"  # replaced by the GPU machine's folders
PREPARED_TIMEOUT_S = 240  # a step: a lent machine comes for minutes
# `--steps repeat`: each job twice with the trainers' `deterministic` setting, the weights
# compared (bench/train_repeat.py, results sections 7-8: as shipped they differ; the full jobs
# repeated under the same torch call through the bench's sitecustomize, LoRA never ran strict).
# 25-50 s a run on an H200: SFT through the setting itself, and the three LoRA jobs.
REPEATED_JOBS = ("sft", "sft-lora", "dpo-lora", "rl-step-lora")
REPEAT_TIMEOUT_S = 540


def prepare(folder: Path, jobs=CHECKLIST_JOBS, tasks: int = 16, pairs: int = 8) -> None:
    """The rows `plan`'s train steps use (train_throughput's expert data: `tasks` trajectories,
    `pairs` pairs), the built-in tokenizer, and one TrainingJob a step of `jobs`, its folders
    marked for the GPU machine to fill in."""
    import transformers

    from bench.train_throughput import LORA_R16, expert_data, token_counts
    from flywheel.chat import ChatTokenizer
    from flywheel.settings import DPOSettings, LoRASettings, RLSettings, SFTSettings
    from tasks.dpo import dpo_trl_args
    from tasks.sft import sft_trl_args
    from training.job import TrainingJob

    folder.mkdir(parents=True, exist_ok=True)
    base = builtin_model()
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(folder / "tokenizer")
    transformers.GenerationConfig.from_pretrained(base).save_pretrained(folder / "tokenizer")
    trajectories, pair_records = expert_data(tasks, 4)
    chat = ChatTokenizer(transformers.AutoTokenizer.from_pretrained(folder / "tokenizer"))
    records = {
        "sft": trajectories,
        "dpo": pair_records[:pairs],
        "rl": sampled_groups(trajectories[: max(1, tasks // RL_GROUP)], RL_GROUP, chat),
    }
    counts = {}
    for trainer, rows in records.items():
        data = folder / f"{trainer}.jsonl"
        data.write_text("".join(r.model_dump_json() + "\n" for r in rows))
        # an RL row is the whole conversation, as an SFT row is: count it the same way
        counts[trainer] = token_counts(
            "dpo" if trainer == "dpo" else "sft", rows, folder / "tokenizer", 1024
        )
    settings = {
        "sft": SFTSettings(epochs=1, learning_rate=1e-4, max_length=1024),
        "dpo": DPOSettings(epochs=1, max_length=1024),
        "rl": RLSettings(max_length=1024),  # Agent-R1's GRPO: 8 sequences an optimizer step
    }
    trl_args = {
        "sft": sft_trl_args(settings["sft"]), "dpo": dpo_trl_args(settings["dpo"]), "rl": {},
    }  # fmt: skip
    (folder / "jobs").mkdir(exist_ok=True)
    plan_file = {}
    for name in jobs:
        trainer, lora, accelerate, extra = PREPARED_JOBS[name]
        out = f"{ROOT_MARK}/{name}"
        job = TrainingJob(
            model_dir=f"{ROOT_MARK}/model", data_file=f"{PREP_MARK}/{trainer}.jsonl",
            output_dir=f"{out}/model",
            settings=settings[trainer].model_copy(update={"lora": LoRASettings(**LORA_R16)})
            if lora else settings[trainer], seed=0,
            trl_args={**trl_args[trainer], **extra, "output_dir": f"{out}/trl",
                      "report_to": "none"} if trl_args[trainer] else {},
        )  # fmt: skip
        job.save(folder / "jobs" / f"{name}.json")
        rows, real, processed = counts[trainer]
        plan_file[name] = {"trainer": trainer, "accelerate": accelerate, "rows": rows,
                           "real_tokens": real, "processed_tokens": processed}  # fmt: skip
    (folder / "plan.json").write_text(json.dumps(plan_file, indent=2) + "\n")
    print(f"prepared {len(plan_file)} jobs in {folder}")


def sampled_groups(trajectories, size: int, chat) -> list:
    """Each trajectory `size` times as one sampled group, rewards 1, 0, 1, ...: the RL step's rows
    (a group-relative advantage of +-1 on every row, so none is skipped). Each agent turn is
    tokenised as if the policy had sampled it, ending on its own end marker; no sampler
    log-probabilities, so the trainer's starting pass supplies the old ones, as it does for a
    backend that records none."""
    sampled = []
    for i, trajectory in enumerate(trajectories):
        messages = [
            chat.generated_message(m.content, as_sampled(chat, m.content))
            if m.role == "assistant" else m
            for m in trajectory.messages
        ]  # fmt: skip
        sampled += [
            trajectory.model_copy(update={"messages": messages, "group_id": f"g{i}",
                                          "reward": float(k % 2 == 0), "success": k % 2 == 0})
            for k in range(size)
        ]  # fmt: skip
    return sampled


def as_sampled(chat, text: str) -> list[int]:
    """`text`'s ids followed by the turn's end marker, as a sampler returns a finished turn."""
    return chat.tokenizer(text, add_special_tokens=False)["input_ids"] + chat.turn_end_ids[:1]


def prepared_job_file(prepared: Path, name: str, work: Path, folder: Path) -> Path:
    """`folder`/job.json: prepared job `name` with this machine's folders in place of the marks."""
    text = (prepared / "jobs" / f"{name}.json").read_text()
    text = text.replace(ROOT_MARK, str(work)).replace(PREP_MARK, str(prepared.resolve()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(text)
    return folder / "job.json"


def train_prepared(prepared: Path, name: str, work: Path) -> None:
    """One prepared job, launched as a stage launches it; prints what it measured last."""
    from training.launch import command

    spec = json.loads((prepared / "plan.json").read_text())[name]
    job_file = prepared_job_file(prepared, name, work, work / name)
    metrics_file = work / name / "metrics.json"
    cmd = command(f"training.{spec['trainer']}", job_file, 1, spec["accelerate"])
    env = os.environ | {"FLYWHEEL_METRICS_FILE": str(metrics_file), "PYTHONUNBUFFERED": "1"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    metrics = json.loads(metrics_file.read_text())
    seconds = float(metrics["train_runtime"])
    print(json.dumps({
        "trained_tokens_per_s": round(spec["real_tokens"] / seconds, 1), "train_s": seconds,
        "rows": spec["rows"], "trained_tokens": spec["real_tokens"],
        "optimizer_steps": metrics.get("optimizer_steps"),
        "train_loss": metrics.get("train_loss", metrics.get("loss")),
    }))  # fmt: skip


def missing_module(*names: str) -> str:
    """'<name> is not installed here' for the first of `names` that is not, or ''."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed on this machine"
    return ""


def run_prepared(
    prepared: Path, work: Path | None, out: Path | None, only: list[str] | None = None
) -> int:
    """`plan`'s steps on a GPU machine with torch and the trainers but not the flows: the train
    steps run `--prepare`'s jobs; a step whose package is missing is skipped, naming it."""
    prepared = prepared.resolve()
    work = (work or Path(tempfile.mkdtemp(prefix="gpu-checklist-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model_dir, gpus = work / "model", gpu_count()
    me = [PY, "-m", "bench.gpu_checklist", "--internal"]
    steps = plan(work, model_dir, gpus, H100)
    run_step(steps[0], work)
    hardware = measured_hardware(steps[0])
    steps = [steps[0], *plan(work, model_dir, gpus, hardware)[1:]]
    prepared_jobs = json.loads((prepared / "plan.json").read_text())
    steps = [s for s in steps if s.name not in PREPARED_JOBS or s.name in prepared_jobs]
    steps += [Step(name, [], PREPARED_TIMEOUT_S) for name in prepared_jobs if name not in
              {s.name for s in steps}]  # fmt: skip
    if "sft" in prepared_jobs:  # where the SFT step's time goes (section 4 of the results)
        profile = [PY, "-m", "bench.profile_train_step", str(prepared), "sft", "--work",
                   str(work), "--out", str(work / "profile-sft.md")]  # fmt: skip
        steps.append(Step("profile-sft", profile, PREPARED_TIMEOUT_S))
    repeated = [job for job in REPEATED_JOBS if job in prepared_jobs]
    if only and "repeat" in only and repeated:  # asked for by name: ~6 min on an H200
        repeat = [PY, "-m", "bench.train_repeat", str(prepared), "--work", str(work), "--modes",
                  "setting", "--jobs", *repeated, "--out", str(work / "repeat.md")]  # fmt: skip
        steps.append(Step("repeat", repeat, REPEAT_TIMEOUT_S))
    if only:
        steps = [s for s in steps if s.name in {"bandwidth", *only}]
    out = out or ROOT / "bench" / "results-gpu-checklist.md"
    for step in steps[1:]:
        if step.name == "build-model":
            step.command = [*me, "build-model", str(model_dir), str(prepared / "tokenizer")]
        elif step.name in PREPARED_JOBS:
            step.command = [*me, "train", str(prepared), step.name, str(work)]
            step.skip = step.skip or missing_module("trl", "peft", "datasets")
            if PREPARED_JOBS[step.name][2]:
                step.skip = step.skip or missing_module("deepspeed")
        elif step.name in ("profile-sft", "repeat"):
            step.skip = missing_module("trl", "datasets")
        elif step.name == "rollout":
            step.skip = missing_module("vllm")
        else:  # the flows
            step.skip = missing_module("prefect", "vllm", "mlflow")
        if step.name != "repeat":  # eight trainer runs, not one
            step.timeout_s = min(step.timeout_s, PREPARED_TIMEOUT_S)
        run_step(step, work)
        print(f"{step.name}: {step.status} ({step.seconds:.0f} s)", flush=True)
        # After every step: a lease that ends mid-checklist still returns the steps done.
        header = (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {gpus} x {hardware.name}, from "
                  f"`--from-prepared` (the trainers' jobs built by `--prepare` on another "
                  "machine); predictions at the bounds measured in step 1 (bench/sizing.py).")  # fmt: skip
        out.write_text(report(steps, header, []))
    print(f"wrote {out}")
    return 0


def measured_hardware(bandwidth: Step) -> Hardware:
    """The bounds the bandwidth step measured (the H100 sheet's where it failed); rewrites its
    measured line for the report."""
    try:
        measured = json.loads(bandwidth.measured)
        hardware = Hardware(measured["device"], measured["flops"], measured["bandwidth"],
                            measured["memory"])  # fmt: skip
    except (ValueError, KeyError):
        return H100
    bandwidth.measured = (f"{measured['device']}: {measured['bandwidth'] / 1e12:.2f} TB/s copy, "
                          f"{measured['flops'] / 1e12:.0f} TFLOP/s bf16 matmul")  # fmt: skip
    return hardware


def internal(argv: list[str]) -> int:
    """The steps run as processes of their own."""
    if argv[0] == "bandwidth":
        print(json.dumps(measure_bandwidth()))
    elif argv[0] == "build-model":
        build_model(Path(argv[1]), Path(argv[2]) if len(argv) > 2 else None)
    else:
        train_prepared(Path(argv[1]), argv[2], Path(argv[3]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="build and check, launch nothing")
    parser.add_argument("--out", type=Path, help="results file (default: bench/results-gpu-"
                        "checklist.md; a dry run prints only, unless given)")  # fmt: skip
    parser.add_argument("--work", type=Path, help="folder for the model, runs and logs")
    parser.add_argument(
        "--prepare",
        type=Path,
        metavar="DIR",
        help="write the trainers' data and jobs for --from-prepared, and stop",
    )
    parser.add_argument(
        "--from-prepared",
        type=Path,
        metavar="DIR",
        help="run on a GPU machine without the flows' packages (see above)",
    )
    parser.add_argument(
        "--jobs",
        nargs="+",
        choices=list(PREPARED_JOBS),
        metavar="JOB",
        help=f"with --prepare: which trainer jobs, of {', '.join(PREPARED_JOBS)} "
        f"(default: the checklist's, {' '.join(CHECKLIST_JOBS)})",
    )
    parser.add_argument("--tasks", type=int, default=16, help="with --prepare: SFT rows")
    parser.add_argument("--pairs", type=int, default=8, help="with --prepare: DPO rows")
    parser.add_argument(
        "--steps",
        nargs="+",
        metavar="STEP",
        help="with --from-prepared: run only these steps (and bandwidth)",
    )
    parser.add_argument("--internal", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.internal:
        return internal(args.internal)
    if args.prepare:
        prepare(args.prepare, args.jobs or CHECKLIST_JOBS, args.tasks, args.pairs)
        return 0
    if args.from_prepared:
        return run_prepared(args.from_prepared, args.work, args.out, args.steps)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-checklist-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "model"
    gpus = gpu_count()
    if args.dry_run:
        write_model_config(model_dir)  # the flows' settings need a folder with config.json
        steps = plan(work, model_dir, gpus, H100)
        for step in steps:
            step.status = f"would skip: {step.skip}" if step.skip else "planned"
        checked = check_configs(steps, model_dir)
        header = (f"Dry run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: nothing launched; predictions "
                  f"at the H100 sheet's bounds; {gpus} GPU(s) visible.")  # fmt: skip
        text = report(steps, header, checked)
        print(text)
        if args.out:
            args.out.write_text(text)
        return 0
    if gpus == 0:
        sys.exit("no CUDA GPU visible: run with --dry-run, or on a GPU machine")
    first = plan(work, model_dir, gpus, H100)
    run_step(first[0], work)
    hardware = measured_hardware(first[0])
    steps = [first[0], *plan(work, model_dir, gpus, hardware)[1:]]  # predictions at measured bounds
    for step in steps[1:]:
        run_step(step, work)
        print(f"{step.name}: {step.status} ({step.seconds:.0f} s)", flush=True)
    header = (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {gpus} x {hardware.name}; predictions at "
              "the bounds measured in step 1 (bench/sizing.py). Logs: " + str(work))  # fmt: skip
    out = args.out or ROOT / "bench" / "results-gpu-checklist.md"
    out.write_text(report(steps, header, []))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
