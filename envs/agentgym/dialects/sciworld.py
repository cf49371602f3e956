"""AgentGym's SciWorld servers (agentenv_sciworld): a cumulative score instead of rewards.

`/create` answers `{"id"}`; the first observation is the reset answer's `task_description` +
newline + `observation`; `/step` answers a cumulative `score` (0-100, -100 on failure), turned
into per-step rewards (score differences) by the client.
"""

from __future__ import annotations

from typing import Any

from envs.agentgym.expert import SCIWORLD_PROMPT, sciworld_plan
from envs.agentgym.protocol import Dialect, answer_number, answer_text
from envs.base import StepResult


class SciWorldDialect(Dialect):
    name = "sciworld"
    reward_range = (0.0, 100.0)
    served_env = "scienceworld"
    system_prompt = SCIWORLD_PROMPT
    emulation = "envs.agentgym.compat.sciworld:AgentGymSciWorldService"

    def first_observation(self, answer: Any) -> str:
        observation = answer_text(answer, "observation", "/reset")
        return f"{answer_text(answer, 'task_description', '/reset')}\n{observation}"

    def step_reward(self, answer: Any, last_score: float) -> tuple[float, float]:
        score = answer_number(answer, "score")
        return score - last_score, score

    def create_answer(self, env_id: int) -> Any:
        return {"id": env_id}

    def reset_answer(self, env_id: int, task_id: str, index: int, instruction: str) -> Any:
        description, _, observation = instruction.partition("\n")
        return {
            "task_name": task_id, "var_num": index, "task_description": description,
            "observation": observation, "reward": 0, "score": 0, "deleted": False, "done": False,
        }  # fmt: skip

    def step_answer(self, result: StepResult, score: float) -> dict:
        return {**super().step_answer(result, score), "score": score}

    def expert_plan(self, instruction: str, reset_answer: Any) -> list[tuple[str, str]] | None:
        """ScienceWorld's gold path for the task and variation the `/reset` answer names."""
        return sciworld_plan(reset_answer) if isinstance(reset_answer, dict) else None


SCIWORLD = SciWorldDialect()
