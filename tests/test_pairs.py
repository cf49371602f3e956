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


def test_a_round_of_explorations_of_every_kind_is_paired_and_counted():
    """Two of each outcome, in an order where stopping early or counting once would show."""
    crashed = trajectory("c1", 0.0, 2).model_copy(update={"finish_reason": "error: X: y"})
    explored = [
        trajectory("x1", 0.0, 2), trajectory("x2", 0.0, 2),  # no expert for these
        trajectory("t1", 1.0, 2), trajectory("t2", 1.0, 3),  # ties
        crashed, crashed.model_copy(update={"task_id": "c2"}),
        trajectory("w1", 1.0, 2), trajectory("w2", 1.0, 4),  # exploration beats the expert
        trajectory("l1", 0.0, 3, trailing_observation=True),  # expert wins; ends on an observation
        trajectory("l2", 0.0, 30),  # expert wins; cut to the expert's length + 5 turns
        trajectory("d1", 0.0, 0), trajectory("d2", 0.0, 0),  # nothing but the task: dropped
    ]  # fmt: skip
    experts = {t: 1.0 for t in ["t1", "t2", "c1", "c2", "l1", "l2", "d1", "d2"]}
    experts |= {"w1": 0.5, "w2": 0.5}
    pairs, report = build_pairs(
        explored, [trajectory(t, r, 2, "expert") for t, r in experts.items()]
    )
    assert vars(report) == {
        "wins": 2, "ties": 2, "losses": 4, "dropped": 2, "no_expert": 2, "crashed": 2,
    }  # fmt: skip
    assert [p.task_id for p in pairs] == ["w1", "w2", "l1", "l2"]
    w2, l1, l2 = pairs[1], pairs[2], pairs[3]
    assert len(w2.chosen) == 7 and w2.chosen[-1].content == "policy act 3"
    # l1's trailing observation goes; its three replies and two observations stay.
    assert [m.content for m in l1.rejected] == [
        "policy act 0", "Observation: 0", "policy act 1", "Observation: 1", "policy act 2",
    ]  # fmt: skip
    assert len(l2.rejected) == 3 + 2 * 5  # ETO's default: the expert's 3 messages + 5 turns
