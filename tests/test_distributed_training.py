"""SFT on two processes (torchrun, gloo on the CPU) learns what one process learns: the same
sequences per optimizer step, so the same losses and the same weights, up to float rounding."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from agents.rollout import agent_prefix
from envs import make_env
from flywheel.settings import SFTSettings
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from tasks.expert_data import collect_expert
from tasks.sft import SFTInputs, sft_stage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    store = ArtifactStore(str(tmp_path_factory.mktemp("ddp") / "store"))
    env = make_env("textcraft")
    trajectories, _ = collect_expert(env, env.task_ids("train")[:8], agent_prefix(env, []))
    data = store.write_records(store.url("expert.jsonl"), trajectories)
    runs = {}
    for processes in (1, 2):
        # 2 sequences per step: both accumulated on one process, or one on each of two; a
        # constant learning rate so that every one of the 4 steps moves the weights.
        settings = SFTSettings(
            epochs=1, batch_size=2, max_length=512, num_processes=processes, learning_rate=1e-3,
            trl_args={"lr_scheduler_type": "constant", "warmup_steps": 0},
        )  # fmt: skip
        inputs = SFTInputs(
            model_url=f"file://{tiny_model_dir}", data_url=data, settings=settings, seed=0
        )
        out = StageOutput(store_url=store.root, url=store.url(f"sft-{processes}"), label="ddp")
        runs[processes] = sft_stage.fn(inputs, out)
    return store, runs


def test_two_processes_learn_what_one_process_learns(trained, tiny_model_dir):
    store, runs = trained
    one, two = runs[1], runs[2]
    assert (one.metrics["processes"], two.metrics["processes"]) == (1, 2)
    assert one.metrics["optimizer_steps"] == two.metrics["optimizer_steps"] == 4
    assert two.metrics["train_loss"] == pytest.approx(one.metrics["train_loss"], rel=1e-3)
    weights = [
        load_file(store.local_dir(m.files["model"]) / "model.safetensors") for m in (one, two)
    ]
    assert weights[0].keys() == weights[1].keys()
    start = load_file(tiny_model_dir / "model.safetensors")
    trained = max((weights[0][k] - start[k]).abs().max().item() for k in start)
    apart = max((weights[0][k] - weights[1][k]).abs().max().item() for k in start)
    assert trained > 1e-3  # training moved the weights...
    assert apart < trained / 100  # ...and both runs moved them the same way


@pytest.mark.extended
def test_rl_on_two_processes_learns_what_one_process_learns(tmp_path, tiny_model_dir, chat):
    """The RL trainer under torchrun: each process trains its share of every optimizer batch
    (all of them computed the starting pass and advantages), DDP sums the gradients."""
    from test_rl import colour_group

    from flywheel.settings import RLSettings
    from tasks.rl import RLInputs, rl_stage

    store = ArtifactStore(str(tmp_path / "store"))
    data = store.write_records(store.url("group.jsonl"), colour_group(chat))
    runs = {}
    for processes in (1, 2):
        settings = RLSettings(
            estimator="grpo", learning_rate=1e-3, epochs=2, batch_size=4, kl_beta=0.01,
            num_processes=processes,
        )  # fmt: skip
        inputs = RLInputs(
            model_url=f"file://{tiny_model_dir}", data_url=data, settings=settings, seed=0
        )
        runs[processes] = rl_stage.fn(inputs, StageOutput(store_url=store.root,
                                                          url=store.url(f"rl-{processes}")))  # fmt: skip
    one, two = runs[1], runs[2]
    assert (one.metrics["processes"], two.metrics["processes"]) == (1, 2)
    assert one.metrics["optimizer_steps"] == two.metrics["optimizer_steps"] == 2
    assert two.metrics["loss_tokens_trained"] == one.metrics["loss_tokens_trained"]
    weights = [
        load_file(store.local_dir(m.files["model"]) / "model.safetensors") for m in (one, two)
    ]
    start = load_file(tiny_model_dir / "model.safetensors")
    trained = max((weights[0][k] - start[k]).abs().max().item() for k in start)
    apart = max((weights[0][k] - weights[1][k]).abs().max().item() for k in start)
    assert trained > 1e-4 and apart < trained / 100
