"""Stage: pick the root-to-leaf paths Agent-R learns from.

A pair is a good leaf and a worse leaf of the same tree: the good one scores at least alpha and
beats the bad one by more than beta. Scores are the environment's rewards normalised to [0, 1],
so alpha and beta mean the same on TextCraft's {0, 1} and on SciWorld's 0-100. (Agent-R's script
compares the values with the thresholds as read from the environment, strings, and crashes.)
Good leaves on their own (score at least alpha) make the good-paths-only data.

Where the environment says whether an episode solved its task (`TreeNode.success`: QA's exact
match), a good leaf must also be solved: QA's reward gives partial credit (answer F1 plus a
format term), so a wrong answer can score above alpha.
"""

from __future__ import annotations

import random

from pydantic import BaseModel

from agents.mcts import PathPair, SearchTree, TreeNode, divergence
from flywheel.stage import StageResult, StageRun, stage


def good_leaf(leaf: TreeNode, alpha: float) -> bool:
    """Scores at least alpha, and is solved where the environment decides success."""
    return leaf.score >= alpha and (leaf.success is None or leaf.solved)


def select_pairs(
    tree: SearchTree, alpha: float, beta: float, cap: int, seed: int = 0
) -> list[PathPair]:
    """Up to `cap` pairs, a seeded random choice among all that pass the thresholds, spreading
    over as many different bad leaves as possible before reusing one."""
    alpha, beta = float(alpha), float(beta)
    leaves = tree.leaves()
    candidates = [
        (good, bad)
        for good in leaves
        for bad in leaves
        if good.id != bad.id and good_leaf(good, alpha) and good.score - bad.score > beta
    ]
    rng = random.Random(f"{seed}:{tree.task_id}")
    rng.shuffle(candidates)
    uses: dict[int, int] = {}
    ranked = []
    for good, bad in candidates:  # round-robin over bad leaves: the i-th use of a leaf ranks i
        uses[bad.id] = uses.get(bad.id, 0) + 1
        ranked.append((uses[bad.id], good, bad))
    ranked.sort(key=lambda item: item[0])  # stable: keeps the shuffled order within a rank
    return [
        PathPair(
            task_id=tree.task_id,
            good_leaf=good.id,
            bad_leaf=bad.id,
            good_score=good.score,
            bad_score=bad.score,
            divergence=divergence(tree, good.id, bad.id),
        )
        for _, good, bad in ranked[:cap]
    ]


def select_good(tree: SearchTree, alpha: float, cap: int) -> list[int]:
    """Good leaves (`good_leaf`), best first, shorter first among equals."""
    good = [leaf for leaf in tree.leaves() if good_leaf(leaf, float(alpha))]
    good.sort(key=lambda leaf: (-leaf.score, leaf.depth, leaf.id))
    return [leaf.id for leaf in good[:cap]]


class SelectPathsInputs(BaseModel):
    """Thresholds on normalised leaf scores (see the module's docstring) and caps per tree."""

    trees_url: str
    alpha: float  # a good leaf scores at least this
    beta: float  # and beats its bad leaf by more than this
    max_pairs_per_task: int
    max_good_per_task: int  # good paths kept for the good-paths data
    seed: int  # which pairs, when more pass than the cap


@stage("select-paths")
def select_paths_stage(inputs: SelectPathsInputs, run: StageRun) -> StageResult:
    store, alpha = run.store, inputs.alpha
    trees = store.read_records(inputs.trees_url, SearchTree)
    pairs = [
        p
        for t in trees
        for p in select_pairs(t, alpha, inputs.beta, inputs.max_pairs_per_task, inputs.seed)
    ]
    good = [
        {"task_id": t.task_id, "leaf": leaf}
        for t in trees
        for leaf in select_good(t, alpha, inputs.max_good_per_task)
    ]
    return StageResult(
        files={
            "pairs": store.write_records(run.file("pairs.jsonl"), pairs),
            "good": store.write_json(run.file("good.json"), good),
        },
        counts={
            "pairs": len(pairs),
            "good_paths": len(good),
            "tasks_with_pairs": len({p.task_id for p in pairs}),
        },
        metrics={"alpha": alpha, "beta": inputs.beta},
    )
