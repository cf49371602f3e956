"""`serve-env --compat agentgym` for SciWorld: answer as AgentGym's SciWorld server does
(agentenv-sciworld/agentenv_sciworld/environment.py at WooooDyy/AgentGym 3ef9235).

- `data_idx` indexes every variation of every ScienceWorld task but AgentGym's exceptions (task
  keys 5-1, 5-2, 9-1, 9-2, 9-3, 10-1, 10-2), in ScienceWorld's task order, loaded without
  simplifications; `/reset` reports the task name and the variation (`var_num`);
  `/action_hint` and `/goals` answer; a step after the end, or on a closed environment, is an error;
  `/close` of a closed or unknown environment is an HTTP 500, as AgentGym's.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from pydantic import BaseModel

from envs.agentgym.compat import (
    AgentGymService,
    CloseBody,
    CompatOptions,
    HTTPReply,
    StepBody,
    agentgym_error,
    validated_body,
)
from envs.agentgym.dialects.sciworld import SCIWORLD

# agentenv_sciworld/environment.py, SciWorldEnv.__init__: task keys AgentGym leaves out.
SCIWORLD_EXCEPTIONS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})


class SciWorldReset(BaseModel):  # agentenv_sciworld/model.py
    id: int
    data_idx: int


@functools.cache
def sciworld_games() -> tuple[tuple[str, int], ...]:
    """AgentGym's SciWorld `data_idx` list, `(task name, variation)` (environment.py, __init__)."""
    from envs.scienceworld import worlds

    with worlds.borrowed() as world:
        return tuple(
            (name, variation)
            for key, name in world.tasks.items()
            if key not in SCIWORLD_EXCEPTIONS
            for variation in range(world.get_max_variations(name))
        )


class _SciWorldGame:
    """A ScienceWorld process for one session, borrowed from Flywheel's pool at the first
    `/reset` and given back at `/close` (AgentGym starts one per `/create`)."""

    def __init__(self) -> None:
        self.world = None
        self.broken = False

    def take(self):
        if self.world is None:
            from envs.scienceworld import worlds

            self.world = worlds.take()
        return self.world

    def call(self, method: str, *args):
        if self.world is None:
            raise RuntimeError("no task loaded: call /reset first")
        try:
            return getattr(self.world, method)(*args)
        except Exception:
            self.broken = True
            raise

    def close(self) -> None:
        world, self.world = self.world, None
        if world is None:
            return
        from envs.scienceworld import worlds

        if self.broken:
            with contextlib.suppress(Exception):
                world.close()
        else:
            worlds.give_back(world)


class AgentGymSciWorldService(AgentGymService):
    """agentenv_sciworld's `SciWorldEnv` and FastAPI routes over Flywheel's ScienceWorld pool."""

    hello_text = "This is environment ScienceWorld."
    dialect = SCIWORLD

    def __init__(
        self,
        env,
        session_ttl_s: float = 3600,
        sequential_ids: bool = False,
        options: CompatOptions = CompatOptions(),  # noqa: B008 (frozen)
    ) -> None:
        if options != CompatOptions():
            raise ValueError(
                "--recipes and --recipe-listing are TextCraft's; SciWorld has no such files"
            )
        self.games = list(sciworld_games())
        tasks = [f"{name}/{variation}" for name, variation in self.games]
        super().__init__(env, tasks, session_ttl_s, sequential_ids)

    def routes(self) -> list[tuple[str, str, Any, str | None]]:
        return [
            *self.common_routes(),
            ("/create", "POST", self.create, None),  # AgentGym's takes no body
            ("/step", "POST", self.step, "body"),
            ("/reset", "POST", self.reset, "body"),
            ("/close", "POST", self.close, "body"),
            ("/observation", "GET", self.observation, "query"),
            ("/action_hint", "GET", self.action_hint, "query"),
            ("/goals", "GET", self.goals, "query"),
            ("/detail", "GET", self.detail, "query"),
        ]

    def _check_id(self, idx: int, is_reset: bool = False) -> None:  # environment.py, _check_id
        info = self.sessions.info
        if idx not in info:
            raise ValueError(f"The id {idx} is not valid.")
        self.sessions.touch(idx)
        if info[idx]["deleted"]:
            raise ValueError(f"The task with environment {idx} has been deleted.")
        if not is_reset and info[idx]["done"]:
            raise ValueError(f"The task with environment {idx} has finished.")

    def create(self) -> dict:
        idx = self.sessions.new_id()
        self.sessions.games[idx] = _SciWorldGame()
        self.sessions.info[idx] = {"deleted": False, "done": False}
        return {"id": idx}

    def step(self, body: Any) -> dict:
        request = validated_body(StepBody, body)
        try:
            self._check_id(request.id)
            ob, reward, done, info = self.sessions.games[request.id].call("step", request.action)
            payload = {"observation": ob, "reward": reward, "score": info["score"], "done": done}
            self.sessions.info[request.id].update(payload)
            return payload
        except Exception as error:
            return agentgym_error(error)

    def reset(self, body: Any) -> dict:
        request = validated_body(SciWorldReset, body)
        idx, data_idx = request.id, request.data_idx
        try:
            self._check_id(idx, True)
            name, variation = self.games[data_idx]
            game = self.sessions.games[idx]
            game.take()
            game.call("load", name, variation)
            task_description = game.call("get_task_description")
            ob, reward, done, info = game.call("step", "look around")
            payload = {
                "task_name": name,
                "var_num": variation,
                "task_description": task_description,
                "observation": ob,
                "reward": reward,
                "score": info["score"],
                "deleted": False,
                "done": done,
            }
            self.sessions.info[idx].update(payload)
            return payload
        except Exception as error:
            return agentgym_error(error)

    def observation(self, query: dict) -> Any:
        return self._query(query, lambda idx: self.sessions.info[idx]["observation"])

    def action_hint(self, query: dict) -> Any:
        def hint(idx: int) -> dict:
            game = self.sessions.games[idx]
            return {
                "possible_actions": game.call("get_possible_actions"),
                "possible_objects": game.call("get_possible_objects"),
            }

        return self._query(query, hint)

    def goals(self, query: dict) -> Any:
        return self._query(
            query, lambda idx: {"goals": self.sessions.games[idx].call("get_goal_progress")}
        )

    def detail(self, query: dict) -> Any:
        return self._query(query, lambda idx: self.sessions.info[idx])

    def close(self, body: Any) -> bool:
        request = validated_body(CloseBody, body)
        idx = request.id
        info = self.sessions.info.get(idx)
        # AgentGym's close raises (KeyError, ValueError) outside any try: FastAPI's plain 500.
        if info is None or info["deleted"]:
            raise HTTPReply(500, text="Internal Server Error")
        self.sessions.games[idx].close()
        info["deleted"] = True
        return True
