"""Environment servers: the same TextCraft exploration in process and through 1 and 2 servers.

Exploration is `run_batched` (all episodes in lockstep, steps of live episodes in flight at once
for remote environments), replies from `NoisyExpertBackend` (the expert's plan with seeded
mistakes: identical episodes in every mode, checked). The protocol's overhead per step is the
extra wall time over the in-process run, divided by the steps taken. A second table gives the
round-trip latency of one step when a single episode runs alone (no overlap to hide it).
Each mode runs `--repeats` times; the fastest run is reported (these machines are shared).

    python -m bench.env_protocol                 # 64 episodes, 3 repeats
    python -m bench.env_protocol --episodes 8 --repeats 1   # smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from agents.rollout import RolloutSettings, agent_prefix, run_batched
from bench.scripted import NoisyExpertBackend
from envs import make_env
from envs.agentgym.client import ClientSettings, RemoteEnv
from envs.agentgym.server import LocalServer
from flywheel.chat import ChatTokenizer

TARGET_OVERHEAD_MS = 2.0


def explore(env, catalog, tasks, chat, prefix, settings) -> tuple[float, list]:
    backend = NoisyExpertBackend(catalog, chat.tokenizer, mistake_rate=0.2)
    started = time.perf_counter()
    trajectories = run_batched(env, tasks, backend, chat, prefix, settings, progress=False)
    return time.perf_counter() - started, trajectories


def step_latency(env, tasks, actions_per_task: int = 20) -> float:
    """Seconds per step of one episode at a time (`inventory` changes nothing, so any count)."""
    steps, started = 0, time.perf_counter()
    for task_id in tasks:
        episode = env.start(task_id)
        for _ in range(actions_per_task):
            episode.step("inventory")
            steps += 1
        episode.close()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the tables to this markdown file")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from flywheel.model import convert_base_model
    from flywheel.storage import cache_root

    base_model = convert_base_model(cache_root() / "models" / "smollm2-135m")
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(base_model))
    local = make_env("textcraft")
    tasks = local.task_ids("train")[: args.episodes]
    prefix = agent_prefix(local, [])
    settings = RolloutSettings(max_steps=args.max_steps)

    servers = [LocalServer("--env", "textcraft") for _ in range(2)]
    client = ClientSettings()
    modes = {
        "in process": local,
        "1 server": RemoteEnv(local, [servers[0].url], client),
        "2 servers": RemoteEnv(local, [s.url for s in servers], client),
    }
    rows, reference = {}, None
    try:
        for name, env in modes.items():
            times = []
            for _ in range(args.repeats):
                seconds, trajectories = explore(env, local, tasks, chat, prefix, settings)
                times.append(seconds)
                outcome = [(t.messages, t.reward, t.finish_reason) for t in trajectories]
                reference = reference or outcome
                assert outcome == reference, f"{name}: episodes differ from the in-process ones"
            steps = sum(t.n_steps for t in trajectories)
            latency = statistics.median(step_latency(env, tasks[:4]) for _ in range(args.repeats))
            rows[name] = {"seconds": min(times), "steps": steps, "latency": latency}
    finally:
        for server in servers:
            server.kill()

    base = rows["in process"]
    lines = [
        f"TextCraft, {len(tasks)} episodes in lockstep, at most {args.max_steps} steps, "
        f"scripted policy (mistake rate 0.2), best of {args.repeats}; episodes identical in "
        "every mode: True",
        "",
        "| mode | steps | wall s | episodes/s | ms/step | overhead ms/step | 1-episode step latency ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        overhead = (row["seconds"] - base["seconds"]) / row["steps"] * 1000
        lines.append(
            f"| {name} | {row['steps']} | {row['seconds']:.2f} | "
            f"{len(tasks) / row['seconds']:.1f} | {row['seconds'] / row['steps'] * 1000:.2f} | "
            f"{overhead:+.2f} | {row['latency'] * 1000:.2f} |"
        )
    worst = max((r["seconds"] - base["seconds"]) / r["steps"] * 1000 for r in rows.values())
    verdict = "met" if worst < TARGET_OVERHEAD_MS else "NOT met"
    lines += [
        "",
        f"Target: overhead under {TARGET_OVERHEAD_MS} ms per step in exploration: {verdict}.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
