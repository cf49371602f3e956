"""The report's paired comparisons (issue 34 item 3): which stage each is compared with, tasks
gained and lost, McNemar and the paired interval, the split it names; and, on the QA
environment, where a wrong answer in the right format earns 0.1, a success column that shows
success, not reward."""

from __future__ import annotations

import pytest

from agents.rollout import RolloutSettings, agent_prefix, run_batched
from envs import make_env
from flywheel.records import EpisodeStats, Manifest, Trajectory
from flywheel.settings import EnvSettings
from flywheel.storage import ArtifactStore
from tasks.report import (
    paired_rows,
    paired_table,
    report_markdown,
    report_tables,
    splits_text,
    started_from,
    task_outcomes,
    write_table_files,
)
from tests.test_qa_rollout import ScriptedQABackend, solver_replies

WRONG = "<answer>Nobody</answer>"  # well formed, wrong: the format term's 0.1 and nothing else


def evaluation(store: ArtifactStore, label: str, trajectories: list[Trajectory]) -> Manifest:
    """An evaluation's manifest as the evaluate stage publishes it (agents.rollout)."""
    url = store.write_records(
        store.url("run", "evaluate", label, "trajectories.jsonl"), trajectories
    )
    stats = EpisodeStats.of(trajectories)
    return Manifest(
        stage="evaluate", url=store.url("run", "evaluate", label), files={"trajectories": url},
        counts={"episodes": stats.episodes, "successes": stats.successes},
        metrics={"success_rate": stats.success_rate, "average_reward": stats.average_reward,
                 "average_steps": stats.average_steps},
    )  # fmt: skip


def test_on_qa_the_success_column_and_the_pairs_read_success_not_reward(chat, tmp_path):
    env = make_env(EnvSettings(name="qa"))
    tasks = env.task_ids("test")[:2]
    questions = {t: env.questions("test")[t].question for t in tasks}
    wrong = {t: [*solver_replies(env, t)[:-1], WRONG] for t in tasks}
    store = ArtifactStore(str(tmp_path))

    def evaluated(label: str, scripts: dict[str, list[str]]) -> tuple[str, Manifest]:
        backend = ScriptedQABackend(chat, questions, scripts)
        played = run_batched(
            env, tasks, backend, chat, agent_prefix(env, []), RolloutSettings(max_steps=6)
        )
        return label, evaluation(store, label, played)

    before = evaluated("warm-start", wrong)  # both answered wrong, in the right format
    after = evaluated("rl-round-1", {**wrong, tasks[0]: solver_replies(env, tasks[0])})
    assert before[1].metrics["average_reward"] == pytest.approx(0.1)  # reward and success differ
    assert after[1].metrics["average_reward"] == pytest.approx((1.1 + 0.1) / 2)

    tables = report_tables(store, [before, after], ["warm-start", "rl-round-1"], {})
    rows, paired = tables[""]
    table = report_markdown(tables, "test", {}).splitlines()
    # Success 0 of 2, then 1 of 2: the column shows 0.0% and 50.0%, never 10.0% and 60.0%.
    assert table[2].startswith("| warm-start | 0.0% | 0.0%–65.8% | 0/2 | 0.100 |")
    assert table[3].startswith("| rl-round-1 | 50.0% | 9.4%–90.5% | 1/2 | 0.600 |")
    # Paired on success: one task gained, none lost (on reward > 0 both would be "solved").
    assert [(r["gained"], r["lost"], r["difference"]) for r in paired] == [(1, 0, 0.5)]


def test_each_stage_is_compared_with_the_nearest_earlier_stage_of_its_lineage():
    lineage = ["untrained", "sft", "eto-round-1", "eto-round-2", "eto-round-3"]
    # A campaign round that trained nothing (no eto-round-2): round 3 started from round 1.
    labels = ["untrained", "sft", "direct-revision", "eto-round-1", "eto-round-3"]
    branches = {"direct-revision": "sft", "good-paths-only": "sft"}
    assert started_from(labels, lineage, branches) == {
        "sft": "untrained",
        "direct-revision": "sft",
        "eto-round-1": "sft",
        "eto-round-3": "eto-round-1",
    }
    # ET-Agent evaluates no untrained model: its lineage starts at the warm start.
    assert started_from(["warm-start", "rft"], ["warm-start", "rft", "stage-1"], {}) == {
        "rft": "warm-start"
    }


def test_paired_rows_against_hand_counted_outcomes():
    tasks = [f"t{i}" for i in range(10)]
    sft = {t: i < 4 for i, t in enumerate(tasks)}  # t0-t3 solved
    # Round 1 keeps t0-t2, loses t3, gains t4-t6: 3 gained, 1 lost of 10 tasks.
    round_1 = {t: i in (0, 1, 2, 4, 5, 6) for i, t in enumerate(tasks)}
    outcomes = {"sft": [sft], "eto-round-1": [round_1]}
    [row] = paired_rows(["sft", "eto-round-1"], outcomes, {"eto-round-1": "sft"}, 400)
    assert {k: row[k] for k in ("stage", "started_from", "tasks", "gained", "lost")} == {
        "stage": "eto-round-1", "started_from": "sft", "tasks": 10, "gained": 3, "lost": 1,
    }  # fmt: skip
    assert row["difference"] == 0.2
    assert row["mcnemar_p"] == 0.625  # 2 * (C(4,0) + C(4,1)) / 2^4
    assert row["difference_ci95_low"] < 0.2 < row["difference_ci95_high"]
    assert paired_table([row]).splitlines()[2] == (
        f"| eto-round-1 | sft | 10 | 3 | 1 | +20.0% | {row['difference_ci95_low']:+.1%} to "
        f"{row['difference_ci95_high']:+.1%} | 0.6250 |"
    )


def test_the_report_names_its_split_and_lists_the_held_out_tasks():
    text = splits_text("validation", {"validation": ["a", "b"], "test": ["c"]})
    assert text.splitlines() == [
        "Evaluated on the **validation** split (2 tasks).",
        "- validation tasks (2): a, b",
        "- test tasks (1): c",
    ]
    assert "Choose settings on the validation split" in splits_text("test", {"test": ["c"]})


def test_sampled_outcomes_pair_sample_by_sample_against_hand_counted_cells():
    # Two samples of three tasks. Sample 0: sft solves a; round 1 solves a, b (b gained).
    # Sample 1: sft solves a, c; round 1 solves b (a and c lost, b gained).
    sft = [{"a": True, "b": False, "c": False}, {"a": True, "b": False, "c": True}]
    round_1 = [{"a": True, "b": True, "c": False}, {"a": False, "b": True, "c": False}]
    outcomes = {"sft": sft, "eto-round-1": round_1}
    [row] = paired_rows(["sft", "eto-round-1"], outcomes, {"eto-round-1": "sft"}, 400)
    assert (row["tasks"], row["samples"], row["gained"], row["lost"]) == (3, 2, 2, 2)
    assert row["difference"] == 0.0  # (2 - 2) / 6 cells
    assert row["mcnemar_p"] == 1.0
    assert paired_table([row]).splitlines()[2].startswith("| eto-round-1 | sft | 3 × 2 | 2 | 2 |")


def sampled_trajectory(task_id: str, success: bool) -> Trajectory:
    return Trajectory(
        task_id=task_id, env="textcraft", messages=[], episode_start=0, reward=float(success),
        success=success, n_steps=1, group_id=task_id,
    )  # fmt: skip


def test_a_sampled_evaluations_outcomes_are_read_per_sample_in_stored_order(tmp_path):
    store = ArtifactStore(str(tmp_path))
    # As `run_batched` stores k samples per task: a task's samples in a row, in sample order.
    played = [sampled_trajectory(t, ok) for t, ok in
              [("a", True), ("a", False), ("b", False), ("b", True)]]  # fmt: skip
    outcomes = task_outcomes(store, evaluation(store, "sft@sampled", played))
    assert outcomes == [{"a": True, "b": False}, {"a": False, "b": True}]


def test_each_variant_gets_its_own_tables_comparing_stages_evaluated_the_same_way(tmp_path):
    store = ArtifactStore(str(tmp_path))
    greedy = {"sft": [("a", False)], "eto-round-1": [("a", True)]}
    sampled = {"sft": [("a", True), ("a", True)], "eto-round-1": [("a", False), ("a", True)]}
    evaluations = [
        (label, evaluation(store, label, [sampled_trajectory(t, ok) for t, ok in played]))
        for label, played in [
            ("sft", greedy["sft"]), ("sft@sampled", sampled["sft"]),
            ("eto-round-1", greedy["eto-round-1"]),
            ("eto-round-1@sampled", sampled["eto-round-1"]),
        ]
    ]  # fmt: skip
    tables = report_tables(store, evaluations, ["untrained", "sft", "eto-round-1"], {})
    assert list(tables) == ["", "sampled"]  # the greedy table first
    rows, paired = tables["sampled"]
    assert [r["stage"] for r in rows] == ["sft@sampled", "eto-round-1@sampled"]
    assert [r["solved"] for r in rows] == ["2/2", "1/2"]
    [row] = paired  # round 1 against SFT, both sampled: one cell lost
    assert (row["stage"], row["started_from"], row["gained"], row["lost"]) == (
        "eto-round-1@sampled", "sft@sampled", 0, 1,
    )  # fmt: skip
    assert [(r["gained"], r["lost"]) for r in tables[""][1]] == [(1, 0)]
    text = report_markdown(tables, "test", {})
    assert "### Sampled episodes" in text and text.index("| sft |") < text.index("### Sampled")


def test_a_report_without_sampled_episodes_removes_an_earlier_runs_sampled_tables(tmp_path):
    # The same run name re-run without `evaluate.samples`: the sampled tables of the earlier
    # run (another policy's episodes) must not be left beside the new greedy ones.
    store = ArtifactStore(str(tmp_path))
    run_url = store.url("run")
    row = [{"stage": "sft", "success_rate": 0.5}]
    write_table_files(store, run_url, {"": (row, []), "sampled": (row, [])})
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "paired-sampled.json", "paired.json", "results-sampled.json", "results.json",
    ]  # fmt: skip
    write_table_files(store, run_url, {"": (row, [])})
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["paired.json", "results.json"]
