"""Shared fixtures. Every cache a run would put in HOME goes to a temporary folder instead."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="flywheel-tests-"))
os.environ.update(
    {
        "PREFECT_HOME": str(_SESSION_HOME / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # A fresh ephemeral server migrates its database first; 20 s is too tight on 2 busy cores.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "HF_HOME": str(_SESSION_HOME / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TORCH_EXTENSIONS_DIR": str(_SESSION_HOME / "torch_extensions"),
        "FLYWHEEL_CACHE": os.environ.get("FLYWHEEL_TEST_CACHE", str(_SESSION_HOME / "cache")),
        "MLFLOW_TRACKING_URI": f"sqlite:///{_SESSION_HOME / 'mlflow.db'}",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
)


def pytest_unconfigure(config):
    """The session's folder goes with the session: a model cache and Prefect's and MLflow's
    databases, half a gigabyte a run, which 345 runs left in /tmp filled the disk with."""
    import shutil

    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: an extended test is never a fast one
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("extended") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _unstopped():
    """Each test starts in a process that is not stopping: a flow an earlier test ran (and
    failed) in this process left `flywheel.stopping` set, as a failed flow does."""
    from flywheel.stopping import resume_runs

    resume_runs()


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    from flywheel.model import convert_base_model

    return convert_base_model(Path(os.environ["FLYWHEEL_CACHE"]) / "models" / "smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_dir(base_model_dir) -> Path:
    from flywheel.model import make_tiny_model

    return make_tiny_model(Path(os.environ["FLYWHEEL_CACHE"]) / "models" / "tiny", base_model_dir)


def _load_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


# Under mutmut (it sets MUTANT_UNDER_TEST) a fork server imports this file once, then forks one
# child per mutant, whose timeout is worked out from the tests' own run time alone. Loading the
# tokenizer (and transformers) here, once, spares each child seconds of its timeout on a busy
# machine; the ChatTokenizer itself is still built in the child, from the mutated code.
# Its children end with os._exit or a kill, possibly while tqdm's lock is held: tqdm's default
# lock is a multiprocessing semaphore that every child shares, so one child ending inside it
# (tqdm's monitor thread takes it every few seconds) leaves every later child waiting on it
# forever. Under mutmut tqdm gets a per-process lock and no monitor thread.
_PRELOADED_TOKENIZER = None
if "MUTANT_UNDER_TEST" in os.environ:
    import threading

    from tqdm import tqdm as _tqdm

    _tqdm.set_lock(threading.RLock())
    _tqdm.monitor_interval = 0

    from flywheel.model import convert_base_model as _convert

    _PRELOADED_TOKENIZER = _load_tokenizer(
        _convert(Path(os.environ["FLYWHEEL_CACHE"]) / "models" / "smollm2-135m")
    )


@pytest.fixture(scope="session")
def chat(base_model_dir):
    from flywheel.chat import ChatTokenizer

    return ChatTokenizer(_PRELOADED_TOKENIZER or _load_tokenizer(base_model_dir))


@pytest.fixture(scope="module")
def textcraft():
    from envs import make_env

    return make_env("textcraft")


@pytest.fixture(scope="module")
def server():
    """A Flywheel TextCraft environment server on loopback (its own process), one per module."""
    from envs.agentgym.server import LocalServer

    server = LocalServer("--env", "textcraft")
    yield server
    server.kill()


def flow_run_ids(client, flow_run_id) -> list:
    """A flow run and its subflow runs (a recipe's stages run in a subflow)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    children = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
        )
    )
    return [flow_run_id, *(run.id for run in children)]


def task_states(flow_state_or_id) -> dict[str, list[str]]:
    """Task name -> state names of one flow run (its subflows included), read back through the
    Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    flow_run_id = getattr(flow_state_or_id, "state_details", None)
    flow_run_id = flow_run_id.flow_run_id if flow_run_id else flow_state_or_id
    with get_client(sync_client=True) as client:
        ids = flow_run_ids(client, flow_run_id)
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": ids}))
    states: dict[str, list[str]] = {}
    for run in sorted(runs, key=lambda r: r.expected_start_time):
        if run.name.startswith("stages") or "-stages" in run.name:
            continue  # the task run Prefect makes for the subflow call
        # A stage's task run is named `<stage>/<label>`; other tasks `<task>-<suffix>`.
        name = run.name.split("/", 1)[0] if "/" in run.name else run.name.rsplit("-", 1)[0]
        states.setdefault(name, []).append(run.state.name)
    return states


def tiny_tool_recipe(run_name: str, root: Path, **sections) -> dict:
    """The smallest Agent-R1 / ET-Agent run on the tiny model (3 train, 2 test questions, groups
    of 2 on 2 questions): the config the tool recipes' flow tests and benches share. `sections`
    are added or replace whole sections."""
    return {
        "run_name": run_name,
        "storage_url": str(root / "store"),
        "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "model": {"base": "tiny"},
        "env": {"train_tasks": 3, "test_tasks": 2, "max_steps": 2, "few_shot": 0},
        "inference": {"max_tokens": 16, "kv_cache_gib": 1, "max_model_len": 2048},
        "rounds": 1,
        "sft": {"epochs": 1, "batch_size": 2, "max_length": 2048},
        "sample": {"tasks_per_round": 2, "samples_per_task": 2},
        **sections,
    }


@pytest.fixture
def s3_store(tmp_path, monkeypatch):
    """A real S3 endpoint on loopback (moto's server) and a bucket in it."""
    import s3fs

    from flywheel.storage import ArtifactStore
    from ops.services import free_port, start_s3

    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FLYWHEEL_CACHE": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(key, value)
    server = start_s3(free_port(), home=tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached client would keep an older endpoint
    yield ArtifactStore("s3://flywheel/runs")
    server.stop()
    s3fs.S3FileSystem.clear_instance_cache()


def running_command_lines() -> list[str]:
    """The command line of every running process. Listed from /proc's names, each read on its
    own: a process that ends meanwhile is skipped (pathlib's glob stats each entry and raised
    ProcessLookupError for one that ended between the listing and the stat)."""
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # ended meanwhile
            continue
    return lines
