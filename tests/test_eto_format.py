from agents.eto_format import read_eto_dpo, read_eto_sft, write_eto_dpo, write_eto_sft
from flywheel.records import Message, Pair, Trajectory

PREFIX = [Message(role="system", content="Craft things."), Message(role="user", content="ex")]


def sample_trajectory() -> Trajectory:
    episode = [
        Message(role="user", content="Goal: craft x."),
        Message(role="assistant", content="Thought: a\nAction: get 1 y", loss=True),
        Message(role="user", content="Observation: Got 1 y"),
        Message(role="assistant", content="Thought: b\nAction: craft 1 x using 1 y", loss=True),
    ]
    return Trajectory(
        task_id="x", env="textcraft", messages=PREFIX + episode, episode_start=2, reward=1.0,
        success=True, n_steps=2, source="expert", finish_reason="done",
    )  # fmt: skip


def test_sft_export_uses_etos_instruction_part_and_roles():
    [item] = write_eto_sft([sample_trajectory()])
    assert item["id"] == "x"
    assert item["conversations"][:2] == [
        {"from": "human", "value": "Craft things."},
        {"from": "gpt", "value": "OK"},
    ]
    assert [t["from"] for t in item["conversations"][2:]] == ["human", "gpt", "human", "gpt"]


def test_sft_round_trip_keeps_the_episode_under_this_runs_prefix():
    original = sample_trajectory()
    [back] = read_eto_sft(write_eto_sft([original]), "textcraft", PREFIX)
    assert back.messages == original.messages
    assert back.episode_start == original.episode_start and back.reward == 1.0


def test_dpo_round_trip():
    t = sample_trajectory()
    pair = Pair(
        task_id="x", prompt=t.prompt, chosen=t.continuation, rejected=t.continuation[:1],
        chosen_reward=1.0, rejected_reward=0.0,
    )  # fmt: skip
    [item] = write_eto_dpo([pair])
    assert item["prompt"][2] == {"from": "human", "value": "Goal: craft x."}
    [back] = read_eto_dpo([item], t.prompt[:1])
    assert back.prompt == t.prompt and back.chosen == pair.chosen and back.rejected == pair.rejected
