"""Environments by name (envs/registry.py): the built-ins, a package's entry point, and
`package.module:Factory`, each checked with its own settings model before any work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envs import make_env
from envs.registry import ENTRY_POINT_GROUP, check_env_settings, known_names
from examples.counter_env import CounterEnv
from flows.eto import ETOConfig
from flywheel.config_files import ConfigError, load_config
from flywheel.settings import EnvSettings
from ops.runner import recipe_config

ROOT = Path(__file__).resolve().parent.parent
COUNTER = "examples.counter_env:CounterEnv"


def env(name: str, **fields) -> EnvSettings:
    return EnvSettings(name=name, **fields)


def test_an_unknown_name_is_refused_when_the_config_is_loaded_naming_what_exists():
    with pytest.raises(ConfigError) as refused:
        recipe_config(ETOConfig, {"env": {"name": "textcraf"}}, None, None)
    message = str(refused.value)
    assert message.startswith("env.name: unknown environment 'textcraf'")
    assert "qa, scienceworld, textcraft" in message and "package.module:Factory" in message


def test_a_factory_by_module_and_name_runs_with_its_settings_model():
    made = make_env(env(COUNTER, options={"largest_target": 3, "test_tasks": 2}))
    assert isinstance(made, CounterEnv) and made.settings.largest_target == 3
    assert made.task_ids("test") == ["test-0", "test-1"]


def test_a_plugins_bad_setting_is_named_under_env_options():
    with pytest.raises(ConfigError) as refused:
        recipe_config(
            ETOConfig, {"env": {"name": COUNTER, "options": {"largest_target": 0}}}, None, None
        )
    assert "env.options.largest_target: Input should be greater than or equal to 1" in str(
        refused.value
    )
    with pytest.raises(ConfigError, match="env.options.largest_targt: unknown setting"):
        check_env_settings(env(COUNTER, options={"largest_targt": 3}))


def test_options_are_overrides_like_any_other_key():
    cfg = load_config(ETOConfig, None, [f"env.name={COUNTER}", "env.options.test_tasks=4"])
    assert make_env(cfg.env).task_ids("test") == [f"test-{i}" for i in range(4)]


@pytest.mark.parametrize(
    "name, complaint",
    [
        ("examples.counter_env:ADD", "is not an environment factory"),  # a regex: not callable
        ("examples.counter_env:Nothing", "examples.counter_env has no 'Nothing'"),
        ("examples.no_such_module:Env", "cannot import 'examples.no_such_module'"),
        (":CounterEnv", "want the form package.module:Factory"),
    ],
)
def test_a_module_and_name_that_is_no_factory_is_refused(name, complaint):
    with pytest.raises(ConfigError, match=complaint):
        check_env_settings(env(name))


def test_a_factory_that_makes_no_environment_is_refused():
    with pytest.raises(ConfigError, match="made a CounterSettings, not an envs.base.Environment"):
        make_env(env("examples.counter_env:CounterSettings"))


def test_a_builtin_takes_its_settings_in_its_own_section_not_in_options():
    with pytest.raises(ConfigError, match="'qa' takes its settings under env.qa"):
        check_env_settings(env("qa", options={"format": "json"}))
    with pytest.raises(ConfigError, match="env.options.size: unknown setting"):
        check_env_settings(env("textcraft", options={"size": 1}))


def test_builtins_are_registered_and_their_keys_and_identities_are_unchanged():
    assert {"textcraft", "scienceworld", "qa", "agentgym-webshop"} <= set(known_names())
    assert make_env("textcraft").name == "textcraft"
    assert EnvSettings(name="qa").identity().keys() == {"name", "qa"}
    assert EnvSettings().identity() == {"name": "textcraft"}
    plugin = env(COUNTER, options={"test_tasks": 2})
    assert plugin.identity() == {"name": COUNTER, "options": {"test_tasks": 2}}


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_the_shipped_configs_still_load_and_name_registered_environments(path):
    from flows.agent_r import AgentR
    from flows.agent_r1 import AgentR1
    from flows.et_agent import ETAgent
    from flows.eto import ETO

    recipes = {"eto": ETO, "agent_r": AgentR, "agent_r1": AgentR1, "et_agent": ETAgent}
    # the longest recipe name the file's name starts with: agent_r_textcraft_expert is agent_r's
    name = max((n for n in recipes if path.stem.startswith(n + "_")), key=len)
    recipe = recipes[name]
    check_env_settings(load_config(recipe.config_class, str(path)).env)


def test_a_validation_split_is_carved_from_a_plugins_train_tasks():
    made = make_env(env(COUNTER, validation_tasks=2))
    train, held = made.task_ids("train"), made.task_ids("validation")
    assert len(held) == 2 and len(train) == 10 and not set(train) & set(held)


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A package's metadata declaring the counter under the entry-point group, on sys.path: as
    `pip install` of a package with `[project.entry-points."flywheel.environments"]` leaves it."""
    info = tmp_path / "counter_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: counter-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ncounter = {COUNTER}\nbroken = examples.counter_env:Gone\n"
    )
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    return tmp_path


def test_an_entry_point_names_an_environment(installed_plugin):
    assert {"counter", "broken"} <= set(known_names())
    made = make_env(env("counter", options={"train_tasks": 3}))
    assert isinstance(made, CounterEnv) and made.task_ids("train") == [
        "train-0",
        "train-1",
        "train-2",
    ]
    with pytest.raises(ConfigError, match="env.options.train_tasks"):
        check_env_settings(env("counter", options={"train_tasks": "many"}))


def test_an_entry_point_that_does_not_load_is_named(installed_plugin):
    with pytest.raises(ConfigError, match="'broken': its entry point 'examples.counter_env:Gone'"):
        check_env_settings(env("broken"))


def test_serve_env_serves_a_plugin_from_a_config_but_still_not_qa(tmp_path):
    from envs.agentgym.server import env_settings, parse_args

    config = tmp_path / "counter.yaml"
    config.write_text(f"env:\n  name: {COUNTER}\n  options: {{test_tasks: 2}}\n")
    served = env_settings(parse_args(["--config", str(config)]))
    assert served.name == COUNTER and served.options == {"test_tasks": 2}
    config.write_text("env:\n  name: qa\n")
    with pytest.raises(ConfigError, match="env.name 'qa' cannot be served here"):
        env_settings(parse_args(["--config", str(config)]))


def test_the_command_line_refuses_an_unknown_name_before_any_work(tmp_path, capsys):
    from flows.eto import main

    store = tmp_path / "store"
    assert main(["env.name=webshopx", f"storage_url={store}"]) == 2
    assert "env.name: unknown environment 'webshopx'" in capsys.readouterr().err
    assert not store.exists()  # refused before the run lock or the store's check


def test_serve_env_by_name_takes_what_the_registry_says_is_servable():
    from envs.agentgym.server import env_settings, parse_args

    assert env_settings(parse_args(["--env", COUNTER])).name == COUNTER  # a plugin, by name
    assert env_settings(parse_args([])).name == "textcraft"
    with pytest.raises(ConfigError, match="--env: env.name 'qa' cannot be served here"):
        env_settings(parse_args(["--env", "qa"]))
    with pytest.raises(ConfigError, match="unknown environment 'nowhere'"):
        env_settings(parse_args(["--env", "nowhere"]))
