"""Stage: the starting model as a Hugging Face folder in the store (converted once, then cached)."""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel

from flywheel.model import convert_base_model, make_tiny_model
from flywheel.settings import BUILTIN_MODELS
from flywheel.stage import StageResult, StageRun, stage
from flywheel.storage import ArtifactStore


def model_stage_url(store: ArtifactStore, base: str) -> str:
    """Where the stage publishes `base`: `<store>/models/<name>`."""
    return store.url("models", base if base in BUILTIN_MODELS else Path(base).name)


class PrepareModelInputs(BaseModel):
    base: str  # `smollm2-135m`, `tiny`, or a model folder


@stage("prepare-model")
def prepare_model_stage(inputs: PrepareModelInputs, run: StageRun) -> StageResult:
    """`smollm2-135m` and `tiny` are built under `<store>/models/`; a folder is used as it is."""
    store, base = run.store, inputs.base
    if base not in BUILTIN_MODELS:
        return StageResult(files={"model": "file://" + base})
    # Converted once per machine (cache), then copied into this store.
    source = convert_base_model(store.cache_dir / "models" / "smollm2-135m")
    if base == "tiny":
        source = make_tiny_model(store.cache_dir / "models" / "tiny", source)
    model_url = run.file("model")
    if store.is_local:
        shutil.copytree(source, store.write_dir(model_url), dirs_exist_ok=True)
    else:
        store.upload_dir(source, model_url)
    return StageResult(files={"model": model_url})
