# The two commands of the README: `make demo` (the ETO run on the embedded defaults) and
# `make test`. Both install what they need into .venv first (scripts/install.sh, idempotent).
PY := .venv/bin/python
export PREFECT_HOME ?= $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 180
export FLYWHEEL_CACHE ?= $(CURDIR)/.cache/flywheel
export FLYWHEEL_TEST_CACHE ?= $(CURDIR)/.cache/flywheel-test

.PHONY: install demo demo-agent-r demo-scienceworld test lint bench bench-mcts bench-env services

install:
	bash scripts/install.sh

demo: install
	$(PY) -m flows.eto --config configs/eto_textcraft.yaml

demo-agent-r: install
	$(PY) -m flows.agent_r --config configs/agent_r_textcraft.yaml

test: install
	$(PY) -m pytest -q

lint: install
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bench: install
	$(PY) bench/rollout_throughput.py --episodes 32 --max-steps 3 --max-tokens 48

bench-mcts: install
	$(PY) bench/mcts_restore.py

bench-env: install
	$(PY) bench/env_protocol.py

demo-scienceworld: install
	$(PY) -m flows.eto --config configs/eto_scienceworld.yaml
