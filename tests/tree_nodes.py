"""Search-tree nodes written by hand for the critique and revision tests."""

from __future__ import annotations

from agents.mcts import TreeNode
from flywheel.chat import format_reply


def step(id, parent, depth, action, observation, **terminal) -> TreeNode:
    """A node that took `action` (its reply's thought is `t<id>`) and saw `observation`."""
    return TreeNode(
        id=id, parent=parent, depth=depth, reply=format_reply(f"t{id}", action), action=action,
        observation=observation, **terminal,
    )  # fmt: skip
