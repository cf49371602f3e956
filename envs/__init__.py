"""Environments behind one interface (`envs.base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envs.base import Environment

if TYPE_CHECKING:
    from flywheel.settings import EnvSettings


def make_env(settings: str | EnvSettings) -> Environment:
    """The environment `settings` describe (a bare name: that environment with its defaults).

    With `servers`, episodes run on those AgentGym-protocol servers instead of in process.
    """
    from flywheel.settings import EnvSettings

    if isinstance(settings, str):
        settings = EnvSettings(name=settings)
    if settings.name.startswith("agentgym-"):
        from envs.agentgym import AgentGymEnv, ClientSettings

        return AgentGymEnv(
            settings.name.removeprefix("agentgym-"),
            settings.servers,
            settings.agentgym.train,
            settings.agentgym.test,
            ClientSettings(timeout_s=settings.request_timeout_s),
        )
    local = _local_env(settings)
    if not settings.servers:
        return local
    from envs.agentgym import ClientSettings, RemoteEnv

    return RemoteEnv(local, settings.servers, ClientSettings(timeout_s=settings.request_timeout_s))


def _local_env(settings: EnvSettings) -> Environment:
    if settings.name == "textcraft":
        from envs.textcraft import TextCraftEnv

        return TextCraftEnv()
    if settings.name == "scienceworld":
        from envs.scienceworld import ScienceWorldEnv

        sw = settings.scienceworld
        return ScienceWorldEnv(sw.task_names, sw.variations, sw.simplification)
    raise ValueError(f"unknown environment {settings.name!r}")
