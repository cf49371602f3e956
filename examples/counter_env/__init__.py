"""An environment outside Flywheel's packages, run by every recipe by name alone (from the
repository root, where `examples` is importable; your own package is importable wherever it is
installed):

    PYTHONPATH=. flywheel eto env.name=examples.counter_env:CounterEnv env.options.largest_target=6

or, once a package declares it under the entry-point group `flywheel.environments`
(`counter = "examples.counter_env:CounterEnv"` in its pyproject's
`[project.entry-points."flywheel.environments"]`), as `env.name=counter`.

The task: bring a counter from 0 to a target with `add 1`, `add 2` or `add 3`. Overshooting
ends the episode unsolved. The expert adds 3 while it can.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from envs.base import Environment, Episode, Split, StepResult

ADD = re.compile(r"add ([1-3])")


class CounterSettings(BaseModel):
    """`env.options` of the counter environment."""

    model_config = ConfigDict(extra="forbid")  # a misspelt option is refused, named

    train_tasks: int = Field(default=12, ge=1)  # targets 1, 2, ... cycle through the tasks
    test_tasks: int = Field(default=6, ge=1)
    largest_target: int = Field(default=8, ge=1)


class CounterEpisode(Episode):
    def __init__(self, task_id: str, target: int) -> None:
        self.task_id, self.target, self.value = task_id, target, 0
        self.instruction = f"The counter reads 0. Bring it to exactly {target}."

    def step(self, action: str) -> StepResult:
        if action.strip() == "look":
            return StepResult(f"The counter reads {self.value}.", 0.0, False)
        move = ADD.fullmatch(action.strip())
        if move is None:
            return StepResult(
                "Unknown action; use 'add 1', 'add 2', 'add 3' or 'look'.", 0.0, False
            )
        self.value += int(move[1])
        if self.value > self.target:
            return StepResult(f"The counter reads {self.value}: past the target.", 0.0, True)
        solved = self.value == self.target
        return StepResult(f"The counter reads {self.value}.", float(solved), solved)

    def snapshot(self) -> int:
        return self.value

    def restore(self, state: int) -> None:
        self.value = state


class CounterEnv(Environment):
    """Count to a target: the factory (a class) and its settings model (`Settings`)."""

    Settings = CounterSettings
    name = "counter"
    system_prompt = (
        "Bring the counter to the target exactly. Actions: add 1, add 2, add 3, look.\n"
        "Reply with one line 'Thought: <reasoning>' then one line 'Action: <action>'."
    )
    noop_action = "look"  # changes nothing: Agent-R's revision turn takes it

    def __init__(self, settings: CounterSettings | None = None) -> None:
        self.settings = settings or CounterSettings()

    def task_ids(self, split: Split) -> list[str]:
        if split == "test":
            return [f"test-{i}" for i in range(self.settings.test_tasks)]
        train = [f"train-{i}" for i in range(self.settings.train_tasks)]
        return self.carved(split, train)  # less the run's validation tasks, or only them

    def target(self, task_id: str) -> int:
        split, _, number = task_id.partition("-")
        if split not in ("train", "test") or not number.isdigit():
            raise KeyError(f"unknown counter task {task_id!r}")
        offset = 0 if split == "train" else self.settings.largest_target // 2
        return (int(number) + offset) % self.settings.largest_target + 1

    def start(self, task_id: str) -> Episode:
        return CounterEpisode(task_id, self.target(task_id))

    def expert_plan(self, task_id: str) -> list[tuple[str, str]]:
        plan, left = [], self.target(task_id)
        while left:
            step = min(3, left)
            plan.append((f"{left} to go, so I add {step}.", f"add {step}"))
            left -= step
        return plan
