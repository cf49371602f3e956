"""The one interface every environment implements.

An `Environment` knows its tasks and starts `Episode`s; an episode is one attempt at one task.
Rollouts keep many episodes alive at once and step them in lockstep, so episodes must be
independent objects (no shared mutable state between two episodes of the same environment).
"""

from __future__ import annotations

import functools
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, TypeVar

# "validation": train tasks held out by the run (`ValidationSplit`), never trained on.
Split = Literal["train", "validation", "test"]
T = TypeVar("T")
R = TypeVar("R")


class EnvironmentUnavailable(ConnectionError):
    """The environment could not be reached (its server is down or hangs): the episode was lost,
    which says nothing about the agent, so it must not count as the agent's failure."""


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    done: bool


class Episode(ABC):
    """One attempt at one task. `instruction` is the first observation the agent sees."""

    task_id: str
    instruction: str

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one action. Invalid actions return an observation saying so, never raise."""

    def snapshot(self) -> Any | None:
        """A copy of the episode's state that `restore` accepts, or None if unsupported."""
        return None

    def restore(self, state: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot restore snapshots")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (remote sessions, processes)."""

    def solved(self) -> bool | None:
        """Whether the episode solved its task, where the environment decides it itself (QA: the
        answer's exact match); None: solved means a full reward (`Environment.normalise`)."""
        return None

    def metrics(self) -> dict[str, float]:
        """Per-episode numbers the environment measures (QA: exact match, F1, tool calls),
        kept on the trajectory and averaged by the stages that play episodes."""
        return {}


@dataclass(frozen=True)
class ValidationSplit:
    """Train tasks a run holds out as its validation split (`env.validation_tasks`): `count` of
    them, a sample seeded by `seed`, drawn from the train tasks the expert solves in at most
    `max_expert_steps` steps (all when None), so they are of the difficulty trained on. The run's
    train split is what remains; settings are chosen on the validation split."""

    count: int = 0
    seed: int = 0
    max_expert_steps: int | None = None

    def carve(self, env: Environment, train_ids: list[str]) -> tuple[list[str], list[str]]:
        """(train, validation) out of the environment's own train tasks, each in their order."""
        if self.count == 0:
            return list(train_ids), []
        limit = self.max_expert_steps
        eligible = [
            t for t in train_ids
            if limit is None or len(env.expert_plan(t) or ()) in range(1, limit + 1)
        ]  # fmt: skip
        if self.count > len(eligible):
            from flywheel.config_files import ConfigError

            within = f" within env.max_expert_steps={limit}" if limit is not None else ""
            raise ConfigError(
                f"env.validation_tasks={self.count}: {env.name} has {len(eligible)} train "
                f"tasks{within} to hold out; ask for fewer"
            )
        held = set(random.Random(self.seed).sample(eligible, self.count))
        return [t for t in train_ids if t not in held], [t for t in train_ids if t in held]


class Environment(ABC):
    """A family of tasks. `reward_range` maps raw rewards onto [0, 1] for shared thresholds."""

    name: str
    # Episodes whose `start` and `step` may run in this many threads at once (remote servers,
    # environments in other processes); 1 = call them one at a time.
    step_workers: int = 1
    reward_range: tuple[float, float] = (0.0, 1.0)
    # At most this many episodes open at once in a rollout (`agents.rollout`: as one ends the next
    # starts), for environments whose sessions are costly; None: every episode at once.
    max_live_episodes: int | None = None
    # What the agent is told once, as the system message: the task family and its actions.
    system_prompt: str = "Solve the task. Reply with 'Thought: ...' then 'Action: ...'."
    # When set, `system_prompt` is not sent as a system message but as the conversation's first
    # user turn, answered by an assistant turn with this text (without loss), before the task's
    # first observation: AgentGym's clients' layout (`agents.rollout.instruction_part`).
    prompt_acknowledgement: str | None = None
    # An action that changes nothing. Agent-R's revision turn takes it, so a revised trajectory
    # is still a sequence of steps the environment really answered.
    noop_action: str = "wait"
    # How the agent writes its moves, an `agents.formats` name. "react": the `Action:` line of a
    # reply is the step's action. A tool format ("tags", "json"): the reply's tool call or answer
    # is, as `envs.tools.call_action` writes it, and a reply that cannot be parsed is stepped
    # too (`envs.tools.malformed_action`), so the environment can score the format.
    agent_format: str = "react"
    # Tool formats: the tools offered, name -> the argument a tag call's body fills.
    tool_arguments: Mapping[str, str] = MappingProxyType({})

    # The run's validation split (`make_env` sets it from the settings); none by default.
    validation: ValidationSplit = ValidationSplit()

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise ValueError saying what to fix when the environment cannot run (a server down,
        an unknown task name); called before any expensive work."""

    @abstractmethod
    def task_ids(self, split: Split) -> list[str]:
        """Stable task ids of a split, in a fixed order, identical on every machine."""

    def carved(self, split: Split, train_ids: list[str]) -> list[str]:
        """The run's "train" or "validation" part of the environment's own train tasks
        `train_ids` (`validation`): environments with a validation split answer `task_ids`
        with it. Computed once per environment (the expert's plans may take seconds)."""
        cache = self.__dict__.setdefault("_carved", {})
        key = (self.validation, tuple(train_ids))
        if key not in cache:
            cache[key] = self.validation.carve(self, train_ids)
        train, validation = cache[key]
        return list(train if split == "train" else validation)

    def validation_ids(self) -> list[str]:
        """The run's validation tasks; none without a validation split (`env.validation_tasks`),
        so an environment need not know the split name then."""
        return self.task_ids("validation") if self.validation.count else []

    @abstractmethod
    def start(self, task_id: str) -> Episode:
        """Start a fresh episode of `task_id`; raises KeyError for an unknown id."""

    def rollout_ended(self) -> None:  # noqa: B027 - optional hook
        """A rollout's episodes are all closed: free what they left idle (processes kept for
        reuse), so the stage that follows has the memory."""

    def step_all(self, moves: list[tuple[Episode, str]]) -> list[StepResult | Exception]:
        """One action for each of many episodes; a step that raised gives its exception in its
        place."""
        return self.in_parallel(_step_or_error, moves)

    def in_parallel(self, work: Callable[[T], R], items: list[T]) -> list[R]:
        """`work` on every item, results in order: in `step_workers` threads when the
        environment allows more than one (starts, steps, a server's batch of steps)."""
        if self.step_workers == 1 or len(items) < 2:
            return [work(item) for item in items]
        return list(self._thread_pool.map(work, items))

    @functools.cached_property
    def _thread_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.step_workers, thread_name_prefix=f"{self.name}-env")

    def expert_plan(self, task_id: str) -> list[tuple[str, str]] | None:
        """(thought, action) steps an expert takes on `task_id`, or None without an expert."""
        return None

    def normalise(self, reward: float) -> float:
        low, high = self.reward_range
        return min(1.0, max(0.0, (reward - low) / (high - low)))

    def mistakes(self, task_id: str, actions: list[str | None]) -> list[bool] | None:
        """An oracle's view of a played path: for each action (None: the reply had none), was it
        a mistake, i.e. does it make the goal unreachable or waste the step? None when the
        environment has no such oracle."""
        return None

    def expert_continuation(
        self, task_id: str, actions: list[str | None]
    ) -> list[tuple[str, str]] | None:
        """(thought, action) steps of the expert's that solve `task_id` from where the played
        path `actions` leaves it, redoing what the path has not done ([] when none can from
        there). None: the environment has none of its own, and Agent-R's expert revisions take
        the shortest suffix of `expert_plan` that solves the task (`tasks.expert_revisions`)."""
        return None


def _step_or_error(move: tuple[Episode, str]) -> StepResult | Exception:
    episode, action = move
    try:
        return episode.step(action)
    except Exception as error:  # reported in place: one episode's failure is not the others'
        return error
