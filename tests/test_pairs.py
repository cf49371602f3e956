from flywheel.records import Message, Trajectory
from tasks.build_pairs import build_pairs

PREFIX = [Message(role="system", content="sys")]


def trajectory(task_id, reward, turns, source="policy", trailing_observation=False):
    messages = PREFIX + [Message(role="user", content=f"Goal: {task_id}")]
    for i in range(turns):
        messages.append(Message(role="assistant", content=f"{source} act {i}", loss=True))
        if i < turns - 1 or trailing_observation:
            messages.append(Message(role="user", content=f"Observation: {i}"))
    return Trajectory(
        task_id=task_id, env="t", messages=messages, episode_start=1, reward=reward,
        success=reward >= 1, n_steps=turns, source=source,
    )  # fmt: skip


def test_expert_wins_when_exploration_fails():
    pairs, report = build_pairs([trajectory("a", 0.0, 3)], [trajectory("a", 1.0, 3, "expert")])
    assert report.losses == 1 and len(pairs) == 1
    assert pairs[0].chosen[0].content == "expert act 0"
    assert pairs[0].rejected[0].content == "policy act 0"
    assert (pairs[0].chosen_reward, pairs[0].rejected_reward) == (1.0, 0.0)
    assert pairs[0].prompt[-1].content == "Goal: a"


def test_ties_are_skipped():
    pairs, report = build_pairs([trajectory("a", 1.0, 2)], [trajectory("a", 1.0, 3, "expert")])
    assert pairs == [] and report.ties == 1


def test_roles_swap_when_exploration_beats_expert():
    pairs, report = build_pairs([trajectory("a", 1.0, 5)], [trajectory("a", 0.5, 2, "expert")])
    assert report.wins == 1
    assert pairs[0].chosen[0].content == "policy act 0"
    assert len(pairs[0].chosen) == 9  # the winner is never truncated
    assert pairs[0].rejected[0].content == "expert act 0"


def test_failed_exploration_is_truncated_to_expert_length_plus_extra_turns():
    expert = trajectory("a", 1.0, 3, "expert")  # 5 continuation messages
    explored = trajectory("a", 0.0, 30)
    pairs, _ = build_pairs([explored], [expert], extra_turns=5)
    assert len(pairs[0].rejected) == 5 + 2 * 5  # ETO: explored[: len(expert) + 5 * 2]
    assert pairs[0].rejected[-1].role == "assistant"
    assert pairs[0].chosen[-1].role == "assistant"


def test_sides_end_on_agent_turns_and_tasks_without_expert_are_counted():
    explored = [trajectory("a", 0.0, 2, trailing_observation=True), trajectory("b", 0.0, 2)]
    pairs, report = build_pairs(explored, [trajectory("a", 1.0, 2, "expert")])
    assert len(pairs) == 1 and pairs[0].rejected[-1].role == "assistant"
    assert report.no_expert == 1


def test_explorations_the_environment_crashed_are_skipped_and_counted():
    crashed = trajectory("a", 0.0, 2).model_copy(
        update={"finish_reason": "error: ConnectionResetError: peer closed"}
    )
    lost = trajectory("b", 0.0, 2).model_copy(update={"finish_reason": "lost: server gone"})
    failed = trajectory("c", 0.0, 2).model_copy(update={"finish_reason": "max_steps"})
    experts = [trajectory(t, 1.0, 2, "expert") for t in "abc"]
    pairs, report = build_pairs([crashed, lost, failed], experts)
    # Only the policy's own failure is paired; the crash and the lost episode are not its doing.
    assert [p.task_id for p in pairs] == ["c"]
    assert (report.crashed, report.losses, report.ties, report.dropped) == (2, 1, 0, 0)
