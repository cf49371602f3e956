"""AgentGym's WebShop servers (agentenv_webshop): their own field names and answer shapes.

Id field `env_idx`; `/create` answers a bare int; `/reset` takes `session_id` and answers
`[observation, null]`; `/step` answers `{"state", "reward", "done", "info"}`, reward in [0, 1].
No expert, no oracle, no emulated server: the project does not play WebShop's game itself.
"""

from __future__ import annotations

from typing import Any

from envs.agentgym.protocol import AgentGymError, Dialect, answer_text
from envs.base import StepResult


class WebShopDialect(Dialect):
    name = "webshop"
    id_field = "env_idx"
    reset_index_field = "session_id"

    def created_id(self, answer: Any) -> Any:
        return answer

    def first_observation(self, answer: Any) -> str:
        if not (isinstance(answer, list) and answer and isinstance(answer[0], str)):
            raise AgentGymError(f"/reset answered {answer!r}; expected [observation, null]")
        return answer[0]

    def step_observation(self, answer: Any) -> str:
        return answer_text(answer, "state", "/step")

    def create_answer(self, env_id: int) -> Any:
        return env_id

    def reset_answer(self, env_id: int, task_id: str, index: int, instruction: str) -> Any:
        return [instruction, None]

    def step_answer(self, result: StepResult, score: float) -> dict:
        return {"state": result.observation, "reward": result.reward, "done": result.done,
                "info": None}  # fmt: skip


WEBSHOP = WebShopDialect()
