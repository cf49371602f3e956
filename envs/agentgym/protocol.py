"""What every AgentGym server family shares: the endpoints' errors and the `Dialect` a family
fills in (envs/agentgym/dialects/, one file each).

AgentGym's servers (`/create`, `/reset`, `/step`, `/observation`, `/close`) differ per
environment: in the id field, the reset field, the answers' shapes and the reward's meaning.
A `Dialect` holds all of one family's rules, read by the client (`envs.agentgym.client`: parse
its answers), written by the server (`envs.agentgym.server`: answer as it does), and known to the
experts and the compatibility mode. The base class is the plain protocol (TextCraft's shapes);
a family overrides what it does differently.
"""

from __future__ import annotations

import hashlib
from typing import Any

from envs.base import Environment, StepResult


class AgentGymError(RuntimeError):
    """A server answered, but not with what the protocol promises (or with an `error` field)."""

    def __init__(self, message: str, status: int = 200) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status it came with


def answer_field(answer: Any, key: str, endpoint: str) -> Any:
    if not isinstance(answer, dict) or key not in answer:
        shown = sorted(answer) if isinstance(answer, dict) else repr(answer)[:120]
        raise AgentGymError(f"{endpoint} answer lacks {key!r} (got {shown})")
    return answer[key]


def answer_text(answer: Any, key: str, endpoint: str) -> str:
    value = answer_field(answer, key, endpoint)
    if not isinstance(value, str):
        raise AgentGymError(f"{endpoint} answered {key}={value!r}; expected a string")
    return value


def answer_number(answer: Any, key: str) -> float:
    value = answer_field(answer, key, "/step")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AgentGymError(f"/step answered {key}={value!r}; expected a number")
    return float(value)


def served_task_ids(env: Environment) -> list[str]:
    """The order a server indexes tasks in (`data_idx`): train tasks, then the validation tasks
    the run holds out of them (none unless `env.validation_tasks`), then test tasks."""
    return env.task_ids("train") + env.validation_ids() + env.task_ids("test")


def tasks_digest(task_ids: list[str]) -> str:
    return hashlib.sha1("\n".join(task_ids).encode()).hexdigest()


class Dialect:
    """One AgentGym server family: every rule in which it differs from the others."""

    name: str
    id_field = "id"  # names the session in every request after `/create`
    reset_index_field = "data_idx"  # the task index `/reset` takes
    reward_range: tuple[float, float] = (0.0, 1.0)
    # The Flywheel environment that plays this family's game: `serve-env` serves it in this
    # dialect, and `--compat agentgym` emulates the family's server over it. None: none does.
    served_env: str | None = None
    # AgentGym's client's first turn for this family (sent as a user turn answered "OK. ..."),
    # or None: the environment's plain system prompt.
    system_prompt: str | None = None
    # Said when a replayed episode does not start or go as it did before (what could explain it).
    replay_hint = ""
    # Said at the start of `serve-env --compat agentgym` in this dialect, where the emulated
    # server's texts need something of the machine (a hash seed); None when nothing.
    compat_note: str | None = None
    # The service that `serve-env --compat agentgym` answers with as this family's server:
    # "module:class", an `envs.agentgym.compat.AgentGymService` subclass; None: no emulation. A
    # name, imported when such a server starts: the emulation imports its dialect, and the client
    # and the stages that read dialects need none of it.
    emulation: str | None = None

    # ---- the client: reading a server's answers ----

    def parse_id(self, answer: Any) -> int:
        value = self.created_id(answer)
        if isinstance(value, bool) or not isinstance(value, int):
            raise AgentGymError(f"/create answered {answer!r}; expected an integer id")
        return value

    def created_id(self, answer: Any) -> Any:
        """Where a `/create` answer holds the new session's id."""
        return answer_field(answer, "id", "/create")

    def first_observation(self, answer: Any) -> str:
        return answer_text(answer, "observation", "/reset")

    def parse_step(self, answer: Any, last_score: float) -> tuple[StepResult, float]:
        """The step's result and the running score after it."""
        observation = self.step_observation(answer)
        done = answer_field(answer, "done", "/step")
        if not isinstance(done, bool):
            raise AgentGymError(f"/step answered done={done!r}; expected true or false")
        reward, score = self.step_reward(answer, last_score)
        return StepResult(observation, reward, done), score

    def step_observation(self, answer: Any) -> str:
        return answer_text(answer, "observation", "/step")

    def step_reward(self, answer: Any, last_score: float) -> tuple[float, float]:
        """The step's reward and the running score after it: here the server reports the
        reward, and the score is their sum."""
        reward = answer_number(answer, "reward")
        return reward, last_score + reward

    # ---- the server: answering as this family's servers do ----

    def create_answer(self, env_id: int) -> Any:
        return {"id": env_id, "observation": "", "done": False, "reward": 0}

    def reset_answer(self, env_id: int, task_id: str, index: int, instruction: str) -> Any:
        return {"id": env_id, "observation": instruction, "done": False, "reward": 0}

    def step_answer(self, result: StepResult, score: float) -> dict:
        return {"observation": result.observation, "reward": result.reward, "done": result.done}

    # ---- what the project knows of the family's tasks, read from their texts ----

    def reads(self, method: str) -> bool:
        """Whether `method` (task_goal, expert_plan, mistakes) reads anything here: the base's
        answers are None, and the text they read costs an episode started on a server."""
        return getattr(type(self), method) is not getattr(Dialect, method)

    def task_goal(self, instruction: str) -> str | None:
        """The task's goal in a form that does not depend on the server's numbering."""
        return None

    def expert_plan(self, instruction: str, reset_answer: Any) -> list[tuple[str, str]] | None:
        return None

    def mistakes(self, instruction: str, actions: list[str | None]) -> list[bool] | None:
        return None

    # ---- `serve-env --compat agentgym` (envs/agentgym/compat/ emulates the family's server) ----

    def compat_mode(self, options) -> str:
        """What the startup line says of the emulation's options."""
        return ""
