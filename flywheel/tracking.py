"""MLflow tracking: one parent run per flow run, a child run per round and per stage.

Runs are addressed by id through `MlflowClient` (no global "active run"), so stages running in
threads never log into each other's runs. A trainer subprocess attaches to its stage's run
through `MLFLOW_RUN_ID` / `MLFLOW_TRACKING_URI`, which transformers' MLflow callback honours.

A flow run's parent run holds its resolved config whole (`config.yaml`) and every setting as a
param of its own (`dpo.beta`), never cut (`log_config`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from mlflow.entities import Param
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH
from pydantic import BaseModel

ERROR_TAG = "flywheel.error"
ERROR_TAG_CHARS = 5000  # MLflow keeps tag values up to 8000 characters
NOTE_TAG = "mlflow.note.content"  # a run's description
CONFIG_ARTIFACT = "config.yaml"  # the parent run's resolved config, as `--print-config` prints it
# The exception names a failure's first line starts with (`TrainingFailed: ValueError: `).
EXCEPTION_NAMES = re.compile(r"^(?:[A-Z]\w*(?:Error|Exception|Failed|Failure): )+")


def short_cause(message: str) -> str:
    """A failure message's first line without the exception names in front. The UIs' short
    views show 30 to 45 characters of it (MLflow's tag chip, Prefect's artifact cards): with
    `TrainingFailed: ValueError: ` in front they showed no cause at all."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return EXCEPTION_NAMES.sub("", first) or first


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str):
        self.tracking_uri = tracking_uri
        with store_setup_lock(tracking_uri):  # creating the store and experiment: one at a time
            self.client = MlflowClient(tracking_uri=tracking_uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = (
                found.experiment_id
                if found
                else self.client.create_experiment(
                    experiment, artifact_location=_artifact_root(tracking_uri)
                )
            )

    def start(self, name: str, parent_id: str | None = None, tags: dict | None = None) -> str:
        """Find the unfinished-or-finished run with this name under `parent_id`, or create it."""
        if existing := self.find_run(name, parent_id):
            return existing
        all_tags = {"mlflow.runName": name, **(tags or {})}
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        return self.client.create_run(self.experiment_id, tags=all_tags).info.run_id

    def find_run(self, name: str, parent_id: str | None = None) -> str | None:
        """The id of the run named `name` (under `parent_id`), or None."""
        filters = [f"tags.mlflow.runName = '{name}'"]
        if parent_id:
            filters.append(f"tags.mlflow.parentRunId = '{parent_id}'")
        found = self.client.search_runs([self.experiment_id], " and ".join(filters), max_results=1)
        return found[0].info.run_id if found else None

    def tag_error(self, run_id: str, message: str) -> None:
        """Why the run failed, as the tag MLflow shows as a chip (`flywheel.error`): the message
        leads with its cause (see `training.launch.trainer_failure`), without the exception
        names (the chip shows ~35 characters); the whole message is the tag's value. The cause
        and where the log is also become the run's description, which its page shows first."""
        rest = message.strip().splitlines()[1:]
        self.client.set_tag(
            run_id, ERROR_TAG, "\n".join([short_cause(message), *rest])[:ERROR_TAG_CHARS]
        )
        # The run page's description: the cause and where the log is, as text that wraps (a code
        # block of the whole message widened the page past the screen).
        lines = [short_cause(message), *rest[:1]]
        self.client.set_tag(run_id, NOTE_TAG, "\n\n".join(plain_markdown(line) for line in lines))

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        for key, value in metrics.items():
            self.client.log_metric(run_id, key, float(value), step=step)

    def log_params(self, run_id: str, params: dict) -> None:
        """Each param as it is, in batches of the most MLflow takes in one call. A value longer
        than MLflow keeps is refused, naming it: MLflow would keep a cut, misleading value."""
        texts = {key: str(value) for key, value in params.items()}
        for key, text in texts.items():
            if len(text) > MAX_PARAM_VAL_LENGTH:
                raise ValueError(
                    f"param {key!r} has {len(text)} characters, over MLflow's limit of "
                    f"{MAX_PARAM_VAL_LENGTH}: log it as an artifact instead"
                )
        batch = [Param(key, text) for key, text in texts.items()]
        for start in range(0, len(batch), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=batch[start : start + MAX_PARAMS_TAGS_PER_BATCH])

    def log_config(self, run_id: str, config: BaseModel) -> None:
        """The resolved config as `config.yaml` (loads back to the same config) and each setting
        as a param named by its path (`setting_params`), so runs compare and filter on any
        setting in MLflow's UI."""
        self.log_files(run_id, {CONFIG_ARTIFACT: settings_yaml(config).encode()})
        self.log_params(run_id, setting_params(config))

    def log_artifact(self, run_id: str, path: Path, folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def log_files(self, run_id: str, files: dict[str, bytes]) -> None:
        """Each `name: content` as an artifact of the run (reports written in memory)."""
        with tempfile.TemporaryDirectory() as folder:
            for name, data in files.items():
                (Path(folder) / name).write_bytes(data)
                self.log_artifact(run_id, Path(folder) / name)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)

    def run_url(self, run_id: str) -> str:
        """Where a person opens the run (`mlflow server` / `mlflow ui` on its default port)."""
        base = os.environ.get("FLYWHEEL_MLFLOW_UI", "http://127.0.0.1:5000")
        return f"{base}/#/experiments/{self.experiment_id}/runs/{run_id}"

    def subprocess_env(self, run_id: str) -> dict[str, str]:
        """Environment for a trainer process that should log into `run_id`."""
        return {"MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_RUN_ID": run_id}


def settings_yaml(config: BaseModel) -> str:
    """`config` as YAML a recipe loads back (`flywheel <recipe> --config`)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def setting_params(config: BaseModel) -> dict[str, str]:
    """Every setting of `config` as `{path: value}`: sections flattened (`dpo.beta`,
    `env.max_steps`), any other value as JSON (lists, dicts, numbers; strings as they are). A
    value longer than MLflow keeps in a param says where it is instead (`CONFIG_ARTIFACT`)."""
    return {
        path: text if len(text) <= MAX_PARAM_VAL_LENGTH else too_long_note(text)
        for path, text in flat_settings(config, config.model_dump(mode="json"))
    }


def flat_settings(model: BaseModel, dumped: dict, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(path, text) of each setting of `model`, whose JSON dump is `dumped`; sections (settings
    models) open into their settings."""
    for name in type(model).model_fields:
        if name not in dumped:  # a field excluded from dumps is no setting of the file
            continue
        value, path = getattr(model, name), f"{prefix}{name}"
        if isinstance(value, BaseModel) and isinstance(dumped[name], dict):
            yield from flat_settings(value, dumped[name], f"{path}.")
        else:
            yield path, param_text(dumped[name])


def param_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def too_long_note(text: str) -> str:
    return (
        f"(in {CONFIG_ARTIFACT} only: {len(text)} characters, over MLflow's param limit of "
        f"{MAX_PARAM_VAL_LENGTH})"
    )


def _artifact_root(tracking_uri: str) -> str | None:
    """Keep a sqlite store's artifacts next to its database, not in the working directory."""
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///")).resolve()
        return (database.parent / "mlartifacts").as_uri()
    return None  # the server's or store's own default


@contextmanager
def store_setup_lock(tracking_uri: str):
    """An OS lock next to a sqlite store's database (`mlflow.db.lock`). Two processes opening a
    fresh store at once both run MLflow's migrations and leave the database unusable; taking turns
    here, the first creates it and the second finds it made. Other stores need no lock."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    database = Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file is closed
        yield


def end_status(error: BaseException) -> str:
    """How a run that ended by `error` is recorded: KILLED when the process was told to stop
    (SIGTERM, Ctrl-C), FAILED otherwise; never FINISHED."""
    from prefect.exceptions import TerminationSignal

    stopped = (KeyboardInterrupt, SystemExit, TerminationSignal)
    return "KILLED" if isinstance(error, stopped) else "FAILED"


def end_open_children(client: MlflowClient, parent_id: str, status: str) -> None:
    """Mark the parent's child runs that are still RUNNING (stages cut short) with `status`."""
    parent = client.get_run(parent_id)
    running = client.search_runs(
        [parent.info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'RUNNING'",
    )
    for child in running:
        client.set_terminated(child.info.run_id, status)


def kill_run(tracking_uri: str, run_id: str) -> None:
    """A run whose process was killed: it and its unfinished children become KILLED."""
    client = MlflowClient(tracking_uri=tracking_uri)
    end_open_children(client, run_id, "KILLED")
    if client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, "KILLED")


MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#|~!])")


def plain_markdown(text: str) -> str:
    """`text` as Markdown that renders as itself: `<frozen runpy>` stays visible (an HTML tag
    otherwise), `__init__` stays unbolded."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", text)
