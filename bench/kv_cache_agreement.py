"""Does a cheaper KV cache change the policy? One model, the config's held-out tasks, greedy
episodes under each KV-cache element type (`inference.kv_cache_dtype`), compared episode by
episode with the first type's.

    python -m bench.kv_cache_agreement --model-dir runs/eto-textcraft/sft/model
    python -m bench.kv_cache_agreement --model-dir M --few-shot 1 --dtypes auto fp8 fp8_e5m2

Prints a markdown table: per type the tasks solved with a 95% Wilson interval, the wall time of
the episodes, how many episodes are identical to the first type's (every reply token the same),
and how many steps agree before an episode's first differing reply.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from flywheel.confidence import wilson_interval
from flywheel.settings import KV_CACHE_DTYPES

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model-dir", required=True, help="a Hugging Face model folder")
    parser.add_argument(
        "--config",
        default=str(ROOT / "configs" / "eto_textcraft.yaml"),
        help="recipe config whose env (held-out tasks, step limit) and inference settings apply",
    )
    parser.add_argument(
        "--few-shot",
        type=int,
        default=0,
        help="worked examples in the prompt: 0 as trained models are prompted, 1 as the "
        "untrained one is",
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=KV_CACHE_DTYPES, default=["auto", "fp8"], help="the first is the "
        "reference the others are compared with",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this path")
    args = parser.parse_args(argv)
    if not (Path(args.model_dir) / "config.json").is_file():
        parser.error(
            f"--model-dir {args.model_dir} holds no config.json (a Hugging Face model folder; "
            "runs/eto-textcraft/sft/model is made by `make demo`)"
        )
    if len(set(args.dtypes)) != len(args.dtypes):
        parser.error("--dtypes: each type once")
    return args


Episodes = dict[str, tuple[list[list[int]], bool]]  # task -> (reply token ids, solved)


def agreement(reference: Episodes, other: Episodes) -> dict:
    """Identical episodes, and steps that agree before each episode's first differing reply."""
    tasks = sorted(reference.keys() & other.keys())
    agreeing = 0
    for task in tasks:
        for ours, theirs in zip(reference[task][0], other[task][0], strict=False):
            if ours != theirs:
                break
            agreeing += 1
    return {
        "tasks": len(tasks),
        "identical": sum(reference[t][0] == other[t][0] for t in tasks),
        "steps": sum(len(reference[t][0]) for t in tasks),
        "agreeing_steps": agreeing,
        "solved_differently": [t for t in tasks if reference[t][1] != other[t][1]],
    }


def table(results: list[dict]) -> str:
    lines = [
        "| KV cache | solved (n) | success rate | 95% interval (Wilson) | wall s | identical "
        "episodes | steps agreeing before the first difference | solved differently |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in results:
        low, high = wilson_interval(r["solved"], r["n"])
        same = r["agreement"]
        lines.append(
            f"| {r['dtype']} | {r['solved']}/{r['n']} | {r['solved'] / r['n']:.1%} | "
            f"{low:.1%}–{high:.1%} | {r['seconds']:.1f} | {same['identical']}/{same['tasks']} | "
            f"{same['agreeing_steps']}/{same['steps']} | "
            f"{', '.join(same['solved_differently']) or '-'} |"
        )
    return "\n".join(lines)


def run_episodes(args, dtype: str) -> tuple[Episodes, float]:
    from transformers import AutoTokenizer

    from agents.rollout import RolloutSettings, agent_prefix, few_shot_examples, run_batched
    from envs import make_env
    from envs.task_selection import task_list
    from flywheel.chat import ChatTokenizer
    from flywheel.config_files import load_config_section
    from flywheel.inference import SamplingSettings, VLLMBackend
    from flywheel.settings import EnvSettings, InferenceSettings

    env_settings = load_config_section(EnvSettings, args.config, "env")
    inference = load_config_section(InferenceSettings, args.config, "inference")
    env = make_env(env_settings)
    tasks = task_list(env, "test", env_settings, 0)
    prefix = agent_prefix(env, few_shot_examples(env, args.few_shot))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(args.model_dir))
    sampling = SamplingSettings(temperature=0.0, max_tokens=inference.max_tokens)
    settings = RolloutSettings(env_settings.max_steps, inference.max_model_len, sampling)
    backend = VLLMBackend.from_settings(
        args.model_dir, inference.model_copy(update={"kv_cache_dtype": dtype})
    )
    try:
        started = time.perf_counter()
        trajectories = run_batched(env, tasks, backend, chat, prefix, settings)
        seconds = time.perf_counter() - started
    finally:
        backend.close()
    episodes = {
        t.task_id: ([list(m.token_ids) for m in t.messages[t.episode_start :]
                     if m.role == "assistant"], t.success)
        for t in trajectories
    }  # fmt: skip
    return episodes, seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the table only
    runs = [(dtype, *run_episodes(args, dtype)) for dtype in args.dtypes]
    reference = runs[0][1]
    results = [
        {
            "dtype": dtype,
            "solved": sum(solved for _, solved in episodes.values()),
            "n": len(episodes),
            "seconds": seconds,
            "agreement": agreement(reference, episodes),
        }
        for dtype, episodes, seconds in runs
    ]
    print(
        f"### Greedy episodes under each KV cache: {Path(args.model_dir)}, held-out tasks of "
        f"{Path(args.config).name}, {args.few_shot}-shot, compared with {args.dtypes[0]}\n"
    )
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
