"""`flywheel`: recipe commands come from the flow files, so a new recipe edits nothing here."""

from __future__ import annotations

from ops.cli import main, recipe_commands


def test_every_flow_file_is_a_command_named_and_described_by_it(tmp_path):
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "__init__.py").write_text("")
    (flows / "agent_r1.py").write_text('"""Agent-R1: RL with tools.\n\nMore."""\nimport nothing\n')
    (flows / "bare.py").write_text("x = 1\n")
    assert recipe_commands(flows) == {
        "agent-r1": ("flows.agent_r1", "Agent-R1: RL with tools."),
        "bare": ("flows.bare", ""),
    }


def test_the_shipped_recipes_and_tools_are_listed(capsys):
    assert main(["--help"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:]]
    assert listed == [
        "agent-r", "agent-r1", "et-agent", "eto", "serve-env", "services", "deploy", "status",
        "gc",
    ]  # fmt: skip
    assert main(["no-such-command"]) == 2


def test_a_recipe_command_runs_its_flows_main(monkeypatch):
    import flows.eto

    seen = []
    monkeypatch.setattr(flows.eto, "main", lambda argv: seen.append(argv) or 0)
    assert main(["eto", "--config", "c.yaml", "rounds=2"]) == 0
    assert seen == [["--config", "c.yaml", "rounds=2"]]
