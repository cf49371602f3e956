"""ET-Agent's calibration stage: Pareto-selected groups, efficiency rewards, sigma per iteration."""

from __future__ import annotations

import json
import math

import pytest

from flywheel.records import Message, Trajectory
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from tasks.calibrate import CalibrateInputs, CalibrationSettings, calibrate_stage, iteration_sigmas


def episode(group: str, f1: float, calls: int, tokens: int, valid: bool = True) -> Trajectory:
    reply = Message(role="assistant", content="x", token_ids=list(range(tokens)), loss=True)
    return Trajectory(
        task_id=group, env="qa", group_id=group, episode_start=1, reward=0.5,
        messages=[Message(role="system", content="s"), Message(role="user", content="q"), reply],
        metrics={"f1": f1, "exact_match": float(f1 == 1.0), "tool_calls": calls,
                 "format_valid": float(valid)},
    )  # fmt: skip


def calibrate(tmp_path, trajectories, iteration=0, **settings):
    store = ArtifactStore(f"file://{tmp_path}")
    data = store.write_records(store.url("sample", "trajectories.jsonl"), trajectories)
    inputs = CalibrateInputs(
        data_url=data, settings=CalibrationSettings(**settings), iteration=iteration
    )
    out = StageOutput(store_url=store.root, url=store.url("calibrate"))
    manifest = calibrate_stage.fn(inputs, out)
    kept = store.read_records(manifest.files["trajectories"], Trajectory)
    return manifest, kept, json.loads(store.read_text(manifest.files["selection"]))


GROUPS = [
    # mixed: right with 1 call and 10 tokens, wrong with 3 calls, right with 2 calls and 30 tokens
    episode("mixed", 1.0, 1, 10), episode("mixed", 0.0, 3, 20), episode("mixed", 1.0, 2, 30),
    # all wrong, but their tool calls vary most: front 1, dropped by the mixed-result filter
    episode("wrong", 0.0, 0, 10), episode("wrong", 0.0, 6, 10), episode("wrong", 0.0, 0, 10),
    # all right with the same calls: dominated, dropped by the budget
    episode("right", 1.0, 1, 10), episode("right", 1.0, 1, 10), episode("right", 1.0, 1, 10),
]  # fmt: skip


def test_only_mixed_groups_are_kept_with_efficiency_rewards(tmp_path):
    manifest, kept, selection = calibrate(tmp_path, GROUPS, budget=2)
    assert {t.group_id for t in kept} == {"mixed"}
    assert manifest.counts == {"groups": 3, "kept_groups": 1, "episodes": 3}
    assert "dropped" in selection["reasons"]["wrong"] and "failed" in selection["reasons"]["wrong"]
    assert "budget of 2" in selection["reasons"]["right"]
    # by hand: mean calls 2, so f_tool = 2/(1+e^{0.2*(T-2)}); lengths 10,20,30: z = -1.2247, 0,
    # 1.2247 (population std 8.165), f_length = 2/(1+e^{0.5*z})
    f_tool = [2 / (1 + math.exp(0.2 * d)) for d in (-1, 1, 0)]
    f_len = [2 / (1 + math.exp(0.5 * z)) for z in (-1.224745, 0.0, 1.224745)]
    expected = [1 * f_tool[0] * f_len[0], 0.0, 1 * f_tool[2] * f_len[2]]
    assert [t.reward for t in kept] == pytest.approx(expected, rel=1e-5)
    assert expected[0] > 1 > expected[2]  # fewer calls and tokens than the group: more reward


def test_sigma_falls_over_the_stage_iterations(tmp_path):
    settings = CalibrationSettings(iterations=4)
    assert iteration_sigmas(settings, 0) == (0.2, 0.5)
    assert iteration_sigmas(settings, 2) == pytest.approx((0.1, 0.25))
    _, kept, _ = calibrate(tmp_path, GROUPS, iteration=3, budget=2, iterations=4)
    f_tool = 2 / (1 + math.exp(0.05 * -1))
    f_len = 2 / (1 + math.exp(0.125 * -1.224745))
    assert kept[0].reward == pytest.approx(f_tool * f_len, rel=1e-5)


def test_exact_match_correctness_and_format_penalty(tmp_path):
    group = [episode("g", 0.9, 1, 10), episode("g", 0.2, 1, 10, valid=False)]
    _, kept, _ = calibrate(tmp_path, group, correctness="exact_match", success_threshold=0.5)
    assert kept == []  # on exact match both are wrong: nothing to compare
    _, kept, _ = calibrate(tmp_path, group, success_threshold=0.5)  # on F1: 0.9 vs 0.2
    assert [t.reward for t in kept] == pytest.approx([0.9, 0.2 - 1.0])


def test_episodes_without_a_group_are_refused(tmp_path):
    lone = episode("g", 1.0, 1, 10).model_copy(update={"group_id": None})
    with pytest.raises(ValueError, match="samples_per_task"):
        calibrate(tmp_path, [lone])


def test_plain_keeps_every_group_and_its_reward(tmp_path):
    manifest, kept, selection = calibrate(tmp_path, GROUPS, method="plain", budget=1)
    assert [t.reward for t in kept] == [0.5] * 9
    assert manifest.counts["kept_groups"] == 3 and set(selection["kept"]) == {
        "mixed",
        "wrong",
        "right",
    }
