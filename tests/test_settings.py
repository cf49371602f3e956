import pytest

from flows.eto import main
from flywheel.settings import AgentRConfig, ConfigError, ETOConfig, load_config


def test_defaults_are_etos():
    cfg = ETOConfig()
    assert cfg.dpo.beta == 0.1 and cfg.dpo.learning_rate == 1e-6
    assert cfg.explore.temperature == 0.0 and cfg.explore.samples_per_task == 1


def test_overrides_parse_values_into_nested_fields(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rounds: 1\nenv:\n  test_tasks: 5\n")
    cfg = load_config(ETOConfig, str(path), ["dpo.beta=0.25", "env.max_steps=7"])
    assert (cfg.rounds, cfg.env.test_tasks, cfg.dpo.beta, cfg.env.max_steps) == (1, 5, 0.25, 7)


@pytest.mark.parametrize(
    "override, field",
    [
        ("env.name=webshopx", "env.name"),
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
    defaults = AgentRConfig()
    assert defaults.mcts.exploration_constant == 0.25 and defaults.paths.beta == 0.2
    assert [defaults.paths.alpha_for(r) for r in (1, 2, 3, 4)] == [0.5, 0.7, 1.0, 1.0]


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
    from flywheel.settings import ConfigError, ETOConfig, load_config

    with pytest.raises(ConfigError, match=r"schedule entry 1 \(round 2\): beta"):
        load_config(ETOConfig, None, ["dpo.schedule=[{beta: 0.1}, {beta: -1}]"])
    with pytest.raises(ConfigError, match=r"schedule entry 0 \(round 1\): betta"):
        load_config(ETOConfig, None, ["dpo.schedule=[{betta: 0.1}]"])
