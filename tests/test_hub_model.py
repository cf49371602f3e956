"""model.base as a Hub id, offline: a Hub-style cache built from the tiny model's folder.

The cache is laid out as huggingface_hub lays it out: `models--org--name/blobs/<sha256>`,
`snapshots/<commit>/<file>` linking to the blob, `refs/main` holding the commit.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from agents.chat_template import check_model
from flywheel import model as model_module
from flywheel.config_files import ConfigError
from flywheel.model import ModelUnavailable, resolve_model, weights_digest
from flywheel.settings import DPOSettings, EnvSettings, ModelSettings, SFTSettings
from flywheel.stage import StageOutput
from tasks.prepare_model import (
    model_stage_url,
    prepare_model_inputs,
    prepare_model_stage,
)

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
# Jinja's raise_exception on the assistant role, as templates that refuse a role do.
RAISING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{{ raise_exception('Assistant role is not supported') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def add_snapshot(cache: Path, repo_id: str, commit: str, folder: Path, main: bool = True) -> Path:
    """`folder`'s files as snapshot `commit` of `repo_id` in the Hub cache `cache`."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        blob = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / blob)
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / blob, link.parent))
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(model_module, "_RESOLVED", {})
    return cache


@pytest.fixture
def raising_template_dir(tmp_path, tiny_model_dir) -> Path:
    from transformers import AutoTokenizer

    folder = tmp_path / "raising"
    shutil.copytree(tiny_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = RAISING_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def test_hub_id_resolves_offline_to_refs_main_snapshot(hub_cache, tiny_model_dir):
    snapshot = add_snapshot(hub_cache, "test-org/tiny-agent", COMMIT_A, tiny_model_dir)
    resolved = resolve_model("test-org/tiny-agent")
    assert resolved.path == snapshot
    assert resolved.revision == COMMIT_A
    # Read from the blobs' names, it equals the digest of the same files hashed in a folder.
    assert resolved.weights_digest == weights_digest(tiny_model_dir)


def test_revision_pins_a_commit_other_than_main(hub_cache, tiny_model_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    (other / "model.safetensors").write_bytes(b"different weights")
    add_snapshot(hub_cache, "test-org/tiny-agent", COMMIT_A, other, main=False)
    add_snapshot(hub_cache, "test-org/tiny-agent", COMMIT_B, tiny_model_dir)
    pinned = prepare_model_inputs(ModelSettings(base="test-org/tiny-agent", revision=COMMIT_A))
    latest = prepare_model_inputs(ModelSettings(base="test-org/tiny-agent"))
    assert (pinned.revision, latest.revision) == (COMMIT_A, COMMIT_B)
    assert pinned.weights_digest != latest.weights_digest  # so the stage keys differ


def test_id_not_in_cache_fails_naming_offline_and_the_cache(hub_cache):
    with pytest.raises(ModelUnavailable) as error:
        resolve_model("test-org/absent")
    message = str(error.value)
    assert "HF_HUB_OFFLINE" in message
    assert str(hub_cache / "models--test-org--absent") in message
    with pytest.raises(ConfigError, match="model.base: .*HF_HUB_OFFLINE"):
        check_model(ModelSettings(base="test-org/absent"), EnvSettings())


def test_settings_accept_a_hub_id_without_network_and_refuse_the_rest(tmp_path):
    assert ModelSettings(base="Qwen/Qwen2.5-1.5B-Instruct").base == "Qwen/Qwen2.5-1.5B-Instruct"
    for wrong in ("./no/such/folder", "a/b/c", str(tmp_path)):
        with pytest.raises(ValueError, match="neither a built-in"):
            ModelSettings(base=wrong)
    with pytest.raises(ValueError, match="no Hub id"):
        ModelSettings(base="tiny", revision=COMMIT_A)


def test_check_model_passes_a_chatml_model_from_the_cache(hub_cache, tiny_model_dir):
    add_snapshot(hub_cache, "test-org/tiny-agent", COMMIT_A, tiny_model_dir)
    check_model(ModelSettings(base="test-org/tiny-agent"), EnvSettings())


def test_template_that_raises_on_assistant_is_refused_with_its_reason(
    hub_cache, raising_template_dir
):
    add_snapshot(hub_cache, "test-org/no-assistant", COMMIT_A, raising_template_dir)
    with pytest.raises(ConfigError, match="Assistant role is not supported"):
        check_model(ModelSettings(base="test-org/no-assistant"), EnvSettings())


def test_stage_uses_the_snapshot_and_keys_on_commit_and_digest(hub_cache, tiny_model_dir, tmp_path):
    from flywheel.storage import ArtifactStore

    snapshot = add_snapshot(hub_cache, "test-org/tiny-agent", COMMIT_A, tiny_model_dir)
    store = ArtifactStore(str(tmp_path / "store"))
    url = model_stage_url(store, "test-org/tiny-agent")
    assert url.endswith("models/test-org--tiny-agent")
    inputs = prepare_model_inputs(ModelSettings(base="test-org/tiny-agent"))
    manifest = prepare_model_stage.fn(inputs, StageOutput(store_url=store.root, url=url))
    assert manifest.files["model"] == f"file://{snapshot}"
    again = prepare_model_stage.fn(inputs, StageOutput(store_url=store.root, url=url))
    assert again.served_from_store
    moved = inputs.model_copy(update={"weights_digest": "0" * 64})
    with pytest.raises(RuntimeError, match="weights changed"):
        prepare_model_stage.fn(moved, StageOutput(store_url=store.root, url=url))


def eto_on(base: str):
    from flows.eto import ETOConfig
    from flywheel.config_files import load_config

    demo = Path(__file__).resolve().parents[1] / "configs" / "eto_textcraft.yaml"
    return load_config(ETOConfig, str(demo), [f"model.base={base}"])


def test_offline_id_not_in_cache_is_refused_in_preflight_at_once(hub_cache):
    from ops.model_checks import check_model_shape

    started = time.monotonic()
    with pytest.raises(ConfigError, match="model.base: .*HF_HUB_OFFLINE is set"):
        check_model_shape(eto_on("test-org/absent"))
    assert time.monotonic() - started < 2  # was 20 s: after trl's import and the task lists


def test_an_unreachable_hub_is_refused_within_the_probe_timeout(hub_cache, monkeypatch):
    from huggingface_hub import constants

    from ops.model_checks import check_model_shape

    monkeypatch.delenv("HF_HUB_OFFLINE")
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(ConfigError, match="the Hub did not answer .*within 2 s"):
            check_model_shape(eto_on("test-org/absent"))
    assert time.monotonic() - started < model_module.HUB_PROBE_TIMEOUT_S + 2


def test_a_cached_id_is_checked_from_the_cache_without_the_hub(
    hub_cache, tiny_model_dir, monkeypatch
):
    """Online, with the Hub down: the cached snapshot's config.json is read, its 2 layers
    refuse the demo's 20 frozen ones, and the Hub is never asked."""
    from ops.model_checks import check_model_shape

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(model_module, "hub_unreachable", lambda: pytest.fail("asked the Hub"))
    add_snapshot(hub_cache, "test-org/tiny-agent", COMMIT_A, tiny_model_dir)
    with pytest.raises(ConfigError, match="model.base='test-org/tiny-agent' has 2 layers"):
        check_model_shape(eto_on("test-org/tiny-agent"))
    assert check_model_shape(eto_on("test-org/tiny-agent").model_copy(
        update={"sft": SFTSettings(), "dpo": DPOSettings()}))  # fmt: skip


def test_an_id_not_downloaded_yet_is_checked_after_preflight_downloads_it(hub_cache, monkeypatch):
    from ops.model_checks import check_model_shape

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(model_module, "hub_unreachable", lambda: None)  # the Hub answers
    assert check_model_shape(eto_on("test-org/not-yet")) is False
