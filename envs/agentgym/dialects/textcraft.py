"""AgentGym's TextCraft servers (agentenv_textcraft): the plain protocol's shapes, rewards 0 or 1.

`/create` answers `{"id", "observation", ...}`; `/reset` takes `data_idx`; `/step` answers
`{"observation", "reward", "done"}`. Its task texts depend on the server process's hash seed.
"""

from __future__ import annotations

from typing import Any

from envs.agentgym.expert import (
    TEXTCRAFT_PROMPT,
    textcraft_goal,
    textcraft_mistakes,
    textcraft_plan,
)
from envs.agentgym.protocol import Dialect

# AgentGym's TextCraft server builds its task text by iterating Python sets, so the text depends
# on the server process's hash seed: servers with different seeds cannot take over each other's
# episodes.
HASH_SEED_HINT = (
    "AgentGym's TextCraft server's text depends on its hash seed, so this server was likely "
    "started with another PYTHONHASHSEED than the first: start every server with the same one "
    "(e.g. `PYTHONHASHSEED=0 textcraft --port 36001`, or `PYTHONHASHSEED=0 flywheel serve-env "
    "--compat agentgym --port 36001`)"
)


class TextCraftDialect(Dialect):
    name = "textcraft"
    served_env = "textcraft"
    system_prompt = TEXTCRAFT_PROMPT
    replay_hint = HASH_SEED_HINT
    compat_note = (
        "note: TextCraft's texts depend on this process's hash seed, as AgentGym's server's "
        "do; start both with the same PYTHONHASHSEED (e.g. PYTHONHASHSEED=0) to get the same "
        "texts, and every server a client moves episodes between"
    )
    emulation = "envs.agentgym.compat.textcraft:AgentGymTextCraftService"

    def task_goal(self, instruction: str) -> str | None:
        """The goal item (`acacia_boat`): AgentGym's numbering depends on the machine the server
        runs on, the goal does not."""
        return textcraft_goal(instruction)

    def expert_plan(self, instruction: str, reset_answer: Any) -> list[tuple[str, str]] | None:
        return textcraft_plan(instruction)

    def mistakes(self, instruction: str, actions: list[str | None]) -> list[bool] | None:
        return textcraft_mistakes(instruction, actions)

    def compat_mode(self, options) -> str:
        return f", recipe files listed by {options.listing}"


TEXTCRAFT = TextCraftDialect()
