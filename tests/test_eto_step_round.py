"""ETO's round at the step level (`explore.level: step`), its stages answered by a planner: which
stages run, with what, and what DPO trains on against which reference."""

from __future__ import annotations

from pathlib import Path

from flows.eto import ETO, ETOConfig
from flywheel.config_files import load_config
from flywheel.records import Manifest
from flywheel.stage import planning
from flywheel.storage import ArtifactStore
from ops.driver import RoundState

ROOT = Path(__file__).resolve().parents[1]
STEP_CONFIG = str(ROOT / "configs/eto_textcraft_step.yaml")
ROUND_2 = RoundState(
    round=2, policy="file:///p", start_policy="file:///sft", carry={"expert": "file:///e.jsonl"}
)


class PairingStages:
    """Every stage answered with a manifest of its own; `pairs` pairs from each pairing stage."""

    def __init__(self, pairs: dict[str, int]):
        self.pairs, self.asked = pairs, []

    def __call__(self, name, keyed, code, out) -> Manifest:
        self.asked.append((name, keyed))
        files = {k: f"{out.url}/{k}" for k in ("trajectories", "pairs", "model")}
        counts = {"pairs": self.pairs[name]} if name in self.pairs else {}
        return Manifest(stage=name, url=out.url, files=files, counts=counts)


def round_2(tmp_path, pairs: dict[str, int], *overrides: str):
    cfg = load_config(ETOConfig, STEP_CONFIG, [f"storage_url={tmp_path}", *overrides])
    stages = PairingStages(pairs)
    with planning(stages):
        recipe = ETO(cfg, ArtifactStore(str(tmp_path)), None)
        return recipe, stages.asked, recipe.round(ROUND_2)


def test_a_step_round_pairs_episodes_and_steps_and_trains_against_the_sft_model(tmp_path):
    recipe, asked, result = round_2(tmp_path, {"build-pairs": 3, "step-pairs": 2})
    names = [name for name, _ in asked]
    assert names == ["explore-shard", "explore-shard", "build-pairs", "step-pairs", "dpo"]
    steps, dpo = asked[3][1], asked[4][1]
    explored = sorted(t for _, keyed in asked[:2] for t in keyed["task_ids"])
    assert sorted(steps["task_ids"]) == explored  # the same slice of train tasks
    assert steps["model_url"] == "file:///p" and steps["expert_url"] == "file:///e.jsonl"
    assert (steps["rollouts"], steps["temperature"]) == (2, 1.0)
    run = recipe.run_url
    assert dpo["pairs_urls"] == [f"{run}/round-2/pairs/pairs", f"{run}/round-2/step-pairs/pairs"]
    assert dpo["model_url"] == "file:///p" and dpo["reference_url"] == "file:///sft"
    assert dpo["settings"]["nll_weight"] == 1.0
    assert result.policy == f"{run}/round-2/dpo/model"


def test_step_pairs_alone_are_enough_to_train(tmp_path):
    _, asked, result = round_2(tmp_path, {"build-pairs": 0, "step-pairs": 2})
    assert asked[-1][0] == "dpo" and result.policy is not None
    _, asked, result = round_2(tmp_path, {"build-pairs": 0, "step-pairs": 0})
    assert asked[-1][0] == "step-pairs" and result.policy is None
    assert "no preference pairs" in result.notes[0]


def test_the_trajectory_level_is_etos_round_against_the_policy_itself(tmp_path):
    overrides = ("explore.level=trajectory", "dpo.reference=policy")
    _, asked, _ = round_2(tmp_path, {"build-pairs": 3}, *overrides)
    assert [name for name, _ in asked][-2:] == ["build-pairs", "dpo"]
    assert asked[-1][1]["reference_url"] is None


def test_balanced_step_pairs_go_to_dpo_in_place_of_the_step_pairs(tmp_path):
    recipe, asked, _ = round_2(
        tmp_path,
        {"build-pairs": 3, "step-pairs": 2, "step-balance": 1},
        "explore.step_balance=true",
    )
    names = [name for name, _ in asked]
    assert names[-3:] == ["step-pairs", "step-balance", "dpo"]
    run = recipe.run_url
    assert asked[-2][1]["pairs_url"] == f"{run}/round-2/step-pairs/pairs"
    assert asked[-1][1]["pairs_urls"][-1] == f"{run}/round-2/step-balance/pairs"
