"""Stage: Monte Carlo Tree Search on the train tasks with the current model (Agent-R).

Stores the trees (`trees.jsonl`, one tree per line, loadable as `SearchTree`) and a readable
outline of each (`trees.txt`) to inspect what the agent tried.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from agents.mcts import SearchLimits, SearchTree, render, search
from flywheel.inference import SamplingSettings
from flywheel.records import Message
from flywheel.settings import EnvSettings, InferenceSettings, RoundSlices
from flywheel.stage import StageResult, StageRun, stage


class MCTSSettings(RoundSlices):
    """Agent-R's tree search over the agent's actions, one tree per train task."""

    iterations: int = Field(default=8, ge=1)
    """descents from the root per tree"""
    max_depth: int = Field(default=12, ge=1)
    """a node this deep is terminal (agent turns)"""
    samples_per_node: int = Field(default=4, ge=1)
    """N replies sampled per expansion"""
    exploration_constant: float = Field(default=0.25, ge=0)
    """UCT: mean value + c * sqrt(ln(parent visits) / visits); Agent-R uses 0.25."""
    temperature: float = Field(default=1.0, gt=0)
    """sampling must differ for N samples to help"""
    restore_state: bool = True
    """Build a child from its parent's snapshot (one environment step) where the environment can
    snapshot; False replays the whole path from a fresh episode for every child (Agent-R's way).
    """
    task_order_seed: int | None = 0
    """`RoundSlices.task_order_seed`, shuffling by default here: Agent-R's slices of QA's
    family-ordered questions would each be one family (Agent-R1 shuffles too)."""


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


class MCTSInputs(BaseModel):
    """One tree per task, grown by sampling the model at each node (`search_limits`)."""

    model_url: str
    env: EnvSettings
    task_ids: list[str]
    """one tree each"""
    prefix: list[Message]
    """system prompt before each task's instruction"""
    inference: InferenceSettings
    settings: MCTSSettings
    seed: int
    """sampling and tie-breaking; the flow varies it per round"""


@stage("mcts")
def mcts_stage(inputs: MCTSInputs, run: StageRun) -> StageResult:
    from transformers import AutoTokenizer

    from envs import make_env
    from flywheel.chat import ChatTokenizer
    from flywheel.inference import open_backend

    store = run.store
    model_dir = str(store.local_dir(inputs.model_url))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    backend = open_backend(inputs.inference, model_dir, chat.tokenizer)
    limits = search_limits(inputs.settings, inputs.inference, inputs.seed)
    started = time.perf_counter()
    trees = search(
        make_env(inputs.env), inputs.task_ids, backend, chat, inputs.prefix, limits, inputs.seed
    )
    seconds = time.perf_counter() - started
    counts = tree_counts(trees)
    outline = "\n\n".join(render(t) for t in trees)
    return StageResult(
        files={
            "trees": store.write_records(run.file("trees.jsonl"), trees),
            "outline": store.write_text(run.file("trees.txt"), outline),
        },
        counts=counts,
        metrics={
            "seconds": seconds,
            "nodes_per_s": counts["nodes"] / seconds if seconds else 0.0,
            "env_steps_per_expansion": counts["env_steps"] / max(1, counts["expansions"]),
        },
    )
