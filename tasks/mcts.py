"""Stage: Monte Carlo Tree Search on the train tasks with the current model (Agent-R).

Stores the trees (`trees.jsonl`, one tree per line, loadable as `SearchTree`) and a readable
outline of each (`trees.txt`) to inspect what the agent tried.
"""

from __future__ import annotations

import time

from flywheel.inference import SamplingSettings
from flywheel.mcts import SearchLimits, SearchTree, render, search
from flywheel.records import Manifest, Message
from flywheel.settings import EnvSettings, InferenceSettings, MCTSSettings
from flywheel.stage import stage_task, store_for


def search_limits(settings: MCTSSettings, inference: InferenceSettings, seed: int) -> SearchLimits:
    return SearchLimits(
        iterations=settings.iterations,
        max_depth=settings.max_depth,
        samples_per_node=settings.samples_per_node,
        exploration_constant=settings.exploration_constant,
        restore_state=settings.restore_state,
        max_model_len=inference.max_model_len,
        sampling=SamplingSettings(
            temperature=settings.temperature, max_tokens=inference.max_tokens, seed=seed
        ),
    )


def tree_counts(trees: list[SearchTree]) -> dict[str, int]:
    leaves = [leaf for t in trees for leaf in t.leaves()]
    return {
        "trees": len(trees),
        "nodes": sum(len(t.nodes) for t in trees),
        "leaves": len(leaves),
        "solved_leaves": sum(leaf.solved for leaf in leaves),
        "trees_with_solution": sum(any(leaf.solved for leaf in t.leaves()) for t in trees),
        "expansions": sum(t.expansions for t in trees),
        "duplicates": sum(t.duplicates for t in trees),
        "env_steps": sum(t.env_steps for t in trees),
    }


@stage_task("mcts")
def mcts_stage(
    store_url: str,
    model_url: str,
    env: EnvSettings,
    task_ids: list[str],
    prefix: list[Message],
    inference: InferenceSettings,
    settings: MCTSSettings,
    seed: int,
    out_url: str,
) -> Manifest:
    store = store_for(store_url)
    inputs = {
        "model": model_url, "env": env.identity(), "tasks": task_ids, "prefix": prefix,
        "inference": inference, "settings": settings, "seed": seed,
    }  # fmt: skip
    if (done := store.manifest(out_url, inputs)) is not None:
        return done
    from transformers import AutoTokenizer

    from envs import make_env
    from flywheel.chat import ChatTokenizer
    from flywheel.rollout import open_backend

    model_dir = str(store.local_dir(model_url))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    backend = open_backend(inference, model_dir, chat.tokenizer)
    started = time.perf_counter()
    trees = search(
        make_env(env), task_ids, backend, chat, prefix,
        search_limits(settings, inference, seed), seed,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    counts = tree_counts(trees)
    return store.publish(
        Manifest(
            stage="mcts",
            url=out_url,
            files={
                "trees": store.write_records(f"{out_url}/trees.jsonl", trees),
                "outline": store.write_text(
                    f"{out_url}/trees.txt", "\n\n".join(render(t) for t in trees)
                ),
            },
            counts=counts,
            metrics={
                "seconds": seconds,
                "nodes_per_s": counts["nodes"] / seconds if seconds else 0.0,
                "env_steps_per_expansion": counts["env_steps"] / max(1, counts["expansions"]),
            },
        ),
        inputs,
    )
