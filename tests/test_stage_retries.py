"""Stages retry transient failures (an environment server or the store unreachable, a timeout)
with back-off, and never deterministic ones (a bad setting, a NaN loss): those would fail the
same way again after the same hours."""

from __future__ import annotations

import botocore.exceptions
import httpx
import pytest
from prefect import flow
from pydantic import BaseModel

from envs.agentgym.client import ServerUnavailable
from flywheel.stage import (
    RETRY_DELAYS_S,
    StageOutput,
    StageResult,
    StageRun,
    is_transient_failure,
    stage,
)
from flywheel.storage import ArtifactStore
from tasks.episodes import EpisodesLost


def raised_from(cause: BaseException, error: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise error from inner
    except BaseException as outer:
        return outer


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError("connection refused"),
        TimeoutError("timed out"),
        httpx.ConnectError("all connection attempts failed"),
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9000"),
        botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:9000"),
        ServerUnavailable("http://127.0.0.1:36001/step: connection refused"),
        EpisodesLost("3 of 3 episodes were lost"),
        raised_from(ConnectionResetError("reset"), RuntimeError("could not write the pairs")),
    ],
    ids=repr,
)
def test_failures_of_what_a_stage_talks_to_are_transient(error):
    assert is_transient_failure(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("dpo.beta must be positive"),
        RuntimeError("TrainingFailed: the loss became NaN at step 12"),
        FileNotFoundError("s3://flywheel/runs/eto/round-1/pairs.jsonl"),
        KeyError("unknown task"),
        raised_from(ValueError("bad"), RuntimeError("could not write the pairs")),
    ],
    ids=repr,
)
def test_failures_of_the_stage_itself_are_not(error):
    assert not is_transient_failure(error)


class FlakyInputs(BaseModel):
    failure: str  # "transient" or "deterministic"
    failing_attempts: int = 1


attempts: list[str] = []


@stage("flaky")
def flaky_stage(inputs: FlakyInputs, run: StageRun) -> StageResult:
    attempts.append(inputs.failure)
    if len(attempts) <= inputs.failing_attempts:
        if inputs.failure == "transient":
            raise ConnectionResetError("the store dropped the connection")
        raise ValueError("dpo.beta must be positive")
    return StageResult(files={"out": run.store.write_text(run.file("out.txt"), "done")})


def test_stages_wait_longer_before_each_retry():
    assert flaky_stage.retries == len(RETRY_DELAYS_S) >= 1
    assert flaky_stage.retry_delay_seconds == sorted(RETRY_DELAYS_S) and RETRY_DELAYS_S[0] >= 10


@pytest.fixture
def immediate_retries(monkeypatch):
    """The stage's retries as configured, without their minutes of waiting."""
    attempts.clear()
    monkeypatch.setattr(flaky_stage, "retry_delay_seconds", [0] * len(RETRY_DELAYS_S))


def run_in_flow(store: ArtifactStore, inputs: FlakyInputs):
    out = StageOutput(store_url=store.root, url=store.url("run/flaky"))

    @flow
    def one_stage():
        return flaky_stage(inputs, out, return_state=True)

    return one_stage(return_state=True), out


def test_a_transient_failure_is_retried_and_the_stage_completes(tmp_path, immediate_retries):
    store = ArtifactStore(str(tmp_path / "store"))
    state, out = run_in_flow(store, FlakyInputs(failure="transient"))
    assert state.is_completed()
    assert attempts == ["transient", "transient"]
    assert store.read_manifest(out.url) is not None and not store.exists(f"{out.url}/_FAILED.json")


def test_a_transient_failure_that_persists_fails_after_the_retries(tmp_path, immediate_retries):
    store = ArtifactStore(str(tmp_path / "store"))
    state, out = run_in_flow(store, FlakyInputs(failure="transient", failing_attempts=99))
    assert state.is_failed()
    assert len(attempts) == 1 + len(RETRY_DELAYS_S)
    assert store.exists(f"{out.url}/_FAILED.json")


def test_a_deterministic_failure_is_not_retried(tmp_path, immediate_retries):
    store = ArtifactStore(str(tmp_path / "store"))
    state, out = run_in_flow(store, FlakyInputs(failure="deterministic"))
    assert state.is_failed()
    assert attempts == ["deterministic"]
    assert "dpo.beta must be positive" in store.read_text(f"{out.url}/_FAILED.json")
