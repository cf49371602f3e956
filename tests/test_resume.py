"""Continuing an episode from a kept prefix (`continue_batched`, the flywheel's and ET-Agent's
resume): the kept turns are played again as recorded, then the policy goes on. The dial world
(`scripted_worlds`), whose rewards, observations and failures are known by hand."""

from __future__ import annotations

from scripted_worlds import Dial, DialEpisode, ScriptedCalls

from agents.rollout import Resume, RolloutSettings, agent_prefix, continue_batched, run_batched
from envs.base import EnvironmentUnavailable
from flywheel.chat import FORMAT_HINT
from flywheel.records import Message

HINT = Message(role="user", content="Hint: count first.")


def script(chat, *texts) -> ScriptedCalls:
    """A policy answering its k-th call (one episode: one prompt) with texts[k]."""
    return ScriptedCalls(chat.tokenizer, [[text] for text in texts])


def first_episode(chat, *texts, max_steps=6):
    env = Dial()
    (trajectory,) = run_batched(env, ["t"], script(chat, *texts), chat, agent_prefix(env, []),
                                RolloutSettings(max_steps=max_steps), progress=False)  # fmt: skip
    return env, trajectory


def test_a_resume_sums_the_replayed_rewards_and_prompts_with_the_encoded_prefix_and_hint(chat):
    env, first = first_episode(chat, *["Action: up"] * 4, "Action: win")
    assert (first.reward, first.success) == (2.0, True)  # the dial's top reward
    policy = script(chat, "Action: win")
    [continued] = continue_batched(env, [Resume(first, 4, (HINT,))], policy, chat,
                                   RolloutSettings(max_steps=6))  # fmt: skip
    # four replayed 'up's (0.25 each) and the policy's 'win' (1.0)
    assert (continued.reward, continued.success, continued.n_steps) == (2.0, True, 5)
    assert continued.messages[-2] == HINT  # the last turn's answer ends the episode unshown
    # the policy was asked once, with the chat's own encoding of everything before its turn
    ((prompts, _),) = policy.calls
    assert prompts == [chat.encode(continued.messages[:-1])[0] + chat.header_ids]


def test_a_reply_without_an_action_in_the_kept_turns_is_answered_again_with_the_hint(chat):
    env, first = first_episode(chat, "Thought: hmm", "Action: up", "Action: up", "Action: win")
    assert first.messages[first.episode_start + 2].content.endswith(FORMAT_HINT)
    [continued] = continue_batched(env, [Resume(first, 3)], script(chat, "Action: win"), chat,
                                   RolloutSettings(max_steps=6))  # fmt: skip
    assert (continued.finish_reason, continued.reward, continued.n_steps) == ("done", 1.5, 4)


def test_kept_turns_that_end_on_an_unanswered_reply_are_a_mismatch_not_a_crash(chat):
    env, first = first_episode(chat, "Action: up", "Action: up", max_steps=2)
    assert first.finish_reason == "max_steps"  # its last reply has no observation recorded
    [continued] = continue_batched(env, [Resume(first, 99)], script(chat), chat,
                                   RolloutSettings(max_steps=6))  # fmt: skip
    assert continued.finish_reason == (
        "replay-mismatch: step 2's observation differs from the record"
    )


def test_a_world_that_fails_on_a_replayed_step_ends_that_episode_with_a_replay_error(
    chat, monkeypatch
):
    env, first = first_episode(chat, "Action: up", "Action: up", "Action: win")
    # the world changed since: the step it once took now raises
    step = DialEpisode.step
    monkeypatch.setattr(DialEpisode, "step", lambda self, action: step(self, "boom"))
    [continued] = continue_batched(env, [Resume(first, 1)], script(chat), chat,
                                   RolloutSettings(max_steps=6))  # fmt: skip
    assert continued.finish_reason == "replay-error: ValueError: boom"
    assert not continued.success


def test_an_episode_that_cannot_start_keeps_its_task_and_prefix(chat, monkeypatch):
    env = Dial()

    def lost_server(task_id):
        raise EnvironmentUnavailable("server down")

    monkeypatch.setattr(env, "start", lost_server)
    prefix = agent_prefix(env, [])
    (lost,) = run_batched(env, ["t"], script(chat), chat, prefix, RolloutSettings(max_steps=6),
                          progress=False)  # fmt: skip
    assert (lost.task_id, lost.finish_reason) == ("t", "lost: EnvironmentUnavailable: server down")
    assert lost.messages == prefix
