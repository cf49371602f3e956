"""Every setting is discoverable from the command line, and bad inputs are refused with a message
naming what to change, never a traceback: through the recipes' real entry (`flows.eto.main`)."""

from __future__ import annotations

import importlib.util
import re
import time

import pytest
import yaml

from flows.agent_r import AgentRConfig
from flows.agent_r1 import AgentR1Config
from flows.et_agent import ETAgentConfig
from flows.eto import ETOConfig, main
from flywheel.config_files import ConfigError, load_config, setting_keys
from flywheel.setting_docs import field_doc, first_sentence, setting_docs, settings_help

RECIPE_CONFIGS = [ETOConfig, AgentRConfig, AgentR1Config, ETAgentConfig]


def listed_keys(out: str) -> list[str]:
    """The keys of `  key (type) = value` lines."""
    return re.findall(r"^  (\S+) \([^)]*\) = ", out, re.M)


def test_help_lists_the_top_level_settings_and_each_section_once(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert sorted(listed_keys(out)) == sorted(k for k in setting_keys(ETOConfig) if "." not in k)
    sections = [line.split()[0] for line in out.split("Sections (")[1].splitlines()[2:]]
    assert sections == ["model", "env", "inference", "evaluate", "sft", "dpo", "explore"]
    assert re.search(r"^  dpo +\d+ settings  ETO's DPO step", out, re.M)


def test_settings_lists_every_key_with_its_type_value_and_doc_under_one_header(capsys):
    assert main(["--settings"]) == 0
    out = capsys.readouterr().out
    assert sorted(listed_keys(out)) == sorted(setting_keys(ETOConfig))
    assert "  dpo.beta (float) = 0.1  # DPO's beta: how far the policy" in out
    assert "  explore.shards (int) = 2  # mapped Prefect tasks\n" in out
    assert "  env.qa.format (tags | json) = tags  # How replies call tools" in out
    assert "  env.train_tasks (int | null) = null  # Train tasks used (None = all of the" in out
    assert "\ndpo: ETO's DPO step; defaults are ETO's (beta 0.1, learning rate 1e-6).\n" in out
    headers = [line.split(":")[0] for line in out.splitlines() if line and line[0] != " "]
    assert len(headers) == len(set(headers)), "a section's header twice"
    assert "(dpo.trl_args: any field of trl.DPOConfig" in out and "loss_type=" in out


def test_settings_shows_the_values_a_config_and_overrides_give(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("dpo:\n  beta: 0.3\n")
    assert main(["--config", str(config), "dpo.epochs=2", "--settings", "dpo"]) == 0
    out = capsys.readouterr().out
    assert "  dpo.beta (float) = 0.3  #" in out and "  dpo.epochs (float) = 2.0  #" in out
    assert "dpo.lora.rank" in out and "sft.epochs" not in out  # dpo and the sections below it


@pytest.mark.parametrize("config_class", RECIPE_CONFIGS, ids=lambda c: c.__name__)
def test_every_setting_of_every_recipe_has_a_one_line_doc(config_class):
    undocumented = [s.key for s in setting_docs(config_class) if not s.doc]
    assert undocumented == []
    assert all("\n" not in s.doc for s in setting_docs(config_class))


def test_a_recipes_own_defaults_are_the_ones_listed():
    """Agent-R1's `env` defaults to the QA environment with 8 steps; ET-Agent samples 8 per task."""
    r1 = {s.key: s.default for s in setting_docs(AgentR1Config)}
    assert (r1["env.name"], r1["env.max_steps"], r1["sample.samples_per_task"]) == ("qa", 8, 4)
    et = {s.key: s.default for s in setting_docs(ETAgentConfig)}
    assert (et["sample.samples_per_task"], et["sample.curriculum"]) == (8, "tool-calls")


def test_a_fields_docstring_is_its_doc_and_a_subclass_keeps_its_bases():
    from flywheel.settings import Strict

    class Base(Strict):
        both: int = 1
        """Above, first line. And its second sentence."""
        bare: int = 2

    class Changed(Base):
        both: int = 3  # a new default, no new words

    assert field_doc(Base, "both") == "Above, first line."
    assert field_doc(Changed, "both") == "Above, first line."
    assert field_doc(Base, "bare") == ""
    assert first_sentence("Episode step limit. TextCraft's expert needs 6 (e.g. 5).") == (
        "Episode step limit."
    )
    assert first_sentence("Weight (e.g. 0.2) of it. More") == "Weight (e.g. 0.2) of it."


def test_num_processes_as_in_sft_settings_takes_sfts_doc():
    docs = {s.key: s.doc for s in setting_docs(ETOConfig)}
    assert docs["dpo.num_processes"] == docs["sft.num_processes"]
    assert docs["dpo.num_processes"].startswith("Training processes: >1 launches")


def test_print_config_prints_file_and_overrides_as_yaml_that_loads_back(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("run_name: mine\ndpo:\n  beta: 0.3\nenv:\n  max_steps: 7\n")
    assert main(["--config", str(config), "dpo.beta=0.2", "rounds=1", "--print-config"]) == 0
    printed = capsys.readouterr().out
    data = yaml.safe_load(printed)
    assert (data["run_name"], data["dpo"]["beta"], data["env"]["max_steps"]) == ("mine", 0.2, 7)
    assert (data["rounds"], data["explore"]["shards"]) == (1, 2)  # a default, listed too
    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    assert load_config(ETOConfig, str(again)) == load_config(
        ETOConfig, str(config), ["dpo.beta=0.2", "rounds=1"]
    )


def run_cli(args: list[str], capsys) -> tuple[int, str, float]:
    started = time.monotonic()
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err, time.monotonic() - started


@pytest.mark.parametrize(
    "override, expected",
    [
        ("dpo.betta=0.2", "dpo.betta: unknown setting; did you mean dpo.beta?"),
        ("dop.beta=0.2", "dop: unknown setting; did you mean dpo?"),
        ("roundz=2", "roundz: unknown setting; did you mean rounds?"),
        ("beta=0.2", "beta: unknown setting here; did you mean dpo.beta?"),
        ("env.qa.formt=json", "env.qa.formt: unknown setting; did you mean env.qa.format?"),
        ("explore.xyz=1", "explore.xyz: unknown setting; section explore has tasks_per_round, "),
    ],
)
def test_an_unknown_key_suggests_the_nearest(override, expected, tmp_path, capsys):
    code, output, _ = run_cli([f"storage_url={tmp_path}", override], capsys)
    assert code == 2
    assert expected in output
    assert "Traceback" not in output


def test_unknown_keys_in_a_config_file_are_named_too(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("sft:\n  learning_rat: 0.1\n")
    with pytest.raises(ConfigError, match="sft.learning_rat: unknown setting; did you mean "):
        load_config(ETOConfig, str(config))


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_a_scheme_whose_package_is_missing_names_the_package(capsys):
    code, output, seconds = run_cli(["storage_url=gs://bucket/x"], capsys)
    assert code == 2
    assert "error: storage_url 'gs://bucket/x': Please install gcsfs" in output
    assert "pip install gcsfs" in output
    assert "Traceback" not in output and seconds < 5


def test_an_unknown_scheme_lists_those_that_work(capsys):
    code, output, seconds = run_cli(["storage_url=s4://x"], capsys)
    assert code == 2
    assert "error: storage_url 's4://x': unknown scheme 's4'; schemes that work here: " in output
    assert "file://, s3://" in output and "gs:// (gcsfs)" in output
    assert "Traceback" not in output and seconds < 5


def test_a_store_that_cannot_be_written_is_refused(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, output, _ = run_cli([f"storage_url={blocker}/runs"], capsys)
    assert code == 2
    assert "is not writable" in output and "Traceback" not in output


def test_the_settings_listing_is_the_help_epilog():
    assert settings_help(ETOConfig).splitlines()[0].startswith("  run_name (str) = eto-textcraft")
