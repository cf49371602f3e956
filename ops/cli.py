"""`flywheel`: one command for the recipes and the environment server.

flywheel eto --config configs/eto_textcraft.yaml rounds=1
flywheel agent-r --config configs/agent_r_textcraft.yaml
flywheel serve-env --env scienceworld --port 36002
flywheel services --s3
"""

from __future__ import annotations

import sys

COMMANDS = {
    "eto": ("flows.eto", "ETO: expert SFT, then explore → pairs → DPO rounds"),
    "agent-r": ("flows.agent_r", "Agent-R: MCTS → first-error critique → revision SFT rounds"),
    "serve-env": ("envs.serve", "serve an environment over AgentGym's HTTP protocol"),
    "services": ("ops.services", "start Prefect's server (UI) and MLflow's server locally"),
}


def main(argv: list[str] | None = None) -> int:
    import importlib

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<10} {about}" for name, (_, about) in COMMANDS.items()]
        print("usage: flywheel COMMAND [--help | ARGS]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
