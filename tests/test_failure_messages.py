"""A failed stage reads at a glance: every short view (the first line of the message, the
artifact's description, the MLflow tag) leads with the cause and what to change, shows as plain
text, and points at the store's copy of the log; a re-run that succeeds supersedes the failure."""

from __future__ import annotations

import textwrap

import pytest
from markdown_it import MarkdownIt
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from flywheel.records import FailedStage
from flywheel.stage import (
    StageOutput,
    StageResult,
    StageRun,
    TrackingRef,
    failure_markdown,
    fenced,
    plain_markdown,
    stage,
)
from flywheel.storage import ArtifactStore
from flywheel.tracking import Tracker, short_cause
from ops.runner import failed_stage_line
from training.launch import (
    CAUSE_CHARS,
    TrainingFailed,
    exception_line,
    launch,
    trainer_failure,
)

DPO_LOG = """\
{'loss': 0.1}
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/work/main/training/dpo.py", line 80, in train
    raise ValueError(f"no pair fits in max_length={job.max_length} ({job.data_file}: {counts})")
ValueError: no pair fits in max_length=64 (/work/main/.cache/flywheel/downloads/ab12/pairs.jsonl: RowCounts(rows=0))
"""  # noqa: E501


def test_a_trainers_failure_leads_with_its_cause_and_the_setting_to_change():
    message = trainer_failure("training.dpo", 1, DPO_LOG, "s3://b/runs/eto/round-1/dpo/train.log")
    first, second, third, *tail = message.splitlines()
    # The fix before the details in parentheses: a view that cuts the line still shows it.
    assert first == (
        "ValueError: no pair fits in max_length=64 → raise dpo.max_length "
        "(pairs.jsonl: RowCounts(rows=0))"
    )
    assert second == (
        "training.dpo exited with code 1; its whole log: s3://b/runs/eto/round-1/dpo/train.log"
    )
    assert third == "last lines of the log:"
    assert tail == DPO_LOG.splitlines()  # the log's last lines, paths and all


@pytest.mark.parametrize(
    "message, cause",
    [
        ("TrainingFailed: ValueError: no pair fits\nmore", "no pair fits"),
        ("RuntimeError: a: b", "a: b"),
        ("KeyboardInterrupt: stopped", "KeyboardInterrupt: stopped"),  # not an error's name
        ("ValueError: ", "ValueError:"),  # nothing after the name: the name is all there is
        ("", ""),
    ],
)
def test_short_views_show_the_cause_without_the_exception_names(message, cause):
    assert short_cause(message) == cause


def test_the_fix_survives_a_long_cause_and_precedes_its_details():
    log = "ValueError: " + "x" * 300 + " max_length=64 (" + "y" * 300 + ")\n"
    first = trainer_failure("training.dpo", 1, log, "train.log").splitlines()[0]
    assert first.startswith("ValueError: xxx") and "… → raise dpo.max_length" in first
    assert len(first) < CAUSE_CHARS + 40


def test_the_workers_error_is_the_cause_not_the_launchers():
    log = textwrap.dedent("""\
        [rank0]: Traceback (most recent call last):
        [rank0]:   File "x.py", line 1, in <module>
        [rank0]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB
        Traceback (most recent call last):
          File "torch/distributed/run.py", line 9, in main
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        training.sft FAILED
    """)
    lines = [line.split("]: ", 1)[-1] for line in log.splitlines()]
    assert exception_line(lines) == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    first = trainer_failure("training.rl", 1, log, "train.log").splitlines()[0]
    assert first == (
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB "
        "→ lower rl.batch_size or .max_length"
    )


def test_an_op_without_a_deterministic_kernel_names_the_setting_that_asked_for_one():
    # torch's wording (2.x, `use_deterministic_algorithms(True)`); a CPU has no such op to raise it
    log = (
        "Traceback (most recent call last):\n"
        "RuntimeError: index_add_cuda_ does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
        "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
        "application.\n"
    )
    first = trainer_failure("training.dpo", 1, log, "train.log").splitlines()[0]
    assert first.startswith("RuntimeError: index_add_cuda_ does not have a deterministic")
    assert "→ set dpo.deterministic=false" in first


def test_a_log_without_a_traceback_gives_its_last_line_and_an_empty_one_the_exit_code():
    assert trainer_failure("training.sft", -9, "step 1\nKilled\n\n", "l").startswith("Killed\n")
    assert trainer_failure("training.sft", 3, "", "l").startswith(
        "training.sft exited with code 3\ntraining.sft exited with code 3; its whole log: l"
    )


def test_launch_raises_the_cause_first_naming_where_the_log_is_kept(tmp_path):
    package = tmp_path / "code"
    package.mkdir()
    (package / "failing_trainer.py").write_text(
        "raise ValueError('/tmp/x/pairs.jsonl: no pair fits in max_length=64 (rows=0)')\n"
    )
    job = tmp_path / "job.json"
    job.write_text("{}")
    with pytest.raises(TrainingFailed) as failed:
        launch(
            "failing_trainer", job, tmp_path / "train.log",
            extra_env={"PYTHONPATH": str(package)}, log_name="file:///store/dpo/train.log",
        )  # fmt: skip
    first, second = str(failed.value).splitlines()[:2]
    assert first == "ValueError: pairs.jsonl: no pair fits in max_length=64 (rows=0)"
    assert (
        second == "failing_trainer exited with code 1; its whole log: file:///store/dpo/train.log"
    )
    assert "Traceback" in (tmp_path / "train.log").read_text()


def rendered_text(markdown: str) -> str:
    """What a Markdown renderer shows of `markdown`, tags stripped, entities decoded."""
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", MarkdownIt().render(markdown))).strip()


@pytest.mark.parametrize(
    "text",
    [
        'File "<frozen runpy>", line 198, in _run_module_as_main',
        "dpo failed: TrainingFailed: ValueError: __init__ got *args [x](y) # not a title",
        "a back`tick and a \\ backslash | pipe ~ tilde! <b>bold</b>",
    ],
)
def test_plain_markdown_renders_as_the_text_itself(text):
    assert rendered_text(plain_markdown(text)) == text


def test_unescaped_a_traceback_line_loses_its_frozen_module():
    assert rendered_text('File "<frozen runpy>", line 198') == 'File "", line 198'


def test_a_fence_no_backtick_run_in_the_text_can_close():
    text = "before\n```\nafter"
    block = "\n".join(fenced(text))
    assert block.startswith("````\n") and MarkdownIt().parse(block)[0].content == text + "\n"


def test_the_failure_artifact_leads_with_the_cause_in_plain_text():
    message = 'TrainingFailed: File "<frozen runpy>" → raise dpo.max_length\nmore\n```\nlines'
    record = FailedStage(
        stage="dpo", task_run="dpo/round-1", failed_at="2026-01-01T00:00:00", message=message,
        partial_outputs=["file:///s/run/round-1/dpo/train.log"],
    )  # fmt: skip
    markdown = failure_markdown(record, "file:///s/run/round-1/dpo")
    lines = markdown.splitlines()
    assert lines[0] == "# Stage `dpo` failed"
    assert rendered_text(lines[2]) == 'File "<frozen runpy>" → raise dpo.max_length'
    assert "````\n" + message + "\n````" in markdown  # the whole message, fenced safely
    line = failed_stage_line(record, "file:///s/run/round-1/dpo/_FAILED.json")
    assert rendered_text(line) == (
        'dpo: File "<frozen runpy>" → raise dpo.max_length (record '
        "file:///s/run/round-1/dpo/_FAILED.json, log file:///s/run/round-1/dpo/train.log)"
    )


class WorkInputs(BaseModel):
    fail: bool


@stage("work")
def work_stage(inputs: WorkInputs, run: StageRun) -> StageResult:
    run.store.write_text(run.file("train.log"), "log")
    if inputs.fail:
        raise RuntimeError(
            'no pair fits in File "<frozen runpy>" → raise dpo.max_length\nthe log: train.log'
        )
    return StageResult(files={"log": run.file("train.log")})


def artifact_versions(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return sorted(found, key=lambda a: a.created)


def test_a_failed_stage_is_named_tagged_described_and_superseded_by_its_rerun(tmp_path):
    import uuid

    from conftest import task_states
    from prefect import flow

    store = ArtifactStore(str(tmp_path / "store"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "failures")
    tracking = TrackingRef(
        tracking_uri=uri, experiment="failures", parent_run_id=tracker.start("p")
    )
    run_name = f"fail-{uuid.uuid4().hex[:8]}"  # the artifact key's folder: new for this test
    out = StageOutput(
        store_url=store.root, url=store.url(run_name, "round-1/work"), label="round-1",
        tracking=tracking,
    )  # fmt: skip

    @flow
    def one_stage(fail: bool):
        return work_stage(WorkInputs(fail=fail), out, return_state=True)

    failed = one_stage(True, return_state=True)
    assert failed.is_failed()
    assert task_states(failed) == {"work": ["Failed"]}  # the task run is named work/round-1
    record = FailedStage.model_validate_json(store.read_text(f"{out.url}/_FAILED.json"))
    assert record.task_run == "work/round-1"
    cause = 'no pair fits in File "<frozen runpy>" → raise dpo.max_length'  # no "RuntimeError: "
    [artifact] = artifact_versions(f"{run_name}-failed-work")
    assert rendered_text(artifact.description) == f"work failed: {cause}"
    assert rendered_text(artifact.data.splitlines()[2]) == cause
    client = MlflowClient(uri)
    [child] = client.search_runs(
        [tracker.experiment_id], f"tags.mlflow.parentRunId = '{tracking.parent_run_id}'"
    )
    assert child.data.tags["mlflow.runName"] == "work/round-1"
    assert child.data.tags["flywheel.error"].splitlines()[0] == cause
    # The run page's description: the cause, then the message's next line, as plain text.
    cause_paragraph, next_paragraph = child.data.tags["mlflow.note.content"].split("\n\n")
    assert rendered_text(cause_paragraph) == cause
    assert rendered_text(next_paragraph) == "the log: train.log"

    assert one_stage(False, return_state=True).is_completed()
    failure, superseded = artifact_versions(f"{run_name}-failed-work")
    assert failure.id == artifact.id
    assert superseded.data.startswith("# Superseded: stage `work` re-run succeeded at ")
    assert superseded.description.startswith("superseded: work re-run succeeded at ")
    one_stage(False)  # served from the store ("Cached"): nothing more to supersede
    assert len(artifact_versions(f"{run_name}-failed-work")) == 2


def test_a_recipe_flow_run_is_named_after_its_run():
    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.eto import ETOConfig
    from ops.runner import run_named

    @flow(flow_run_name=run_named(ETOConfig))
    def recipe(config: dict | None = None, config_file: str | None = None, overrides=None):
        return "ran"

    named = recipe(config={"run_name": "eto-mine"}, return_state=True)
    default = recipe(overrides=["rounds=1"], return_state=True)
    broken = recipe(overrides=["roundz=1"], return_state=True)  # the flow says what is wrong
    with get_client(sync_client=True) as client:
        names = [
            client.read_flow_run(state.state_details.flow_run_id).name
            for state in (named, default, broken)
        ]
    assert names == ["eto-mine", "eto-textcraft", "eto-textcraft"]


def failing_round(cfg, store, tracking):
    """A recipe body whose one stage fails (`work/round-1`)."""
    out = StageOutput(
        store_url=store.root, url=store.url(cfg.run_name, "round-1/work"), label="round-1",
        tracking=tracking,
    )  # fmt: skip
    work_stage(WorkInputs(fail=True), out)


def failing_before_any_stage(cfg, store, tracking):
    raise ValueError("the policy file is empty\nmore lines")


def test_a_failed_runs_state_message_leads_with_the_stage_and_its_cause(tmp_path):
    import uuid

    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.eto import ETOConfig
    from ops.runner import run_tracked

    config = {
        "run_name": f"fail-{uuid.uuid4().hex[:8]}", "storage_url": str(tmp_path / "store"),
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "env": {"train_tasks": 2, "test_tasks": 1},
    }  # fmt: skip

    @flow
    def recipe(config: dict, body_name: str):
        body = {"stage": failing_round, "before": failing_before_any_stage}[body_name]
        cfg = ETOConfig.model_validate(config)  # the store given: no preflight (slow)
        return run_tracked(cfg, body, store=ArtifactStore(cfg.storage_url))

    cause = 'no pair fits in File "<frozen runpy>" → raise dpo.max_length'
    for body_name, message, error in (
        ("stage", f"work/round-1: {cause}", RuntimeError),
        ("before", "the policy file is empty", ValueError),
    ):
        state = recipe(config, body_name, return_state=True)
        assert state.is_failed()
        with get_client(sync_client=True) as client:  # as the UI's run list shows it
            stored = client.read_flow_run(state.state_details.flow_run_id).state
        assert (state.message, stored.message, stored.type.value) == (message, message, "FAILED")
        with pytest.raises(error):  # the error itself is kept
            state.result()
        # The run's page: its first artifact and its own logs lead with the same message.
        run_id = state.state_details.flow_run_id
        first = first_artifact(run_id)
        assert rendered_text(first.data.splitlines()[0]) == f"Failed: {message}"
        assert rendered_text(first.description) == message
        assert f"Failed: {message}" in error_logs(run_id)


def first_artifact(flow_run_id):
    """The flow run's own first artifact, as its Artifacts tab lists them (the record of a
    persisted result, with no type, is not shown there)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return min((a for a in found if a.type), key=lambda artifact: artifact.created)


def error_logs(flow_run_id) -> list[str]:
    """The first lines of the flow run's own ERROR logs (not its subflows')."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterLevel
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)  # logs reach the API in batches: send the queued ones
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]),
                      level=LogFilterLevel(ge_=40))
        )  # fmt: skip
    return [log.message.splitlines()[0] for log in logs]
