"""The services a production setup talks to, started on this machine: Prefect's server (API and
UI), MLflow's tracking server, and optionally an S3 endpoint (moto) on loopback.

    flywheel services [--s3]        # foreground; Ctrl-C stops them all

Tests start the same services on free ports through these functions.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Service:
    name: str
    url: str
    process: subprocess.Popen | None = None
    log: Path | None = None

    def stop(self) -> None:
        """Stop the service and whatever it started (its own process group)."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def wait_until_up(service: Service, health_url: str, timeout_s: float = 180) -> Service:
    """Poll `health_url` until it answers 200; a service that exits or never answers raises
    with the tail of its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.process and service.process.poll() is not None:
            break
        try:
            if httpx.get(health_url, timeout=2).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    tail = service.log.read_text()[-3000:] if service.log and service.log.exists() else ""
    service.stop()
    raise RuntimeError(f"{service.name} did not come up at {health_url}; its log ends:\n{tail}")


def _spawn(name: str, cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            start_new_session=True,  # a process group of its own, stopped whole
        )  # fmt: skip


def start_prefect_server(home: Path, port: int = 4200, env: dict | None = None) -> Service:
    """`prefect server start` with its database under `home` (PREFECT_HOME)."""
    # The UI asks the API at PREFECT_UI_API_URL, which defaults to port 4200, not `--port`: on
    # another port its pages stay empty ("Oops. Something went wrong", seen in a browser).
    ui_api = os.environ.get("PREFECT_UI_API_URL", f"http://127.0.0.1:{port}/api")
    env = {
        "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": ui_api, **(env or {}),
    }  # fmt: skip
    bin_dir = Path(sys.executable).parent
    cmd = [str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    log = home / "prefect-server.log"
    service = Service(
        "Prefect server", f"http://127.0.0.1:{port}", _spawn("prefect", cmd, log, env), log
    )
    return wait_until_up(service, f"{service.url}/api/health")


def start_mlflow_server(home: Path, artifacts_url: str, port: int = 5000) -> Service:
    """`mlflow server`: runs in sqlite under `home`, artifacts proxied to `artifacts_url` (the
    artifact store, e.g. s3://bucket/mlflow), so clients need no storage credentials."""
    home.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
        "--artifacts-destination", artifacts_url, "--workers", "1",
    ]  # fmt: skip
    log = home / "mlflow-server.log"
    service = Service("MLflow server", f"http://127.0.0.1:{port}", _spawn("mlflow", cmd, log), log)
    return wait_until_up(service, f"{service.url}/health")


def start_s3(port: int = 9000, bucket: str = "flywheel", home: Path | None = None) -> Service:
    """An S3 endpoint on loopback (moto's server, in memory, its own process) with `bucket`
    created. Clients find it through the standard AWS_ENDPOINT_URL setting."""
    import tempfile

    import boto3

    log = Path(home or tempfile.mkdtemp(prefix="flywheel-s3-")) / "s3.log"
    cmd = [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    url = f"http://127.0.0.1:{port}"
    service = wait_until_up(Service("S3 endpoint (moto)", url, _spawn("s3", cmd, log), log), url)
    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=bucket)
    return service


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flywheel services",
        description="Start Prefect's server (UI), MLflow's server and, with --s3, an S3 endpoint "
        "on loopback; print where to look. Ctrl-C stops them.",
    )
    parser.add_argument(
        "--home", default=".services", help="databases and logs (default: %(default)s)"
    )
    parser.add_argument("--prefect-port", type=int, default=4200)
    parser.add_argument("--mlflow-port", type=int, default=5000)
    parser.add_argument("--s3", action="store_true", help="also start moto's S3 server (in memory)")
    parser.add_argument("--s3-port", type=int, default=9000)
    args = parser.parse_args(argv)
    home = Path(args.home).resolve()
    started: list[Service] = []
    signal.signal(signal.SIGTERM, _exit_once)  # `kill` stops the services too
    try:
        if args.s3:
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "flywheel")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "flywheel")
            os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
            started.append(start_s3(args.s3_port, home=home))
            os.environ["AWS_ENDPOINT_URL"] = started[-1].url
            artifacts = "s3://flywheel/mlflow"
        else:
            artifacts = str(home / "mlflow-artifacts")
        started.append(start_prefect_server(home / "prefect", args.prefect_port))
        started.append(start_mlflow_server(home / "mlflow", artifacts, args.mlflow_port))
        print(where_to_look(started, args.s3))
        while all(s.process is None or s.process.poll() is None for s in started):
            time.sleep(1)
        print("a service exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for service in reversed(started):
            service.stop()


def _exit_once(*_) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the clean-up short
    sys.exit(0)


def where_to_look(services: list[Service], s3: bool) -> str:
    prefect, mlflow = services[-2], services[-1]
    lines = [f"{s.name:<20} {s.url}" for s in services]
    lines += [
        "",
        "In another shell, point runs and workers at them:",
        f"  export PREFECT_API_URL={prefect.url}/api",
        f"  export MLFLOW_TRACKING_URI={mlflow.url} FLYWHEEL_MLFLOW_UI={mlflow.url}",
    ]
    if s3:
        lines += [
            f"  export AWS_ENDPOINT_URL={services[0].url} AWS_ACCESS_KEY_ID=flywheel "
            "AWS_SECRET_ACCESS_KEY=flywheel AWS_DEFAULT_REGION=us-east-1",
        ]
    store = "s3://flywheel/runs" if s3 else "runs"
    lines += [
        "  make deploy        # work pool + every deployment in deployments/prefect.yaml",
        "  make worker        # a process worker that runs them",
        "  .venv/bin/prefect deployment run eto-campaign/eto-campaign-textcraft \\",
        f'      --param overrides=\'["rounds=6", "storage_url={store}"]\'',
        "",
        f"Prefect UI: {prefect.url} (flow runs, failed stages, artifacts); MLflow UI: {mlflow.url}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
