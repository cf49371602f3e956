"""Tree search: building children from the parent's snapshot versus replaying the whole path.

The same trees are built twice on real TextCraft, once restoring the parent's state (one
environment step per child) and once replaying the path from a fresh episode for every child
(Agent-R's way). Replies come from `NoisyExpertBackend` (the expert's plan with seeded mistakes),
so both ways get identical replies and build identical trees (checked), and the time measured is
the search's own, not a model's. The script prints environment steps per expanded node, by the
depth of the children built, and expanded nodes per second, with the environment's share timed.

    python -m bench.mcts_restore                       # 12 tasks, 8 iterations, depth 12, N 4
    python -m bench.mcts_restore --tasks 2 --iterations 2   # smoke test
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from agents.mcts import SearchLimits, search
from agents.rollout import agent_prefix, few_shot_examples
from bench.scripted import NoisyExpertBackend
from envs import make_env
from flywheel.chat import ChatTokenizer

TARGET_STEP_RATIO = 3.0  # at depth >= 6


class TimedEnv:
    """Wraps an environment so the time spent in its episodes' steps is measured."""

    def __init__(self, env):
        self.env, self.seconds = env, 0.0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def start(self, task_id):
        started = time.perf_counter()
        episode = self.env.start(task_id)
        self.seconds += time.perf_counter() - started
        step = episode.step

        def timed_step(action):
            begin = time.perf_counter()
            try:
                return step(action)
            finally:
                self.seconds += time.perf_counter() - begin

        episode.step = timed_step
        return episode


def run(restore: bool, args, env, tasks, chat, prefix) -> dict:
    timed = TimedEnv(env)
    backend = NoisyExpertBackend(env, chat.tokenizer, mistake_rate=args.mistake_rate)
    limits = SearchLimits(
        iterations=args.iterations,
        max_depth=args.max_depth,
        samples_per_node=args.samples,
        restore_state=restore,
    )
    started = time.perf_counter()
    trees = search(timed, tasks, backend, chat, prefix, limits, seed=args.seed, progress=False)
    seconds = time.perf_counter() - started
    steps_by_depth: dict[int, int] = {}
    children_by_depth: dict[int, int] = {}
    for tree in trees:
        for depth, steps in tree.steps_by_depth.items():
            steps_by_depth[depth] = steps_by_depth.get(depth, 0) + steps
        for node in tree.nodes[1:]:
            if node.action is not None:  # children built with an environment step
                children_by_depth[node.depth] = children_by_depth.get(node.depth, 0) + 1
    expansions = sum(t.expansions for t in trees)
    return {
        "trees": trees,
        "seconds": seconds,
        "env_seconds": timed.seconds,
        "nodes": sum(len(t.nodes) - 1 for t in trees),
        "expansions": expansions,
        "steps": sum(t.env_steps for t in trees),
        "steps_by_depth": steps_by_depth,
        "children_by_depth": children_by_depth,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=12, help="train tasks, expert plan >= 6 steps")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--max-depth", type=int, default=12)
    parser.add_argument("--samples", type=int, default=4, help="replies sampled per expansion")
    parser.add_argument("--mistake-rate", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="tokenizer folder (default: SmolLM2-135M)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    if args.model is None:
        from flywheel.model import convert_base_model

        cache = Path(os.environ.get("FLYWHEEL_CACHE", ".cache/flywheel"))
        args.model = str(convert_base_model(cache / "models" / "smollm2-135m"))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(args.model))
    env = make_env("textcraft")
    tasks = [t for t in env.task_ids("train") if len(env.expert_plan(t)) >= 6][: args.tasks]
    prefix = agent_prefix(env, few_shot_examples(env, 1))
    restore = run(True, args, env, tasks, chat, prefix)
    replay = run(False, args, env, tasks, chat, prefix)
    same = all(
        [n.model_dump() for n in a.nodes] == [n.model_dump() for n in b.nodes]
        for a, b in zip(restore["trees"], replay["trees"], strict=True)
    )

    print(
        f"TextCraft, {len(tasks)} tasks (expert plan >= 6 steps), {args.iterations} iterations, "
        f"max depth {args.max_depth}, N={args.samples}, mistake rate {args.mistake_rate}; "
        f"identical trees: {same}\n"
    )
    print("| children at depth | children | env steps/child, restore | env steps/child, replay "
          "| ratio |\n|---|---|---|---|---|")  # fmt: skip
    buckets = [(1, 2), (3, 5), (6, 8), (9, args.max_depth)]
    deep_ratio = None
    for low, high in buckets:
        depths = range(low, high + 1)
        children = sum(restore["children_by_depth"].get(d, 0) for d in depths)
        if not children:
            continue
        a = sum(restore["steps_by_depth"].get(d, 0) for d in depths) / children
        b = sum(replay["steps_by_depth"].get(d, 0) for d in depths) / children
        print(f"| {low}-{high} | {children} | {a:.2f} | {b:.2f} | {b / a:.1f}x |")
    deep = range(6, args.max_depth + 1)
    deep_children = sum(restore["children_by_depth"].get(d, 0) for d in deep)
    if deep_children:
        deep_ratio = sum(replay["steps_by_depth"].get(d, 0) for d in deep) / max(
            1, sum(restore["steps_by_depth"].get(d, 0) for d in deep)
        )
    print("\n| way | nodes | expansions | env steps | env steps/node | env ms/node | wall seconds "
          "| nodes/s |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for name, r in [("restore", restore), ("replay", replay)]:
        print(
            f"| {name} | {r['nodes']} | {r['expansions']} | {r['steps']} | "
            f"{r['steps'] / r['nodes']:.2f} | {1000 * r['env_seconds'] / r['nodes']:.3f} | "
            f"{r['seconds']:.2f} | {r['nodes'] / r['seconds']:.1f} |"
        )
    speed = (restore["nodes"] / restore["seconds"]) / (replay["nodes"] / replay["seconds"])
    verdict = "met" if deep_ratio and deep_ratio >= TARGET_STEP_RATIO and speed > 1 else "NOT met"
    ratio_text = f"{deep_ratio:.1f}x" if deep_ratio else "n/a (no children at depth >= 6)"
    print(
        f"\nAt depth >= 6 replay takes {ratio_text} the environment steps of restore; restore "
        f"expands {speed:.2f}x the nodes per second. Target (>= {TARGET_STEP_RATIO:.0f}x fewer "
        f"steps at depth >= 6, more nodes/s): {verdict}."
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
