"""Environments behind one interface (`envs.base`), found by name in a registry
(`envs.registry`; the built-ins register in `envs.builtins`)."""

from __future__ import annotations

import envs.builtins  # noqa: F401 - the built-in environments register themselves
from envs.base import Environment, ValidationSplit
from envs.registry import check_env_settings
from flywheel.config_files import ConfigError
from flywheel.settings import EnvSettings


def make_env(settings: str | EnvSettings) -> Environment:
    """The environment `settings` describe (a bare name: that environment with its defaults).

    With `servers`, episodes run on those AgentGym-protocol servers instead of in process.
    """
    if isinstance(settings, str):
        settings = EnvSettings(name=settings)
    registration = check_env_settings(settings)
    env = registration.make(settings)
    if settings.max_live_episodes is not None:
        env.max_live_episodes = settings.max_live_episodes
    if registration.agentgym_only:  # on AgentGym's servers (EnvSettings refuses none given)
        return env
    if not isinstance(env, Environment):
        raise ConfigError(
            f"env.name={settings.name!r} made a {type(env).__name__}, not an envs.base.Environment"
        )
    env.validation = ValidationSplit(
        settings.validation_tasks, settings.validation_seed, settings.max_expert_steps
    )
    if not settings.servers:
        return env
    from envs.agentgym.client import ClientSettings, RemoteEnv

    return RemoteEnv(env, settings.servers, ClientSettings(timeout_s=settings.request_timeout_s))
