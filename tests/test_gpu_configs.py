"""The shipped GPU configs (configs/gpu/) load through the real config loader and are sized for
real models: no frozen layers, the papers' learning rates, replies long enough to think in, and
the CPU demo's warning does not fire on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.agent_r1 import AgentR1Config
from flows.eto import ETOConfig
from flywheel.config_files import load_config
from flywheel.model import shape_from_config
from ops.model_checks import cpu_demo_warning, gpu_config_for, trainer_sections

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIGS = ROOT / "configs" / "gpu"
# config.json fields of the models the configs name (from the Hub).
QWEN_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True)  # fmt: skip
QWEN_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False)  # fmt: skip
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                tie_word_embeddings=False)  # fmt: skip
SHAPES = {
    "Qwen/Qwen2.5-1.5B-Instruct": shape_from_config(QWEN_1_5B),
    "Qwen/Qwen2.5-7B-Instruct": shape_from_config(QWEN_7B),
}
HEADS = {"Qwen/Qwen2.5-1.5B-Instruct": 12, "Qwen/Qwen2.5-7B-Instruct": 28}
# file: (config class, {trainer: learning rate}, processes a trainer runs, LoRA)
EXPECTED = {
    "eto_textcraft_qwen1.5b": (ETOConfig, {"sft": 2e-5, "dpo": 1e-6}, 1, False),
    "eto_textcraft_qwen7b_lora": (ETOConfig, {"sft": 2e-4, "dpo": 1e-5}, 1, True),
    "eto_textcraft_qwen7b_8gpu": (ETOConfig, {"sft": 2e-5, "dpo": 1e-6}, 8, False),
    "agent_r1_qa_qwen1.5b": (AgentR1Config, {"sft": 1e-5, "rl": 1e-6}, 1, False),
}


def test_every_shipped_gpu_config_is_checked_here():
    assert sorted(p.stem for p in GPU_CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gpu_config_loads_and_is_sized_for_its_model(name):
    config_class, rates, processes, lora = EXPECTED[name]
    path = GPU_CONFIGS / f"{name}.yaml"
    cfg = load_config(config_class, str(path))
    header = path.read_text().split("\nrun_name:")[0]
    assert "GPU" in header and "local folder" in header and "Hub" in header
    assert cfg.model.base in SHAPES  # a Hub id, accepted without network
    assert 256 <= cfg.inference.max_tokens <= 512
    trainers = trainer_sections(cfg)
    assert {t: s.learning_rate for t, s in trainers.items()} == rates
    for trainer in trainers.values():
        assert trainer.frozen_layers == 0 and trainer.lora.enabled == lora
        assert trainer.num_processes == processes
        assert (trainer.accelerate_config == "zero3") == (processes > 1)
    # vLLM's engine: a tensor-parallel split must divide the model's attention heads.
    split = cfg.inference.vllm_args.get("tensor_parallel_size", 1)
    assert 1 < split <= processes or (split == 1 and processes == 1)
    assert HEADS[cfg.model.base] % split == 0
    assert 0 < cfg.inference.vllm_args["gpu_memory_utilization"] <= 0.9
    if "dpo" in trainers:
        assert [entry["beta"] for entry in cfg.dpo.schedule] == [0.1, 0.5]
    assert cpu_demo_warning(cfg, SHAPES[cfg.model.base]) is None


def test_the_models_sizes_are_estimated_from_their_config():
    """Published sizes: Qwen2.5-1.5B 1.54B, Qwen2.5-7B 7.61B, Llama-3.1-8B 8.03B parameters."""
    for fields, published in [(QWEN_1_5B, 1.54e9), (QWEN_7B, 7.61e9), (LLAMA_8B, 8.03e9)]:
        shape = shape_from_config(fields)
        assert abs(shape.parameters / published - 1) < 0.01
        assert shape.layers == fields["num_hidden_layers"]


@pytest.mark.parametrize(
    "demo, model, shape",
    [("eto_textcraft", ETOConfig, QWEN_1_5B), ("eto_textcraft", ETOConfig, LLAMA_8B),
     ("agent_r1_qa", AgentR1Config, QWEN_1_5B)],
)  # fmt: skip
def test_the_demo_warning_names_a_gpu_config_that_ships(demo, model, shape):
    cfg = load_config(model, str(ROOT / "configs" / f"{demo}.yaml"))
    warning = cpu_demo_warning(cfg, shape_from_config(shape))
    assert "frozen_layers=20" in warning and "max_tokens" in warning
    named = gpu_config_for(cfg, shape_from_config(shape))
    assert named in warning
    for file in named.replace(" or ", " ").split():
        if file.endswith(".yaml"):
            assert (ROOT / file).is_file(), file
