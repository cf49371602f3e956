"""Published expert trajectories, imported as this run's expert data (setting `expert_file`).

Two formats, told apart by their items:

- ETO's SFT files (`{"id", "conversations": [{"from", "value"}]}`; agent-eto/eto-sft-trajectory):
  one file per environment, recognised by its instruction turn. ScienceWorld items are named
  `<family>_<variation>` with ETO's family number (its eval_agent/data/sciworld/taskname2id.json),
  mapped here to the project's `<family-name>/<variation>`.
- AgentGym's AgentTraj (`{"item_id", "conversations": [{"from", "loss", "value"}]}`): `item_id`
  is `<env>_<index>`, the index into the task list of the AgentGym server it was recorded on.
  SciWorld items keep that index as their `agentgym-sciworld` task id (ScienceWorld's own task
  order, the same on every machine). TextCraft items are matched by the goal their first task turn
  names, never by index: AgentGym numbers TextCraft's goals in the order its recipe files are
  listed on the machine, so the recording machine's index 0 ("light blue dye" on one) can be
  another goal here ("acacia planks"). For `agentgym-textcraft` the goal is looked up in the task
  texts of this run's servers (`task_goal`); for the project's own `textcraft` it is the task id.

Both begin with an instruction part (the instructions, then the model's "OK"), replaced by this
run's prefix so imported and explored trajectories share one prompt, and the turns after the task
are rewritten in the project's layout ("Observation: ..", "Thought: ..\nAction: .."). Settings the
file was recorded under that differ from the run's are noted (`recording_notes`). What could not
be used is dropped and counted by reason; WebShop and ALFWorld files are refused outright, as the
project has no such environment yet.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.eto_format import read_eto_sft
from envs.agentgym.expert import textcraft_goal
from flywheel.chat import format_observation, format_reply, parse_reply
from flywheel.records import Message, Trajectory

if TYPE_CHECKING:
    from flywheel.settings import EnvSettings

# ETO's ScienceWorld family numbers (eval_agent/data/sciworld/taskname2id.json; 5, the unknown-
# substance melting point, is left out of ETO's data).
ETO_SCIWORLD_FAMILIES = {
    0: "task-1-boil",
    1: "task-1-change-the-state-of-matter-of",
    2: "task-1-freeze",
    3: "task-1-melt",
    4: "task-10-measure-melting-point-(known-substance)",
    6: "task-10-use-thermometer",
    7: "task-2-power-component",
    8: "task-2-power-component-(renewable-vs-nonrenewable-energy)",
    9: "task-2a-test-conductivity",
    10: "task-2a-test-conductivity-of-unknown-substances",
    11: "task-3-find-animal",
    12: "task-3-find-living-thing",
    13: "task-3-find-non-living-thing",
    14: "task-3-find-plant",
    15: "task-4-grow-fruit",
    16: "task-4-grow-plant",
    17: "task-5-chemistry-mix",
    18: "task-5-chemistry-mix-paint-(secondary-color)",
    19: "task-5-chemistry-mix-paint-(tertiary-color)",
    20: "task-6-lifespan-(longest-lived)",
    21: "task-6-lifespan-(longest-lived-then-shortest-lived)",
    22: "task-6-lifespan-(shortest-lived)",
    23: "task-7-identify-life-stages-1",
    24: "task-7-identify-life-stages-2",
    25: "task-8-inclined-plane-determine-angle",
    26: "task-8-inclined-plane-friction-(named-surfaces)",
    27: "task-8-inclined-plane-friction-(unnamed-surfaces)",
    28: "task-9-mendellian-genetics-(known-plant)",
    29: "task-9-mendellian-genetics-(unknown-plant)",
}
# ETO ran ScienceWorld with this simplification: under another one some of its actions fail.
ETO_SCIWORLD_SIMPLIFICATION = "easy"
# How each ETO file's instruction turn begins (eval_agent/prompt/instructions/*_inst.txt).
ETO_INSTRUCTIONS = {
    "You are a helpful assistant to do some scientific experiment": "sciworld",
    "You are web shopping.": "webshop",
    "Interact with a household to solve a task.": "alfworld",
}
# Source environments (ETO's and AgentGym's names) → the project environments that can use them.
TARGETS = {
    "sciworld": ("scienceworld", "agentgym-sciworld"),
    "textcraft": ("textcraft", "agentgym-textcraft"),
}
NO_SUCH_ENVIRONMENT = {"webshop": "WebShop", "alfworld": "ALFWorld"}
OBSERVATION_PREFIX = format_observation("")


@dataclass
class ImportCounts:
    """What a file held and what became of it: kept items, renamed ids, drops by reason."""

    read: int = 0
    mapped: int = 0  # ids renamed from the file's naming to the environment's
    imported: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def counts(self) -> dict[str, int]:
        return {
            "imported_read": self.read,
            "imported_mapped": self.mapped,
            "imported": self.imported,
            "imported_dropped": sum(self.dropped.values()),
        }

    def notes(self) -> list[str]:
        return [f"dropped {n} imported item(s): {why}" for why, n in sorted(self.dropped.items())]


def import_trajectories(
    items: list[dict],
    env: str,
    prefix: list[Message],
    task_ids: list[str],
    task_goal: Callable[[str], str | None] | None = None,
) -> tuple[list[Trajectory], ImportCounts]:
    """The file's trajectories for `task_ids` of environment `env`, under `prefix`.
    `task_goal(task_id)`: a TextCraft task's goal item (`acacia_boat`) in `env`, which AgentGym's
    TextCraft items into `agentgym-textcraft` are matched by (`task_goal_reader`)."""
    if not isinstance(items, list) or not items:
        raise ValueError("an expert file holds a JSON list of trajectories; this one does not")
    sources = [_source_env(item) for item in items]
    _refuse_unusable(sources, env)
    counts, wanted, kept = ImportCounts(read=len(items)), set(task_ids), {}
    goals = _GoalLookup(task_ids, task_goal, env)
    for item, source in zip(items, sources, strict=True):
        if source is not None and env not in TARGETS.get(source, ()):
            counts.dropped[f"recorded on {source}, not for {env}"] += 1
            continue
        trajectory = _trajectory(item, env, prefix)
        task_id = _task_id(item, source, env, trajectory, goals)
        if task_id is None:
            counts.dropped[f"{source} id names no {env} task"] += 1
        elif task_id not in wanted:
            counts.dropped["not among this run's train tasks"] += 1
        elif task_id in kept:
            counts.dropped["a second trajectory for the same task"] += 1
        else:
            counts.mapped += task_id != _file_id(item)
            kept[task_id] = trajectory.model_copy(update={"task_id": task_id})
    counts.imported = len(kept)
    return list(kept.values()), counts


def task_goal_reader(env: EnvSettings) -> Callable[[str], str | None] | None:
    """How to read a task's goal where imports are matched by goal: from the task texts of an
    `agentgym-textcraft` run's servers (one `/create` and `/reset` per task, once needed)."""
    if env.name != "agentgym-textcraft":
        return None
    from envs import make_env

    return make_env(env).task_goal


class _GoalLookup:
    """The run's task with a given TextCraft goal, from `task_goal` over the run's tasks, read
    once the first item needs it."""

    def __init__(self, task_ids: list[str], task_goal, env: str) -> None:
        self.task_ids, self.task_goal, self.env = task_ids, task_goal, env
        self._tasks: dict[str, str] | None = None

    def task_for(self, goal: str) -> str | None:
        if self._tasks is None:
            if self.task_goal is None:
                raise ValueError(
                    f"AgentGym's TextCraft items are matched to {self.env} tasks by goal, which "
                    "needs the tasks' goals (task_goal; see task_goal_reader)"
                )
            self._tasks = {}
            for task_id in self.task_ids:  # index i and i + 544 share a goal: the first wins
                self._tasks.setdefault(self.task_goal(task_id), task_id)
        return self._tasks.get(goal)


def recording_notes(items: list[dict], env: str, simplification: str) -> list[str]:
    """Settings the file was recorded under that differ from this run's."""
    eto_sciworld = env == "scienceworld" and any(
        "item_id" not in item and _source_env(item) == "sciworld" for item in items
    )
    if not eto_sciworld:
        return []
    notes = [
        "ETO's first turn is the task alone; this environment's is the task and what `look "
        "around` shows, so the model sees a longer first turn than it trained on"
    ]
    if simplification != ETO_SCIWORLD_SIMPLIFICATION:
        notes.append(
            f"ETO recorded ScienceWorld with simplification {ETO_SCIWORLD_SIMPLIFICATION!r} and "
            f"this run uses {simplification!r}: some imported actions are invalid here (set "
            f"env.scienceworld.simplification={ETO_SCIWORLD_SIMPLIFICATION})"
        )
    return notes


def _source_env(item: dict) -> str | None:
    """The environment an item was recorded on, in its file's naming. None: an ETO-format item
    with other instructions, such as this project's own export (`eto_sft.json`), taken to be for
    the run's environment under the run's task ids."""
    if "item_id" in item:  # AgentTraj
        return str(item["item_id"]).rsplit("_", 1)[0]
    first = _first_turn(item)
    return next((env for start, env in ETO_INSTRUCTIONS.items() if first.startswith(start)), None)


def _first_turn(item: dict) -> str:
    turns = item.get("conversations") or [{}]
    return str(turns[0].get("value", "")) if isinstance(turns[0], dict) else ""


def _refuse_unusable(sources: list[str], env: str) -> None:
    """A file with nothing for any project environment is a mistake, not a pile of drops."""
    if any(source is None or source in TARGETS for source in sources):
        return
    names = sorted({NO_SUCH_ENVIRONMENT.get(s, s) for s in sources})
    raise ValueError(
        f"the expert file holds {', '.join(names)} trajectories, and Flywheel has no such "
        f"environment yet (this run is {env}); use a TextCraft or ScienceWorld file"
    )


def _file_id(item: dict) -> str:
    return str(item.get("item_id", item.get("id")))


def _trajectory(item: dict, env: str, prefix: list[Message]) -> Trajectory:
    if "item_id" in item:
        # AgentTraj keeps ETO's turn layout and adds per-turn loss flags, dropped here: the
        # project trains on every assistant turn of an episode, as ETO's reader does.
        turns = [{"from": t.get("from"), "value": t.get("value")} for t in item["conversations"]]
        item = {"id": item["item_id"], "conversations": turns}
    trajectory = read_eto_sft([item], env, prefix)[0]
    start = trajectory.episode_start
    episode = [_in_project_layout(m) for m in trajectory.messages[start + 1 :]]
    return trajectory.model_copy(update={"messages": trajectory.messages[: start + 1] + episode})


def _in_project_layout(message: Message) -> Message:
    """A turn as the project's rollouts write it, so imported and explored trajectories train the
    same text: AgentGym sends observations bare and replies as "Thought:\n..\n\nAction:\n..",
    the project "Observation: .." and "Thought: ..\nAction: ..". The first (task) turn is as is."""
    if message.role == "user":
        if message.content.startswith(OBSERVATION_PREFIX):
            return message
        return message.model_copy(update={"content": format_observation(message.content)})
    reply = parse_reply(message.content)
    if reply.action is None:  # kept as recorded: the model learns what the file holds
        return message
    return message.model_copy(update={"content": format_reply(reply.thought, reply.action)})


def _task_id(
    item: dict, source: str, env: str, trajectory: Trajectory, goals: _GoalLookup
) -> str | None:
    """The task's id in `env`, or None when the item's id names none."""
    if "item_id" in item:
        if source == "textcraft":  # its index is the recording machine's: go by the goal
            goal = textcraft_goal(trajectory.messages[trajectory.episode_start].content)
            if goal is None or env == "textcraft":
                return goal
            # A goal none of the run's tasks has stays a goal name, which is no task index: it
            # is dropped as not among the run's tasks.
            return goals.task_for(goal) or goal
        index = _file_id(item).rpartition("_")[2]
        if env.startswith("agentgym-"):
            return index if index.isdigit() else None
        return None
    if source is None:
        return _file_id(item)
    if source == "sciworld" and env == "scienceworld":
        return _eto_sciworld_task_id(_file_id(item))
    return None


def _eto_sciworld_task_id(eto_id: str) -> str | None:
    """ETO's `14_3` → `find-plant/3`."""
    match = re.fullmatch(r"(\d+)_(\d+)", eto_id)
    family = match and ETO_SCIWORLD_FAMILIES.get(int(match.group(1)))
    if not family:
        return None
    return f"{scienceworld_task_name(family)}/{match.group(2)}"


def scienceworld_task_name(eto_name: str) -> str:
    """ScienceWorld's own name for one of ETO's (the package's `infer_task`, without the import:
    `task-6-lifespan-(longest-lived)` → `lifespan-longest-lived`)."""
    name = eto_name.replace("mendellian", "mendelian")
    return re.sub(r"task-(\d|a|b)+-|[()]", "", name)
