"""Continuing an episode from a kept prefix (`continue_batched`, the flywheel's and ET-Agent's
resume): the kept turns are played again as recorded, then the policy goes on. A counter world
whose rewards, observations and failures are known by hand."""

from __future__ import annotations

from agents.rollout import Resume, RolloutSettings, agent_prefix, continue_batched, run_batched
from envs.base import Environment, EnvironmentUnavailable, Episode, StepResult
from flywheel.chat import FORMAT_HINT
from flywheel.inference import Generation
from flywheel.records import Message


class Counter(Environment):
    """'up' counts one (reward 0.25), 'win' ends the episode from 2 on (reward 1), 'boom' raises.
    Task 'gone' cannot start (its server is lost). `breaks` makes every later 'up' raise (a world that changed)."""

    name = "counter"

    def __init__(self):
        self.breaks = False

    def task_ids(self, split):
        return ["t"]

    def start(self, task_id):
        if task_id == "gone":
            raise EnvironmentUnavailable("server down")
        return CounterEpisode(self)


class CounterEpisode(Episode):
    task_id, instruction = "t", "Goal: count to 2, then win."

    def __init__(self, env):
        self.env, self.count = env, 0

    def step(self, action):
        if action == "boom" or (action == "up" and self.env.breaks):
            raise ValueError("boom")
        if action == "win" and self.count >= 2:
            return StepResult("You won.", 1.0, True)
        self.count += action == "up"
        return StepResult(f"at {self.count}", 0.25 if action == "up" else 0.0, False)


class Replies:
    """Answers every prompt of call k with replies[k]; records the prompts."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    def generate(self, prompts, sampling):
        self.prompts.append(prompts)
        text = self.replies[len(self.prompts) - 1]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [Generation(text, ids + [self.tokenizer.eos_token_id], "stop") for _ in prompts]


HINT = Message(role="user", content="Hint: count first.")


def first_episode(chat, replies, max_steps=6):
    env = Counter()
    settings = RolloutSettings(max_steps=max_steps)
    prefix = agent_prefix(env, [])
    (trajectory,) = run_batched(env, ["t"], Replies(chat.tokenizer, replies), chat, prefix,
                                settings, progress=False)  # fmt: skip
    return env, trajectory


def test_a_resume_sums_the_replayed_rewards_and_prompts_with_the_encoded_prefix_and_hint(chat):
    env, first = first_episode(chat, ["Action: up", "Action: up", "Action: win"])
    assert (first.reward, first.success) == (1.5, True)
    policy = Replies(chat.tokenizer, ["Action: win"])
    [continued] = continue_batched(env, [Resume(first, 2, (HINT,))], policy, chat,
                                   RolloutSettings(max_steps=6))  # fmt: skip
    # two replayed 'up's (0.25 each) and the policy's 'win' (1.0)
    assert (continued.reward, continued.success, continued.n_steps) == (1.5, True, 3)
    assert continued.messages[-2] == HINT  # the last turn's answer ends the episode unshown
    # the policy was asked once, with the chat's own encoding of everything before its turn
    (prompts,) = policy.prompts
    assert prompts == [chat.encode(continued.messages[:-1])[0] + chat.header_ids]


def test_a_reply_without_an_action_in_the_kept_turns_is_answered_again_with_the_hint(chat):
    env, first = first_episode(chat, ["Thought: hmm", "Action: up", "Action: up", "Action: win"])
    assert first.messages[first.episode_start + 2].content.endswith(FORMAT_HINT)
    [continued] = continue_batched(env, [Resume(first, 3)], Replies(chat.tokenizer, ["Action: win"]),
                                   chat, RolloutSettings(max_steps=6))  # fmt: skip
    assert (continued.finish_reason, continued.reward, continued.n_steps) == ("done", 1.5, 4)


def test_kept_turns_that_end_on_an_unanswered_reply_are_a_mismatch_not_a_crash(chat):
    env, first = first_episode(chat, ["Action: up", "Action: up"], max_steps=2)
    assert first.finish_reason == "max_steps"  # its last reply has no observation recorded
    [continued] = continue_batched(env, [Resume(first, 99)], Replies(chat.tokenizer, []), chat,
                                   RolloutSettings(max_steps=6))  # fmt: skip
    assert continued.finish_reason == (
        "replay-mismatch: step 2's observation differs from the record"
    )


def test_a_world_that_fails_on_a_replayed_step_ends_that_episode_with_a_replay_error(chat):
    env, first = first_episode(chat, ["Action: up", "Action: up", "Action: win"])
    env.breaks = True
    [continued] = continue_batched(env, [Resume(first, 1)], Replies(chat.tokenizer, []), chat,
                                   RolloutSettings(max_steps=6))  # fmt: skip
    assert continued.finish_reason == "replay-error: ValueError: boom"
    assert not continued.success


def test_an_episode_that_cannot_start_keeps_its_task_and_prefix(chat):
    env = Counter()
    prefix = agent_prefix(env, [])
    (lost,) = run_batched(env, ["gone"], Replies(chat.tokenizer, []), chat, prefix,
                          RolloutSettings(max_steps=6), progress=False)  # fmt: skip
    assert (lost.task_id, lost.finish_reason) == (
        "gone",
        "lost: EnvironmentUnavailable: server down",
    )
    assert lost.messages == prefix
