"""The recipes' Prefect flows (`python -m flows.<recipe>` or `flywheel <recipe>`)."""

import os

# A run without a Prefect server starts a temporary one, which Prefect gives 20 s: on a loaded
# machine (2 cores running a trainer) it took longer, and the run failed before its first stage
# ("Timed out while attempting to connect to ephemeral Prefect API server"). Set before Prefect
# reads its settings; a value the user set wins.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
