"""A LoRA adapter published alone (`lora.publish=adapter`) served by vLLM: the engine loads its
base with LoRA enabled and sends the adapter with every request; slow, the adapter-served greedy
replies are the merged model's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_lora import write_adapter_config

from flywheel.inference import SamplingSettings
from flywheel.settings import LoRASettings, SFTSettings
from training.job import TrainingJob, load_model, publishable, save_trained, with_lora


def test_an_adapter_folder_is_served_from_its_base_with_the_adapter_on_every_request(
    tmp_path, tiny_model_dir, monkeypatch
):
    import vllm

    import flywheel.inference as inference

    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):  # it sets these
        monkeypatch.delenv(name, raising=False)
    made = []

    class Engine:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.requests = []

        def generate(self, prompts, params, use_tqdm, lora_request=None):
            self.requests.append(lora_request)
            return []

    monkeypatch.setattr(vllm, "LLM", Engine)
    folder = write_adapter_config(tmp_path / "adapter", tiny_model_dir, 4)
    served = inference.VLLMBackend(str(folder), 2048, 2)
    assert made[0]["model"] == str(tiny_model_dir)
    assert (made[0]["enable_lora"], made[0]["max_lora_rank"]) == (True, 8)
    served.generate([], SamplingSettings())
    assert served.llm.requests[0].lora_path == str(folder)
    with pytest.raises(NotImplementedError, match="lora.publish=merged"):  # vllm-cpu fails
        served.score([[1]], [[2]])
    full = inference.VLLMBackend(str(tiny_model_dir), 2048, 2)
    assert made[1]["model"] == str(tiny_model_dir) and "enable_lora" not in made[1]
    full.generate([], SamplingSettings())
    assert full.llm.requests == [None]


PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nHow do I craft planks?<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4,",
    "Write a haiku about a stick:",
]


def published_both_ways(base_model_dir: Path, folder: Path) -> tuple[Path, Path]:
    """One adapter (rank 8 on every linear layer, B drawn at random: as if trained), published
    alone and merged into the base."""
    from transformers import AutoTokenizer

    lora = LoRASettings(enabled=True, rank=8, alpha=16.0, publish="adapter")
    job = TrainingJob(model_dir=str(base_model_dir), data_file="", output_dir="",
                      settings=SFTSettings(lora=lora), seed=0)  # fmt: skip
    model = with_lora(load_model(job), job)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    save_trained(model, job, str(folder / "adapter"))
    publishable(model).save_pretrained(folder / "merged")
    AutoTokenizer.from_pretrained(base_model_dir).save_pretrained(
        folder / "merged"
    )  # vLLM reads it
    return folder / "adapter", folder / "merged"


def greedy(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """vLLM's greedy replies. (Scoring through an adapter fails on vllm-cpu 0.32: its LoRA
    logits processor cannot give prompt log-probabilities; `VLLMBackend.score` refuses it.)"""
    from flywheel.inference import VLLMBackend

    backend = VLLMBackend(str(model_dir), max_model_len=512, kv_cache_gib=1)
    try:
        return [g.token_ids for g in backend.generate(prompts, SamplingSettings(max_tokens=24))]
    finally:
        backend.close()


@pytest.mark.extended
@pytest.mark.slow
def test_the_adapter_served_by_vllm_replies_as_the_merged_model(tmp_path, base_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter, merged = published_both_ways(base_model_dir, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    served = greedy(adapter, prompts)
    assert served == greedy(merged, prompts)

    # ... and the adapter matters: the base alone answers otherwise
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype="float32")
    base_replies = []
    for prompt in prompts:
        ids = base.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
        base_replies.append(ids[0, len(prompt) :].tolist())
    assert base_replies != served
