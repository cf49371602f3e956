"""`make deploy`: the process work pool and the deployments of deployments/prefect.yaml on the
Prefect server at PREFECT_API_URL, then which schedules run and how to switch each on or off.

    flywheel deploy [--api-url URL] [--name DEPLOYMENT ...]

A server that does not answer is one line saying how to start one, not Prefect's traceback.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
PREFECT_FILE = "deployments/prefect.yaml"
WORK_POOL = "flywheel-process"
DEFAULT_API_URL = "http://127.0.0.1:4200/api"
# The deployments on the process pool, which `make worker` runs; the docker and kubernetes ones
# need their pools and images first (deployments/prefect.yaml).
PROCESS_DEPLOYMENTS = (
    "eto-campaign-textcraft", "agent-r-campaign-textcraft", "eto-textcraft", "agent-r-textcraft",
    "agent-r1-qa", "et-agent-qa", "eto-scienceworld",
)  # fmt: skip
HEALTH_TIMEOUT_S = 5.0


def api_url() -> str:
    """The server to deploy to: an exported PREFECT_API_URL, else the one `make services` starts."""
    return os.environ.get("PREFECT_API_URL") or DEFAULT_API_URL


def server_problem(api: str) -> str | None:
    """Why no Prefect server answers at `api` (one line, saying how to start one), or None."""
    health = api.rstrip("/") + "/health"
    try:
        answer = httpx.get(health, timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError as error:
        reason = f"{type(error).__name__}: {error}"
    else:
        if answer.status_code == 200:
            return None
        reason = f"{health} answered {answer.status_code}; is it a Prefect server's /api?"
    return (
        f"no Prefect server answers at {api} ({reason}); start one with `make services` "
        "(PREFECT_PORT=4300 for another port), or export PREFECT_API_URL=<a running server>/api"
    )


def prefect(api: str, *args: str) -> None:
    """Run the `prefect` command line against `api`; a failure raises with its output."""
    env = {**os.environ, "PREFECT_API_URL": api, "FLYWHEEL_HOME": str(REPO)}
    command = [str(Path(sys.executable).parent / "prefect"), *args]
    done = subprocess.run(command, cwd=REPO, env=env, text=True, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"`prefect {' '.join(args)}` failed:\n{done.stdout}{done.stderr}")


def schedules(api: str, names: list[str]) -> list[tuple[str, str, str, bool]]:
    """(`flow/deployment`, schedule id, when, active) for each schedule of the deployments
    named, read back from the server: what `prefect deploy` really switched on."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    found = []
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        named = DeploymentFilter(name=DeploymentFilterName(any_=names))
        for deployment in client.read_deployments(deployment_filter=named):
            flow = client.read_flow(deployment.flow_id).name
            for schedule in deployment.schedules:
                when = getattr(schedule.schedule, "cron", None) or str(schedule.schedule)
                timezone = getattr(schedule.schedule, "timezone", None) or "UTC"
                found.append(
                    (f"{flow}/{deployment.name}", str(schedule.id), f"{when} {timezone}",
                     schedule.active)
                )  # fmt: skip
    return sorted(found, key=lambda row: (not row[3], row[0]))


def schedule_lines(found: list[tuple[str, str, str, bool]]) -> list[str]:
    """Each schedule, on or off, with the command that switches it the other way."""
    if not found:
        return ["No schedules: the deployments run when started (`prefect deployment run`)."]
    on = [row for row in found if row[3]]
    lines = [
        f"Schedules switched ON ({len(on)}): the worker starts these runs by itself."
        if on
        else "Every schedule is off: runs start only when you start them."
    ]
    for name, schedule_id, when, active in found:
        verb = "pause" if active else "resume"
        lines += [
            f"  {'ON ' if active else 'off'}  {name:<44} {when}",
            f"       {verb}: .venv/bin/prefect deployment schedule {verb} {name} {schedule_id}",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flywheel deploy",
        description=f"Create the {WORK_POOL} work pool and deploy {PREFECT_FILE} to the Prefect "
        "server at PREFECT_API_URL, then list the schedules and how to pause or resume each.",
    )
    parser.add_argument(
        "--api-url",
        default=api_url(),
        help="Prefect API (default: PREFECT_API_URL, else %(default)s)",
    )
    parser.add_argument(
        "--name", action="append", help="a deployment to deploy (repeat; default: the process ones)"
    )
    args = parser.parse_args(argv)
    names = args.name or list(PROCESS_DEPLOYMENTS)
    if problem := server_problem(args.api_url):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        prefect(args.api_url, "work-pool", "create", WORK_POOL, "--type", "process", "--overwrite")
        name_args = [arg for name in names for arg in ("--name", name)]
        prefect(args.api_url, "--no-prompt", "deploy", "--prefect-file", PREFECT_FILE, *name_args)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Deployed to {args.api_url} on work pool {WORK_POOL}: {', '.join(names)}")
    print("\n".join(schedule_lines(schedules(args.api_url, names))))
    print("Start runs with `make worker` running (it runs what the pool is given).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
