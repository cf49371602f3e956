"""LoRA adapters instead of full training: the settings and what they refuse, the job that
carries them to the trainer, the adapters on the tiny model (only they train, merged into a plain
model folder), and, slow, SFT and DPO with LoRA through their trainer entry points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
from test_checkpoint_resume import expert_data  # noqa: F401  (a fixture: expert trajectories)

from flywheel.model import lora_adapter
from flywheel.settings import DPOSettings, LoRASettings, RLSettings, SFTSettings
from flywheel.stage import StageOutput, StageRun
from training.checkpoint import CheckpointPlan
from training.job import (
    TrainingJob,
    load_model,
    lora_config,
    new_adapters,
    publishable,
    save_trained,
    with_lora,
)

LORA = LoRASettings(enabled=True, rank=4, alpha=8.0)
ADAPTER = LORA.model_copy(update={"publish": "adapter"})


def job_with(lora: LoRASettings | None = None, model_dir="m", settings_class=SFTSettings, **job):
    """A job for `model_dir` whose settings carry `lora` (None: LoRA off)."""
    settings = settings_class(lora=lora or LoRASettings())
    fields = {"data_file": "d", "output_dir": "o", "seed": 0, **job}
    return TrainingJob(model_dir=str(model_dir), settings=settings, **fields)


def test_lora_is_off_by_default_and_merged_is_what_is_published():
    for settings in (SFTSettings(), DPOSettings(), RLSettings()):
        assert settings.lora == LoRASettings()
    assert (LoRASettings().enabled, LoRASettings().target_modules) == (False, "all-linear")
    assert LoRASettings().publish == "merged"


def test_publishing_the_adapter_alone_is_a_choice():
    assert LoRASettings(enabled=True, publish="adapter").publish == "adapter"
    with pytest.raises(ValidationError):
        LoRASettings(enabled=True, publish="both")


def write_adapter_config(folder: Path, base, rank: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"base_model_name_or_path": str(base), "r": rank, "peft_type": "LORA"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_an_adapter_folder_names_its_base_and_the_rank_vllm_is_sized_for(tmp_path, tiny_model_dir):
    adapter = lora_adapter(write_adapter_config(tmp_path / "a", tiny_model_dir, 4))
    assert (adapter.folder, adapter.base, adapter.rank) == (tmp_path / "a", tiny_model_dir, 4)
    assert adapter.vllm_max_rank == 8  # vLLM's ranks: 1, 8, 16, 32, ...
    assert (
        lora_adapter(write_adapter_config(tmp_path / "b", tiny_model_dir, 16)).vllm_max_rank == 16
    )
    assert (
        lora_adapter(write_adapter_config(tmp_path / "c", tiny_model_dir, 17)).vllm_max_rank == 32
    )
    assert lora_adapter(tiny_model_dir) is None  # a full model folder
    with pytest.raises(FileNotFoundError, match="is not a model folder here"):
        lora_adapter(write_adapter_config(tmp_path / "d", tmp_path / "gone", 4))


@pytest.mark.parametrize("settings_class", [SFTSettings, DPOSettings, RLSettings])
def test_lora_with_frozen_layers_or_zero3_is_refused(settings_class):
    with pytest.raises(ValidationError, match="set frozen_layers=0"):
        settings_class(lora=LORA, frozen_layers=2)
    with pytest.raises(ValidationError, match="use ddp or zero2"):
        settings_class(lora=LORA, accelerate_config="zero3")
    settings_class(lora=LORA.model_copy(update={"enabled": False}), frozen_layers=2)  # off: fine


def test_the_job_carries_lora_to_peft_config():
    job = job_with(LORA)
    config = lora_config(job)
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8.0, 0.0)
    assert config.target_modules == "all-linear" and config.task_type == "CAUSAL_LM"
    assert lora_config(job_with()) is None
    off = LORA.model_copy(update={"enabled": False})
    assert lora_config(job_with(off)) is None
    listed = LORA.model_copy(update={"target_modules": ["q_proj", "v_proj"]})
    assert lora_config(job_with(listed)).target_modules == {
        "q_proj",
        "v_proj",
    }


@pytest.mark.parametrize("stage_name", ["sft", "dpo", "rl"])
def test_each_training_stage_hands_its_lora_settings_to_the_trainer(
    stage_name, tmp_path, monkeypatch
):
    import importlib

    import training.launch

    module = importlib.import_module(f"tasks.{stage_name}")
    handed = []

    def train_to_store(store, module, model_url, data_url, out_url, settings, seed, *rest, **kw):
        handed.append((settings, rest[-1]))  # what `trained_model` hands over: settings, plan
        return {}

    monkeypatch.setattr(training.launch, "train_to_store", train_to_store)
    settings_class = {"sft": SFTSettings, "dpo": DPOSettings, "rl": RLSettings}[stage_name]
    inputs_class = {"sft": "SFTInputs", "dpo": "DPOInputs", "rl": "RLInputs"}[stage_name]
    (tmp_path / "pairs.jsonl").write_text("")
    data = {"pairs_urls": [f"{tmp_path}/pairs.jsonl"]} if stage_name == "dpo" else {"data_url": "d"}
    inputs = getattr(module, inputs_class)(
        model_url="m", settings=settings_class(lora=LORA), seed=0, **data
    )
    run = StageRun(stage_name, StageOutput(store_url=str(tmp_path), url=f"{tmp_path}/s"))
    getattr(module, f"{stage_name}_stage").body(inputs, run)
    settings, checkpoint = handed[0]
    assert settings.lora == LORA
    assert checkpoint is None  # a bare body has no key: no checkpoints
    job = TrainingJob(model_dir="m", data_file="d", output_dir="o", settings=settings, seed=0)
    written = TrainingJob[settings_class].load(str(job.save(tmp_path / "job.json")))
    assert lora_config(written).r == 4  # what the trainer reads back


def test_only_the_adapters_train_and_the_merged_model_is_a_plain_one(tiny_model_dir):
    job = job_with(LORA, tiny_model_dir)
    model = with_lora(load_model(job), job)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert not any("lm_head" in n or "embed" in n for n in trainable)  # all-linear skips them
    merged = publishable(trained_as_if(model))
    base = load_model(job_with(model_dir=tiny_model_dir))
    assert type(merged) is type(base)
    assert merged.state_dict().keys() == base.state_dict().keys()
    changed = [k for k, v in merged.state_dict().items() if not v.equal(base.state_dict()[k])]
    assert changed and all("proj" in k for k in changed)


def test_top_layers_puts_adapters_on_the_top_layers_only(tiny_model_dir):
    """lora.top_layers: the backward stops below the adapted layers, as frozen_layers does."""
    top = LORA.model_copy(update={"top_layers": 1})
    job = job_with(top, tiny_model_dir)
    model = with_lora(load_model(job), job)
    layers = model.config.num_hidden_layers
    adapted = {n.split(".layers.")[1].split(".")[0] for n, p in model.named_parameters()
               if p.requires_grad}  # fmt: skip
    assert adapted == {str(layers - 1)}
    # all-linear's modules, on that layer alone
    assert adapted_modules(model) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"}  # fmt: skip
    assert lora_config(job).layers_to_transform is None  # no model yet: placed when wrapped
    too_many = job_with(top.model_copy(update={"top_layers": layers + 1}))
    with pytest.raises(ValueError, match=f"top_layers={layers + 1} but the model has {layers}"):
        lora_config(too_many, load_model(job_with(model_dir=tiny_model_dir)))


def adapted_modules(model) -> set[str]:
    return {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters()
            if ".lora_A." in n}  # fmt: skip


def trained_as_if(model):
    """`model`'s adapters as if trained (B starts at zero: the adapters would change nothing)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.fill_(0.01)
    return model


def adapter_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}


def test_a_published_adapter_names_its_base_and_the_next_stage_trains_it_further(
    tmp_path, tiny_model_dir
):
    job = job_with(ADAPTER, tiny_model_dir)
    model = trained_as_if(with_lora(load_model(job), job))
    save_trained(model, job, str(tmp_path / "sft"))
    published = sorted(p.name for p in (tmp_path / "sft").iterdir())
    assert published == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert lora_adapter(tmp_path / "sft").base == tiny_model_dir.resolve()

    # the next stage under LoRA: the base with this adapter, trainable, not wrapped again
    next_job = job_with(ADAPTER, tmp_path / "sft")
    resumed = load_model(next_job)
    assert new_adapters(resumed, next_job) is None and with_lora(resumed, next_job) is resumed
    trainable = {n for n, p in resumed.named_parameters() if p.requires_grad}
    assert trainable == set(adapter_weights(model))
    assert all(adapter_weights(resumed)[n].equal(w) for n, w in adapter_weights(model).items())
    # ... publishing the same base again (not the adapter's folder)
    save_trained(resumed, next_job, str(tmp_path / "dpo"))
    assert lora_adapter(tmp_path / "dpo").base == tiny_model_dir.resolve()

    # the next stage under full training: the adapter merged into the base
    merged = load_model(job_with(model_dir=tmp_path / "sft"))
    expected = publishable(model).state_dict()
    assert merged.state_dict().keys() == expected.keys()
    assert all(torch.allclose(v, expected[k], atol=1e-6) for k, v in merged.state_dict().items())


# Slow: the trainers themselves ----------------------------------------------------------------


def lora_job(
    tmp_path: Path, model_dir, data: str, settings_class=SFTSettings, **trl_args
) -> TrainingJob:
    return TrainingJob(
        model_dir=str(model_dir), data_file=data, output_dir=str(tmp_path / "model"),
        settings=settings_class(max_length=512, lora=LORA), seed=3,
        trl_args={"num_train_epochs": 1, "learning_rate": 1e-2,
                  "output_dir": str(tmp_path / "work"), "report_to": "none",
                  "disable_tqdm": True, **trl_args},
    )  # fmt: skip


def assert_a_trained_plain_model(output: Path, base_dir: Path) -> None:
    """The published folder is a plain model (no adapter files) that transformers loads, with
    the base's tensors, some of them moved."""
    from transformers import AutoModelForCausalLM

    assert not (output / "adapter_config.json").exists()
    AutoModelForCausalLM.from_pretrained(output)
    trained, base = (
        load_file(output / "model.safetensors"),
        load_file(base_dir / "model.safetensors"),
    )
    assert trained.keys() == base.keys()
    moved = [k for k in base if not base[k].equal(trained[k])]
    assert moved and all("proj" in k for k in moved)  # only where adapters were merged in


@pytest.mark.slow
def test_sft_with_lora_publishes_a_merged_model(tmp_path, tiny_model_dir, monkeypatch):
    import training.sft as sft
    from agents.rollout import agent_prefix
    from envs import make_env
    from tasks.expert_data import collect_expert

    env = make_env("textcraft")
    trajectories, _ = collect_expert(env, env.task_ids("train")[:2], agent_prefix(env, []))
    data = tmp_path / "expert.jsonl"
    data.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    metrics = sft.train(lora_job(tmp_path, tiny_model_dir, str(data)))
    assert metrics["optimizer_steps"] == 2
    assert_a_trained_plain_model(tmp_path / "model", tiny_model_dir)


def built_dpo_trainers(monkeypatch) -> list:
    """The DPO trainers `training.dpo` builds from now on, kept for the test to inspect."""
    import training.dpo as dpo

    built = []
    original = dpo.TokenizedDPOTrainer.__init__

    def keep(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(dpo.TokenizedDPOTrainer, "__init__", keep)
    return built


@pytest.mark.slow
def test_dpo_with_lora_references_the_base_and_publishes_a_merged_model(
    tmp_path, tiny_model_dir, monkeypatch
):
    from test_dpo_entry import make_pair, write_pairs

    import training.dpo as dpo

    built = built_dpo_trainers(monkeypatch)
    data = write_pairs(tmp_path / "pairs.jsonl", [make_pair(3, 2), make_pair(2, 4)])
    job = lora_job(tmp_path, tiny_model_dir, data, DPOSettings, precompute_ref_log_probs=True)
    metrics = dpo.train(job)
    trainer = built[0]
    # no second model and no copied "ref" adapter: the reference is the base, adapters off
    assert trainer.ref_model is None
    assert list(trainer.model.peft_config) == ["default"]
    assert metrics["optimizer_steps"] == 2
    assert_a_trained_plain_model(tmp_path / "model", tiny_model_dir)
    history = json.loads(json.dumps(trainer.state.log_history))
    first = next(e for e in history if "loss" in e)
    # the first step's policy is the base itself: its rewards (policy vs reference) are zero
    assert first["rewards/chosen"] == 0.0 == first["rewards/rejected"]


@pytest.mark.extended
@pytest.mark.slow
def test_sft_with_lora_killed_mid_training_resumes_to_the_uninterrupted_result(
    tmp_path,
    tiny_model_dir,
    expert_data,  # noqa: F811  (the fixture imported above)
    monkeypatch,
):
    """A checkpoint of a LoRA run holds the adapters (the Trainer's `adapter_model.safetensors`)
    and their optimizer state; resumed, the merged model and the per-step losses are the
    uninterrupted run's."""
    from test_checkpoint_resume import assert_same_weights, killed_and_resumed

    def make_job(folder: Path, checkpoint: CheckpointPlan | None) -> TrainingJob:
        monkeypatch.setenv("FLYWHEEL_METRICS_FILE", str(folder / "metrics.json"))
        job = lora_job(folder, tiny_model_dir, expert_data, num_train_epochs=2)
        job.checkpoint, job.history_file = checkpoint, str(folder / "history.json")
        return job

    through, resumed = killed_and_resumed("training.sft", tmp_path, make_job, total_steps=12)
    assert_same_weights(through[0], resumed[0])

    def per_step(history: list[dict]) -> list[tuple]:
        return [(e["step"], e["loss"], e["grad_norm"]) for e in history if "loss" in e]

    assert per_step(through[1]) == per_step(resumed[1]) and len(per_step(through[1])) == 12
    assert resumed[2]["resumed_from_step"] > 0


@pytest.mark.slow
def test_dpo_from_a_published_adapter_trains_it_against_its_frozen_copy(
    tmp_path, tiny_model_dir, monkeypatch
):
    """SFT publishes its adapter alone; DPO starts from it: the reference is trl's frozen copy
    of that adapter (the SFT policy, not the bare base), and DPO publishes the trained adapter
    alone, naming the same base."""
    from test_dpo_entry import make_pair, write_pairs

    import training.dpo as dpo
    import training.sft as sft
    from agents.rollout import agent_prefix
    from envs import make_env
    from tasks.expert_data import collect_expert

    env = make_env("textcraft")
    trajectories, _ = collect_expert(env, env.task_ids("train")[:2], agent_prefix(env, []))
    data = tmp_path / "expert.jsonl"
    data.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    sft_job = lora_job(tmp_path / "sft", tiny_model_dir, str(data))
    sft_job.settings.lora = ADAPTER
    sft.train(sft_job)
    assert lora_adapter(tmp_path / "sft" / "model").base == tiny_model_dir.resolve()

    built = built_dpo_trainers(monkeypatch)
    pairs = write_pairs(tmp_path / "pairs.jsonl", [make_pair(3, 2), make_pair(2, 4)])
    dpo_job = lora_job(tmp_path / "dpo", tmp_path / "sft" / "model", pairs, DPOSettings)
    dpo_job.settings.lora, dpo_job.trl_args["precompute_ref_log_probs"] = ADAPTER, True
    dpo.train(dpo_job)
    trainer = built[0]
    assert trainer.ref_model is None and sorted(trainer.model.peft_config) == ["default", "ref"]
    history = json.loads(json.dumps(trainer.state.log_history))
    first = next(e for e in history if "loss" in e)
    # the reference is the policy DPO started from: zero rewards at the first step (against the
    # bare base they would not be: SFT moved the adapter)
    assert first["rewards/chosen"] == 0.0 == first["rewards/rejected"]
    published = tmp_path / "dpo" / "model"
    assert lora_adapter(published).base == tiny_model_dir.resolve()
    assert not (published / "ref").exists() and not (published / "model.safetensors").exists()
