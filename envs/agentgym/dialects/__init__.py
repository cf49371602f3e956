"""One object per AgentGym server family, each in its own file: a new family is a new file
here, a `Dialect` subclass (envs/agentgym/protocol.py), and its line in `DIALECTS`. For `serve-env
--compat agentgym` to emulate the family's server, one more file in envs/agentgym/compat/ (an
`AgentGymService` subclass), which the dialect's `emulation` names."""

from __future__ import annotations

from envs.agentgym.dialects.sciworld import SCIWORLD
from envs.agentgym.dialects.textcraft import TEXTCRAFT
from envs.agentgym.dialects.webshop import WEBSHOP
from envs.agentgym.protocol import Dialect

DIALECTS: dict[str, Dialect] = {d.name: d for d in (TEXTCRAFT, SCIWORLD, WEBSHOP)}


def dialect_serving(env_name: str) -> Dialect:
    """The dialect a Flywheel environment is served in: its AgentGym counterpart's, else the
    plain protocol's (TextCraft's)."""
    return next((d for d in DIALECTS.values() if d.served_env == env_name), TEXTCRAFT)
