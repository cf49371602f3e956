"""ScienceWorld from its PyPI package (real Java processes): the split, the gold expert, its
scores, and the same episodes served over AgentGym's SciWorld protocol."""

from __future__ import annotations

import time

import httpx
import pytest

from envs.agentgym.client import ClientSettings, RemoteEnv
from envs.agentgym.protocol import served_task_ids
from envs.agentgym.server import LocalServer
from envs.scienceworld import ScienceWorldEnv, looking_before_focus, parse_task_id

TASK = "lifespan-longest-lived"  # gold paths of 6 steps


@pytest.fixture(scope="module")
def env():
    return ScienceWorldEnv([TASK], variations=3)


def play_gold(env, task_id):
    episode = env.start(task_id)
    seen, total = [episode.instruction], 0.0
    for _, action in env.expert_plan(task_id):
        result = episode.step(action)
        seen.append(result)
        total += result.reward
        if result.done:
            break
    episode.close()
    return seen, total


def test_the_expert_looks_around_before_focusing_on_what_it_has_not_been_shown():
    gold = ["open door to kitchen", "go to kitchen", "open door to outside", "go to outside",
            "focus on baby baby brown bear", "focus on baby baby mouse", "wait1"]  # fmt: skip
    assert looking_before_focus(gold) == [
        *gold[:4], "look around", *gold[4:],
    ]  # fmt: skip
    # a focus that does not follow a move, or a path that already looks, is left as it is
    looked = ["go to outside", "look around", "focus on bee"]
    assert looking_before_focus(looked) == looked
    assert looking_before_focus(["focus on bee"]) == ["focus on bee"]


def test_looking_first_shows_the_animal_the_expert_then_focuses_on(env):
    task_id = env.task_ids("train")[0]
    seen, total = play_gold(env, task_id)
    assert total == 100.0  # the extra move scores nothing and costs nothing
    plan = [action for _, action in env.expert_plan(task_id)]
    looked = plan.index("look around")
    animal = plan[looked + 1].removeprefix("focus on ").split()[-1]
    assert animal in seen[looked + 1].observation  # shown before it is named
    raw = ScienceWorldEnv([TASK], variations=3, expert_looks_around=False)
    assert "look around" not in [action for _, action in raw.expert_plan(task_id)]


def test_split_is_scienceworlds_own_and_keeps_test_variations_out_of_training(env):
    from scienceworld import ScienceWorldEnv as World

    world = World("", envStepLimit=100)
    world.load(TASK, 0, "")
    train, test = world.get_variations_train()[:3], world.get_variations_test()[:3]
    world.close()
    assert env.task_ids("train") == [f"{TASK}/{v}" for v in train]
    assert env.task_ids("test") == [f"{TASK}/{v}" for v in test]
    uncapped = ScienceWorldEnv([TASK], variations=None)
    all_train = {parse_task_id(t)[1] for t in uncapped.task_ids("train")}
    all_test = {parse_task_id(t)[1] for t in uncapped.task_ids("test")}
    assert all_train and all_test and not all_train & all_test


def test_gold_expert_scores_100_and_is_cached_on_disk(env, tmp_path, monkeypatch):
    task_id = env.task_ids("train")[0]
    seen, total = play_gold(env, task_id)
    assert seen[0].startswith("Your task is to") and "This room is called" in seen[0]
    assert seen[-1].done and total == 100.0 and env.normalise(total) == 1.0

    cached = ScienceWorldEnv([TASK], variations=3, cache_dir=tmp_path)
    plan = cached.expert_plan(task_id)
    assert (tmp_path / "scienceworld" / "gold-.json").is_file()
    monkeypatch.setattr(ScienceWorldEnv, "_generate_gold", lambda *_: pytest.fail("not cached"))
    again = ScienceWorldEnv([TASK], variations=3, cache_dir=tmp_path)
    assert again.expert_plan(task_id) == plan


def test_a_failed_task_ends_at_score_minus_100_and_normalises_to_zero(env):
    episode = env.start(env.task_ids("train")[0])
    result = episode.step("focus on agent")  # the wrong focus fails the task at once
    episode.close()
    assert result.done and result.reward <= -100
    assert env.normalise(result.reward) == 0.0


def test_unknown_task_names_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown ScienceWorld task names \['boil-the-ocean'\]"):
        ScienceWorldEnv(["boil-the-ocean"]).check()


def test_served_over_the_sciworld_protocol(env, tmp_path):
    config = tmp_path / "sw.yaml"
    config.write_text(f"env:\n  name: scienceworld\n  scienceworld:\n    task_names: [{TASK}]\n"
                      "    variations: 3\n")  # fmt: skip
    server = LocalServer("--config", str(config))
    try:
        # A fresh server's first reset loads ScienceWorld in its JVM: 30 s ran out on a loaded machine.
        http = httpx.Client(base_url=server.url, timeout=120)
        env_id = http.post("/create").json()["id"]
        reset = http.post("/reset", json={"id": env_id, "data_idx": 0}).json()
        task_id = served_task_ids(env)[0]
        # AgentGym's SciWorld client shows task_description + "\n" + observation.
        first = env.start(task_id)
        assert f"{reset['task_description']}\n{reset['observation']}" == first.instruction
        first.close()
        step = http.post("/step", json={"id": env_id, "action": "look around"}).json()
        assert set(step) == {"observation", "reward", "score", "done"}

        remote = RemoteEnv(env, [server.url], ClientSettings(timeout_s=120))
        remote.check()
        assert play_gold(remote, task_id) == play_gold(env, task_id)
    finally:
        server.kill()


LOOK = "Thought: I look.\nAction: look around"  # 3 episodes x 2 steps of it


def java_children() -> int:
    import psutil

    return sum("java" in p.name() for p in psutil.Process().children(recursive=True))


def test_a_rollout_ends_the_java_processes_it_leaves_idle(env, chat):
    from agents.rollout import RolloutSettings, agent_prefix, run_batched
    from envs.scienceworld import worlds
    from tests.test_agentgym_expert import ScriptedReplies

    worlds.close_idle()
    before = java_children()
    capped = ScienceWorldEnv([TASK], variations=3)
    capped.max_live_episodes = 2
    trajectories = run_batched(
        capped, capped.task_ids("train"), ScriptedReplies(chat.tokenizer, [LOOK] * 6), chat,
        agent_prefix(capped, []), RolloutSettings(max_steps=2), progress=False,
    )  # fmt: skip
    assert [t.finish_reason for t in trajectories] == ["max_steps"] * 3
    assert worlds._idle.qsize() == 0  # none kept for the stage after the rollout
    deadline = time.monotonic() + 20  # a JVM told to stop exits within about a second
    while java_children() > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert java_children() <= before
