"""ScienceWorld (elementary-science tasks in a text world), in process, from its PyPI package.

Each `ScienceWorldEnv` of the package is a Java process (~1.5 s to start, ~105 MiB), so episodes
borrow one from a pool and give it back on `close`; py4j calls release the GIL, so episodes of
one rollout step in parallel threads.

Tasks: a task id is `<task name>/<variation>` (`find-plant/3`). Split: ScienceWorld's own
per-task variation split; `train` is its train variations and `test` its test variations (the dev
variations are used by neither), so no test variation is ever trained on. `variations` caps how
many variations of each task name a split uses (the first ones, in ScienceWorld's order).

Rewards: a step's reward is the change in ScienceWorld's score (0-100); a failed task ends the
episode at score -100. An episode's summed reward is therefore its final score, normalised over
(0, 100), with failure clamped to 0 (AgentGym's SciWorld server reports the same score).

Expert: ScienceWorld's own gold action sequence for the variation. Generating it takes 0.2-3 s a
variation, so plans are cached in `cache_dir` (a JSON file per simplification setting).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import threading
from pathlib import Path

from envs.base import Environment, Episode, Split, StepResult
from flywheel.storage import cache_root

# Short-horizon task families: their gold paths take 5-10 steps (measured), so a small model
# and a small step budget have a chance. Every ScienceWorld task name is accepted.
DEFAULT_TASK_NAMES = (
    "find-plant",
    "find-animal",
    "lifespan-longest-lived",
    "lifespan-shortest-lived",
)
STEP_LIMIT = 100  # ScienceWorld's own per-episode move limit (AgentGym's default too)

SYSTEM_PROMPT = (
    "You are an agent in ScienceWorld, a text world of rooms, objects and substances. Do the "
    "science task you are given. Actions: look around, look at OBJ, look in OBJ, go to ROOM, "
    "open OBJ, close OBJ, pick up OBJ, put down OBJ, move OBJ to OBJ, pour OBJ in OBJ, mix OBJ, "
    "activate OBJ, deactivate OBJ, use OBJ on OBJ, focus on OBJ, inventory, wait, wait1. "
    "Focus only on the object the task names: focusing on a wrong one fails the task.\n"
    "Reply with one line 'Thought: <reasoning>' then one line 'Action: <action>'."
)


class WorldPool:
    """Idle ScienceWorld processes, started on demand and reused by later episodes. They end
    with this process (the package starts them with `die_on_exit`)."""

    def __init__(self) -> None:
        self._idle: queue.SimpleQueue = queue.SimpleQueue()

    def take(self):
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            from scienceworld import ScienceWorldEnv

            return ScienceWorldEnv("", envStepLimit=STEP_LIMIT)

    def give_back(self, world) -> None:
        self._idle.put(world)

    def close_idle(self) -> int:
        """End every idle process (a later episode starts a new one); how many were ended."""
        ended = 0
        while True:
            try:
                world = self._idle.get_nowait()
            except queue.Empty:
                return ended
            with contextlib.suppress(Exception):  # it may have died already
                world.close()
            ended += 1

    @contextlib.contextmanager
    def borrowed(self):
        """A process for a short query, given back afterwards."""
        world = self.take()
        try:
            yield world
        finally:
            self.give_back(world)


# This process's ScienceWorld processes: its episodes', and those the AgentGym compatibility
# server (envs/agentgym/compat/sciworld.py) lends its sessions.
worlds = WorldPool()


class ScienceWorldEpisode(Episode):
    def __init__(self, task_id: str, simplification: str) -> None:
        name, variation = parse_task_id(task_id)
        self.task_id = task_id
        self._world = worlds.take()
        try:
            self._world.load(name, variation, simplification)
            self._world.reset()
            description = self._world.get_task_description()
            observation, _, _, _ = self._world.step("look around")
        except BaseException:
            with contextlib.suppress(Exception):  # it may be the process that failed
                self._world.close()
            raise
        self.instruction = f"{description}\n{observation}"
        self._closed = self._broken = False

    def step(self, action: str) -> StepResult:
        try:
            observation, reward, done, info = self._world.step(action)
        except Exception:
            self._broken = True  # the Java side failed: this process is not reused
            raise
        return StepResult(observation=observation, reward=float(reward), done=bool(done))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._broken:
            with contextlib.suppress(Exception):
                self._world.close()
        else:
            worlds.give_back(self._world)


def parse_task_id(task_id: str) -> tuple[str, int]:
    name, _, variation = task_id.rpartition("/")
    if not name or not variation.isdigit():
        raise KeyError(f"not a ScienceWorld task id (want '<task name>/<variation>'): {task_id!r}")
    return name, int(variation)


@functools.cache
def _variation_splits(task_name: str) -> dict[str, tuple[int, ...]]:
    with worlds.borrowed() as world:
        world.load(task_name, 0, "")
        return {
            "train": tuple(world.get_variations_train()),
            "test": tuple(world.get_variations_test()),
        }


@functools.cache
def task_names() -> tuple[str, ...]:
    with worlds.borrowed() as world:
        return tuple(world.get_task_names())


def looking_before_focus(actions: list[str]) -> list[str]:
    """The gold path with `look around` between a move and a focus that follows it.

    ScienceWorld's gold paths focus on an object right after arriving, and arriving shows only
    "You move to the outside.": imitating them, a policy must name an animal it was never shown
    (the animals differ per variation). Looking first shows what is there, so the focus can be
    read off the observation; ScienceWorld counts the extra move and scores nothing for it."""
    looked = []
    for action in actions:
        if action.startswith("focus on") and looked and looked[-1].startswith("go to"):
            looked.append("look around")
        looked.append(action)
    return looked


class ScienceWorldEnv(Environment):
    name = "scienceworld"
    reward_range = (0.0, 100.0)
    system_prompt = SYSTEM_PROMPT
    noop_action = "look around"  # changes nothing but ScienceWorld's move count
    step_workers = 8  # each episode has its own Java process; py4j calls release the GIL
    # Each live episode holds a Java process, 210-380 MiB resident (measured: 90 at once beside
    # a trainer ran a 24-GiB machine out of memory); 16 take 3.5-6 GiB. `env.max_live_episodes`.
    max_live_episodes = 16

    def __init__(
        self,
        task_names: tuple[str, ...] | list[str] = DEFAULT_TASK_NAMES,
        variations: int | None = 10,
        simplification: str = "",
        cache_dir: str | os.PathLike | None = None,
        expert_looks_around: bool = True,
    ) -> None:
        self.task_names = tuple(task_names)
        self.variations = variations
        self.simplification = simplification
        self.expert_looks_around = expert_looks_around
        root = Path(cache_dir).expanduser() if cache_dir else cache_root()
        self._gold_file = root / "scienceworld" / f"gold-{simplification}.json"
        self._gold: dict[str, list[str]] | None = None
        self._gold_lock = threading.Lock()

    def check(self) -> None:
        """Fail early on task names ScienceWorld does not have."""
        unknown = sorted(set(self.task_names) - set(task_names()))
        if unknown:
            raise ValueError(
                f"unknown ScienceWorld task names {unknown}; choose from {list(task_names())}"
            )

    def task_ids(self, split: Split) -> list[str]:
        """Test: the test variations; train and validation: the train variations, less or only
        those the run holds out (`Environment.carved`)."""
        self.check()
        ids = []
        for name in self.task_names:
            variations = _variation_splits(name)["test" if split == "test" else "train"]
            ids += [f"{name}/{v}" for v in variations[: self.variations]]
        return ids if split == "test" else self.carved(split, ids)

    def start(self, task_id: str) -> Episode:
        name, _ = parse_task_id(task_id)
        if name not in task_names():
            raise KeyError(f"unknown ScienceWorld task {task_id!r}")
        return ScienceWorldEpisode(task_id, self.simplification)

    def rollout_ended(self) -> None:
        """The rollout's Java processes, idle now, are ended: up to `max_live_episodes` of them,
        3.5-6 GiB that the stage after it (a trainer) would otherwise run beside."""
        worlds.close_idle()

    def expert_plan(self, task_id: str) -> list[tuple[str, str]] | None:
        actions = self.gold_actions(task_id)
        if self.expert_looks_around:
            actions = looking_before_focus(actions)
        return [(f"Next step of the procedure: {a}.", a) for a in actions] or None

    def gold_actions(self, task_id: str) -> list[str]:
        """ScienceWorld's gold action sequence for the variation (cached on disk)."""
        with self._gold_lock:
            if self._gold is None:
                self._gold = (
                    json.loads(self._gold_file.read_text()) if self._gold_file.exists() else {}
                )
            if task_id not in self._gold:
                self._gold[task_id] = self._generate_gold(task_id)
                self._gold_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = self._gold_file.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(self._gold, sort_keys=True))
                tmp.replace(self._gold_file)
            return list(self._gold[task_id])

    def _generate_gold(self, task_id: str) -> list[str]:
        name, variation = parse_task_id(task_id)
        with worlds.borrowed() as world:
            world.load(name, variation, self.simplification, generateGoldPath=True)
            actions = list(world.get_gold_action_sequence())
        if actions and actions[0].startswith("ERROR"):
            return []
        return actions
