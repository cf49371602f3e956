"""Every number a run reports, computed on hand-made records whose answers are worked out by
hand: episode statistics, how episodes ended, tree counts, the results table."""

from __future__ import annotations

from agents.episode_metrics import ending_counts
from agents.mcts import SearchTree, TreeNode
from flywheel.records import EpisodeStats, Manifest, Message, Trajectory
from tasks.mcts import tree_counts
from tasks.report import markdown_table, results_rows


def episode(reward: float, success: bool, steps: int, finish: str = "done", recoveries: int = 0):
    return Trajectory(
        task_id="t", env="e", messages=[Message(role="system", content="S")], episode_start=0,
        reward=reward, success=success, n_steps=steps, finish_reason=finish,
        recoveries=recoveries,
    )  # fmt: skip


def test_episode_stats_average_over_all_episodes():
    stats = EpisodeStats.of(
        [
            episode(1.0, True, 3),
            episode(0.0, False, 10),
            episode(0.5, False, 7),
            episode(1.0, True, 4),
        ]  # fmt: skip
    )
    # 2 of 4 solved; rewards 2.5 / 4; steps 24 / 4.
    assert stats == EpisodeStats(
        episodes=4, successes=2, success_rate=0.5, average_reward=0.625, average_steps=6.0
    )
    assert EpisodeStats.of([]) == EpisodeStats(
        episodes=0, successes=0, success_rate=0.0, average_reward=0.0, average_steps=0.0
    )


def test_ending_counts_name_each_ending_and_the_moves_between_servers():
    trajectories = [
        episode(1.0, True, 3, "done"),
        episode(0.0, False, 9, "max_steps", recoveries=2),
        episode(0.0, False, 2, "error: ValueError: bad"),
        episode(1.0, True, 5, "done", recoveries=1),
        episode(0.0, False, 4, "context"),
    ]
    assert ending_counts(trajectories) == {
        "ended_done": 2, "ended_max_steps": 1, "ended_error": 1, "ended_context": 1,
        "retried": 2, "recoveries": 3,
    }  # fmt: skip


def leaf(id, parent, finish, score):
    return TreeNode(id=id, parent=parent, depth=1, finish=finish, score=score, closed=True)


def test_tree_counts_add_up_over_trees():
    solved = SearchTree(
        task_id="a", env="e", expansions=2, duplicates=1, env_steps=5,
        nodes=[TreeNode(id=0, children=[1, 2, 3]), leaf(1, 0, "done", 1.0),
               leaf(2, 0, "max_depth", 0.0), TreeNode(id=3, parent=0, depth=1)],
    )  # fmt: skip
    half = SearchTree(
        task_id="b", env="e", expansions=1, duplicates=0, env_steps=2,
        nodes=[TreeNode(id=0, children=[1]), leaf(1, 0, "done", 0.5)],
    )  # fmt: skip
    assert tree_counts([solved, half]) == {
        "trees": 2, "nodes": 6, "leaves": 3,
        "solved_leaves": 1,  # done with the full score; 0.5 is not solved
        "trees_with_solution": 1, "expansions": 3, "duplicates": 1, "env_steps": 7,
    }  # fmt: skip


def evaluation(successes: int, episodes: int, reward: float, steps: float) -> Manifest:
    return Manifest(
        stage="evaluate", url="file:///r/e", counts={"episodes": episodes, "successes": successes},
        metrics={"success_rate": successes / episodes, "average_reward": reward,
                 "average_steps": steps},
    )  # fmt: skip


def test_results_table_from_known_evaluations():
    evaluations = [
        ("sft", evaluation(4, 26, 4 / 26, 148 / 13)),
        ("dpo round 1", evaluation(13, 26, 0.5, 9.0)),
        (
            "empty",
            Manifest(
                stage="evaluate",
                url="u",
                metrics={"success_rate": 0.0, "average_reward": 0.0, "average_steps": 0.0},
            ),
        ),  # fmt: skip
    ]
    rows = results_rows(evaluations)
    # Wilson 95% intervals, by hand: 4/26 -> [0.0615, 0.3353]; 13/26 -> 0.5 -/+ 0.1794;
    # no episodes say nothing: [0, 1].
    assert rows == [
        {"stage": "sft", "success_rate": 0.1538, "ci95_low": 0.0615, "ci95_high": 0.3353,
         "solved": "4/26", "average_reward": 0.1538, "average_steps": 11.38},
        {"stage": "dpo round 1", "success_rate": 0.5, "ci95_low": 0.3206, "ci95_high": 0.6794,
         "solved": "13/26", "average_reward": 0.5, "average_steps": 9.0},
        {"stage": "empty", "success_rate": 0.0, "ci95_low": 0.0, "ci95_high": 1.0,
         "solved": "0/0", "average_reward": 0.0, "average_steps": 0.0},
    ]  # fmt: skip
    assert markdown_table(rows).splitlines() == [
        "| stage | success rate | 95% interval (Wilson) | solved (n) | average reward "
        "| average steps |",
        "|---|---|---|---|---|---|",
        "| sft | 15.4% | 6.2%–33.5% | 4/26 | 0.154 | 11.4 |",
        "| dpo round 1 | 50.0% | 32.1%–67.9% | 13/26 | 0.500 | 9.0 |",
        "| empty | 0.0% | 0.0%–100.0% | 0/0 | 0.000 | 0.0 |",
    ]
