"""What every stage shares: where it stores and tracks, how it is cached, what a failure leaves
behind.

A stage is written as a plain function of one typed inputs object (what it reads and its
settings) and the `StageRun` it writes into, decorated with `@stage(name)`. The decorator owns the
rest: the content-keyed cache lookup, the MLflow child run, publishing the manifest, and the
failure record. Its `.fn` runs all of that without Prefect; its `.body` is the bare function.

A stage's cache is its manifest in the artifact store (`ArtifactStore.manifest`), keyed on its
settings, the content of what it read and the code version; Prefect caches and persists nothing
(its persisted results are pickles, and a pickle from a shared bucket is code run on load). A
stage served from its manifest ends in a Completed state named "Cached", as Prefect's own cache
hits do, so the UI tells the two apart; its MLflow child run is tagged `cached=true`.

A stage that fails for a transient cause (an environment server or the store unreachable, a
timeout) is retried with back-off; a deterministic failure (a bad setting, a NaN loss) is not:
retrying it would spend the same hours to fail the same way (`is_transient_failure`).
"""

from __future__ import annotations

import functools
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

from prefect import Task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.states import Completed, State
from pydantic import BaseModel, Field

from flywheel.code_version import StageCode, is_project_module, module_path, stage_code
from flywheel.records import FailedStage, Manifest
from flywheel.settings import EnvSettings, is_keyed
from flywheel.storage import FAILED, ArtifactStore
from flywheel.tracking import Tracker, end_status, plain_markdown, short_cause


class TrackingRef(BaseModel):
    tracking_uri: str
    experiment: str
    parent_run_id: str

    def tracker(self) -> Tracker:
        return Tracker(self.tracking_uri, self.experiment)

    def stage_run(self, name: str) -> tuple[Tracker, str]:
        tracker = self.tracker()
        return tracker, tracker.start(name, parent_id=self.parent_run_id)


class StageOutput(BaseModel):
    """Where a stage writes and reports: the store, the stage's folder in it, and the flow run's
    MLflow run, under which the stage opens a child run named `<stage>/<label>` (none when
    `tracking` is None). Not part of the cache key: a result is keyed on what it read."""

    store_url: str
    url: str
    label: str = ""
    tracking: TrackingRef | None = None


class StageResult(BaseModel):
    """What a stage's body returns: the files it wrote into its folder and its numbers. The
    decorator turns it into the published manifest."""

    files: dict[str, str] = Field(default_factory=dict)  # logical name -> URL
    counts: dict[str, int] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class StageRun:
    """A running stage's side of its output: the store, its folder, and its MLflow child run."""

    def __init__(
        self,
        name: str,
        output: StageOutput,
        tracker: Tracker | None = None,
        run_id: str | None = None,
    ):
        self.name = name
        self.store = ArtifactStore(output.store_url)
        self.url = output.url
        self.tracker, self.run_id = tracker, run_id
        self.key: str | None = None  # the stage's cache key (set by `run_body`): checkpoints'

    def file(self, name: str) -> str:
        """The URL of `name` inside the stage's folder."""
        return f"{self.url}/{name}"

    def tracking_env(self) -> dict[str, str]:
        """Environment for a trainer process that logs into this stage's MLflow run."""
        return self.tracker.subprocess_env(self.run_id) if self.tracker else {}


def artifact_key(name: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes: `eto-textcraft`."""
    return re.sub(r"[^a-z0-9-]+", "-", name.rstrip("/").rsplit("/", 1)[-1].lower()).strip("-")


def publish_markdown(markdown: str, key: str, description: str) -> None:
    """`markdown` as a Prefect artifact under `key`, inside a Prefect run only: a direct call
    (`task.fn(...)`, a script) has no run to attach it to, and Prefect would start an API
    server just to store it."""
    from prefect.artifacts import create_markdown_artifact

    if TaskRunContext.get() is not None:
        create_markdown_artifact(markdown, key=artifact_key(key), description=description)


# A planner (`ops.status`): while one is set, a stage runs nothing, in Prefect or out: it hands
# its name, keyed inputs, code and output to the planner, which answers with a manifest.
Planner = Callable[[str, dict, StageCode, "StageOutput"], Manifest]
PLANNER: ContextVar[Planner | None] = ContextVar("flywheel_planner", default=None)


def active_planner() -> Planner | None:
    """The planner set by `planning`, if any. Stage functions call this rather than reading
    `PLANNER` themselves: Dask pickles a stage's function by value, and a ContextVar it
    referenced directly cannot be pickled (this function is pickled by reference)."""
    return PLANNER.get()


@contextmanager
def planning(planner: Planner) -> Iterator[None]:
    """Stages called inside are answered by `planner` (a dry run of a recipe), not run."""
    token = PLANNER.set(planner)
    try:
        yield
    finally:
        PLANNER.reset(token)


class PlannedResults(list):
    """What `.map` gives while planning: the results, with a Prefect future list's `result()`."""

    def result(self) -> list:
        return list(self)


class StageTask(Task):
    """A Prefect task whose function may end it in a state of its own ("Cached"); a direct call
    still returns the value, as for any task (Prefect would hand back the state itself). While
    planning, calls and maps go straight to the function: no Prefect run, no API."""

    def __call__(self, *args, return_state: bool = False, wait_for=None, **kwargs):
        if active_planner() is not None:
            return self.fn(*args, **kwargs)
        result = super().__call__(*args, return_state=return_state, wait_for=wait_for, **kwargs)
        if not return_state and isinstance(result, State):
            return result.result()
        return result

    def map(self, *args, **kwargs):
        if active_planner() is None:
            return super().map(*args, **kwargs)
        n = len(args)  # one call per row of the mapped lists, as Prefect's map
        rows = zip(*args, *kwargs.values(), strict=True)
        return PlannedResults(
            self.fn(*r[:n], **dict(zip(kwargs, r[n:], strict=True))) for r in rows
        )


def stage_task(name: str):
    """A stage: a Prefect task that Prefect neither caches nor persists (the manifest is the
    cache), whose failure is recorded next to its outputs (`record_failed_stage`). Called
    outside a task run (`.fn`), it returns the manifest itself."""

    def decorate(function):
        @functools.wraps(function)
        def run_stage(*args, **kwargs):
            result = function(*args, **kwargs)
            in_task_run = TaskRunContext.get() is not None
            if in_task_run and isinstance(result, Manifest) and result.served_from_store:
                return Completed(data=result, name="Cached", message=f"{result.url} is current")
            return result

        return StageTask(
            run_stage,
            name=name,
            cache_policy=NO_CACHE,
            persist_result=False,
            task_run_name=stage_run_name,
            retries=len(RETRY_DELAYS_S),
            retry_delay_seconds=list(RETRY_DELAYS_S),
            retry_condition_fn=retry_if_transient,
            on_failure=[record_failed_stage],
            on_completion=[mark_failure_superseded],
        )

    return decorate


# Waits before each retry of a transiently failed stage: long enough for a restarted
# environment server or a store that dropped connections to come back.
RETRY_DELAYS_S = (30, 120)


def transient_errors() -> tuple[type[BaseException], ...]:
    """Failures of what a stage talks to, not of the stage: connections refused or reset,
    timeouts (built in, and as httpx, botocore and aiohttp raise them). An environment's own
    unavailability (`envs.base.EnvironmentUnavailable`) is a ConnectionError."""
    import aiohttp
    import botocore.exceptions as boto
    import httpx

    return (
        ConnectionError,
        TimeoutError,
        socket.gaierror,
        httpx.TransportError,
        boto.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError
        boto.HTTPClientError,  # ReadTimeoutError, ConnectionClosedError
        aiohttp.ClientConnectionError,  # s3fs talks to S3 through aiohttp
    )


def is_transient_failure(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is transient (`transient_errors`)."""
    transient, seen = transient_errors(), set()
    while error is not None and id(error) not in seen:
        if isinstance(error, transient):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def retry_if_transient(task, task_run, state) -> bool:
    """Prefect's `retry_condition_fn` for stages: retry a transient failure only."""
    try:
        error = state.result(raise_on_failure=False)
    except Exception:
        return False
    return isinstance(error, BaseException) and is_transient_failure(error)


def report_task(name: str):
    """A flow run's report (results table, behaviour table): a Prefect task that is never cached,
    because every flow run writes its own report into its own MLflow parent run and Prefect
    artifacts. Not a stage: it has no key or manifest and plays or trains nothing; the stages
    whose manifests it reads are cached."""

    def decorate(function):
        return Task(function, name=name, cache_policy=NO_CACHE, persist_result=False)

    return decorate


def cache_inputs(name: str, inputs: BaseModel) -> dict:
    """What a stage's result is keyed on (with the content of every artifact URL among them and
    the stage's code version, `ArtifactStore.stage_key`): its name and every field of its
    inputs. An environment enters as its identity: the servers an episode runs on do not change
    it. Settings marked `NOT_KEYED` (`flywheel.settings`), at any depth, are left out: they
    cannot change the result."""
    keyed = {"stage": name}
    for field, info in type(inputs).model_fields.items():
        if not is_keyed(info):
            continue
        value = getattr(inputs, field)
        if isinstance(value, EnvSettings):
            keyed[field] = value.identity()
        elif isinstance(value, BaseModel) and (unkeyed := unkeyed_fields(value)):
            keyed[field] = value.model_dump(mode="json", exclude=unkeyed)
        else:
            keyed[field] = value
    return keyed


def unkeyed_fields(value) -> dict:
    """The `NOT_KEYED` fields inside `value` (a model, or a list or dict of them) as pydantic's
    `exclude` argument: {field: True} and {field: {nested field: True}}; empty where none."""
    if isinstance(value, BaseModel):
        found = {}
        for field, info in type(value).model_fields.items():
            nested = unkeyed_fields(getattr(value, field)) if is_keyed(info) else True
            if nested:
                found[field] = nested
        return found
    if not isinstance(value, dict | list | tuple):
        return {}
    items = value.items() if isinstance(value, dict) else enumerate(value)
    return {key: nested for key, item in items if (nested := unkeyed_fields(item))}


def stage(name: str, launches: tuple[str, ...] = ()):
    """A cached, tracked stage from `body(inputs, run) -> StageResult`.

    Called as `stage_fn(inputs, out)`: a manifest published for the same key at `out.url` is
    returned as it is (a "Cached" state in Prefect); otherwise the body runs and its result is
    published. With `out.tracking`, a child MLflow run `<name>/<out.label>` holds the stage's
    counts and metrics (a trainer logs into it while the body runs) and ends FAILED or KILLED
    with the body.

    The key holds the stage's code: the import closure of the body's module and of `launches`,
    the project modules the body runs as processes of their own (`python -m training.sft`),
    which no import reaches (`flywheel.code_version`)."""
    for module in launches:
        if not (is_project_module(module) and module_path(module)):
            raise ValueError(f"stage {name!r} launches {module!r}, which is no project module")

    def decorate(body: Callable[[BaseModel, StageRun], StageResult]):
        code_roots = (body.__module__, *launches)

        def run_stage(inputs: BaseModel, out: StageOutput) -> Manifest:
            keyed, code = cache_inputs(name, inputs), stage_code(code_roots)
            if (planner := active_planner()) is not None:
                return planner(name, keyed, code, out)
            store = ArtifactStore(out.store_url)
            tracker = out.tracking.tracker() if out.tracking else None
            run_id = start_child_run(tracker, name, out) if tracker else None
            if (done := store.manifest(out.url, keyed, code)) is None:
                run = StageRun(name, out, tracker, run_id)
                done = run_body(body, inputs, run, keyed, code)
            else:
                forget_failure(store, out.url)
            if run_id:
                log_child_run(tracker, run_id, done)
            return done

        # The body's name and docstring, but this signature: Prefect names the parameters
        # (inputs, out) from it, and the failure record reads `out` (no `__wrapped__`).
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(run_stage, attribute, getattr(body, attribute))
        task = stage_task(name)(run_stage)
        task.body, task.code_roots = body, code_roots
        return task

    return decorate


# What a redone stage keeps of an earlier attempt: its trainer's checkpoints, each recorded with
# the key it was written for (training/checkpoint.py resumes only a matching one).
KEPT_ON_REDO = ("checkpoint",)


def run_body(
    body, inputs: BaseModel, run: StageRun, keyed: dict, code: StageCode | None = None
) -> Manifest:
    """Run the stage's body and publish its result under `keyed` and `code`; a failure ends the
    stage's MLflow run FAILED (KILLED when told to stop), never FINISHED."""
    try:
        run.key = run.store.stage_key(keyed, code)[0]  # as `publish` keys it
        if left := run.store.clear_stage_folder(run.url, keep=KEPT_ON_REDO):
            print(
                f"stage {run.name} ({run.url}): removed {len(left)} files an earlier attempt left"
            )
        result = body(inputs, run)
        manifest = Manifest(stage=run.name, url=run.url, **result.model_dump())
        return run.store.publish(manifest, keyed, code)
    except BaseException as error:
        if run.run_id:
            run.tracker.finish(run.run_id, end_status(error))
        raise


def forget_failure(store: ArtifactStore, url: str) -> None:
    """A stage served from its manifest has no failure to show: a record left by an attempt that
    failed before the cache was read (keying it, say) is history."""
    if store.exists(failed := f"{url}/{FAILED}"):
        store.remove(failed)


def start_child_run(tracker: Tracker, name: str, out: StageOutput) -> str:
    label = out.label or out.url.rstrip("/").rsplit("/", 1)[-1]
    return tracker.start(f"{name}/{label}", parent_id=out.tracking.parent_run_id)


CACHED_TAG = "cached"  # "true": the stage was served from its manifest, not run
STAGE_KEY_TAG = "flywheel.stage_key"  # the key the stage's manifest was published under


def log_child_run(tracker: Tracker, run_id: str, manifest: Manifest) -> None:
    """A finished stage's counts and metrics, where its output is, whether it was served from
    its manifest (`cached`) and under which key; then the run ends. A served stage keeps a
    child run of its own, so every flow run shows all its stages; one whose run already
    finished in this flow run (a retried flow run) is left as that run recorded it."""
    served = manifest.served_from_store
    if served and tracker.client.get_run(run_id).info.status == "FINISHED":
        return
    numbers = {**manifest.counts, **manifest.metrics}
    tracker.log_metrics(run_id, {k: float(v) for k, v in numbers.items()})
    # Tags, not params: a run reused for the same stage and label may be told again.
    tags = {
        "flywheel.output_url": manifest.url,
        CACHED_TAG: "true" if served else "false",
        STAGE_KEY_TAG: manifest.inputs_digest,
    }
    if served:
        tags["flywheel.published_at"] = manifest.published_at  # when it was computed
    for key, value in tags.items():
        tracker.client.set_tag(run_id, key, value)
    tracker.finish(run_id)


def record_failed_stage(task, task_run, state) -> None:
    """Prefect on_failure hook: write `_FAILED.json` into the stage's folder (the error, the
    input URLs, what the stage had written, the MLflow run), tag the stage's MLflow run with the
    error, and show it all as a Prefect artifact, so a person can open a failed stage's inputs,
    partial outputs and log from the UI."""
    from prefect.artifacts import create_markdown_artifact

    context = TaskRunContext.get()
    params = context.parameters if context else {}
    store_url, out_url, tracking = params.get("store_url"), params.get("out_url"), None
    child_run = None
    if isinstance(out := params.get("out"), StageOutput):  # a `stage`: (inputs, out)
        store_url, out_url, tracking = out.store_url, out.url, out.tracking
        child_run = child_run_name(task.name, out)
        params = fields_of(params)
    else:
        tracking = params.get("tracking")
    if not (store_url and out_url):
        return
    store = ArtifactStore(store_url)
    tracker = tracking.tracker() if tracking else None
    failed_run = (
        tracker.find_run(child_run, tracking.parent_run_id) if tracker and child_run else None
    )
    record = FailedStage(
        stage=task.name,
        task_run=task_run.name,
        flow_run_id=str(task_run.flow_run_id) if task_run.flow_run_id else None,
        failed_at=datetime.now(UTC).isoformat(timespec="seconds"),
        message=failure_message(state),
        inputs=url_inputs(params),
        partial_outputs=[u for u in store.list_files(out_url) if not u.endswith(FAILED)],
        # The failed stage's own run (its trainer's curves, its error); the flow run's otherwise.
        mlflow_run=tracker.run_url(failed_run or tracking.parent_run_id) if tracker else None,
    )
    store.write_text(f"{out_url}/{FAILED}", record.model_dump_json(indent=2))
    if failed_run:  # the failed stage's own run carries the error too, not only the flow's run
        tracker.tag_error(failed_run, record.message)
    create_markdown_artifact(
        failure_markdown(record, out_url),
        key=failure_artifact_key(store, out_url, task.name),
        description=plain_markdown(f"{task.name} failed: {headline(record.message)}"),
    )


def stage_run_name() -> str:
    """A stage's task run name in Prefect's UI: the stage and its label (`dpo/round-1`), the
    MLflow child run's name, rather than a random suffix."""
    from prefect.runtime import task_run

    out = task_run.parameters.get("out")
    if isinstance(out, StageOutput):
        return child_run_name(task_run.task_name, out)
    return task_run.task_name or "stage"


def child_run_name(name: str, out: StageOutput) -> str:
    """`<stage>/<label>`: the stage's MLflow child run (see `start_child_run`)."""
    return f"{name}/{out.label or out.url.rstrip('/').rsplit('/', 1)[-1]}"


def failure_artifact_key(store: ArtifactStore, out_url: str, stage_name: str) -> str:
    return artifact_key(f"{store.top_folder(out_url)}-failed-{stage_name}")


def mark_failure_superseded(task, task_run, state) -> None:
    """Prefect on_completion hook: a stage that ran (not "Cached") after a failure of the same
    stage folder publishes a new version of the failure's artifact saying the failure is
    history, so the UI's latest version does not show a failure that a re-run fixed."""
    from prefect.artifacts import Artifact, create_markdown_artifact

    context = TaskRunContext.get()
    out = (context.parameters if context else {}).get("out")
    if state.name == "Cached" or not isinstance(out, StageOutput):
        return
    key = failure_artifact_key(ArtifactStore(out.store_url), out.url, task.name)
    latest = Artifact.get(key)
    record = f"`{out.url}/{FAILED}`"
    if latest is None or record not in str(latest.data) or is_superseded(str(latest.data)):
        return
    now = datetime.now(UTC).isoformat(timespec="seconds")
    create_markdown_artifact(
        f"# Superseded: stage `{task.name}` re-run succeeded at {now}\n\n"
        f"Task run `{task_run.name}` published `{out.url}`; the failure recorded before (the "
        "previous version of this artifact) is history, and its record was removed.",
        key=key,
        description=plain_markdown(f"superseded: {task.name} re-run succeeded at {now}"),
    )


def is_superseded(markdown: str) -> bool:
    return markdown.startswith("# Superseded")


def failure_message(state) -> str:
    """`RuntimeError: ...` from the failed state's exception (Prefect's own message otherwise)."""
    try:
        error = state.result(raise_on_failure=False)
    except Exception:
        error = None
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return state.message or "failed"


def headline(message: str, limit: int = 200) -> str:
    """A message's first line, as every short view shows it (lists, descriptions, chips): the
    cause without the exception names in front (`short_cause`)."""
    first = short_cause(message)
    return first if len(first) <= limit else first[: limit - 1] + "…"


def fenced(text: str) -> list[str]:
    """`text` in a Markdown code block whose fence no backtick run inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence]


def fields_of(params: dict) -> dict:
    """A `stage`'s parameters as the fields of its inputs object (where its URLs are)."""
    found = {}
    for name, value in params.items():
        if isinstance(value, StageOutput):
            continue
        found.update(dict(value) if isinstance(value, BaseModel) else {name: value})
    return found


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
    """The failure artifact: the cause as plain text first (the UI's preview shows the top), the
    whole message in a code block, then the inputs, partial outputs (the log among them) and
    links."""
    lines = [
        f"# Stage `{record.stage}` failed",
        "",
        plain_markdown(headline(record.message)),
        "",
        f"Task run `{record.task_run}` at {record.failed_at}:",
        "",
        *fenced(record.message.strip()),
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
