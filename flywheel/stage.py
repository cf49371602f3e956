"""What every stage task shares: where it stores and tracks, how it is cached, what a failure
leaves behind.

`tracking` is left out of Prefect's cache key (`STAGE_CACHE`), so a re-run with a
new MLflow parent run still hits the cache of every finished stage; `env` enters it only through
`EnvSettings.identity()`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy
from prefect.utilities.hashing import hash_objects
from pydantic import BaseModel

from flywheel.records import FailedStage
from flywheel.storage import FAILED, ArtifactStore
from flywheel.tracking import Tracker


class StoreIdentity(CachePolicy):
    """Keys a stage's cache on the identity of the folder it writes to (the top folder of its
    `out_url` in `store_url`), so a result cached for a run folder or store that was deleted
    since is not reused: its files are gone."""

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        store_url = inputs.get("store_url")
        if not store_url:
            return None
        store = ArtifactStore(store_url)
        return hash_objects(store.identity(store.top_folder(inputs.get("out_url") or "")))


class EnvIdentity(CachePolicy):
    """Keys a stage's cache on `env.identity()` instead of all environment settings: which
    servers episodes ran on, or how many tasks the run took, does not change a stage's result."""

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        env = inputs.get("env")
        return hash_objects(env.identity()) if env is not None else None


STAGE_CACHE = (INPUTS + TASK_SOURCE) - "tracking" - "env" + StoreIdentity() + EnvIdentity()


class TrackingRef(BaseModel):
    tracking_uri: str
    experiment: str
    parent_run_id: str

    def tracker(self) -> Tracker:
        return Tracker(self.tracking_uri, self.experiment)

    def stage_run(self, name: str) -> tuple[Tracker, str]:
        tracker = self.tracker()
        return tracker, tracker.start(name, parent_id=self.parent_run_id)

    def log_stage(self, name: str, manifest) -> None:
        """A child run holding a finished stage's counts and metrics, and where its output is."""
        tracker, run_id = self.stage_run(name)
        numbers = {**manifest.counts, **manifest.metrics}
        tracker.log_metrics(run_id, {k: float(v) for k, v in numbers.items()})
        tracker.log_params(run_id, {"output_url": manifest.url})
        tracker.finish(run_id)


def store_for(store_url: str) -> ArtifactStore:
    return ArtifactStore(store_url)


def artifact_key(name: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes: `eto-textcraft`."""
    return re.sub(r"[^a-z0-9-]+", "-", name.rstrip("/").rsplit("/", 1)[-1].lower()).strip("-")


def stage_task(name: str):
    """A stage: a Prefect task cached on its inputs and code, results persisted, and a failure
    recorded next to its outputs (`record_failed_stage`)."""
    return task(
        name=name, cache_policy=STAGE_CACHE, persist_result=True, on_failure=[record_failed_stage]
    )


def record_failed_stage(task, task_run, state) -> None:
    """Prefect on_failure hook: write `_FAILED.json` into the stage's folder (the error, the
    input URLs, what the stage had written, the MLflow run) and show it as a Prefect artifact,
    so a person can open a failed stage's inputs and partial outputs from the UI."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.context import TaskRunContext

    context = TaskRunContext.get()
    params = context.parameters if context else {}
    store_url, out_url = params.get("store_url"), params.get("out_url")
    if not (store_url and out_url):
        return
    store = ArtifactStore(store_url)
    tracking = params.get("tracking")
    record = FailedStage(
        stage=task.name,
        task_run=task_run.name,
        flow_run_id=str(task_run.flow_run_id) if task_run.flow_run_id else None,
        failed_at=datetime.now(UTC).isoformat(timespec="seconds"),
        message=failure_message(state),
        inputs=url_inputs(params),
        partial_outputs=[u for u in store.list_files(out_url) if not u.endswith(FAILED)],
        mlflow_run=tracking.tracker().run_url(tracking.parent_run_id) if tracking else None,
    )
    store.write_text(f"{out_url}/{FAILED}", record.model_dump_json(indent=2))
    create_markdown_artifact(
        failure_markdown(record, out_url),
        key=artifact_key(f"{store.top_folder(out_url)}-failed-{task.name}"),
        description=f"{task.name} failed: {record.message[:200]}",
    )


def failure_message(state) -> str:
    """`RuntimeError: ...` from the failed state's exception (Prefect's own message otherwise)."""
    try:
        error = state.result(raise_on_failure=False)
    except Exception:
        error = None
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return state.message or "failed"


def url_inputs(params: dict) -> dict[str, str | list[str]]:
    """The stage's inputs that are artifact URLs (models, trajectories, pairs)."""

    def is_url(value) -> bool:
        return isinstance(value, str) and "://" in value

    found: dict[str, str | list[str]] = {}
    for name, value in params.items():
        if name in ("store_url", "out_url"):
            continue
        if is_url(value):
            found[name] = value
        elif isinstance(value, list) and value and all(is_url(v) for v in value):
            found[name] = list(value)
    return found


def failure_markdown(record: FailedStage, out_url: str) -> str:
    lines = [
        f"# Stage `{record.stage}` failed",
        "",
        f"Task run `{record.task_run}` at {record.failed_at}:",
        "",
        "```",
        record.message.strip(),
        "```",
        "",
        "## Inputs",
        *[
            f"- {name}: `{url}`"
            for name, urls in record.inputs.items()
            for url in ([urls] if isinstance(urls, str) else urls)
        ],
        "",
        f"## Partial outputs (in `{out_url}`)",
        *([f"- `{url}`" for url in record.partial_outputs] or ["- (none)"]),
        "",
        f"This record: `{out_url}/{FAILED}`",
    ]
    if record.mlflow_run:
        lines.append(f"MLflow run: {record.mlflow_run}")
    return "\n".join(lines)
