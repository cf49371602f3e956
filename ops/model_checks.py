"""Preflight's checks of the config against its model, from the model's config.json alone (no
weights, no trainer): a Hub id that cannot be had is refused in seconds, frozen layers beyond the
model's depth are refused naming the setting, and a 135M CPU demo's settings on a large model
draw a warning naming the GPU config to start from (docs/your-model.md)."""

from __future__ import annotations

import sys
from pathlib import Path

from flywheel.config_files import ConfigError
from flywheel.model import ModelShape, ModelUnavailable, check_hub_model_available, model_shape
from flywheel.settings import BUILTIN_MODELS, TrainerSettings

# A model this large is a GPU model (Qwen2.5-1.5B: 1.54B parameters estimated, 28 layers).
LARGE_MODEL_PARAMETERS = 1_000_000_000
# Full fine-tuning at this rate or above is the 135M demos' (4.5e-4); ETO's paper trains
# Llama-2-7B at 2e-5, GRPO-style RL runs at ~1e-6.
CPU_DEMO_LEARNING_RATE = 1e-4
# Fewer reply tokens than this is the demos' cap for a 135M model's ~30-token actions; a real
# model thinks before it acts (256-512 in configs/gpu/).
CPU_DEMO_MAX_TOKENS = 128
GPU_CONFIG_DIR = "configs/gpu"


def check_model_shape(cfg) -> bool:
    """Refuse a Hub id that is neither in the Hub cache nor downloadable (within seconds), and
    frozen layers the model does not have; warn when a CPU demo's settings meet a large model.
    False when the model's config.json is not on this machine yet (a Hub id that preflight
    downloads later): call again after `check_model` has."""
    base, revision = cfg.model.base, cfg.model.revision
    if is_hub_id(base):
        try:
            check_hub_model_available(base, revision)
        except ModelUnavailable as error:
            raise ConfigError(f"model.base: {error}") from None
    shape = model_shape(base, revision)
    if shape is None:
        return False
    check_frozen_layers(cfg, shape)
    if warning := cpu_demo_warning(cfg, shape):
        print(f"warning: {warning}", file=sys.stderr)
    return True


def is_hub_id(base: str) -> bool:
    """Neither a built-in nor a model folder: ModelSettings let it through as a Hub id."""
    return base not in BUILTIN_MODELS and not (Path(base) / "config.json").is_file()


def trainer_sections(cfg) -> dict[str, TrainerSettings]:
    """Every trainer section of a recipe config by its key: sft, dpo, rl, revision_sft, ..."""
    sections = {name: getattr(cfg, name) for name in type(cfg).model_fields}
    return {name: s for name, s in sections.items() if isinstance(s, TrainerSettings)}


def check_frozen_layers(cfg, shape: ModelShape) -> None:
    """A trainer's `frozen_layers` count above the model's depth: refused now, not when the
    trainer has loaded the model minutes into the run."""
    for name, trainer in trainer_sections(cfg).items():
        try:
            trainer.frozen_layer_count(shape.layers)
        except ValueError:
            raise ConfigError(
                f"{name}.frozen_layers={trainer.frozen_layers} but model.base="
                f"{cfg.model.base!r} has {shape.layers} layers: lower {name}.frozen_layers to at "
                f"most {shape.layers} (0 trains every layer), or give a share of the layers "
                f"({name}.frozen_layers=0.67)"
            ) from None


def cpu_demo_settings(cfg) -> list[str]:
    """The config's settings that size it for a 135M model on a CPU, as `key=value`."""
    found = []
    for name, trainer in trainer_sections(cfg).items():
        if trainer.frozen_layers:
            found.append(f"{name}.frozen_layers={trainer.frozen_layers}")
        rate = getattr(trainer, "learning_rate", 0)
        if not trainer.lora.enabled and rate >= CPU_DEMO_LEARNING_RATE:
            found.append(f"{name}.learning_rate={rate:g}")
    if cfg.inference.max_tokens < CPU_DEMO_MAX_TOKENS:
        found.append(f"inference.max_tokens={cfg.inference.max_tokens}")
    return found


def cpu_demo_warning(cfg, shape: ModelShape) -> str | None:
    """One line when a large model meets a CPU demo's settings, naming the GPU config to use."""
    if shape.parameters <= LARGE_MODEL_PARAMETERS or not (found := cpu_demo_settings(cfg)):
        return None
    return (
        f"model.base={cfg.model.base!r} has ~{shape.parameters / 1e9:.1f}B parameters, but "
        f"{', '.join(found)} size this config for the 135M model on a CPU: start from "
        f"{gpu_config_for(cfg, shape)} (docs/your-model.md)"
    )


def gpu_config_for(cfg, shape: ModelShape) -> str:
    """The shipped GPU config nearest to `cfg`'s recipe and model size."""
    if "rl" in type(cfg).model_fields:  # Agent-R1, ET-Agent: RL on the QA world
        return f"{GPU_CONFIG_DIR}/agent_r1_qa_qwen1.5b.yaml"
    if shape.parameters < 4_000_000_000:
        return f"{GPU_CONFIG_DIR}/eto_textcraft_qwen1.5b.yaml"
    return (
        f"{GPU_CONFIG_DIR}/eto_textcraft_qwen7b_lora.yaml (one GPU) or "
        f"{GPU_CONFIG_DIR}/eto_textcraft_qwen7b_8gpu.yaml (eight)"
    )
