"""Environments behind one interface (`envs.base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envs.base import Environment, ValidationSplit

if TYPE_CHECKING:
    from flywheel.settings import EnvSettings


def make_env(settings: str | EnvSettings) -> Environment:
    """The environment `settings` describe (a bare name: that environment with its defaults).

    With `servers`, episodes run on those AgentGym-protocol servers instead of in process.
    """
    from flywheel.settings import EnvSettings

    if isinstance(settings, str):
        settings = EnvSettings(name=settings)
    if not settings.servers:
        return _local_env(settings)  # agentgym-* without servers is refused by EnvSettings
    from envs.agentgym import AgentGymEnv, ClientSettings, RemoteEnv

    client = ClientSettings(timeout_s=settings.request_timeout_s)
    if settings.name.startswith("agentgym-"):
        return AgentGymEnv(
            settings.name.removeprefix("agentgym-"),
            settings.servers,
            settings.agentgym.train,
            settings.agentgym.test,
            client,
        )
    return RemoteEnv(_local_env(settings), settings.servers, client)


def _local_env(settings: EnvSettings) -> Environment:
    """The environment in this process, holding out the run's validation split."""
    env = _local_env_of(settings)
    env.validation = ValidationSplit(
        settings.validation_tasks, settings.validation_seed, settings.max_expert_steps
    )
    return env


def _local_env_of(settings: EnvSettings) -> Environment:
    if settings.name == "textcraft":
        from envs.textcraft import TextCraftEnv

        return TextCraftEnv()
    if settings.name == "scienceworld":
        from envs.scienceworld import ScienceWorldEnv

        sw = settings.scienceworld
        return ScienceWorldEnv(sw.task_names, sw.variations, sw.simplification)
    if settings.name == "qa":
        from envs.qa_env import QAEnv

        return QAEnv(settings.qa)
    raise ValueError(f"unknown environment {settings.name!r}")
