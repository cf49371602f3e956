"""Agent-R end to end: the stages on trees with real pairs, and the whole flow with the tiny model.

Real TextCraft, real vLLM (CPU), real trl SFT in a subprocess, real Prefect and MLflow. The tiny
random model never solves a task, so its own trees hold no pair; the stage test builds trees with
`NoisyExpertBackend` (the expert's plan with mistakes) to get pairs, then runs the real stages on
them: path selection, the tiny model's critique through vLLM, the splice, SFT.
"""

from __future__ import annotations

import json

import pytest
from conftest import task_states
from mlflow.tracking import MlflowClient
from scripted_policy import NoisyExpertBackend

from agents.mcts import Critique, SearchLimits, SearchTree, search
from agents.rollout import agent_prefix
from envs import make_env
from flows.agent_r import agent_r, agent_r_campaign
from flywheel.chat import ChatTokenizer
from flywheel.inference import release_vllm
from flywheel.records import Trajectory
from flywheel.settings import EnvSettings, InferenceSettings, SFTSettings
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from tasks.critique import CritiqueInputs, CritiqueSettings, critique_stage
from tasks.select_paths import SelectPathsInputs, select_paths_stage
from tasks.sft import SFTInputs, sft_stage
from tasks.splice import SpliceInputs, splice_stage
from training.datasets import sft_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stages(tmp_path_factory, tiny_model_dir):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("agent-r-stages")
    store = ArtifactStore(str(root / "store"))
    env = make_env("textcraft")
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(tiny_model_dir))
    prefix = agent_prefix(env, [])
    backend = NoisyExpertBackend(env, chat.tokenizer, mistake_rate=0.4)
    limits = SearchLimits(iterations=4, max_depth=7, samples_per_node=3)
    trees = search(env, ["acacia_boat", "birch_boat"], backend, chat, prefix, limits, seed=0)
    trees_url = store.write_records(store.url("mcts/trees.jsonl"), trees)
    model_url = store.upload_dir(tiny_model_dir, store.url("model"))

    def out(name: str) -> StageOutput:
        return StageOutput(store_url=store.root, url=store.url(name))

    paths = select_paths_stage.fn(
        SelectPathsInputs(
            trees_url=trees_url, alpha=0.5, beta=0.2, max_pairs_per_task=3, max_good_per_task=1,
            seed=0,
        ),
        out("paths"),
    )  # fmt: skip
    inference = InferenceSettings(max_tokens=16, kv_cache_gib=1, max_model_len=2048)
    critiques = critique_stage.fn(
        CritiqueInputs(
            model_url=model_url, env=EnvSettings(), trees_url=trees_url,
            pairs_url=paths.files["pairs"], inference=inference,
            settings=CritiqueSettings(max_tokens=16),
        ),
        out("critique"),
    )  # fmt: skip
    release_vllm()
    data = splice_stage.fn(
        SpliceInputs(
            env=EnvSettings(), trees_url=trees_url, pairs_url=paths.files["pairs"],
            good_url=paths.files["good"], critiques_url=critiques.files["critiques"],
            prefix=prefix, mode="revision", include_good=True, seed=0,
        ),
        out("revisions"),
    )  # fmt: skip
    settings = SFTSettings(epochs=1, batch_size=2, max_length=2048)
    model = sft_stage.fn(
        SFTInputs(
            model_url=model_url, data_url=data.files["trajectories"], settings=settings, seed=0
        ),
        out("sft"),
    )  # fmt: skip
    return {
        "store": store, "chat": chat, "paths": paths, "critiques": critiques, "data": data,
        "model": model,
    }  # fmt: skip


@pytest.mark.extended
def test_stages_turn_trees_into_trained_revisions(stages):
    store, paths, critiques, data = (stages[k] for k in ("store", "paths", "critiques", "data"))
    assert paths.counts["pairs"] > 0 and paths.counts["good_paths"] > 0
    judged = store.read_records(critiques.files["critiques"], Critique)
    assert len(judged) == paths.counts["pairs"]
    assert all(c.oracle and len(c.verdicts) >= 1 for c in judged)  # TextCraft has an oracle
    assert "first_error_oracle_agreement" in critiques.metrics
    trajectories = store.read_records(data.files["trajectories"], Trajectory)
    assert data.counts == {
        "trajectories": len(trajectories),
        "revisions": paths.counts["pairs"],
        "good_paths": paths.counts["good_paths"],
    }
    revision = next(t for t in trajectories if t.source == "revision")
    turns = [m for m in revision.continuation if m.role == "assistant"]
    assert not turns[0].loss and turns[-1].loss  # bad prefix unlearned, good path learned
    revision_turn = next(m for m in turns if m.loss)
    assert revision_turn.content.endswith("Action: inventory") and revision_turn.token_ids is None
    (row,), _ = sft_rows([revision], stages["chat"], 2048)
    assert 0 < sum(row["assistant_masks"]) < len(row["input_ids"])
    assert store.exists(stages["model"].files["model"] + "/config.json")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("agent-r")
    config = {
        "run_name": "agent-r-tiny",
        "storage_url": str(root / "store"),
        "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "model": {"base": "tiny"},
        "env": {"train_tasks": 3, "test_tasks": 2, "max_steps": 3, "few_shot": 0},
        "inference": {"max_tokens": 16, "kv_cache_gib": 1, "max_model_len": 2048},
        "rounds": 1,
        "sft": {"epochs": 1, "batch_size": 2, "max_length": 2048},
        "mcts": {"iterations": 2, "max_depth": 3, "samples_per_node": 2},
    }
    first = agent_r(config=config, return_state=True)
    cached = agent_r(config=config, return_state=True)
    campaign = [agent_r_campaign(config=config, return_state=True) for _ in range(3)]
    release_vllm()
    return {"config": config, "first": first, "cached": cached, "campaign": campaign}


def test_flow_runs_a_round_and_reports_why_it_stopped(runs):
    first = runs["first"]
    assert first.is_completed()
    states = task_states(first)
    for stage in ["mcts", "select-paths", "critique", "splice", "sft", "evaluate"]:
        assert set(states[stage]) <= {"Completed"}, (stage, states[stage])
    store = ArtifactStore(runs["config"]["storage_url"])
    trees = store.read_records(store.url("agent-r-tiny/round-1/mcts/trees.jsonl"), SearchTree)
    assert len(trees) == 3 and all(t.iterations >= 1 and len(t.nodes) > 1 for t in trees)
    assert "task " in store.read_text(store.url("agent-r-tiny/round-1/mcts/trees.txt"))
    # A random model solves nothing: no pair, no training; the report says so.
    assert [row["stage"] for row in first.result()] == ["sft"]
    client = MlflowClient(runs["config"]["mlflow_tracking_uri"])
    names = {
        r.data.tags["mlflow.runName"]
        for r in client.search_runs([client.get_experiment_by_name("flywheel").experiment_id])
    }
    assert {"mcts/round-1", "select-paths/round-1", "critique/round-1", "sft/expert"} <= names


def test_rerun_is_cached(runs):
    states = task_states(runs["cached"])
    assert {n: set(s) for n, s in states.items() if n != "report"} == {
        n: {"Cached"} for n in states if n != "report"
    }
    assert runs["cached"].result() == runs["first"].result()
    store = ArtifactStore(runs["config"]["storage_url"])
    rows = json.loads(store.read_text(store.url("agent-r-tiny/results.json")))
    assert [r["stage"] for r in rows] == ["sft"]


def test_a_campaign_on_the_same_store_publishes_a_round_per_run_from_finished_work(runs):
    """The campaign's rounds are the one-shot run's stages: each is served from the cache."""
    round_0, round_1, nothing = runs["campaign"]
    assert "published round 0" in round_0.message and "published round 1" in round_1.message
    states = task_states(round_1)
    assert states and {n: set(s) for n, s in states.items() if n != "report"} == {
        n: {"Cached"} for n in states if n != "report"
    }
    assert nothing.is_completed() and "nothing new to do" in nothing.message
    store = ArtifactStore(runs["config"]["storage_url"])
    state = json.loads(store.read_text(store.url("agent-r-tiny/campaign.json")))
    assert [r["round"] for r in state["rounds"]] == [0, 1]
    # Round 1 found nothing to train on: the policy stays the SFT start, and the note says why.
    assert state["rounds"][1]["policy"] == state["rounds"][0]["policy"]
    assert any("no training data" in n for n in state["rounds"][1]["notes"])
