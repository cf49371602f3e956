"""Search-tree nodes written by hand for the critique and revision tests."""

from __future__ import annotations

from agents.mcts import SearchTree, TreeNode
from flywheel.chat import format_reply


def step(id, parent, depth, action, observation, **terminal) -> TreeNode:
    """A node that took `action` (its reply's thought is `t<id>`) and saw `observation`."""
    return TreeNode(
        id=id, parent=parent, depth=depth, reply=format_reply(f"t{id}", action), action=action,
        observation=observation, **terminal,
    )  # fmt: skip


def crafting_tree(*more: TreeNode) -> SearchTree:
    """root -> 1 get a -> {2 get b -> 4 craft x (solved), 3 get z}, then the nodes `more`."""
    nodes = [
        TreeNode(id=0, observation="Crafting commands: ...\n\nGoal: craft x."),
        step(1, 0, 1, "get 1 a", "Got 1 a"),
        step(2, 1, 2, "get 1 b", "Got 1 b"),
        step(3, 1, 2, "get 1 z", "Got 1 z"),
        step(
            4, 2, 3, "craft 1 x using 1 a, 1 b", "Crafted 1 x", finish="done", score=1.0, reward=1.0
        ),
        *more,
    ]
    for n in nodes[1:]:
        nodes[n.parent].children.append(n.id)
    return SearchTree(task_id="acacia_boat", env="textcraft", nodes=nodes)
