"""How vLLM engines are sized and started (docs/determinism.md): seeded requests on a CPU are
admitted only as the KV cache holds them whole (no cap on sequences, no preemption), and
`inference.vllm_args` reaches the engine checked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from flywheel.inference import (
    KVAdmission,
    SamplingSettings,
    VLLMBackend,
    engine_args,
)
from flywheel.settings import InferenceSettings, check_vllm_args

BLOCK = 32


def test_a_requests_blocks_are_its_shareable_prompt_blocks_and_its_own_rest():
    admission = KVAdmission(blocks=100, block_size=BLOCK)
    # 70 prompt tokens + 20 reply: 3 blocks at its longest; blocks 0 and 1 are full prompt blocks
    request = admission.blocks_of(list(range(70)), 20)
    assert len(request.shared) == 2 and request.own == 1
    # 64 tokens fill two blocks, but the second holds the last prompt token, which vLLM's prefix
    # cache never serves: only block 0 is shared
    exact = admission.blocks_of(list(range(64)), 1)
    assert len(exact.shared) == 1 and exact.own == 2
    # a block's key is its whole prefix: the same tokens after another first block differ
    other = admission.blocks_of([7] * 32 + list(range(32, 70)), 20)
    assert other.shared[1] != request.shared[1]


def test_requests_of_one_prefix_count_its_blocks_once():
    admission = KVAdmission(blocks=10, block_size=BLOCK)
    prefix = [1] * (4 * BLOCK)  # 4 full blocks every request shares
    requests = [admission.blocks_of(prefix + [task] * 10, 40) for task in range(5)]
    assert [r.own for r in requests] == [2, 2, 2, 2, 2]  # 138 + 40 tokens: 6 blocks, 4 shared
    admission.admit(requests[0])
    assert admission.in_use() == 6
    admission.admit(requests[1])
    assert admission.in_use() == 8  # the prefix counted once
    admission.admit(requests[2])
    assert admission.in_use() == 10
    assert not admission.fits(requests[3])
    admission.release(requests[0])
    assert admission.in_use() == 8 and admission.fits(requests[3])
    for request in requests[1:3]:
        admission.release(request)
    assert admission.in_use() == 0 and not admission.holders  # nothing held any more


class FakeEngine:
    """vLLM's offline engine as far as admission sees it: requests enqueued one at a time, one
    token a step each, a full prompt block shared with the running requests that hold it (as
    vLLM's prefix cache does), and the blocks in use checked against the cache every step."""

    def __init__(self, blocks: int, reply_tokens: int):
        self.blocks, self.reply_tokens = blocks, reply_tokens
        self.llm_engine = self
        self.running: dict[str, list] = {}  # external id -> [prompt, tokens generated]
        self.count = 0
        self.most_at_once = 0

    def enqueue(self, prompts, params, use_tqdm, lora_request):
        (prompt,) = prompts
        self.running[str(self.count)] = [prompt["prompt_token_ids"], 0]
        self.count += 1
        return [f"{self.count - 1}-abcd1234"]  # vLLM's internal id

    def blocks_in_use(self) -> int:
        shared, own = set(), 0
        for prompt, generated in self.running.values():
            full = (len(prompt) - 1) // BLOCK
            shared.update(tuple(prompt[: (i + 1) * BLOCK]) for i in range(full))
            own += -(-(len(prompt) + generated) // BLOCK) - full
        return len(shared) + own

    def step(self):
        for state in self.running.values():
            state[1] += 1
        assert self.blocks_in_use() <= self.blocks, "the engine would preempt a request"
        self.most_at_once = max(self.most_at_once, len(self.running))
        done = [
            rid for rid, (_, generated) in self.running.items() if generated >= self.reply_tokens
        ]
        outputs = [Finished(rid, self.running.pop(rid)) for rid in done]
        return outputs

    def generate(self, requests, params, use_tqdm, lora_request):
        raise AssertionError("a seeded call must go through admission")

    def abort_request(self, request_ids, internal):
        self.aborted = (sorted(request_ids), internal)


class Finished:
    def __init__(self, request_id: str, state: list):
        self.request_id, self.finished, self.prompt = request_id, True, state[0]
        self.outputs = [SimpleNamespace(finish_reason="length")]


def backend_on(engine, blocks: int, max_model_len: int = 4096) -> VLLMBackend:
    """A `VLLMBackend` around a fake engine, without starting vLLM."""
    backend = object.__new__(VLLMBackend)
    backend.llm, backend.gpu, backend.takes_seeds = engine, False, True
    backend.closed, backend.lora_request = False, None
    backend.kv_blocks, backend.block_size, backend.max_model_len = blocks, BLOCK, max_model_len
    return backend


def test_seeded_requests_run_as_many_at_once_as_fit_whole_and_never_overflow_the_cache():
    # The demo's shape: one ~1k-token prefix (system prompt and example), a goal each, 48-token
    # replies. 200 blocks of 32: 1 sequence of max_model_len 4096 under the old sizing.
    prefix = list(range(1000))
    prompts = [prefix + [5000 + task] * 60 for task in range(64)]
    engine = FakeEngine(blocks=200, reply_tokens=48)
    backend = backend_on(engine, blocks=200)
    outputs = backend._run(
        prompts_for(prompts), [None] * len(prompts), backend.seeded_blocks(prompts, 48)
    )
    assert [o.prompt for o in outputs] == prompts  # each request's output in its place
    # the prefix's 31 full blocks once, then 4 blocks each (60 + 48 tokens after them)
    assert engine.most_at_once == (200 - 31) // 4 == 42


def prompts_for(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


def test_a_tight_cache_admits_in_waves_without_ever_overflowing():
    prompts = [[task] * 100 for task in range(20)]  # nothing shared: 130 tokens, 5 blocks each
    engine = FakeEngine(blocks=12, reply_tokens=30)
    backend = backend_on(engine, blocks=12)
    outputs = backend._run(
        prompts_for(prompts), [None] * len(prompts), backend.seeded_blocks(prompts, 30)
    )
    assert [o.prompt for o in outputs] == prompts
    assert engine.most_at_once == 2  # 12 blocks hold two requests of 5 blocks, not three


def test_a_failed_seeded_call_leaves_none_of_its_requests_in_the_engine():
    engine = FakeEngine(blocks=100, reply_tokens=5)
    engine.step = lambda: (_ for _ in ()).throw(RuntimeError("the engine died"))
    backend = backend_on(engine, blocks=100)
    prompts = [[1] * 40, [2] * 40]
    with pytest.raises(RuntimeError, match="the engine died"):
        backend._run(prompts_for(prompts), [None] * 2, backend.seeded_blocks(prompts, 5))
    assert engine.aborted == (["0-abcd1234", "1-abcd1234"], True)  # vLLM's internal ids


def test_a_seeded_request_that_cannot_run_whole_fails_loudly():
    backend = backend_on(FakeEngine(blocks=10, reply_tokens=1), blocks=10, max_model_len=1024)
    with pytest.raises(ValueError, match=r"1000 tokens .* up to 48 exceed inference.max_model_len"):
        backend.seeded_blocks([[1] * 1000], 48)
    with pytest.raises(ValueError, match="raise inference.kv_cache_gib"):
        backend.seeded_blocks([[1] * 400], 48)  # 14 blocks of 32 in a cache of 10


def test_only_seeded_calls_go_through_admission():
    engine = FakeEngine(blocks=100, reply_tokens=1)
    backend = backend_on(engine, blocks=100)
    with pytest.raises(AssertionError, match="through admission"):  # greedy: all at once
        backend.generate([[1, 2, 3]], SamplingSettings(temperature=0.0, max_tokens=1))


def test_the_engines_arguments_are_flywheels_then_vllm_args():
    seeded = {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
    cpu = engine_args("/m", gpu=False, max_model_len=2048, seed=3, block_size=32,
                      seeded_scheduling=seeded)  # fmt: skip
    assert cpu["model"] == "/m" and cpu["max_model_len"] == 2048 and cpu["seed"] == 3
    assert cpu["dtype"] == "float32" and cpu["gpu_memory_utilization"] == 0.3
    assert cpu["enable_chunked_prefill"] is False and cpu["block_size"] == 32
    assert "max_num_seqs" not in cpu  # no cap on sequences: admission keeps seeded ones whole
    gpu = engine_args("/m", gpu=True, max_model_len=2048, seed=3)
    assert gpu["gpu_memory_utilization"] == 0.5 and "enable_chunked_prefill" not in gpu
    tuned = engine_args("/m", gpu=True, max_model_len=2048, seed=3,
                        vllm_args={"gpu_memory_utilization": 0.9, "tensor_parallel_size": 2})  # fmt: skip
    assert tuned["gpu_memory_utilization"] == 0.9 and tuned["tensor_parallel_size"] == 2
    with pytest.raises(ValueError, match="set inference.max_model_len instead"):
        engine_args("/m", gpu=True, max_model_len=2048, seed=3, vllm_args={"max_model_len": 1})


def test_vllm_args_are_checked_when_the_settings_are_read():
    assert InferenceSettings(vllm_args={"tensor_parallel_size": 2}).vllm_args == {
        "tensor_parallel_size": 2
    }
    with pytest.raises(ValidationError, match="set inference.max_model_len instead"):
        InferenceSettings(vllm_args={"max_model_len": 8192})
    with pytest.raises(ValidationError, match="set inference.kv_cache_dtype instead"):
        InferenceSettings(vllm_args={"kv_cache_dtype": "fp8"})
    with pytest.raises(ValidationError, match="seeded sampling on a CPU needs it off"):
        InferenceSettings(vllm_args={"enable_chunked_prefill": True})
    with pytest.raises(ValidationError, match="did you mean tensor_parallel_size"):
        InferenceSettings(vllm_args={"tensor_paralel_size": 2})
    with pytest.raises(ValueError, match="not one of vLLM's engine arguments$"):
        check_vllm_args({"zzzzqqqq": 1})  # nothing near: no suggestion
