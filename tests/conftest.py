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


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    from flywheel.model import convert_base_model

    return convert_base_model(Path(os.environ["FLYWHEEL_CACHE"]) / "models" / "smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_dir(base_model_dir) -> Path:
    from flywheel.model import make_tiny_model

    return make_tiny_model(Path(os.environ["FLYWHEEL_CACHE"]) / "models" / "tiny", base_model_dir)


@pytest.fixture(scope="session")
def chat(base_model_dir):
    from transformers import AutoTokenizer

    from flywheel.chat import ChatTokenizer

    return ChatTokenizer(AutoTokenizer.from_pretrained(base_model_dir))


def task_states(flow_state) -> dict[str, list[str]]:
    """Task name -> state names of one flow run, read back through the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    flow_run_id = flow_state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [flow_run_id]}))
    states: dict[str, list[str]] = {}
    for run in sorted(runs, key=lambda r: r.expected_start_time):
        states.setdefault(run.name.rsplit("-", 1)[0], []).append(run.state.name)
    return states


class EnvServer:
    """`python -m envs.serve` in a real child process on a free loopback port."""

    def __init__(self, *args: str, port: int | None = None) -> None:
        import socket
        import subprocess
        import sys

        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.args, self.port, self.url = args, port, f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "envs.serve", *args, "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 120) -> None:
        import time

        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.process.stdout.read()}")
            try:
                httpx.get(f"{self.url}/flywheel", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"server {self.args} did not come up in {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL: no goodbye to the clients, as when a machine dies."""
        self.process.kill()
        self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.__init__(*self.args, port=self.port)
