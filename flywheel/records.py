"""Typed records passed between stages and stored as JSON lines.

A trajectory keeps, next to each generated message's text, the exact token ids the model produced,
so training sees what was generated (re-tokenising text drifts). `loss` marks the messages a
trainer learns from: assistant turns by default, none of the observations.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_validator

Role = Literal["system", "user", "assistant"]


class Message(BaseModel):
    role: Role
    content: str
    loss: bool = False
    # Token ids exactly as generated (assistant turns sampled from a model), without the end token.
    token_ids: list[int] | None = None
    # Whether the model generated the turn's end token itself (turns with `token_ids` only). False
    # when it stopped on a stop string or at max_tokens: the turn end was added for it, so no loss
    # goes on those tokens (a loss on a token the model never sampled can blow up).
    end_generated: bool = True
    # The sampler's log-probability of each of `token_ids` (the behaviour policy's, which an RL
    # trainer's importance ratio divides by); None where the backend did not return them.
    logprobs: list[float] | None = None
    # On an agent turn: the environment's reward for the action it took (per-step rewards);
    # None where the turn took no step (no action parsed, an expert or imported trajectory).
    reward: float | None = None


def opening_length(messages: list[Message]) -> int:
    """How many messages open a conversation, before any worked example or episode: the system
    message (1), or, in AgentGym's clients' layout, the task prompt as a user turn and the
    assistant's acknowledgement of it (2)."""
    if len(messages) > 1 and messages[0].role == "user" and messages[1].role == "assistant":
        return 2
    return 1


class Trajectory(BaseModel):
    """One episode: the full chat, where the episode's own part starts, and its outcome."""

    task_id: str
    env: str
    messages: list[Message]
    # Index of the first message that belongs to this episode (before it: system prompt, examples).
    episode_start: int
    reward: float = 0.0
    success: bool = False
    n_steps: int = 0
    source: str = "policy"  # "expert", "policy", "revision", ...
    finish_reason: str = ""  # "done", "max_steps", "context", "error: ..."
    # Episodes sampled together to be compared with each other (a GRPO group: one task, several
    # samples); None outside such a group.
    group_id: str | None = None
    # Times the episode was moved to another environment server (its own died) and replayed.
    # A record of a fault, not of the episode: never stored (a stage's manifest counts it,
    # `counts.retried` and `counts.recoveries`), so a server that died under an episode changes
    # no file's bytes and no cache key downstream of it.
    recoveries: int = Field(default=0, exclude=True)
    # What the environment measured on the episode (`Episode.metrics`: exact match, tool calls).
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def prompt(self) -> list[Message]:
        """The opening (`opening_length`: the system prompt, or the task prompt and its "OK")
        and the task instruction, without worked examples.

        Examples help an untrained model at inference; training leaves them out (as ETO does),
        which keeps sequences short.
        """
        head = min(opening_length(self.messages), max(self.episode_start, 1))
        return [*self.messages[:head], self.messages[self.episode_start]]

    @property
    def training_messages(self) -> list[Message]:
        return self.prompt + self.continuation

    @property
    def continuation(self) -> list[Message]:
        return self.messages[self.episode_start + 1 :]


class Pair(BaseModel):
    """A preference pair on one task: `chosen` and `rejected` continue the same `prompt`."""

    task_id: str
    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]
    chosen_reward: float
    rejected_reward: float
    # A step-level pair's agent turn (0-based) where the two sides part (`tasks.step_pairs`);
    # None for a pair of whole episodes.
    step: int | None = None


class EpisodeStats(BaseModel):
    episodes: int
    successes: int
    success_rate: float
    average_reward: float
    average_steps: float

    @classmethod
    def of(cls, trajectories: list[Trajectory]) -> EpisodeStats:
        n = len(trajectories)
        wins = sum(t.success for t in trajectories)
        return cls(
            episodes=n,
            successes=wins,
            success_rate=wins / n if n else 0.0,
            average_reward=sum(t.reward for t in trajectories) / n if n else 0.0,
            average_steps=sum(t.n_steps for t in trajectories) / n if n else 0.0,
        )


class FileDigest(BaseModel):
    size: int
    sha256: str


class Manifest(BaseModel):
    """What a finished stage published: written last, so its presence means the stage finished.

    It is the stage's cache entry too (see `ArtifactStore.manifest`): the key it was computed
    for, the content digests of what it read, and the size and sha256 of every file it wrote."""

    stage: str
    url: str
    files: dict[str, str] = Field(default_factory=dict)  # logical name -> URL
    counts: dict[str, int] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    inputs_digest: str = ""  # settings + upstream content + code version
    upstream: dict[str, str] = Field(default_factory=dict)  # input URL -> its content digest
    checksums: dict[str, FileDigest] = Field(default_factory=dict)  # file (relative to url)
    code_version: str = ""  # one digest of `code` and `libraries`
    # The stage's code (flywheel.code_version): each module of its import closure (and data file)
    # -> the digest of its syntax tree; and the library versions. `flywheel status` names what
    # changed from these. A manifest without them predates per-stage code versions.
    code: dict[str, str] = Field(default_factory=dict)
    libraries: dict[str, str] = Field(default_factory=dict)
    # What the key was computed from: the stage's name and inputs as JSON (artifact URLs as
    # URLs; their content is in `upstream`), so a changed setting can be named.
    key_inputs: dict[str, Any] = Field(default_factory=dict)
    published_at: str = ""
    # Set when a run found this stage finished for its key, instead of computing it.
    _served_from_store: bool = PrivateAttr(default=False)

    def relative(self, file_url: str) -> str:
        """How `checksums` names a file: relative to the stage's folder when inside it."""
        inside = file_url.startswith(self.url + "/")
        return file_url[len(self.url) + 1 :] if inside else file_url

    def absolute(self, name: str) -> str:
        return name if "://" in name else f"{self.url}/{name}"

    @property
    def served_from_store(self) -> bool:
        return self._served_from_store


class FailedStage(BaseModel):
    """Why a stage failed and what it left: written into the stage's folder (`_FAILED.json`)
    when it fails, removed when the stage is published. Shown as a Prefect artifact too."""

    stage: str
    task_run: str  # Prefect's name for the task run, as the UI shows it
    flow_run_id: str | None = None
    failed_at: str  # ISO time, UTC
    message: str  # the exception, as a person reads it
    inputs: dict[str, str | list[str]] = Field(default_factory=dict)  # parameter -> URL(s)
    partial_outputs: list[str] = Field(default_factory=list)  # what the stage had written
    mlflow_run: str | None = None  # the failed stage's MLflow run (the flow run's, if it has none)


class CampaignRound(BaseModel):
    """One published round of a campaign: the policy the next round starts from, and how the
    round's models did on the test tasks."""

    round: int
    policy: str  # model URL
    evaluations: list[tuple[str, Manifest]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    flow_run_id: str | None = None
    published_at: str


class Campaign(BaseModel):
    """A campaign's state in the artifact store (`<run>/campaign.json`): the rounds published so
    far. Round 0 is the starting point (SFT on expert trajectories)."""

    name: str
    recipe: str
    # URLs that round 0 fixed for later rounds (ETO: "expert", the expert trajectories).
    carry: dict[str, str] = Field(default_factory=dict)
    rounds: list[CampaignRound] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _expert_is_carried(cls, data):
        """A campaign stored before `carry` kept ETO's expert trajectories as `expert`."""
        if isinstance(data, dict) and "expert" in data:
            data = dict(data)
            expert = data.pop("expert")
            if expert:
                data["carry"] = {"expert": expert, **data.get("carry", {})}
        return data
