"""The batched rollout on the dial world (`scripted_worlds`), where every prompt, reward and
failure is known by hand: what each step hands the model, the expert's rewards, and episodes
closed when a start or a generation fails."""

from __future__ import annotations

import pytest
from scripted_worlds import Dial, ScriptedCalls

from agents.rollout import RolloutSettings, agent_prefix, expert_trajectory, run_batched


class BrokenStartDial(Dial):
    """Task 'u' cannot start: a bug in the environment, not an outage."""

    def start(self, task_id):
        if task_id == "u":
            raise ValueError("no dial named u")
        return super().start(task_id)


class PlannedDial(Dial):
    def expert_plan(self, task_id):
        return [("Turn it.", "up"), ("Once more.", "up"), ("Now.", "win")]


class FailingSecondCall(ScriptedCalls):
    def generate(self, prompts, sampling):
        if self.calls:
            raise RuntimeError("the engine died")
        return super().generate(prompts, sampling)


def play(env, tasks, backend, chat, max_steps=6):
    return run_batched(env, tasks, backend, chat, agent_prefix(env, []),
                       RolloutSettings(max_steps=max_steps), progress=False)  # fmt: skip


def test_each_step_prompts_with_the_chats_encoding_of_the_episode_so_far(chat):
    backend = ScriptedCalls(chat.tokenizer, [["Action: up"], ["Action: up"], ["Action: win"]])
    (trajectory,) = play(Dial(), ["t"], backend, chat)
    assert (trajectory.reward, trajectory.n_steps, trajectory.finish_reason) == (1.5, 3, "done")
    assert trajectory.source == "policy"
    # call k (from 0) sees the prefix, the instruction and k replies with their observations
    start = trajectory.episode_start
    assert len(backend.calls) == 3
    for k, (prompts, _) in enumerate(backend.calls):
        seen = trajectory.messages[: start + 1 + 2 * k]
        assert prompts == [chat.encode(seen)[0] + chat.header_ids], f"call {k}"


def test_an_episode_with_the_top_reward_that_never_ended_is_no_success(chat):
    backend = ScriptedCalls(chat.tokenizer, [["Action: up"]] * 8)
    (trajectory,) = play(Dial(), ["t"], backend, chat, max_steps=8)
    # eight notches earn the dial's top reward, but only 'win' ends an episode as done
    assert (trajectory.reward, trajectory.finish_reason) == (2.0, "max_steps")
    assert trajectory.success is False


def test_an_episode_that_cannot_start_for_a_bug_is_raised_and_the_started_ones_closed(chat):
    env = BrokenStartDial()
    with pytest.raises(ValueError, match="no dial named u"):
        play(env, ["t", "u"], ScriptedCalls(chat.tokenizer, []), chat)
    assert [(e.task_id, e.closed) for e in env.episodes] == [("t", True)]


def test_when_generation_fails_every_live_episode_is_closed(chat):
    env = Dial()
    backend = FailingSecondCall(chat.tokenizer, [["Action: up", "Action: up"]])
    with pytest.raises(RuntimeError, match="the engine died"):
        play(env, ["t", "u"], backend, chat)
    assert [(e.notch, e.closed) for e in env.episodes] == [(1, True), (1, True)]


def test_the_expert_trajectory_sums_its_rewards_and_shows_every_observation_but_the_last(chat):
    env = PlannedDial()
    trajectory = expert_trajectory(env, "t", agent_prefix(env, []))
    assert (trajectory.reward, trajectory.n_steps, trajectory.finish_reason) == (1.5, 3, "done")
    assert trajectory.success is False  # 1.5 of the dial's 2.0
    episode = [(m.role, m.content) for m in trajectory.messages[trajectory.episode_start :]]
    assert episode == [
        ("user", "Goal: win t."),
        ("assistant", "Thought: Turn it.\nAction: up"),
        ("user", "Observation: at 1"),
        ("assistant", "Thought: Once more.\nAction: up"),
        ("user", "Observation: at 2"),
        ("assistant", "Thought: Now.\nAction: win"),
    ]


def test_an_expert_plan_that_does_not_finish_gives_no_trajectory(chat):
    class ShortPlan(Dial):
        def expert_plan(self, task_id):
            return [("Turn it.", "up")]

    assert expert_trajectory(ShortPlan(), "t", []) is None
    assert expert_trajectory(Dial(), "t", []) is None  # no expert at all
