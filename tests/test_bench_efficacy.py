"""The efficacy bench's arithmetic: tokens to reach a stage, the orderings it checks, the
bootstrap interval's ends."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import efficacy  # noqa: E402


def test_tokens_to_reach_a_stage_add_sft_and_every_round_up_to_its_own():
    tokens = {"sft": 100, "round-1/dpo": 10, "round-2/dpo": 20, "round-2/revision-sft": 5}
    assert efficacy.cumulative_tokens(tokens, "untrained") == 0
    assert efficacy.cumulative_tokens(tokens, "sft") == 100
    assert efficacy.cumulative_tokens(tokens, "eto-round-1") == 110
    assert efficacy.cumulative_tokens(tokens, "agent-r-round-2") == 135


def test_orderings_mark_each_predicted_order_per_seed():
    rates = {
        0: {"eto:sft": 0.1, "eto:eto-round-1": 0.2, "eto:eto-round-2": 0.2,
            "agent-r:agent-r-round-2": 0.3},
        1: {"eto:sft": 0.2, "eto:eto-round-1": 0.2, "eto:eto-round-2": 0.1,
            "agent-r:agent-r-round-2": 0.0},
    }  # fmt: skip
    assert efficacy.orderings(rates, 2) == [
        "- seed 0: SFT < ETO round 1: holds, ETO round 1 <= round 2: holds, "
        "ETO round 2 <= Agent-R round 2: holds",
        "- seed 1: SFT < ETO round 1: does not hold, ETO round 1 <= round 2: does not hold, "
        "ETO round 2 <= Agent-R round 2: does not hold",
    ]


def test_the_bootstrap_interval_is_a_point_when_every_seed_and_task_agree():
    solved = [{"a": True, "b": True}, {"a": True, "b": True}]
    assert efficacy.bootstrap_interval(solved, 200) == (1.0, 1.0)
    mixed = [{"a": True, "b": False}, {"a": True, "b": False}]
    low, high = efficacy.bootstrap_interval(mixed, 400)
    assert low == 0.0 and high == 1.0  # resampling tasks alone can pick only a, or only b


def test_every_budget_is_valid_settings_of_its_recipe():
    from flywheel.settings import AgentRConfig, ETOConfig, load_config

    models = {"eto": ETOConfig, "agent-r": AgentRConfig}
    for gpu in (False, True):
        for recipe, (_, config) in efficacy.RECIPES.items():
            overrides = [*efficacy.BUDGET, *efficacy.recipe_budget(recipe, gpu), "rounds=2"]
            settings = load_config(models[recipe], str(efficacy.ROOT / config), overrides)
            assert settings.env.test_tasks == 26 and settings.rounds == 2
            slices = settings.explore if recipe == "eto" else settings.mcts
            assert slices.tasks_per_round == (99 if gpu else 32)
