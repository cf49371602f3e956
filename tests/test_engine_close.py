"""Closing the engine ends a call another thread has waiting on it, with `EngineClosed` (found by
the chaos bench: a flow failed while another stage was generating, its failure path closed the
shared engine, and the generating thread waited on the closed engine's outputs forever, so the
flow never exited). Two ways the engine goes: it answers the shutdown by aborting its requests,
or it cannot answer (busy, stopped) and is killed, which leaves the caller nothing to read."""

from __future__ import annotations

import signal
import threading

import psutil
import pytest

pytestmark = pytest.mark.slow  # a real vLLM engine on the built-in model (~1 min on 2 cores)


def engine_core_processes():
    return [c for c in psutil.Process().children(recursive=True) if "EngineCore" in c.name()]


# CI keeps the case the chaos campaign found hanging (a core that cannot answer any more)
@pytest.mark.parametrize(
    "core", [pytest.param("answers", marks=pytest.mark.extended), "cannot-answer"]
)
def test_closing_the_engine_fails_a_generate_call_waiting_in_another_thread(
    core, base_model_dir, chat
):
    from flywheel.inference import EngineClosed, SamplingSettings, VLLMBackend
    from flywheel.records import Message

    engine = VLLMBackend(str(base_model_dir), 1024, 1)
    client = engine.llm.llm_engine.engine_core
    waiting, original = threading.Event(), client.get_output

    def get_output():  # the generating thread is about to wait on the engine's outputs
        waiting.set()
        return original()

    client.get_output = get_output
    prompt, _ = chat.encode([Message(role="user", content="Write a long story about a fox.")])
    outcome = {}

    def generate():
        try:
            outcome["result"] = engine.generate([prompt] * 8, SamplingSettings(max_tokens=800))
        except Exception as error:  # what the stage sees
            outcome["error"] = error

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    assert waiting.wait(120), "generate never asked the engine for outputs"
    if core == "cannot-answer":
        for process in engine_core_processes():
            process.send_signal(signal.SIGSTOP)  # shutdown then ends in SIGKILL, no aborts
    engine.close()
    thread.join(60)
    assert not thread.is_alive(), "the generate call still waits on the closed engine"
    assert "result" not in outcome, f"the call returned replies from a closed engine: {outcome}"
    assert isinstance(outcome["error"], EngineClosed)
    assert engine_core_processes() == []
