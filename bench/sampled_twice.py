"""Does one command sample the same episodes twice? One explore shard as the ETO config's
explore stage plays it (TextCraft tasks within 4 expert steps, SmolLM2-135M, 48-token replies),
sampled at temperature 1, two samples per task; the generated ids of every episode written as
JSON lines. Run it twice (two processes), then compare the two files:

    python -m bench.sampled_twice play runs/sampled-1.jsonl --tasks 4 --kv-cache-gib 1 --max-steps 4
    python -m bench.sampled_twice play runs/sampled-2.jsonl --tasks 4 --kv-cache-gib 1 --max-steps 4
    python -m bench.sampled_twice compare runs/sampled-1.jsonl runs/sampled-2.jsonl

docs/determinism.md reports what it measured before and after requests were seeded.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def play(out: str, tasks: int, kv_cache_gib: int, max_steps: int) -> None:
    from transformers import AutoTokenizer

    from agents.rollout import RolloutSettings, agent_prefix, few_shot_examples, run_batched
    from envs import make_env
    from envs.task_selection import task_list
    from flywheel.chat import ChatTokenizer
    from flywheel.inference import SamplingSettings, open_backend
    from flywheel.settings import EnvSettings, InferenceSettings

    cache = Path(os.environ.get("FLYWHEEL_CACHE", ".cache/flywheel"))
    model_dir = str(cache / "models" / "smollm2-135m")
    env_settings = EnvSettings(name="textcraft", max_expert_steps=4, max_steps=6, few_shot=1)
    inference = InferenceSettings(max_tokens=48, kv_cache_gib=kv_cache_gib)
    env = make_env(env_settings)
    task_ids = task_list(env, "train", env_settings, 0)[:tasks]
    prefix = agent_prefix(env, few_shot_examples(env, 1))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    backend = open_backend(inference, model_dir, chat.tokenizer)
    sampling = SamplingSettings(temperature=1.0, max_tokens=48, seed=1000)
    settings = RolloutSettings(max_steps, inference.max_model_len, sampling)
    started = time.perf_counter()
    played = run_batched(env, task_ids, backend, chat, prefix, settings, progress=False,
                         samples_per_task=2)  # fmt: skip
    seconds = time.perf_counter() - started
    with open(out, "w") as file:
        for t in played:
            turns = [m.token_ids for m in t.messages if m.role == "assistant"]
            file.write(json.dumps({"task": t.task_id, "reward": t.reward, "ids": turns}) + "\n")
    print(f"{len(played)} episodes in {seconds:.1f} s, {sum(t.success for t in played)} solved")


def episodes(path: str) -> dict[tuple[str, int], list]:
    """(task, its k-th episode in the file) -> the episode's generated ids per turn."""
    seen: dict[str, int] = {}
    out = {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        k = seen.get(record["task"], 0)
        seen[record["task"]] = k + 1
        out[(record["task"], k)] = record["ids"]
    return out


def compare(first: str, second: str) -> None:
    a, b = episodes(first), episodes(second)
    same = sum(a[key] == b.get(key) for key in a)
    same_first = sum(a[key][:1] == b.get(key, [])[:1] for key in a)
    print(f"{same} of {len(a)} episodes identical; first reply identical in {same_first}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("play")
    p.add_argument("out")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--kv-cache-gib", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=4)
    c = sub.add_parser("compare")
    c.add_argument("first")
    c.add_argument("second")
    args = parser.parse_args()
    if args.command == "play":
        play(args.out, args.tasks, args.kv_cache_gib, args.max_steps)
    else:
        compare(args.first, args.second)


if __name__ == "__main__":
    main()
