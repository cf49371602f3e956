"""The validation split (issue 34 item 2): train tasks a run holds out, seeded and stable, of the
trained difficulty, disjoint from the train tasks every stage reads and from the test tasks; and
the settings that ask for it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agents.rollout import few_shot_examples
from envs import make_env
from envs.base import ValidationSplit
from envs.task_selection import task_list
from flows.eto import ETOConfig
from flywheel.config_files import ConfigError
from flywheel.settings import EnvSettings
from ops.driver import run_task_lists


def splits_of(settings: EnvSettings, seed: int = 0) -> dict[str, list[str]]:
    """What a run trains on and evaluates on, as ops/driver.py's Recipe computes them."""
    return run_task_lists(make_env(settings), settings, seed)


EASY = dict(name="textcraft", max_expert_steps=4, test_tasks=26)


def test_textcraft_validation_is_held_out_of_training_and_apart_from_test():
    splits = splits_of(EnvSettings(**EASY, validation_tasks=20))
    train, validation, test = splits["train"], splits["validation"], splits["test"]
    # 99 train tasks within 4 expert steps: 20 held out, 79 left to train on.
    assert (len(train), len(validation), len(test)) == (79, 20, 26)
    assert not set(train) & set(validation)
    assert not set(validation) & set(test) and not set(train) & set(test)
    # Of the trained difficulty: every validation task is within the run's max_expert_steps.
    env = make_env("textcraft")
    assert all(1 <= len(env.expert_plan(t)) <= 4 for t in validation)
    # Without a validation split, the same run trains on all 99 and evaluates on test alone.
    plain = splits_of(EnvSettings(**EASY))
    assert sorted(plain["train"]) == sorted(train + validation) and "validation" not in plain


def test_the_validation_split_is_seeded_stable_and_apart_from_the_runs_seed():
    settings = EnvSettings(**EASY, validation_tasks=20)
    first = make_env(settings).task_ids("validation")
    assert make_env(settings).task_ids("validation") == first  # a new process, the same tasks
    assert splits_of(settings, seed=1)["validation"] == first  # every run seed holds out the same
    assert first[:3] == ["birch_boat", "black_terracotta", "brown_terracotta"]  # pinned
    other = make_env(EnvSettings(**EASY, validation_tasks=20, validation_seed=1))
    assert other.task_ids("validation") != first


def test_no_stage_trains_on_a_validation_task():
    settings = EnvSettings(name="textcraft", validation_tasks=40, few_shot=3)
    env = make_env(settings)
    held = set(env.task_ids("validation"))
    # Expert data, explore, MCTS and RL read the run's train list or the environment's train
    # split; the untrained model's worked examples come from the train split too.
    assert not held & set(task_list(env, "train", settings, 0))
    assert not held & set(env.task_ids("train"))
    assert not held & {t.task_id for t in few_shot_examples(env, settings.few_shot)}


def test_qa_validation_questions_are_train_questions_the_run_does_not_train_on():
    env = make_env(EnvSettings(name="qa", validation_tasks=5))
    validation, train = env.task_ids("validation"), env.task_ids("train")
    assert len(validation) == 5 and not set(validation) & set(train)
    assert set(validation) <= set(env.questions("train"))  # carved from train, not from test
    assert not set(validation) & set(env.task_ids("test"))
    episode = env.start(validation[0])  # played with the train split's corpus, as written for
    assert episode.record.id == validation[0]


def test_asking_for_more_than_the_train_tasks_of_that_difficulty_is_refused():
    env = make_env(EnvSettings(**EASY, validation_tasks=100))
    with pytest.raises(ConfigError, match="env.validation_tasks=100: textcraft has 99 train"):
        env.task_ids("train")
    # The train list left over is what train_tasks counts against.
    settings = EnvSettings(**EASY, validation_tasks=20, train_tasks=99)
    with pytest.raises(ConfigError, match="env.train_tasks=99"):
        task_list(make_env(settings), "train", settings, 0)


def test_carving_keeps_the_split_order_and_takes_nothing_when_asked_for_none():
    env = make_env("textcraft")
    ids = env.task_ids("train")[:10]
    assert ValidationSplit().carve(env, ids) == (ids, [])
    train, held = ValidationSplit(count=3, seed=7).carve(env, ids)
    assert len(held) == 3 and sorted(train + held) == sorted(ids)
    assert train == [t for t in ids if t in train] and held == [t for t in ids if t in held]


def test_settings_refuse_a_validation_split_that_cannot_exist():
    with pytest.raises(ValidationError, match="evaluate.split=validation needs a validation"):
        ETOConfig.model_validate({"evaluate": {"split": "validation"}})
    config = ETOConfig.model_validate(
        {"env": {"validation_tasks": 5}, "evaluate": {"split": "validation"}}
    )
    assert config.evaluate.split == "validation"
    with pytest.raises(ValidationError, match="has no validation split"):
        EnvSettings(
            name="agentgym-textcraft", servers=["http://localhost:1"], validation_tasks=5,
            agentgym={"train": (0, 10), "test": (10, 20)},
        )  # fmt: skip


def test_scienceworld_validation_variations_come_from_its_train_variations():
    from envs.scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv(["lifespan-longest-lived"], variations=3)
    train, test = env.task_ids("train"), env.task_ids("test")
    env.validation = ValidationSplit(count=1, seed=0)
    held = env.task_ids("validation")
    assert len(held) == 1 and set(held) <= set(train) and not set(held) & set(test)
    assert sorted(env.task_ids("train") + held) == sorted(train)
    assert env.task_ids("test") == test


def test_a_recipe_evaluates_on_the_split_its_settings_name_and_trains_apart_from_it(tmp_path):
    from flows.et_agent import ETAgent
    from flows.eto import ETO
    from flywheel.storage import ArtifactStore

    overrides = {"env": {**EASY, "validation_tasks": 20}, "rounds": 2}
    store = ArtifactStore(str(tmp_path))
    tuning = ETO(
        ETOConfig.model_validate({**overrides, "evaluate": {"split": "validation"}}), store, None
    )
    reporting = ETO(ETOConfig.model_validate(overrides), store, None)
    assert tuning.evaluation_ids == tuning.splits["validation"] == reporting.splits["validation"]
    assert (
        reporting.evaluation_ids == reporting.splits["test"] and len(reporting.evaluation_ids) == 26
    )
    assert tuning.train_ids == reporting.train_ids  # tuning and reporting train on the same tasks
    assert not set(tuning.train_ids) & set(tuning.evaluation_ids)
    # The report pairs each stage with the one it started from.
    assert tuning.lineage() == ["untrained", "sft", "eto-round-1", "eto-round-2"]
    assert ETAgent.lineage_start == "warm-start"


def test_environment_servers_still_serve_every_task_with_a_validation_split():
    from envs.agentgym.protocol import served_task_ids

    plain = served_task_ids(make_env("textcraft"))
    held = make_env(EnvSettings(name="textcraft", validation_tasks=5))
    served = served_task_ids(held)
    assert sorted(served) == sorted(plain) and len(served) == 321 + 98
    assert served[321 - 5 : 321] == held.task_ids("validation")  # after the train tasks


def test_every_seed_of_a_run_evaluates_the_same_test_tasks_and_trains_on_its_own_sample(tmp_path):
    """A bench pairs its seeds task by task, so the test tasks a run samples from a larger split
    (QA: 120 of 165) must not depend on the run's seed; its train sample does."""
    from flows.agent_r1 import AgentR1, AgentR1Config
    from flywheel.storage import ArtifactStore

    store = ArtifactStore(str(tmp_path))
    qa = {"name": "qa", "train_tasks": 64, "test_tasks": 120, "validation_tasks": 40}
    runs = [
        AgentR1(AgentR1Config.model_validate({"env": qa, "seed": seed}), store, None)
        for seed in (0, 1)
    ]
    assert len(runs[0].env.task_ids("test")) == 165  # so 120 of them is a sample
    assert runs[0].splits["test"] == runs[1].splits["test"] and len(runs[0].splits["test"]) == 120
    assert runs[0].train_ids != runs[1].train_ids  # each seed trains on its own 64
