"""`flywheel`: one command for the recipes and the environment server.

flywheel eto --config configs/eto_textcraft.yaml rounds=1
flywheel agent-r --config configs/agent_r_textcraft.yaml
flywheel serve-env --env scienceworld --port 36002
flywheel services --s3

Every module `flows/<name>.py` is a recipe command `<name>` (underscores as dashes), described by
its docstring's first line: a new recipe is a new flow file, and nothing here changes.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

FLOWS = Path(__file__).resolve().parent.parent / "flows"
TOOLS = {
    "serve-env": ("envs.agentgym.server", "serve an environment over AgentGym's HTTP protocol"),
    "services": ("ops.services", "start Prefect's server (UI) and MLflow's server locally"),
    "deploy": ("ops.deploy", "deploy deployments/prefect.yaml; list its schedules, on or off"),
    "status": ("ops.status", "each stage of a run: cached, would re-run (why) or never run"),
    "gc": ("ops.gc", "delete what a run's stages parked for other keys (lists it first)"),
}


def recipe_commands(flows: Path = FLOWS) -> dict[str, tuple[str, str]]:
    """Command name -> (module, description) for each recipe flow, read without importing it
    (importing a flow imports Prefect: seconds, for a --help)."""
    commands = {}
    for path in sorted(flows.glob("*.py")):
        if path.name.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        summary = doc.strip().splitlines()[0] if doc.strip() else ""
        commands[path.stem.replace("_", "-")] = (f"{flows.name}.{path.stem}", summary)
    return commands


def main(argv: list[str] | None = None) -> int:
    import importlib

    argv = sys.argv[1:] if argv is None else argv
    commands = {**recipe_commands(), **TOOLS}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        lines = [f"  {name:<10} {about}" for name, (_, about) in commands.items()]
        print("usage: flywheel COMMAND [--help | ARGS]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(commands[argv[0]][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
