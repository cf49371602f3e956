"""Stage: the starting model as a Hugging Face folder in the store (converted once, then cached)."""

from __future__ import annotations

import shutil
from pathlib import Path

from flywheel.model import convert_base_model, make_tiny_model
from flywheel.records import Manifest
from flywheel.settings import BUILTIN_MODELS
from flywheel.stage import stage_task, store_for
from flywheel.storage import ArtifactStore


def model_stage_url(store: ArtifactStore, base: str) -> str:
    """Where the stage publishes `base`: `<store>/models/<name>`."""
    return store.url("models", base if base in BUILTIN_MODELS else Path(base).name)


def prepare_model(store: ArtifactStore, base: str, out_url: str | None = None) -> Manifest:
    """`smollm2-135m` and `tiny` are built under `<store>/models/`; a folder is used as it is."""
    out_url = out_url or model_stage_url(store, base)
    if (done := store.manifest(out_url, {"base": base})) is not None:
        return done
    if base not in BUILTIN_MODELS:
        model_url = "file://" + base
    else:
        # Converted once per machine (cache), then copied into this store.
        source = convert_base_model(store.cache_dir / "models" / "smollm2-135m")
        if base == "tiny":
            source = make_tiny_model(store.cache_dir / "models" / "tiny", source)
        model_url = f"{out_url}/model"
        if store.is_local:
            shutil.copytree(source, store.write_dir(model_url), dirs_exist_ok=True)
        else:
            store.upload_dir(source, model_url)
    manifest = Manifest(stage="prepare-model", url=out_url, files={"model": model_url})
    return store.publish(manifest, {"base": base})


@stage_task("prepare-model")
def prepare_model_stage(store_url: str, base: str, out_url: str | None = None) -> Manifest:
    return prepare_model(store_for(store_url), base, out_url)
