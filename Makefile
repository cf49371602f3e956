# The two commands of the README: `make demo` (the ETO run on the embedded defaults) and
# `make test`. Both install what they need into .venv first (scripts/install.sh, idempotent).
PY := .venv/bin/python
export PREFECT_HOME ?= $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 180
export FLYWHEEL_CACHE ?= $(CURDIR)/.cache/flywheel
export FLYWHEEL_TEST_CACHE ?= $(CURDIR)/.cache/flywheel-test

.PHONY: install demo demo-agent-r demo-agent-r1 demo-et-agent demo-et-agent-grpo demo-scienceworld test test-fast test-extended mutation lint bench bench-kv-cache bench-sandbox bench-chaos bench-mcts gpu-checklist bench-env bench-train bench-efficacy bench-et-agent-competent bench-agent-r1 bench-demo-cost bench-train-repeat bench-profile-train-step bench-sizing bench-determinism bench-seeded-sampling services deploy worker

install:
	bash scripts/install.sh

demo: install
	$(PY) -m flows.eto --config configs/eto_textcraft.yaml

demo-agent-r: install
	$(PY) -m flows.agent_r --config configs/agent_r_textcraft.yaml

demo-agent-r1: install
	$(PY) -m flows.agent_r1 --config configs/agent_r1_qa.yaml

demo-et-agent: install
	$(PY) -m flows.et_agent --config configs/et_agent_qa.yaml

# the same samples and budget, plain GRPO on every group with the QA reward (the comparison)
demo-et-agent-grpo: install
	$(PY) -m flows.et_agent --config configs/et_agent_qa.yaml run_name=et-agent-qa-grpo \
	  calibration.method=plain

# CI's two tiers, the fast one first: a broken rule fails in minutes, before vLLM and trainers
# start. The fast tier runs on TEST_JOBS processes (default 2: both cores), a test file to a
# process so that a module's server or model is made once; the slow tier runs alone (vLLM and the
# trainers use every core themselves) and holds one end-to-end run of each promise; the variants
# beyond CI's time budget are marked `extended` (make test-extended; docs/testing.md).
TEST_JOBS ?= 2
FAST_TESTS = -m "not slow" -n $(TEST_JOBS) --dist loadfile

test: install
	$(PY) -m pip check
	$(PY) -m pytest -q $(FAST_TESTS)
	$(PY) -m pytest -q -m "slow and not extended"

# The end-to-end variants CI leaves out (~30 min on 2 cores): run before a release and after
# changing what they guard (their list: `pytest -m extended --collect-only -q`).
test-extended: install
	$(PY) -m pytest -q -m extended

# The fast tier alone (no vLLM, no trainer): run it on every change.
test-fast: install
	$(PY) -m pytest -q $(FAST_TESTS)

# Mutation testing of the core modules against the fast tests ([tool.mutmut] in pyproject.toml);
# not part of `make test` (tens of minutes). `mutmut results` lists survivors, `mutmut show NAME`
# shows one. MUTANTS narrows the run, e.g. MUTANTS='agents.mcts*'. One OpenMP thread: mutmut forks
# its children after torch's thread pool exists, and a child in a torch test then waits on a lock forever.
mutation: install
	rm -rf mutants
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 19 .venv/bin/mutmut run --max-children $(or $(MUTATION_JOBS),2) $(MUTANTS)
	.venv/bin/python scripts/mutation_scores.py

lint: install
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

# 6 steps an episode: the demos' env.max_steps
bench: install
	$(PY) -m bench.rollout_throughput --episodes 32 --max-steps 6 --max-tokens 48

# The demo's SFT policy (make demo first) under a float32 and an fp8 KV cache, episode by episode
bench-kv-cache: install
	$(PY) -m bench.kv_cache_agreement --model-dir runs/eto-textcraft/sft/model

# The python tool's two boxes: latency per call and batch throughput (bench/results-sandbox-latency.md)
bench-sandbox: install
	$(PY) -m bench.sandbox_latency

bench-mcts: install
	$(PY) -m bench.mcts_restore

# The tiny ETO campaign on two environment servers, the flow, trainers, vLLM's engine and the
# servers killed at seeded moments and resumed; the store compared with an undisturbed run's
# (bench/results-chaos.md; hours on 2 cores)
bench-chaos: install
	$(PY) -m bench.chaos --kills 12 --seed 0

# On a CUDA machine: bandwidth, vLLM against the decode bound, SFT/DPO/RL step time and memory
# (full and LoRA, a 1.7B-shaped model), ZeRO-2/3, an ETO round: bench/results-gpu-checklist.md.
# `--dry-run` (in the fast tests) builds every command and parses every config, launching nothing.
gpu-checklist: install
	$(PY) -m bench.gpu_checklist

bench-env: install
	$(PY) -m bench.env_protocol

bench-train: install
	$(PY) -m bench.train_throughput --tasks 16 --pairs 8 --out bench/results-train-throughput.md

# ETO and Agent-R at a larger budget, 3 seeds (about 2 hours on 2 cores): bench/results-efficacy.md
bench-efficacy: install
	$(PY) -m bench.efficacy

# ET-Agent from the warm start on every train question at the setting chosen on validation
# (docs/notebook.md, ET-Agent): validation seeds 0-2 first, then the test split on the same store
# (every trained stage served, only the evaluations run). Hours on 2 cores (not timed end to end).
ET_AGENT_COMPETENT = --recipes et-agent --seeds 0 1 2 --rounds 2 --set env.train_tasks=null \
	--set sample.curriculum=none --set calibration.budget=16 --set evolve.rewrite=false \
	--set rl.learning_rate=5e-5
bench-et-agent-competent: install
	$(PY) -m bench.efficacy $(ET_AGENT_COMPETENT) --split validation \
		--out bench/results-validation/et-agent-seeds012-all-none-b16-norewrite-rl5e-5.md
	$(PY) -m bench.efficacy $(ET_AGENT_COMPETENT) --split test \
		--out bench/results-efficacy-et-agent-competent.md

# Agent-R1: the five estimators side by side on one warm start (hours on 2 cores), the tools'
# speed, rollouts with tool calls against the decode bound: bench/results-agent-r1.md
bench-agent-r1: install
	$(PY) bench/agent_r1.py

# The cost of a whole command: wall time and the peak memory of its process tree (the README's
# demo cost; CMD= any other command)
bench-demo-cost: install
	$(PY) -m bench.measure_run -- $(or $(CMD),$(MAKE) demo)

# On a CUDA machine, after `python -m bench.gpu_checklist --prepare DIR` (PREPARED=DIR): the same
# training job twice, weights compared (docs/determinism.md), and one job's step profiled
bench-train-repeat: install
	$(PY) -m bench.train_repeat $(PREPARED) --work $(or $(WORK),/tmp/flywheel-train-repeat)

bench-profile-train-step: install
	$(PY) -m bench.profile_train_step $(PREPARED) $(or $(JOB),sft) --work $(or $(WORK),/tmp/flywheel-train-repeat)

# Memory and wall time per stage on paper, from FLOP counts and an H100's bounds (docs/sizing.md)
bench-sizing: install
	$(PY) -m bench.sizing

# Seeded sampling admitted as the KV cache holds each request, against the old cap and an
# unseeded engine, twice, compared token for token (bench/results-seeded-sampling.md)
bench-seeded-sampling: install
	$(PY) -m bench.seeded_sampling --tasks 8 --samples 4 --max-steps 6 --out runs/seeded-sampling

# The same sampled explore shard played twice and compared episode by episode (docs/determinism.md)
bench-determinism: install
	$(PY) -m bench.sampled_twice play runs/sampled-1.jsonl
	$(PY) -m bench.sampled_twice play runs/sampled-2.jsonl
	$(PY) -m bench.sampled_twice compare runs/sampled-1.jsonl runs/sampled-2.jsonl

demo-scienceworld: install
	$(PY) -m flows.eto --config configs/eto_scienceworld.yaml

# Production-like, on this machine: Prefect server (UI) + MLflow server (+ S3 with S3=1), then
# deployments on a process work pool and a worker that runs them. Ports: PREFECT_PORT,
# MLFLOW_PORT, S3_PORT. deploy and worker use an exported PREFECT_API_URL / MLFLOW_TRACKING_URI
# (a server elsewhere), else the services' addresses on those ports.
PREFECT_PORT ?= 4200
MLFLOW_PORT ?= 5000
S3_PORT ?= 9000
PREFECT_URL ?= $(or $(PREFECT_API_URL),http://127.0.0.1:$(PREFECT_PORT)/api)
MLFLOW_URL ?= $(or $(MLFLOW_TRACKING_URI),http://127.0.0.1:$(MLFLOW_PORT))
MLFLOW_UI ?= $(or $(FLYWHEEL_MLFLOW_UI),$(MLFLOW_URL))

services: install
	$(PY) -m ops.services $(if $(S3),--s3) --prefect-port $(PREFECT_PORT) --mlflow-port $(MLFLOW_PORT) --s3-port $(S3_PORT)

deploy: install
	PREFECT_API_URL=$(PREFECT_URL) $(PY) -m ops.deploy

worker: install
	PREFECT_API_URL=$(PREFECT_URL) MLFLOW_TRACKING_URI=$(MLFLOW_URL) FLYWHEEL_MLFLOW_UI=$(MLFLOW_UI) \
	  FLYWHEEL_HOME=$(CURDIR) .venv/bin/prefect worker start --pool flywheel-process
