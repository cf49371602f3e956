"""What seeded sampling costs on a CPU, and whether it repeats: sampled TextCraft episodes as the
ETO config's explore stage plays them (SmolLM2-135M, 48-token replies, kv_cache_gib 2,
max_model_len 4096, temperature 1), played by three engines, each in a fresh process:

- seeded, capped: the old sizing, at most as many sequences at once as fit the KV cache at
  max_model_len (11 here), every request handed to vLLM at once;
- seeded, admitted: the engine as shipped, no cap, each seeded request handed to vLLM once the
  KV cache can hold it whole beside those running (`flywheel.inference.KVAdmission`);
- unseeded, uncapped: vLLM's defaults and no seeds (what sampling was before seeds).

The seeded+admitted run is played twice. Prints a markdown table: wall time, the ratio to the
unseeded run, vLLM's preemption count, and whether the episodes are token for token those of
the first seeded+admitted run.

    python -m bench.seeded_sampling --tasks 16 --samples 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODES = ("capped", "admitted", "admitted-again", "unseeded")
LABELS = {
    "capped": "seeded, capped (old sizing)",
    "admitted": "seeded, admitted (shipped)",
    "admitted-again": "seeded, admitted, run again",
    "unseeded": "unseeded, uncapped",
}
KV_CACHE_GIB, MAX_MODEL_LEN, MAX_TOKENS = 2, 4096, 48


def old_cap(model_dir: str) -> int:
    """The old sizing's sequences at once: the cache's blocks over a full sequence's."""
    from flywheel.inference import kv_cache_blocks

    return kv_cache_blocks(model_dir, KV_CACHE_GIB, "auto", 32) // (MAX_MODEL_LEN // 32)


def open_engine(mode: str, model_dir: str):
    from flywheel.inference import VLLMBackend

    class AllAtOnce(VLLMBackend):
        """Seeded requests handed to vLLM together, as before `KVAdmission`."""

        def seeded_blocks(self, prompts, max_tokens):
            return None

    class Unseeded(AllAtOnce):
        def request_seeds(self, sampling, count):
            return [None] * count

    stats = {"disable_log_stats": False}  # for vLLM's preemption counter
    if mode == "capped":
        return AllAtOnce(model_dir, MAX_MODEL_LEN, KV_CACHE_GIB, block_size=32,
                         vllm_args={**stats, "max_num_seqs": old_cap(model_dir)})  # fmt: skip
    if mode == "unseeded":
        return Unseeded(model_dir, MAX_MODEL_LEN, KV_CACHE_GIB, block_size=32, sampling=False,
                        vllm_args=stats)  # fmt: skip
    return VLLMBackend(model_dir, MAX_MODEL_LEN, KV_CACHE_GIB, block_size=32, vllm_args=stats)


def preemptions(backend) -> int:
    return int(sum(m.value for m in backend.llm.get_metrics() if m.name == "vllm:num_preemptions"))


def play(mode: str, out: str, tasks: int, samples: int, max_steps: int) -> None:
    from transformers import AutoTokenizer

    from agents.rollout import RolloutSettings, agent_prefix, few_shot_examples, run_batched
    from envs import make_env
    from envs.task_selection import task_list
    from flywheel.chat import ChatTokenizer
    from flywheel.inference import SamplingSettings
    from flywheel.settings import EnvSettings

    cache = Path(os.environ.get("FLYWHEEL_CACHE", ".cache/flywheel"))
    model_dir = str(cache / "models" / "smollm2-135m")
    env_settings = EnvSettings(
        name="textcraft", max_expert_steps=4, max_steps=max_steps, few_shot=1
    )
    env = make_env(env_settings)
    task_ids = task_list(env, "train", env_settings, 0)[:tasks]
    prefix = agent_prefix(env, few_shot_examples(env, 1))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    backend = open_engine(mode, model_dir)
    sampling = SamplingSettings(temperature=1.0, max_tokens=MAX_TOKENS, seed=1000)
    settings = RolloutSettings(max_steps, MAX_MODEL_LEN, sampling)
    started = time.perf_counter()
    played = run_batched(env, task_ids, backend, chat, prefix, settings, progress=False,
                         samples_per_task=samples)  # fmt: skip
    seconds = time.perf_counter() - started
    episodes = [
        {
            "task": t.task_id,
            "ids": [m.token_ids for m in t.messages[t.episode_start :] if m.role == "assistant"],
        }  # fmt: skip
        for t in played
    ]
    summary = {"mode": mode, "seconds": seconds, "episodes": episodes,
               "preemptions": preemptions(backend), "solved": sum(t.success for t in played),
               "tokens": sum(len(ids) for e in episodes for ids in e["ids"])}  # fmt: skip
    Path(out).write_text(json.dumps(summary))
    backend.close()


def table(results: dict[str, dict], command: str) -> str:
    reference = results["admitted"]["episodes"]
    unseeded = results["unseeded"]["seconds"]
    lines = [
        "| engine | wall s | / unseeded | generated tokens | preemptions | episodes equal to "
        "the first seeded+admitted run |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for mode in MODES:
        r = results[mode]
        same = sum(a == b for a, b in zip(r["episodes"], reference, strict=True))
        equal = "(itself)" if mode == "admitted" else f"{same} of {len(reference)}"
        lines.append(f"| {LABELS[mode]} | {r['seconds']:.1f} | {r['seconds'] / unseeded:.2f}x | "
                     f"{r['tokens']} | {r['preemptions']} | {equal} |")  # fmt: skip
    return "\n".join(lines) + f"\n\nCommand: `{command}`"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--play", choices=MODES, help="one engine's run (a subprocess)")
    parser.add_argument("--out", default="runs/seeded-sampling")
    args = parser.parse_args()
    sizes = (args.tasks, args.samples, args.max_steps)
    if args.play:
        play(args.play, f"{args.out}/{args.play}.json", *sizes)
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in MODES:
        subprocess.run([sys.executable, "-m", "bench.seeded_sampling", "--play", mode,
                        "--out", args.out, "--tasks", str(args.tasks), "--samples",
                        str(args.samples), "--max-steps", str(args.max_steps)], check=True)  # fmt: skip
        results[mode] = json.loads(Path(f"{args.out}/{mode}.json").read_text())
        print(f"{mode}: {results[mode]['seconds']:.1f} s", flush=True)
    print(table(results, "python -m bench.seeded_sampling " + " ".join(sys.argv[1:])))


if __name__ == "__main__":
    main()
