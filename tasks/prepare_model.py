"""Stage: the starting model as a Hugging Face folder in the store (converted once, then cached).

A built-in (`smollm2-135m`, `tiny`) is built under `<store>/models/`; a local folder or a Hub id
(`org/name`, resolved into the Hub cache by `flywheel.model.resolve_model`) is used where it
lies. The stage's key holds the Hub commit and the weights' digest, so a branch that moves or a
folder whose weights change re-runs everything downstream, and a copy of the same weights does not.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel

from flywheel.model import (
    convert_base_model,
    make_tiny_model,
    resolve_model,
    weights_digest,
)
from flywheel.settings import BUILTIN_MODELS, ModelSettings
from flywheel.stage import StageResult, StageRun, stage
from flywheel.storage import ArtifactStore


def model_stage_url(store: ArtifactStore, base: str) -> str:
    """Where the stage publishes `base`: `<store>/models/<name>` (a Hub id `org/name` as
    `org--name`, as the Hub cache names it)."""
    if base in BUILTIN_MODELS:
        return store.url("models", base)
    if Path(base).is_absolute():
        return store.url("models", Path(base).name)
    return store.url("models", base.replace("/", "--"))


class PrepareModelInputs(BaseModel):
    base: str  # `smollm2-135m`, `tiny`, a model folder, or a Hub id
    revision: str | None = None  # the Hub commit `base` resolved to (None: a folder or built-in)
    weights_digest: str | None = None  # `flywheel.model.weights_digest` (None: a built-in)


def prepare_model_inputs(model: ModelSettings) -> PrepareModelInputs:
    """The stage's inputs for `model`: a Hub id or folder resolved now (a Hub id may download;
    `agents.chat_template.check_model` in preflight did it first), so its commit and digest key the stage."""
    if model.base in BUILTIN_MODELS:
        return PrepareModelInputs(base=model.base)
    resolved = resolve_model(model.base, model.revision)
    return PrepareModelInputs(
        base=model.base, revision=resolved.revision, weights_digest=resolved.weights_digest
    )


@stage("prepare-model")
def prepare_model_stage(inputs: PrepareModelInputs, run: StageRun) -> StageResult:
    """`smollm2-135m` and `tiny` are built under `<store>/models/`; a folder or a Hub snapshot
    is used as it is. The commit and digest go into the stage's MLflow run as params."""
    store, base = run.store, inputs.base
    if base not in BUILTIN_MODELS:
        resolved = resolve_model(base, inputs.revision)  # the commit itself: no network needed
        if resolved.weights_digest != inputs.weights_digest:
            raise RuntimeError(
                f"{base}'s weights changed since the run resolved them "
                f"({inputs.weights_digest} -> {resolved.weights_digest}); run again"
            )
        _log_identity(run, base, inputs.revision, inputs.weights_digest)
        return StageResult(files={"model": "file://" + str(resolved.path)})
    # Converted once per machine (cache), then copied into this store.
    source = convert_base_model(store.cache_dir / "models" / "smollm2-135m")
    if base == "tiny":
        source = make_tiny_model(store.cache_dir / "models" / "tiny", source)
    _log_identity(run, base, None, weights_digest(source))
    model_url = run.file("model")
    if store.is_local:
        shutil.copytree(source, store.write_dir(model_url), dirs_exist_ok=True)
    else:
        store.upload_dir(source, model_url)
    return StageResult(files={"model": model_url})


def _log_identity(run: StageRun, base: str, revision: str | None, digest: str | None) -> None:
    if run.tracker is not None and run.run_id:
        params = {
            "model.base": base,
            "model.revision": revision or "",
            "model.weights_sha256": digest,
        }
        run.tracker.log_params(run.run_id, params)
