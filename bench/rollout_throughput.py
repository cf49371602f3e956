"""Rollout throughput: the same TextCraft episodes explored one request at a time, then batched.

Both ways use one vLLM engine, the same model, greedy decoding and the same test tasks, so only
the scheduling differs:

- sequential: one request per step per episode, episode after episode (how ETO's and Agent-R's
  clients work) -- `run_sequential` below;
- batched: every live episode's next prompt in one `generate` call per step --
  `agents.rollout.run_batched`.

The prefix cache is emptied before each way, so neither inherits the other's cached prompts. The
script prints a markdown table (episodes/s, generated tokens/s, steps/s, prompt tokens computed
versus served from the prefix cache), the speed-up against the target, and how close the batched
way comes to the machine's arithmetic bound for this model:

- attainable FLOP/s: a float32 1024x1024 matmul timed with 1 thread (vLLM's CPU worker binds to
  one core on a 2-core machine: VLLM_CPU_OMP_THREADS_BIND=auto reserves the other) and with all;
- decode bound: FLOP/s / (2 x (non-embedding parameters + lm_head parameters)) tokens/s;
- prefill-inclusive fraction: 2 x those parameters x (prompt tokens computed + generated tokens),
  divided by wall seconds x FLOP/s. Attention over the context is left out of both (its share is
  printed), so the bound is optimistic and the fractions are conservative.

    python -m bench.rollout_throughput                      # SmolLM2-135M, 32 episodes x 6 steps
    python -m bench.rollout_throughput --model tiny --episodes 4 --max-steps 3   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flywheel.config_files import load_config_section
from flywheel.settings import KV_CACHE_DTYPES, InferenceSettings

# The bench explores with the README demo's inference settings.
DEMO_CONFIG = "configs/eto_textcraft.yaml"
DEMO_INFERENCE = load_config_section(
    InferenceSettings, str(Path(__file__).resolve().parent.parent / DEMO_CONFIG), "inference"
)
TARGET_SPEEDUP = 5.0
TARGET_DECODE_FRACTION = 0.30  # of the all-cores decode bound, in generated tokens/s
MATMUL_SIZE = 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Prints a markdown table to stdout (progress bars go to stderr).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--model",
        choices=("smollm2-135m", "tiny"),
        default="smollm2-135m",
        help="built-in model, converted once into $FLYWHEEL_CACHE/models/<name> "
        "(FLYWHEEL_CACHE defaults to ~/.cache/flywheel); 'tiny' is a 2-layer random model "
        "for smoke tests only",
    )
    which.add_argument(
        "--model-dir", help="a Hugging Face model folder to benchmark instead of --model"
    )
    parser.add_argument(
        "--episodes",
        type=int,
        default=32,
        help="TextCraft test episodes, the same seeded sample for both ways",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=6,
        help="step limit per episode. Bounded so the sequential way finishes in minutes: an "
        "untrained model rarely finishes a task, so nearly every episode runs to this limit "
        "and both ways do the same number of steps",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEMO_INFERENCE.max_tokens,
        help=f"tokens per reply at most; {DEMO_CONFIG}'s",
    )
    parser.add_argument(
        "--few-shot",
        type=int,
        default=1,
        help="expert episodes shown as earlier chat turns (the shared, cached prompt prefix)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the task sample")
    parser.add_argument("--max-model-len", type=int, default=4096, help="vLLM context length")
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEMO_INFERENCE.block_size,
        help=f"KV-cache block size (prefix caching reuses whole blocks); {DEMO_CONFIG}'s",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=DEMO_INFERENCE.kv_cache_dtype,
        help=f"KV-cache element type ('auto': the model's, float32); {DEMO_CONFIG}'s",
    )
    parser.add_argument(
        "--no-decode-alone",
        dest="decode_alone",
        action="store_false",
        help="skip timing the engine's decoding alone (no prefill, no environment) at the "
        "batched way's batch and mean context: the ceiling the rollout works under",
    )
    parser.add_argument(
        "--kv-cache-gib",
        type=int,
        default=int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")),
        help="vllm-cpu KV cache size (VLLM_CPU_KVCACHE_SPACE)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this path")
    parser.add_argument("--verbose", action="store_true", help="keep vLLM's INFO logging")
    args = parser.parse_args(argv)
    for name in ("episodes", "max_steps", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.few_shot < 0:
        parser.error("--few-shot must be at least 0")
    return args


# --- the model -----------------------------------------------------------------------------------


def resolve_model(args: argparse.Namespace) -> tuple[str, Path]:
    """(label, folder) of the model to benchmark, converting a built-in one if needed."""
    if args.model_dir:
        folder = Path(args.model_dir).expanduser().resolve()
        if not (folder / "config.json").is_file():
            sys.exit(f"{folder} holds no config.json")
        return folder.name, folder
    from flywheel.model import convert_base_model, make_tiny_model
    from flywheel.storage import cache_root

    cache = cache_root()
    base = convert_base_model(cache / "models" / "smollm2-135m")
    if args.model == "tiny":
        return "tiny", make_tiny_model(cache / "models" / "tiny", base)
    return "smollm2-135m", base


@dataclass(frozen=True)
class ModelShape:
    parameters: int  # unique parameters (tied embeddings counted once)
    non_embedding: int
    lm_head: int
    layers: int
    attention_width: int  # query heads x head size

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs of one forward token: 2 x (non-embedding + lm_head parameters)."""
        return 2 * (self.non_embedding + self.lm_head)


def model_shape(model_dir: Path) -> ModelShape:
    """Parameter counts from the config, on the meta device (no weights are loaded)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    unique = list(model.parameters())  # de-duplicates tied weights
    non_embedding = sum(p.numel() for p in unique if p is not embedding and p is not head)
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(
        parameters=sum(p.numel() for p in unique),
        non_embedding=non_embedding,
        lm_head=head.numel(),
        layers=text.num_hidden_layers,
        attention_width=heads * head_dim,
    )


# The number formats whose matmul rate a bench measures: the engine and the trainers run in one
# of them (`model.precision`), and which is fastest depends on the CPU (bf16 runs several times
# float32 on AMX / avx512_bf16 cores and tens of times slower without them).
PRECISIONS = ("float32", "bfloat16")


def matmul_flops(
    threads: int, seconds: float = 0.5, repeats: int = 3, precision: str = "float32"
) -> float:
    """Best FLOP/s of a square matmul in `precision` over `repeats` windows of `seconds` each.

    Where one product takes longer than a window (bf16 without hardware support runs at well under
    1 GFLOP/s), that one timed product is the measurement: its rate is what matters, not its
    third digit."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtype = getattr(torch, precision)
        a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype)
        b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype)
        out = torch.empty(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype)
        work = 2 * MATMUL_SIZE**3
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        if (first := time.perf_counter() - start) > seconds:
            return work / first
        for _ in range(2):
            torch.mm(a, b, out=out)
        best = 0.0
        for _ in range(repeats):
            count, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds:
                torch.mm(a, b, out=out)
                count += 1
            best = max(best, work * count / elapsed)
        return best
    finally:
        torch.set_num_threads(previous)


def matmul_bounds(threads: int, timed: dict[str, float] | None = None) -> dict[str, float]:
    """FLOP/s of every precision in PRECISIONS on `threads` threads; those in `timed` (already
    measured in this run) are not timed again."""
    timed = timed or {}
    return {p: timed[p] if p in timed else matmul_flops(threads, precision=p) for p in PRECISIONS}


def bound_lines(bounds: dict[str, float], ran_in: str, threads: int) -> list[str]:
    """A table of the machine's matmul bound in every precision, the one the work ran in marked,
    with each precision's rate against float32."""
    fastest = max(bounds, key=bounds.get)
    lines = [
        f"| precision | {MATMUL_SIZE}x{MATMUL_SIZE} matmul on {threads} threads, GFLOP/s "
        "| against float32 | |",
        "|---|---:|---:|---|",
    ]
    for precision, flops in bounds.items():
        marks = [
            m
            for m, on in (("ran in", precision == ran_in), ("fastest", precision == fastest))
            if on
        ]
        lines.append(
            f"| {precision} | {flops / 1e9:.1f} | {flops / bounds['float32']:.2f}x | "
            + " ".join([", ".join(marks), "|"]).lstrip()
        )
    return lines


# --- counting what the engine did ----------------------------------------------------------------


@dataclass
class Request:
    prompt: list[int]
    cached: int | None  # prompt tokens served from vLLM's prefix cache (None: not reported)
    generated: list[int]  # as the engine produced them, end token included
    call: int = 0  # which generate call sent it (0 = the first since the log was cleared)


class RequestLog:
    """Wraps `llm.generate` to keep each request's prompt, cache hits and output."""

    def __init__(self, llm):
        self.requests: list[Request] = []
        self.calls = 0
        original = llm.generate

        def generate(*args, **kwargs):
            outputs = original(*args, **kwargs)
            for o in outputs:
                self.requests.append(
                    Request(
                        list(o.prompt_token_ids),
                        o.num_cached_tokens,
                        list(o.outputs[0].token_ids),
                        self.calls,
                    )
                )
            self.calls += 1
            return outputs

        llm.generate = generate

    def clear(self) -> None:
        self.requests, self.calls = [], 0


def new_prompt_tokens(requests: list[Request]) -> int:
    """Prompt tokens no earlier token sequence already held: the ideal prefix cache's work.

    A request may reuse the longest common prefix with any earlier request's prompt + reply.
    It stands in for the measured count where vLLM does not report its cache hits.
    """
    import numpy as np

    seen: list[np.ndarray] = []  # earlier prompts, each followed by its reply
    total = 0
    for request in requests:
        prompt = np.asarray(request.prompt)
        best = 0
        for tokens in seen:
            n = min(len(prompt), len(tokens))
            differ = np.flatnonzero(prompt[:n] != tokens[:n])
            best = max(best, int(differ[0]) if differ.size else n)
        total += len(prompt) - best
        seen.append(np.asarray(request.prompt + request.generated))
    return total


def attention_flops(requests: list[Request], shape: ModelShape) -> int:
    """Score and value matmuls over the context for every computed token (4 x layers x width x pos)."""
    positions = 0
    for r in requests:
        cached = r.cached or 0
        end = len(r.prompt) + len(r.generated)
        positions += (end * (end - 1) - cached * (cached - 1)) // 2  # sum of cached..end-1
    return 4 * shape.layers * shape.attention_width * positions


# --- one way of exploring ------------------------------------------------------------------------


@dataclass
class WayResult:
    way: str
    episodes: int
    steps: int
    successes: int
    seconds: float
    generate_calls: int
    generated_tokens: int  # reply tokens kept in the trajectories (end tokens stripped)
    engine_generated_tokens: int  # as vLLM produced them (end tokens included)
    prompt_tokens: int  # sum of prompt lengths sent
    prompt_tokens_computed: int  # not served from the prefix cache
    prompt_tokens_computed_measured: bool  # False: `prompt_tokens_new` stands in for it
    prompt_tokens_new: int  # the ideal prefix cache's work (see `new_prompt_tokens`)
    attention_flops: int
    replies: dict[str, list[list[int]]] = field(repr=False, default_factory=dict)
    middle_prompts: list[list[int]] = field(repr=False, default_factory=list)

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    def summary(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("replies", "middle_prompts")}
        out.update(
            episodes_per_s=self.episodes_per_s,
            generated_tokens_per_s=self.tokens_per_s,
            steps_per_s=self.steps_per_s,
        )
        return out


def run_sequential(env, task_ids, backend, chat, prefix, settings):
    """One request per step per episode, episode after episode (the upstream clients' way)."""
    from tqdm import tqdm

    from agents.rollout import run_batched

    out = []
    for task_id in tqdm(task_ids, desc=f"{env.name} episodes (sequential)", unit="ep"):
        out += run_batched(env, [task_id], backend, chat, prefix, settings, progress=False)
    return out


def explore(way, run, backend, log, shape, *run_args) -> WayResult:
    if not backend.llm.reset_prefix_cache():
        print(f"warning: vLLM did not reset its prefix cache before {way}", file=sys.stderr)
    log.clear()
    started = time.perf_counter()
    trajectories = run(*run_args)
    seconds = time.perf_counter() - started
    requests = log.requests
    measured = all(r.cached is not None for r in requests)
    prompt_tokens = sum(len(r.prompt) for r in requests)
    new = new_prompt_tokens(requests)
    replies = {
        t.task_id: [list(m.token_ids) for m in t.messages[t.episode_start :] if m.token_ids]
        for t in trajectories
    }
    return WayResult(
        way=way,
        episodes=len(trajectories),
        steps=sum(t.n_steps for t in trajectories),
        successes=sum(t.success for t in trajectories),
        seconds=seconds,
        generate_calls=log.calls,
        generated_tokens=sum(len(ids) for episode in replies.values() for ids in episode),
        engine_generated_tokens=sum(len(r.generated) for r in requests),
        prompt_tokens=prompt_tokens,
        prompt_tokens_computed=(
            prompt_tokens - sum(r.cached for r in requests) if measured else new
        ),
        prompt_tokens_computed_measured=measured,
        prompt_tokens_new=new,
        attention_flops=attention_flops(requests, shape),
        replies=replies,
        middle_prompts=middle_call_prompts(requests),
    )


def decode_alone(llm, prompts: list[list[int]], tokens: int) -> float:
    """Tokens/s of the engine decoding `prompts` as one batch, with no prefill and no environment.

    The prompts are prefilled first (the prefix cache keeps them); then one timed call generates
    1 token and another `tokens` + 1, end tokens ignored, so the difference is `tokens` decode
    steps of the whole batch: the rate the engine itself reaches at this batch and context.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def timed(n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        started = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - started

    timed(1)  # prefill, outside the timings
    return len(prompts) * tokens / max(timed(tokens + 1) - timed(1), 1e-9)


def middle_call_prompts(requests: list[Request]) -> list[list[int]]:
    """The prompts of the middle generate call of a batched exploration: its typical context."""
    calls = sorted({r.call for r in requests})
    middle = calls[len(calls) // 2]
    return [r.prompt for r in requests if r.call == middle]


# --- report --------------------------------------------------------------------------------------


def si(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} "


def report(info: dict, sequential: WayResult, batched: WayResult) -> tuple[str, dict]:
    shape: ModelShape = info["shape"]
    speedup = batched.episodes_per_s / sequential.episodes_per_s
    verdict = "PASS" if speedup >= TARGET_SPEEDUP else "FAIL"
    decode_fraction = batched.tokens_per_s * shape.flops_per_token / info["flops_all"]
    decode_verdict = "PASS" if decode_fraction >= TARGET_DECODE_FRACTION else "FAIL"
    # Prefill costs a generated token's FLOPs per prompt token: even at the matmul bound,
    # generated tokens/s reach this share of the decode bound and no more.
    generated_share = batched.engine_generated_tokens / (
        batched.prompt_tokens_computed + batched.engine_generated_tokens
    )
    busy = info["load"] >= 0.5
    same = sum(sequential.replies.get(task) == replies for task, replies in batched.replies.items())
    lines = [
        f"### Rollout throughput: TextCraft, {info['model']}, {batched.episodes} test episodes "
        f"x <= {info['max_steps']} steps, greedy, <= {info['max_tokens']} tokens a reply, "
        f"{info['few_shot']}-shot",
        "",
        "| way | wall s | episodes/s | steps/s | generated tok/s | generated tokens | "
        "generate calls | prompt tokens sent | computed (not from prefix cache) | "
        "new (token-level ideal) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r, label in (
        (sequential, "sequential: one request per step per episode"),
        (batched, "batched: one call per step for all live episodes"),
    ):
        mark = "" if r.prompt_tokens_computed_measured else " (est.)"
        lines.append(
            f"| {label} | {r.seconds:.1f} | {r.episodes_per_s:.3f} | {r.steps_per_s:.2f} | "
            f"{r.tokens_per_s:.1f} | {r.generated_tokens:,} | {r.generate_calls:,} | "
            f"{r.prompt_tokens:,} | {r.prompt_tokens_computed:,}{mark} | {r.prompt_tokens_new:,} |"
        )
    lines.append(
        f"| **batched / sequential** | | **{speedup:.2f}x** | "
        f"{batched.steps_per_s / sequential.steps_per_s:.2f}x | "
        f"{batched.tokens_per_s / sequential.tokens_per_s:.2f}x | | | | | |"
    )

    flops = {1: info["flops_1"], info["threads"]: info["flops_all"]}
    work = shape.flops_per_token * (
        batched.prompt_tokens_computed + batched.engine_generated_tokens
    )
    columns = ["1 thread", f"{info['threads']} threads (all cores: vLLM's CPU worker)"]
    if info["threads"] == 1:
        columns = columns[:1]
    rows = {
        f"float32 {MATMUL_SIZE}x{MATMUL_SIZE} matmul FLOP/s": [
            f"{si(f)}FLOP/s" for f in flops.values()
        ],
        f"decode bound at {si(shape.flops_per_token)}FLOPs a token (tokens/s)": [
            f"{f / shape.flops_per_token:,.0f}" for f in flops.values()
        ],
        "batched generated tokens/s, fraction of the decode bound": [
            f"{batched.tokens_per_s * shape.flops_per_token / f:.1%}" for f in flops.values()
        ],
        "batched model FLOP/s incl. prefill, fraction of matmul FLOP/s": [
            f"{work / batched.seconds / f:.1%}" for f in flops.values()
        ],
        "most a generated-token fraction can be at this prefill share (generated / computed)": [
            f"{generated_share:.1%}" for _ in flops
        ],
    }
    decode = info.get("decode_alone")
    if decode:
        rows[
            f"engine decoding alone, batch {decode['batch']} at a mean context of "
            f"{decode['mean_context']:,.0f} tokens: tokens/s, fraction of the decode bound"
        ] = [
            f"{decode['tokens_per_s']:,.0f}, {decode['tokens_per_s'] * shape.flops_per_token / f:.1%}"
            for f in flops.values()
        ]
    lines += [
        "",
        "| arithmetic bound, batched way | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for name, values in rows.items():
        lines.append(f"| {name} | " + " | ".join(values[: len(columns)]) + " |")

    estimated = "" if batched.prompt_tokens_computed_measured else " (estimated, see JSON)"
    lines += [
        "",
        f"Model: {shape.parameters / 1e6:.1f}M parameters; FLOPs a token = 2 x "
        f"({shape.non_embedding / 1e6:.1f}M non-embedding + {shape.lm_head / 1e6:.1f}M lm_head). "
        f"Batched work: {batched.prompt_tokens_computed:,} prompt tokens computed{estimated} "
        f"+ {batched.engine_generated_tokens:,} generated; attention over the context adds "
        f"{batched.attention_flops / work:.0%} more FLOPs, not counted. "
        + (
            f"vLLM caches whole blocks of {info['block_size']} tokens, hence computed > new. "
            if info["block_size"]
            else ""
        )
        + f"{same} of {batched.episodes} episodes replied identically both ways. "
        f"{info['cpus']} CPUs, load average {info['load']:.2f} at the start"
        + (" (other processes were busy: timings are noisy)" if busy else "")
        + f", vLLM {info['vllm']}, torch {info['torch']}.",
        "",
        f"**Summary:** batched exploration is {speedup:.2f}x the sequential way "
        f"({batched.episodes_per_s:.3f} vs {sequential.episodes_per_s:.3f} episodes/s, "
        f"{batched.tokens_per_s:.1f} vs {sequential.tokens_per_s:.1f} generated tokens/s): "
        f"{verdict} against the >= {TARGET_SPEEDUP:.0f}x target; batched decoding reaches "
        f"{decode_fraction:.1%} of the {info['threads']}-thread decode bound: {decode_verdict} "
        f"against the >= {TARGET_DECODE_FRACTION:.0%} target (at most {generated_share:.1%} "
        f"with this workload's prefill share), "
        f"{work / batched.seconds / info['flops_all']:.0%} of the matmul bound counting prefill"
        + (
            f"; the engine decoding alone at the batched way's batch and context reaches "
            f"{decode['tokens_per_s'] * shape.flops_per_token / info['flops_all']:.1%}"
            if decode
            else ""
        )
        + f" (KV cache: {info.get('kv_cache_dtype', 'auto')}). "
        "The bound is the best of matmul timings before and after the explorations.",
    ]
    if bounds := info.get("matmul_bounds"):
        fastest = max(bounds.values())
        lines += [
            "",
            f"The engine computed in {info['precision']}; against the fastest format's bound "
            f"({fastest / 1e9:.1f} GFLOP/s) batched decoding reaches "
            f"{batched.tokens_per_s * shape.flops_per_token / fastest:.1%} of the decode bound.",
            "",
            *bound_lines(bounds, info["precision"], info["threads"]),
        ]
    results = {
        "settings": {k: v for k, v in info.items() if k != "shape"},
        "model_shape": asdict(shape) | {"flops_per_token": shape.flops_per_token},
        "sequential": sequential.summary(),
        "batched": batched.summary(),
        "speedup_episodes_per_s": speedup,
        "target_speedup": TARGET_SPEEDUP,
        "pass": speedup >= TARGET_SPEEDUP,
        "target_decode_fraction": TARGET_DECODE_FRACTION,
        "pass_decode_fraction": decode_fraction >= TARGET_DECODE_FRACTION,
        "generated_share_of_computed": generated_share,
        "identical_episodes": same,
        "batched_fraction_of_decode_bound": {
            str(t): batched.tokens_per_s * shape.flops_per_token / f for t, f in flops.items()
        },
        "batched_fraction_incl_prefill": {
            str(t): work / batched.seconds / f for t, f in flops.items()
        },
        "decode_alone_fraction_of_decode_bound": (
            {str(t): decode["tokens_per_s"] * shape.flops_per_token / f for t, f in flops.items()}
            if decode
            else None
        ),
    }
    return "\n".join(lines), results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the table only
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    import vllm
    from transformers import AutoTokenizer

    from agents.rollout import RolloutSettings, agent_prefix, few_shot_examples, run_batched
    from envs import make_env
    from envs.task_selection import select_tasks
    from flywheel.chat import ChatTokenizer
    from flywheel.inference import SamplingSettings, VLLMBackend

    load = os.getloadavg()[0]
    label, model_dir = resolve_model(args)
    shape = model_shape(model_dir)
    cpus = len(os.sched_getaffinity(0))
    print(f"timing float32 matmuls on 1 and {cpus} threads ...", file=sys.stderr)
    flops_1 = matmul_flops(1)
    flops_all = matmul_flops(cpus) if cpus > 1 else flops_1

    env = make_env("textcraft")
    test_ids = env.task_ids("test")
    if args.episodes > len(test_ids):
        sys.exit(f"--episodes {args.episodes}: TextCraft has only {len(test_ids)} test tasks")
    task_ids = select_tasks(test_ids, args.episodes, args.seed)
    prefix = agent_prefix(env, few_shot_examples(env, args.few_shot))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    sampling = SamplingSettings(temperature=0.0, max_tokens=args.max_tokens)
    settings = RolloutSettings(args.max_steps, args.max_model_len, sampling)

    backend = VLLMBackend(
        str(model_dir), args.max_model_len, args.kv_cache_gib, block_size=args.block_size,
        kv_cache_dtype=args.kv_cache_dtype,
    )  # fmt: skip
    try:
        log = RequestLog(backend.llm)
        engine_config = getattr(backend.llm.llm_engine, "vllm_config", None)
        block_size = getattr(getattr(engine_config, "cache_config", None), "block_size", None)
        # Warm-up outside the timings (first-call allocations); the cache is reset before each way.
        backend.generate([chat.encode(prefix)[0] + chat.header_ids], sampling)
        common = (env, task_ids, backend, chat, prefix, settings)
        sequential = explore("sequential", run_sequential, backend, log, shape, *common)
        batched = explore("batched", run_batched, backend, log, shape, *common)
        decode = None
        if args.decode_alone:
            print("timing the engine's decoding alone ...", file=sys.stderr)
            prompts = batched.middle_prompts
            decode = {
                "tokens_per_s": decode_alone(backend.llm, prompts, args.max_tokens),
                "batch": len(prompts),
                "mean_context": sum(map(len, prompts)) / len(prompts),
            }
    finally:
        backend.close()
    # The machine's limit is the best it showed: a timing taken while something else ran reads low.
    flops_1 = max(flops_1, matmul_flops(1))
    flops_all = max(flops_all, matmul_flops(cpus)) if cpus > 1 else flops_1
    # Every format's bound on all threads: the engine computes in one (float32 on a CPU), and
    # the fastest says what a change of format could give on this machine.
    bounds = matmul_bounds(cpus, timed={"float32": flops_all})

    info = {
        "model": label,
        "model_dir": str(model_dir),
        "episodes": args.episodes,
        "max_steps": args.max_steps,
        "max_tokens": args.max_tokens,
        "few_shot": args.few_shot,
        "prefix_tokens": len(chat.encode(prefix)[0]),
        "seed": args.seed,
        "max_model_len": args.max_model_len,
        "kv_cache_gib": args.kv_cache_gib,
        "block_size": block_size,
        "kv_cache_dtype": args.kv_cache_dtype,
        "decode_alone": decode,
        "cpus": cpus,
        "threads": cpus,
        "load": load,
        "flops_1": flops_1,
        "flops_all": flops_all,
        "matmul_bounds": bounds,
        "precision": "float32",
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "shape": shape,
    }
    table, results = report(info, sequential, batched)
    print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
