from pathlib import Path

import pytest

from flows.agent_r import AgentRConfig
from flows.agent_r1 import AgentR1Config
from flows.et_agent import ETAgentConfig
from flows.eto import ETOConfig, main
from flywheel.config_files import ConfigError, load_config
from flywheel.inference import SamplingSettings
from flywheel.stage import StageOutput, StageRun

ROOT = Path(__file__).resolve().parents[1]


SMOLLM2_LAYERS = 30  # SmolLM2-135M, the model every shipped config trains


@pytest.mark.parametrize(
    "name, model",
    [("eto_textcraft", ETOConfig), ("eto_scienceworld", ETOConfig),
     ("agent_r_textcraft", AgentRConfig), ("agent_r1_qa", AgentR1Config),
     ("et_agent_qa", ETAgentConfig)],
)  # fmt: skip
def test_shipped_configs_validate_and_freeze_fewer_layers_than_the_model_has(name, model):
    cfg = load_config(model, str(ROOT / "configs" / f"{name}.yaml"))
    trainers = {ETOConfig: ["sft", "dpo"], AgentRConfig: ["sft", "revision_sft"],
                AgentR1Config: ["sft", "rl"], ETAgentConfig: ["sft", "rft", "rl"]}[model]  # fmt: skip
    trainers = [getattr(cfg, name) for name in trainers]
    assert all(0 < t.frozen_layers < SMOLLM2_LAYERS for t in trainers), name


def test_etos_defaults_reach_the_trainer_and_the_explorer(monkeypatch, tmp_path):
    """ETO explores each train task once, greedily, and runs DPO with beta 0.1 at lr 1e-6: what
    the stages hand on, not what the settings classes say."""
    import tasks.explore
    from tasks.dpo import dpo_trl_args

    cfg = ETOConfig()
    args = dpo_trl_args(cfg.dpo)
    assert (args["beta"], args["learning_rate"]) == (0.1, 1e-6)
    seen = {}
    monkeypatch.setattr(
        tasks.explore, "rollout_to_store", lambda *a, **kw: seen.update(sampling=a[8])
    )
    inputs = tasks.explore.ExploreInputs(
        model_url="model", env=cfg.env, task_ids=["t"], prefix=[], inference=cfg.inference,
        temperature=cfg.explore.temperature, max_steps=5, seed=3,
    )  # fmt: skip
    run = StageRun(
        "explore-shard", StageOutput(store_url=str(tmp_path), url=f"file://{tmp_path}/out")
    )
    tasks.explore.explore_stage.body(inputs, run)
    assert seen["sampling"] == SamplingSettings(temperature=0.0, max_tokens=96, seed=3)
    assert tasks.explore.shard(["a", "b"], cfg.explore.shards, cfg.explore.samples_per_task) == [
        ["a"], ["b"]
    ]  # one exploration per task  # fmt: skip


def test_exploring_a_slice_per_round_walks_the_task_list_and_wraps():
    from flows.eto import ExploreSettings

    ids = ["a", "b", "c", "d", "e"]
    assert ExploreSettings().tasks_for_round(ids, 3) == ids  # ETO: every task, every round
    slices = ExploreSettings(tasks_per_round=2)
    assert [slices.tasks_for_round(ids, r) for r in (1, 2, 3)] == [
        ["a", "b"], ["c", "d"], ["e", "a"]
    ]  # fmt: skip
    assert ExploreSettings(tasks_per_round=9).tasks_for_round(ids, 2) == ids


def test_every_per_round_slice_walks_the_same_way():
    from flows.agent_r1 import SampleSettings
    from tasks.mcts import MCTSSettings

    ids = ["a", "b", "c"]
    listed = MCTSSettings(tasks_per_round=2, task_order_seed=None)  # its default shuffles first
    for settings in (listed, SampleSettings(tasks_per_round=2)):
        assert settings.tasks_for_round(ids, 2) == ["c", "a"]


def test_agent_r1_refuses_an_environment_without_tools_and_mismatched_temperatures():
    assert AgentR1Config(env={"test_tasks": 5}).env.name == "qa"  # a section without a name
    with pytest.raises(ValueError, match="set env.name=qa"):
        AgentR1Config(env={"name": "textcraft"})
    with pytest.raises(ValueError, match="set both to the same value"):
        AgentR1Config(sample={"temperature": 0.7})


def test_agent_rs_defaults_reach_the_tree_search():
    from tasks.mcts import search_limits

    cfg = AgentRConfig()
    limits = search_limits(cfg.mcts, cfg.inference, seed=4)
    assert (limits.exploration_constant, limits.samples_per_node) == (0.25, 4)
    assert (limits.iterations, limits.max_depth, limits.restore_state) == (8, 12, True)
    assert limits.max_model_len == cfg.inference.max_model_len
    assert limits.sampling == SamplingSettings(temperature=1.0, max_tokens=96, seed=4)


def test_overrides_parse_values_into_nested_fields(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rounds: 1\nenv:\n  test_tasks: 5\n")
    cfg = load_config(ETOConfig, str(path), ["dpo.beta=0.25", "env.max_steps=7"])
    assert (cfg.rounds, cfg.env.test_tasks, cfg.dpo.beta, cfg.env.max_steps) == (1, 5, 0.25, 7)


@pytest.mark.parametrize(
    "override, field",
    [
        ("model.base=/no/such/model", "model.base"),
        ("rounds=-1", "rounds"),
        ("dpo.bta=0.1", "dpo.bta"),
        ("task_runner=spark", "task_runner"),
    ],
)
def test_bad_config_names_the_field(override, field):
    with pytest.raises(ConfigError) as error:
        load_config(ETOConfig, None, [override])
    assert field in str(error.value)


def test_malformed_override_and_missing_file_are_explained(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(ETOConfig, None, ["rounds"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(ETOConfig, str(tmp_path / "nope.yaml"))


def test_cli_refuses_unwritable_storage_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code = main([f"storage_url={blocker}/runs", f"mlflow_tracking_uri=sqlite:///{tmp_path}/m.db"])
    assert code == 2
    assert "storage_url" in capsys.readouterr().err


def test_cli_refuses_trl_arguments_trl_does_not_know(tmp_path, capsys):
    code = main([f"storage_url={tmp_path}/runs", "dpo.trl_args={no_such_option: 1}"])
    assert code == 2
    assert "dpo.trl_args" in capsys.readouterr().err


def test_cli_refuses_a_task_filter_that_leaves_no_task(tmp_path, capsys):
    code = main([f"storage_url={tmp_path}/runs", "env.max_expert_steps=2"])
    assert code == 2
    assert "env.max_expert_steps=2 leaves no train task" in capsys.readouterr().err


def test_agent_r_cli_checks_its_own_sections(tmp_path, capsys):
    from flows.agent_r import main as agent_r_main

    code = agent_r_main([f"storage_url={tmp_path}/runs", "revision_sft.trl_args={bogus: 1}"])
    assert code == 2 and "revision_sft.trl_args" in capsys.readouterr().err
    code = agent_r_main([f"storage_url={tmp_path}/runs", "paths.alpha=[0.5, 1.5]"])
    assert code == 2 and "paths.alpha" in capsys.readouterr().err
    # Round r pairs at alpha[r-1], the last value after the list ends.
    paths = AgentRConfig(paths={"alpha": [0.5, 0.7, 1.0]}).paths
    assert [paths.alpha_for(r) for r in (1, 2, 3, 4, 9)] == [0.5, 0.7, 1.0, 1.0, 1.0]


def test_dpo_settings_change_by_round_as_etos_schedule_does():
    from flywheel.settings import DPOSettings

    dpo = DPOSettings(
        beta=0.2,
        epochs=2,
        schedule=[{"beta": 0.1, "learning_rate": 1e-6}, {"beta": 0.5, "learning_rate": 5e-7}],
    )
    first, second, third = (dpo.for_round(r) for r in (1, 2, 3))
    assert (first.beta, first.learning_rate) == (0.1, 1e-6)
    assert (second.beta, second.learning_rate) == (0.5, 5e-7)
    assert (third.beta, third.learning_rate) == (0.5, 5e-7)  # the last entry holds
    assert first.epochs == second.epochs == 2 and first.schedule == []
    plain = DPOSettings(beta=0.3)
    assert plain.for_round(2) == plain


def test_a_bad_schedule_entry_is_refused_naming_its_round():
    from flows.eto import ETOConfig
    from flywheel.config_files import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"schedule entry 1 \(round 2\): beta"):
        load_config(ETOConfig, None, ["dpo.schedule=[{beta: 0.1}, {beta: -1}]"])
    with pytest.raises(ConfigError, match=r"schedule entry 0 \(round 1\): betta"):
        load_config(ETOConfig, None, ["dpo.schedule=[{betta: 0.1}]"])


@pytest.mark.parametrize(
    ("section", "trl_args", "setting"),
    [("dpo", {"beta": 0.3}, "beta"), ("dpo", {"learning_rate": 1e-5}, "learning_rate"),
     ("sft", {"num_train_epochs": 1}, "epochs"), ("sft", {"seed": 4}, "the run's seed"),
     ("sft", {"gradient_accumulation_steps": 8}, "batch_size")],
)  # fmt: skip
def test_a_setting_set_again_through_trl_args_is_refused_naming_it(section, trl_args, setting):
    """trl_args are passed last, so a repeated setting would silently win over the setting."""
    from flows.eto import ETOConfig
    from flywheel.config_files import ConfigError, validate_config

    with pytest.raises(ConfigError, match=f"{section}: .*trl_args.* set {setting} instead"):
        validate_config(ETOConfig, {section: {"trl_args": trl_args}})


def test_a_schedule_entry_cannot_repeat_a_setting_through_trl_args_either():
    from flows.eto import ETOConfig
    from flywheel.config_files import ConfigError, validate_config

    entry = {"trl_args": {"beta": 0.5}}
    with pytest.raises(ConfigError, match="schedule entry 0 .*set beta instead"):
        validate_config(ETOConfig, {"dpo": {"schedule": [entry]}})
    validate_config(ETOConfig, {"dpo": {"trl_args": {"loss_type": "ipo"}}})  # a trl-only argument


@pytest.mark.parametrize(
    "override, new", [("flywheel.rounds=1", "evolve"), ("flywheel_tasks=8", "evolve_tasks")]
)
def test_et_agents_renamed_keys_are_refused_naming_the_new_key(override, new):
    """`flywheel` and `flywheel_tasks` were named after the paper's "data flywheel"; a config that
    still sets them would otherwise run the defaults without a word."""
    with pytest.raises(ConfigError, match=f"is now called {new}: write {new} instead"):
        load_config(ETAgentConfig, None, [override])
    assert load_config(ETAgentConfig, None, ["evolve.rounds=1"]).evolve.rounds == 1
