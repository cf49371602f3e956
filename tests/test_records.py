"""Records: what reinforcement learning needs (per-step rewards, sampling log-probabilities,
groups) is optional, so records stored before it still load; the rollout fills per-step rewards."""

from __future__ import annotations

import json

from test_rollout import ScriptedBackend

from agents.rollout import RolloutSettings, agent_prefix, run_batched
from envs import make_env
from flywheel.chat import format_reply
from flywheel.records import Campaign, Message, Trajectory, opening_length


def test_a_trajectory_stored_before_the_rl_fields_loads_with_them_unset():
    line = json.dumps(
        {
            "task_id": "chest", "env": "textcraft", "episode_start": 1, "reward": 1.0,
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "assistant", "content": "Action: inventory", "loss": True,
                 "token_ids": [1, 2], "end_generated": True},
            ],
        }
    )  # fmt: skip
    trajectory = Trajectory.model_validate_json(line)
    assert trajectory.group_id is None
    assert [(m.reward, m.logprobs) for m in trajectory.messages] == [(None, None), (None, None)]
    again = Message(role="assistant", content="x", token_ids=[5], logprobs=[-0.5], reward=0.25)
    assert Message.model_validate_json(again.model_dump_json()) == again


def test_a_campaign_stored_with_its_expert_url_carries_it():
    stored = {"name": "c", "recipe": "eto", "expert": "file:///s/expert.jsonl", "rounds": []}
    assert Campaign.model_validate(stored).carry == {"expert": "file:///s/expert.jsonl"}
    assert Campaign.model_validate({**stored, "expert": ""}).carry == {}


def test_the_rollout_records_each_steps_reward_on_the_turn_that_took_it(chat):
    env = make_env("textcraft")
    plan = env.expert_plan("acacia_boat")
    replies = ["no action here"] + [format_reply(t, a) for t, a in plan]
    backend = ScriptedBackend(chat, {"acacia_boat": replies})
    settings = RolloutSettings(max_steps=len(plan) + 1)
    [trajectory] = run_batched(
        env, ["acacia_boat"], backend, chat, agent_prefix(env, []), settings, progress=False
    )
    turns = [m for m in trajectory.messages if m.role == "assistant"]
    assert trajectory.success and len(turns) == len(plan) + 1
    # The reply without an action took no step; the last step earned the episode's reward.
    assert [m.reward for m in turns] == [None] + [0.0] * (len(plan) - 1) + [1.0]
    assert sum(m.reward or 0.0 for m in turns) == trajectory.reward


def test_the_opening_is_the_system_message_or_agentgyms_task_and_acknowledgement():
    user, assistant = Message(role="user", content="task"), Message(role="assistant", content="OK")
    system = Message(role="system", content="rules")
    assert opening_length([user, assistant]) == 2  # AgentGym's layout, nothing after it yet
    assert opening_length([user, assistant, user]) == 2
    assert opening_length([system, user, assistant]) == 1
    assert opening_length([user]) == 1  # a lone task prompt: no acknowledgement to count
    assert opening_length([user, user]) == 1
