"""Environments by name: each maps to a factory and the settings model its settings are checked by.

`env.name` is looked up in this order:

1. a registered name: the built-ins (`envs.builtins`), or any `register(...)` call made before;
2. an entry point of the group `flywheel.environments` with that name: a package's
   `[project.entry-points."flywheel.environments"] counter = "counter_env:CounterEnv"`;
3. `package.module:Factory`, imported as written (no registration at all).

A factory is a callable that returns an `envs.base.Environment` (a subclass is one). Its
settings model, a pydantic model at `Factory.Settings`, checks `env.options` and is what the
factory is called with; a factory without one takes no settings and is called without any.

The core's `EnvSettings` knows no environment (flywheel/ is below envs/): it checks the form of
its fields, and `check_env_settings` here checks the name and the options. Recipes call it when
they load a config, before any other work (`ops.runner`), and `make_env` calls it every time.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from envs.base import Environment
from flywheel.config_files import ConfigError
from flywheel.settings import EnvSettings

ENTRY_POINT_GROUP = "flywheel.environments"
FACTORY_FORM = "package.module:Factory"


class NoSettings(BaseModel):
    """The settings of an environment that takes none: every key is refused."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Registration:
    """How `make_env` builds one environment from the run's `env` settings.

    `make` gets the whole `EnvSettings`: the built-ins read their own section of it
    (`env.qa`, `env.scienceworld`), a plugin its `options` as its settings model made them.
    `settings` is the model `env.options` must fit (NoSettings: none may be given).
    `section` names where its settings live, for the error when some are put in `env.options`.
    `agentgym_only`: it runs on AgentGym's own servers only (`env.servers`), never in process.
    `servable`: `flywheel serve-env --config` serves it (a plugin's episodes are plain text).
    """

    make: Callable[[EnvSettings], Environment]
    settings: type[BaseModel] = NoSettings
    section: str = "options"
    agentgym_only: bool = False
    servable: bool = True


REGISTERED: dict[str, Registration] = {}


def register(name: str, registration: Registration) -> None:
    """Make `name` an environment name (a second registration of a name replaces the first)."""
    REGISTERED[name] = registration


def plugin_registration(factory: Any, where: str) -> Registration:
    """A factory named by an entry point or `module:Factory` (`where`), as a registration: its
    settings model from `factory.Settings`, called with `env.options` checked by that model."""
    settings = getattr(factory, "Settings", None)
    if not callable(factory) or not (settings is None or is_settings_model(settings)):
        raise ConfigError(
            f"env.name={where!r} is not an environment factory: want a callable that returns an "
            "envs.base.Environment, with its settings as a pydantic model at .Settings (or none)"
        )

    def make(env: EnvSettings) -> Environment:
        if settings is None:
            return factory()
        return factory(settings.model_validate(env.options))

    return Registration(make, settings or NoSettings)


def is_settings_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def registration_of(name: str) -> Registration:
    """The registration `name` resolves to (see the module docstring); ConfigError otherwise."""
    if name in REGISTERED:
        return REGISTERED[name]
    entry_point = next((e for e in plugin_entry_points() if e.name == name), None)
    if entry_point is not None:
        return plugin_registration(load_entry_point(entry_point), name)
    if ":" in name:
        return plugin_registration(import_factory(name), name)
    raise ConfigError(
        f"env.name: unknown environment {name!r}; registered: {', '.join(known_names())}; "
        f"or name a factory as {FACTORY_FORM} (docs/architecture.md, 'A new environment')"
    )


def plugin_entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    """Read afresh each time: a package installed while this process runs counts."""
    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


def known_names() -> list[str]:
    return sorted({*REGISTERED, *(e.name for e in plugin_entry_points())})


def load_entry_point(entry_point: importlib.metadata.EntryPoint) -> Any:
    try:
        return entry_point.load()
    except (ImportError, AttributeError) as error:
        raise ConfigError(
            f"env.name={entry_point.name!r}: its entry point {entry_point.value!r} (group "
            f"{ENTRY_POINT_GROUP}) does not load: {type(error).__name__}: {error}"
        ) from None


def import_factory(name: str) -> Any:
    """`package.module:Factory` (a dotted path after the colon reaches a nested attribute)."""
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"env.name={name!r}: want the form {FACTORY_FORM}")
    try:
        found = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"env.name={name!r}: cannot import {module_name!r}: {error}") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"env.name={name!r}: {module_name} has no {attribute!r}")
        found = getattr(found, part)
    return found


def check_env_settings(env: EnvSettings) -> Registration:
    """The environment's registration, once its name resolves and `env.options` fits its
    settings model; a ConfigError naming the field otherwise (`env.options.size: ...`)."""
    registration = registration_of(env.name)
    if env.options and registration.section != "options":
        raise ConfigError(
            f"env.options: environment {env.name!r} takes its settings under "
            f"env.{registration.section}, not env.options"
        )
    try:
        registration.settings.model_validate(env.options)
    except ValidationError as error:
        raise ConfigError(options_problems(env.name, error)) from None
    return registration


def options_problems(name: str, error: ValidationError) -> str:
    """One line per problem, each naming its key under `env.options`."""
    lines = [f"invalid settings for environment {name!r}:"]
    for problem in error.errors():
        key = ".".join(["env.options", *(str(part) for part in problem["loc"])])
        reason = "unknown setting" if problem["type"] == "extra_forbidden" else problem["msg"]
        lines.append(f"  {key}: {reason}")
    return "\n".join(lines)
