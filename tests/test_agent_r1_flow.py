"""Agent-R1 end to end: sampled QA groups through the RL stage, and the whole flow with the tiny
model.

Real QA environment (BM25 search, sandboxed python), real vLLM (CPU) in the flow, the RL trainer
in its own process, real Prefect and MLflow. The tiny random model never answers, so its groups
carry no reward variance and the flow's round says so; the stage test gets groups with variance
from a scripted model that answers right in one sample of each pair and wrong in the other.
"""

from __future__ import annotations

import pytest
from conftest import task_states, tiny_tool_recipe
from mlflow.tracking import MlflowClient
from test_qa_rollout import ScriptedQABackend, solver_replies

from agents.rollout import RolloutSettings, agent_prefix, run_batched
from envs import make_env
from flows.agent_r1 import agent_r1
from flywheel.inference import release_vllm
from flywheel.records import Trajectory
from flywheel.settings import EnvSettings, RLSettings
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from tasks.rl import RLInputs, rl_stage

pytestmark = pytest.mark.slow


class RightThenWrong(ScriptedQABackend):
    """The solver's replies in even samples; odd samples answer wrong at once (the first call
    has every episode, a task's samples in a row), so each group has a win and a loss."""

    def generate(self, prompts, sampling):
        replies = super().generate(prompts, sampling)
        if len(self.calls) == 1:
            replies[1::2] = [self._wrong() for _ in replies[1::2]]
        return replies

    def _wrong(self):
        from flywheel.inference import Generation

        text = "<answer>Nowhere</answer>"
        ids = self.chat.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += [self.chat.tokenizer.eos_token_id]
        return Generation(text, ids, "stop", [-0.5] * len(ids))


def test_sampled_groups_train_through_the_rl_stage(tmp_path, tiny_model_dir, chat):
    env = make_env(EnvSettings(name="qa"))
    tasks = [t for t in env.task_ids("train") if t.startswith("founder_birth_town/")][:2]
    questions = {t: env.questions("train")[t].question for t in tasks}
    backend = RightThenWrong(chat, questions, {t: solver_replies(env, t) for t in tasks})
    trajectories = run_batched(
        env, tasks, backend, chat, agent_prefix(env, []), RolloutSettings(6), False, 2
    )
    assert [t.success for t in trajectories] == [True, False, True, False]
    store = ArtifactStore(str(tmp_path / "store"))
    data = store.write_records(store.url("sample/trajectories.jsonl"), trajectories)
    model = store.upload_dir(tiny_model_dir, store.url("model"))
    settings = RLSettings(estimator="grpo", learning_rate=1e-4, kl_beta=0.0, batch_size=4)
    trained = rl_stage.fn(
        RLInputs(model_url=model, data_url=data, settings=settings, seed=0),
        StageOutput(store_url=store.root, url=store.url("rl")),
    )
    assert trained.metrics["groups"] == 2 and trained.metrics["groups_zero_reward_variance"] == 0
    assert trained.metrics["rows_skipped_zero_advantage"] == 0
    # the loss tokens are the replies the policy sampled: not the tool results between them
    replies = [m for t in trajectories for m in t.messages if m.token_ids]
    sampled = sum(len(m.token_ids) for m in replies) + sum(m.end_generated for m in replies)
    assert trained.metrics["loss_tokens_trained"] == sampled
    assert store.exists(trained.files["model"] + "/config.json")


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("agent-r1")
    config = tiny_tool_recipe("agent-r1-tiny", root)
    state = agent_r1(config=config, return_state=True)
    release_vllm()
    return {"config": config, "state": state}


def test_the_flow_warm_starts_samples_groups_and_says_why_it_stopped(run):
    state, config = run["state"], run["config"]
    assert state.is_completed()
    states = task_states(state)
    for stage in ["expert-trajectories", "sft", "evaluate", "sample"]:
        assert set(states[stage]) <= {"Completed"}, (stage, states[stage])
    assert "rl" not in states  # no group had reward variance: nothing to train
    assert [row["stage"] for row in state.result()] == ["untrained", "warm-start"]
    store = ArtifactStore(config["storage_url"])
    sampled = store.read_records(
        store.url("agent-r1-tiny/round-1/sample/trajectories.jsonl"), Trajectory
    )
    assert len(sampled) == 4 and len({t.group_id for t in sampled}) == 2
    replies = [m for t in sampled for m in t.continuation if m.role == "assistant"]
    assert replies and all(m.logprobs and len(m.logprobs) == len(m.token_ids) for m in replies)
    assert "every group's episodes earned the same reward" in store.read_text(
        store.url("agent-r1-tiny/results.md")
    )
    client = MlflowClient(config["mlflow_tracking_uri"])
    experiment = client.get_experiment_by_name("flywheel").experiment_id
    parent = next(
        r for r in client.search_runs([experiment]) if "mlflow.parentRunId" not in r.data.tags
    )
    curve = client.get_metric_history(parent.info.run_id, "rollout/zero_variance_groups")
    assert [(m.step, m.value) for m in curve] == [(1, 1.0)]
    evaluations = client.get_metric_history(parent.info.run_id, "evaluate/success_rate")
    assert [m.step for m in evaluations] == [0]


@pytest.mark.extended
def test_vllm_records_the_logprobs_of_the_distribution_it_sampled_from(tiny_model_dir, chat):
    """At temperature 2 a sampled token's recorded log-probability is the tempered one the RL
    trainer computes (`training.rl.Policy` at the sampling temperature), not the raw model's."""
    import torch
    from transformers import AutoModelForCausalLM

    from flywheel.inference import SamplingSettings, shared_vllm
    from training.rl import Policy

    prompt = chat.tokenizer("The sky is", add_special_tokens=False)["input_ids"]
    sampling = SamplingSettings(temperature=2.0, max_tokens=6, seed=3, logprobs=True)
    sampling = sampling.with_request_seeds([3])  # a sampled request names its seed
    try:
        (generation,) = shared_vllm(str(tiny_model_dir), 512, 1).generate([prompt], sampling)
    finally:
        release_vllm()
    ids = torch.tensor([prompt + generation.token_ids])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    n = len(generation.token_ids)
    with torch.no_grad():
        tempered = Policy(model, None, temperature=2.0)(ids)[0][0, -n:]
        raw = Policy(model, None, temperature=1.0)(ids)[0][0, -n:]
    recorded = torch.tensor(generation.logprobs)
    assert torch.allclose(recorded, tempered, atol=1e-3)
    assert not torch.allclose(recorded, raw, atol=1e-2)


@pytest.mark.extended
def test_a_ppo_policy_with_its_value_head_loads_in_vllm(tmp_path, tiny_model_dir, chat):
    """PPO saves its value head with the policy; the next sampling or evaluation loads that
    folder in vLLM, which takes every *.safetensors at its top for the model's weights (a value
    head there failed the bench's PPO run: "no module or parameter named 'bias'")."""
    from flywheel.inference import SamplingSettings, shared_vllm
    from flywheel.records import Message, Trajectory
    from flywheel.settings import RLSettings
    from training import rl
    from training.job import TrainingJob

    def answered(text: str) -> Trajectory:
        ids = chat.tokenizer(text, add_special_tokens=False)["input_ids"]
        reply = Message(role="assistant", content=text, loss=True, token_ids=ids)
        question = Message(role="user", content="Which colour is the sky?")
        return Trajectory(task_id="q", env="qa", messages=[question, reply], episode_start=0,
                          reward=float(text == "blue"), group_id="q")  # fmt: skip

    data = tmp_path / "group.jsonl"
    data.write_text("".join(answered(c).model_dump_json() + "\n" for c in ("blue", "red")))
    settings = RLSettings(estimator="ppo", learning_rate=1e-3, batch_size=2, max_length=512)
    job = TrainingJob(model_dir=str(tiny_model_dir), data_file=str(data),
                      output_dir=str(tmp_path / "model"), settings=settings, seed=0)  # fmt: skip
    rl.train(job)
    assert (tmp_path / "model" / rl.VALUE_HEAD_FILE).is_file()
    prompt = chat.tokenizer("The sky is", add_special_tokens=False)["input_ids"]
    try:
        (generation,) = shared_vllm(job.output_dir, 512, 1).generate(
            [prompt], SamplingSettings(temperature=0.0, max_tokens=4, seed=0)
        )
    finally:
        release_vllm()
    assert generation.token_ids
