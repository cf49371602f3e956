"""`make deploy` (ops/deploy.py) deploys to the server an exported PREFECT_API_URL names, says in
one line how to start one when none answers, and lists which schedules it switched on, each with
the command that pauses or resumes it. The Makefile passes the exported URL and the ports on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from ops import deploy
from ops.services import free_port

REPO = Path(__file__).resolve().parent.parent


def test_an_exported_api_url_is_the_one_deployed_to(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://10.1.2.3:4300/api")
    assert deploy.api_url() == "http://10.1.2.3:4300/api"
    monkeypatch.delenv("PREFECT_API_URL")
    assert deploy.api_url() == "http://127.0.0.1:4200/api"


def test_no_server_is_one_line_saying_how_to_start_one(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(deploy, "prefect", lambda *args: ran.append(args))
    api = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    assert deploy.main(["--api-url", api]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(f"error: no Prefect server answers at {api} (")
    assert "`make services`" in err and "export PREFECT_API_URL=" in err
    assert ran == []  # nothing tried against a server that is not there


def test_deploys_to_the_exported_server_and_lists_its_schedules(monkeypatch, capsys):
    api = "http://10.1.2.3:4300/api"
    monkeypatch.setenv("PREFECT_API_URL", api)
    ran = []
    monkeypatch.setattr(deploy, "server_problem", lambda url: None)
    monkeypatch.setattr(deploy, "prefect", lambda url, *args: ran.append((url, args[:2])))
    found = [
        ("eto/eto-textcraft", "id-2", "0 3 * * * UTC", False),
        ("eto-campaign/eto-campaign-textcraft", "id-1", "0 */6 * * * UTC", True),
    ]
    monkeypatch.setattr(deploy, "schedules", lambda url, names: found)
    assert deploy.main([]) == 0
    assert ran == [(api, ("work-pool", "create")), (api, ("--no-prompt", "deploy"))]
    out = capsys.readouterr().out
    assert "Schedules switched ON (1)" in out
    assert (
        "pause: .venv/bin/prefect deployment schedule pause eto-campaign/eto-campaign-textcraft "
        "id-1" in out
    )
    assert "resume: .venv/bin/prefect deployment schedule resume eto/eto-textcraft id-2" in out


def test_every_shipped_schedule_is_off_until_resumed():
    shipped = yaml.safe_load((REPO / "deployments/prefect.yaml").read_text())
    schedules = [s for d in shipped["deployments"] for s in d.get("schedules", [])]
    assert schedules and [s["active"] for s in schedules] == [False] * len(schedules)


def make_dry_run(target: str, *args: str, env: dict | None = None) -> str:
    """The commands `make -n target` would run for it (not its `install` prerequisite)."""
    import os

    # Under `make test` the parent make exports MAKEFLAGS/MAKELEVEL, and a child make then prints
    # "Leaving directory" after its commands: read the dry run as a top-level make would print it.
    outer = {"MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES"}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, *args], cwd=REPO, text=True,
        capture_output=True, timeout=60,
        env={**{k: v for k, v in os.environ.items() if k not in outer}, **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_make_deploy_uses_an_exported_api_url_else_the_port(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    exported = make_dry_run("deploy", env={"PREFECT_API_URL": "http://10.1.2.3:4300/api"})
    assert exported.startswith("PREFECT_API_URL=http://10.1.2.3:4300/api ")
    by_port = make_dry_run("deploy", "PREFECT_PORT=4301")
    assert by_port.startswith("PREFECT_API_URL=http://127.0.0.1:4301/api ")


def test_make_services_passes_its_ports_on():
    command = make_dry_run("services", "PREFECT_PORT=4301", "MLFLOW_PORT=5001", "S3_PORT=9001")
    assert "--prefect-port 4301 --mlflow-port 5001 --s3-port 9001" in command
