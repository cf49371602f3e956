"""Evaluation variants (issue 34 item 4): k seeded samples per held-out task beside the greedy
episode, and harder goals than the run trained on, each reported in a table of its own."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from envs import make_env
from flows.eto import ETO, ETOConfig
from flywheel.config_files import ConfigError
from flywheel.settings import EnvSettings, EvaluateSettings, InferenceSettings
from flywheel.storage import ArtifactStore
from tasks.evaluate import (
    EvaluateInputs,
    harder_tasks,
    label_variant,
    variant_inputs,
    variant_label,
)

EASY = dict(name="textcraft", max_expert_steps=4, test_tasks=26)


def test_the_variants_each_setting_asks_for():
    assert EvaluateSettings().variants() == []
    assert EvaluateSettings(samples=4).variants() == ["sampled"]
    assert EvaluateSettings(harder_max_expert_steps=8).variants() == ["harder"]
    assert EvaluateSettings(samples=4, harder_max_expert_steps=8).variants() == [
        "sampled", "harder", "harder-sampled",
    ]  # fmt: skip
    assert variant_label("sft", "sampled") == "sft@sampled" and variant_label("sft", "") == "sft"
    assert label_variant("eto-round-1@harder-sampled") == ("eto-round-1", "harder-sampled")
    assert label_variant("eto-round-1") == ("eto-round-1", "")


def test_harder_goals_are_the_test_tasks_beyond_the_trained_difficulty():
    env = make_env("textcraft")
    harder = harder_tasks(env, EnvSettings(**EASY), 8)
    plan_lengths = {len(env.expert_plan(t)) for t in harder}
    # The test split's expert plans of 5 to 8 steps: 10 + 11 + 17 + 6 tasks.
    assert len(harder) == 44 and plan_lengths == {5, 6, 7, 8}
    assert set(harder) <= set(env.task_ids("test"))
    assert not set(harder) & set(env.task_ids("train"))
    with pytest.raises(ConfigError, match="no test task of textcraft has an expert plan of 5 to"):
        harder_tasks(env, EnvSettings(**EASY), 4)


def test_settings_refuse_harder_goals_that_cannot_be_told_apart():
    with pytest.raises(ValidationError, match="needs env.max_expert_steps"):
        ETOConfig.model_validate({"evaluate": {"harder_max_expert_steps": 8}})
    with pytest.raises(ValidationError, match="must exceed env.max_expert_steps=4"):
        ETOConfig.model_validate({"env": EASY, "evaluate": {"harder_max_expert_steps": 4}})
    with pytest.raises(ValidationError, match="leave it unset while tuning"):
        ETOConfig.model_validate({
            "env": {**EASY, "validation_tasks": 5},
            "evaluate": {"harder_max_expert_steps": 8, "split": "validation"},
        })  # fmt: skip
    with pytest.raises(ValidationError, match="several episodes per task need temperature > 0"):
        EvaluateInputs.model_validate({**greedy_inputs().model_dump(), "samples_per_task": 2})


def greedy_inputs() -> EvaluateInputs:
    return EvaluateInputs(
        model_url="file:///m", env=EnvSettings(**EASY), task_ids=["a", "b"], prefix=[],
        inference=InferenceSettings(), max_steps=6,
    )  # fmt: skip


def test_a_variant_changes_only_its_tasks_or_its_sampling():
    settings = EvaluateSettings(samples=3, temperature=0.7, harder_max_expert_steps=8)
    greedy = greedy_inputs()
    sampled = variant_inputs(greedy, "sampled", settings, ["h"], seed=5)
    assert (sampled.task_ids, sampled.samples_per_task, sampled.temperature, sampled.seed) == (
        ["a", "b"], 3, 0.7, 5,
    )  # fmt: skip
    harder = variant_inputs(greedy, "harder", settings, ["h"], seed=5)
    # Greedy episodes do not depend on the seed: every seed's run shares their cache.
    assert (harder.task_ids, harder.samples_per_task, harder.temperature, harder.seed) == (
        ["h"], 1, 0.0, 0,
    )  # fmt: skip
    both = variant_inputs(greedy, "harder-sampled", settings, ["h"], seed=5)
    assert (both.task_ids, both.samples_per_task, both.seed) == (["h"], 3, 5)


def test_a_recipe_lists_the_harder_goals_it_reports(tmp_path):
    config = ETOConfig.model_validate(
        {"env": EASY, "evaluate": {"harder_max_expert_steps": 5, "samples": 2}}
    )
    recipe = ETO(config, ArtifactStore(str(tmp_path)), None)
    assert len(recipe.splits["harder"]) == 10 and len(recipe.evaluation_ids) == 26
    assert not set(recipe.splits["harder"]) & set(recipe.train_ids)


def test_a_harder_goal_gets_its_plan_plus_the_trained_slack_in_steps():
    from ops.driver import harder_step_budget

    # Trained: plans of <= 4 steps in 6-step episodes (slack 2); harder plans of <= 8 get 10.
    assert harder_step_budget(EnvSettings(**EASY, max_steps=6), 8) == 10
    assert harder_step_budget(EnvSettings(**EASY, max_steps=4), 8) == 8
    # Never fewer steps than the trained episodes, even with no slack to carry over.
    assert harder_step_budget(EnvSettings(**EASY, max_steps=2), 3) == 3
    assert harder_step_budget(EnvSettings(**EASY, max_steps=12), 5) == 13


def test_a_recipe_plays_harder_goals_with_room_to_reach_them(tmp_path, monkeypatch):
    """At the trained `env.max_steps` an 8-step goal could not be reached in 6 steps; the harder
    evaluations get the longer budget, the greedy and sampled ones keep the trained one."""
    import ops.driver
    from flywheel.records import Manifest

    played = {}

    def recorded(inputs, out):  # the inputs each evaluation stage was given, no episodes
        played[out.label] = inputs
        return Manifest(stage="evaluate", url=out.url)

    monkeypatch.setattr(ops.driver, "evaluate_stage", recorded)
    config = ETOConfig.model_validate({
        "env": {**EASY, "max_steps": 6},
        "evaluate": {"harder_max_expert_steps": 8, "samples": 2},
    })  # fmt: skip
    recipe = ETO(config, ArtifactStore(str(tmp_path)), None)
    recipe.evaluate("sft", "file:///model")
    steps = {label: inputs.max_steps for label, inputs in played.items()}
    assert steps == {"sft": 6, "sft@sampled": 6, "sft@harder": 10, "sft@harder-sampled": 10}
    assert len(played["sft@harder"].task_ids) == 44


def test_the_untrained_model_gets_no_sampled_episodes_and_every_trained_policy_does(
    tmp_path, monkeypatch
):
    """The untrained model samples every reply to max_tokens: its sampled evaluation cost more
    than all trained stages' (Agent-R1, 2026-11-28); its greedy and harder ones stay."""
    import ops.driver
    from flywheel.records import Manifest

    played = []

    def recorded(inputs, out):
        played.append(out.label)
        files = {"model": "file:///m", "trajectories": "file:///t"}
        return Manifest(stage="evaluate", url=out.url, files=files)

    monkeypatch.setattr(ops.driver, "evaluate_stage", recorded)
    config = ETOConfig.model_validate({
        "env": EASY, "evaluate": {"harder_max_expert_steps": 8, "samples": 2},
    })  # fmt: skip
    recipe = ETO(config, ArtifactStore(str(tmp_path)), None)
    for stage in ("base_model", "expert_trajectories"):
        monkeypatch.setattr(recipe, stage, lambda s=stage: recorded(None, recipe.out("x", s)))
    monkeypatch.setattr(recipe, "sft", lambda *args: recorded(None, recipe.out("x", "sft-stage")))
    recipe.start()
    recipe.evaluate("sft", "file:///model")
    evaluations = [label for label in played if "@" in label or label in ("untrained", "sft")]
    assert evaluations == [
        "untrained", "untrained@harder", "sft", "sft@sampled", "sft@harder", "sft@harder-sampled",
    ]  # fmt: skip


@pytest.mark.slow
def test_a_recipe_runs_every_variant_of_an_evaluation_and_the_report_tables_them(tmp_path):
    """The tiny model in vLLM: the greedy evaluation, then its variants, handed to the round by
    `take_variants`; the sampled ones seeded, so a second recipe reads them from the cache."""
    from flywheel.inference import release_vllm
    from tasks.report import report_tables

    config = ETOConfig.model_validate({
        "model": {"base": "tiny"}, "env": {**EASY, "test_tasks": 2, "max_steps": 2},
        "inference": {"max_tokens": 8, "kv_cache_gib": 1},
        "evaluate": {"harder_max_expert_steps": 5, "samples": 2},
    })  # fmt: skip
    store = ArtifactStore(str(tmp_path))
    recipe = ETO(config, store, None)
    model = recipe.base_model().files["model"]
    try:
        label, greedy = recipe.evaluate("untrained", model)
        variants = dict(recipe.take_variants())
        again = ETO(config, store, None)
        again.evaluate("untrained", model)
        cached = dict(again.take_variants())
    finally:
        release_vllm()
    assert recipe.take_variants() == []  # handed over once
    assert (label, greedy.counts["episodes"]) == ("untrained", 2)
    assert {k: m.counts["episodes"] for k, m in variants.items()} == {
        "untrained@sampled": 4, "untrained@harder": 10, "untrained@harder-sampled": 20,
    }  # fmt: skip
    assert variants["untrained@sampled"].url.endswith("/evaluate-sampled/untrained")
    assert {k: m.checksums for k, m in cached.items()} == {
        k: m.checksums for k, m in variants.items()
    }
    tables = report_tables(store, [(label, greedy), *variants.items()], recipe.lineage(), {})
    assert list(tables) == ["", "sampled", "harder", "harder-sampled"]
    assert tables["harder-sampled"][0][0]["solved"].endswith("/20")


def test_the_driver_adds_the_variants_of_every_evaluation_a_round_ran():
    from flywheel.records import Manifest
    from ops.driver import Recipe, RoundResult, evaluated

    def manifest(label: str) -> Manifest:
        return Manifest(stage="evaluate", url=f"file:///run/{label}")

    class Evaluating(Recipe):  # `Recipe`'s bookkeeping, without playing episodes
        def __init__(self):
            pass

        def evaluate(self, label, model_url, prefix=None):
            self.pending_variants += ((variant_label(label, "sampled"), manifest(label)),)
            return label, manifest(label)

        def policy_label(self, round_no):
            return "sft"

        def log_curve(self, metrics, round_no, prefix):
            pass

    recipe = Evaluating()
    untrained = recipe.evaluate("untrained", "m")  # what round 0 evaluated itself
    result = evaluated(recipe, 0, RoundResult(policy="p", evaluations=[untrained]))
    assert [label for label, _ in result.evaluations] == [
        "untrained", "sft", "untrained@sampled", "sft@sampled",
    ]  # fmt: skip
    # A round that trained nothing adds no evaluation of its own, but keeps what it ran.
    recipe.evaluate("direct-revision", "m")
    kept = evaluated(recipe, 1, RoundResult(evaluations=[]))
    assert [label for label, _ in kept.evaluations] == ["direct-revision@sampled"]
