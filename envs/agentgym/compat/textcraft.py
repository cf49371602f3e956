"""`serve-env --compat agentgym` for TextCraft: answer as AgentGym's TextCraft server does
(agentenv-textcraft/agentenv_textcraft/{env_wrapper,environment}.py at WooooDyy/AgentGym 3ef9235).

- `data_idx` i is AgentGym's goal `i % 544`: the craftable items of recipe depth >= 1, sorted by
  depth (a stable sort, so ties keep the crafting tree's order, which is the order its recipe
  files are read in: see the end); the instruction is built as AgentGym's `TextCraftEnv.reset(seed=42)` builds
  it, from Python sets, so it depends on the server's hash seed, as AgentGym's does: start it with
  the same `PYTHONHASHSEED` as the AgentGym server it stands in for.
- `/create` answers the task at `data_idx` = the new id (AgentGym resets every new environment
  to its own id); observations keep `minecraft:` (`Crafted 1 minecraft:oak_planks`); rewards are
  integers; a step after the goal is played like any other (the game has no end); `/detail` answers
  `{observation, done, reward, deleted}`; `/close` answers `true`, then `false`.

AgentGym reads its recipe files in the filesystem's order (`os.listdir`), which differs between
machines and changes the order of goals of equal depth (so the numbering: index 0 is "light blue
dye" on one machine, "acacia planks" in name order), the decoy recipes each text shows, and
which recipes it drops as cycles. By default this server reads them in name order, the same on
every machine; `--recipe-listing directory` reads them in the folder's own order, as AgentGym
does, so that with the same files on the same machine (`--recipes` AgentGym's own
`agentenv_textcraft` folder, to be sure) every index names the same task with the same text as
AgentGym's server there (docs/agentgym.md).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import io
import itertools
import os
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from envs.agentgym.compat import (
    AgentGymService,
    CloseBody,
    CompatOptions,
    StepBody,
    agentgym_error,
    recipes_folder,
    validated_body,
)
from envs.agentgym.dialects.textcraft import TEXTCRAFT

# AgentGym's TextCraft goals: items of recipe depth at least 1 (Flywheel's own tasks need 2).
AGENTGYM_MIN_DEPTH = 1
AGENTGYM_SEED = 42  # TextCraftEnv.reset's default seed, which its server always uses
MAX_DISTRACTORS = 10  # decoy recipes shown at most
USES_PER_INGREDIENT = 10  # decoys drawn per ingredient at most


class TextCraftCreate(BaseModel):  # agentenv_textcraft/model.py
    commands: str | None = None
    goal: str | None = None


class TextCraftReset(BaseModel):
    id: int
    data_idx: int | None = 0


_load_lock = threading.Lock()


@functools.cache
def agentgym_textcraft(options: CompatOptions = CompatOptions()) -> AgentGymTextCraft:  # noqa: B008
    """AgentGym's TextCraft built from `options`' recipe files, once per process."""
    from envs.textcraft import load_game

    if options == CompatOptions():
        return AgentGymTextCraft(load_game())  # Flywheel's own game: the same files, by name
    return AgentGymTextCraft(_load_game(options))


def _load_game(options: CompatOptions):
    """The `textcraft` package's game over `options`' recipe files, read in its listing order.
    Which recipes the crafting tree drops as cycles, and so the goals, depend on that order."""
    from unittest import mock

    from textcraft import crafting_tree
    from textcraft.env import TextCraft

    folder = recipes_folder(options.recipes) if options.recipes else None
    if folder is None:
        import importlib.resources

        folder = Path(str(importlib.resources.files("textcraft") / "data" / "recipes"))
    listed = sorted if options.listing == "name" else list
    # The tree reads `<minecraft_dir>/recipes/`; only the listing's order is ours to choose.
    listing_os = types.SimpleNamespace(path=os.path, listdir=lambda path: listed(os.listdir(path)))
    with _load_lock, mock.patch.object(crafting_tree, "os", listing_os):
        game = TextCraft(minecraft_dir=str(folder.parent) + os.sep)
    for item in game.crafting_tree.itemid_recipes:  # fill the depth cache now, not from threads
        game.crafting_tree.get_min_depth(item)
    return game


class AgentGymTextCraft:
    """AgentGym's TextCraft tasks over one crafting tree (read-only): its goal list, its task
    texts and new games."""

    def __init__(self, game) -> None:
        self.game = game
        self.tree = game.crafting_tree
        self.instruction = functools.cache(self._instruction)

    @functools.cached_property
    def goals(self) -> tuple[tuple[str, int], ...]:
        """AgentGym's goal list, `(item id, depth)` in `data_idx` order (environment.py, reset):
        a stable sort by depth, so goals of equal depth keep the tree's order, which is the order
        its recipe files were read in."""
        goals = self.tree.item_recipes_min_depth(AGENTGYM_MIN_DEPTH)
        return tuple(sorted(goals, key=lambda x: x[1]))

    @functools.cached_property
    def task_ids(self) -> tuple[str, ...]:
        return tuple(goal.removeprefix("minecraft:") for goal, _ in self.goals)

    @functools.cached_property
    def recipes_using(self) -> dict[str, tuple]:
        """Ingredient name -> the recipes that take it, item recipes before tag recipes, in the
        tree's order (AgentGym's `collect_item_uses`), computed once: the tree never changes."""
        using: dict[str, list] = collections.defaultdict(list)
        tree = self.tree
        for recipe in itertools.chain(*tree.itemid_recipes.values(), *tree.tag_recipes.values()):
            for ingredient in recipe.input_items:
                using[ingredient.item_tag.name].append(recipe)
        return {name: tuple(recipes) for name, recipes in using.items()}

    def _instruction(self, goal: str) -> str:
        """The text AgentGym's `TextCraftEnv.reset(seed=42, data_idx)` shows for `goal`: the
        recipes the goal needs and up to ten decoys, shuffled. The random draws are AgentGym's,
        in its order, from a generator seeded 42 (AgentGym reseeds the global `random`; a private
        generator draws the same numbers); the lines pass through Python sets, so their order
        depends on the hash seed, as AgentGym's does."""
        import random

        from textcraft.utils import item_id_to_str

        rng = random.Random(AGENTGYM_SEED)
        needed = list(_recipes_below(self.tree, goal))
        decoys = []  # up to USES_PER_INGREDIENT other uses of each ingredient, drawn in order
        for recipe in needed:
            for ingredient in recipe.input_items:
                uses = self.recipes_using.get(ingredient.item_tag.name, ())
                if uses:
                    decoys += rng.sample(uses, min(len(uses), USES_PER_INGREDIENT))
        needed_lines = {recipe.recipe_str for recipe in needed}
        decoy_lines = {r.recipe_str for r in decoys if r.recipe_str not in needed_lines}
        shown = list(needed_lines)
        shown += rng.sample(list(decoy_lines), min(len(decoy_lines), MAX_DISTRACTORS))
        rng.shuffle(shown)
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format(
            "\n".join(shown), item_id_to_str(goal)
        )

    def new_game(self, data_idx: int) -> _TextCraftGame:
        goal = self.goals[data_idx % len(self.goals)][0]  # a None data_idx fails, as AgentGym's
        return _TextCraftGame(self.game, goal, self.instruction(goal))


def textcraft_goals() -> tuple[tuple[str, int], ...]:
    """AgentGym's goal list from the project's recipe files in name order."""
    return agentgym_textcraft().goals


def textcraft_instruction(goal: str) -> str:
    return agentgym_textcraft().instruction(goal)


def textcraft_task_ids() -> tuple[str, ...]:
    return agentgym_textcraft().task_ids


def _recipes_below(tree, item: str, path: tuple[str, ...] = ()) -> Iterator:
    """Every recipe on the way to `item`, as AgentGym lists them (crafting_tree.py,
    traverse_recipe_tree): the item's own recipes, then, recipe by recipe and ingredient by
    ingredient, those below each ingredient; an item already on the path is a cycle and adds
    nothing. Subtrees reached twice are listed twice. The `textcraft` package's version differs:
    it extends the tree's lists as it goes."""
    if item in path:
        return
    own = tree.itemid_recipes.get(item) or tree.tag_recipes.get(item) or []
    yield from own
    for recipe in own:
        for ingredient in recipe.input_items:
            yield from _recipes_below(tree, ingredient.item_tag.name, (*path, item))


class _TextCraftGame:
    """One AgentGym `TextCraftEnv`: the `textcraft` package's game rules (`TextCraft.step`, the
    same as AgentGym's but for `get`ting the goal, which neither allows: goals are craftable and
    craftable items cannot be got), its own inventory, its goal."""

    def __init__(self, game, goal: str, instruction: str) -> None:
        self.observation = instruction
        self._game = copy.copy(game)  # shares the read-only tree
        self._game.inventory = {}
        self._game.goal = goal

    def step(self, action: str) -> tuple[str, int, bool]:
        with contextlib.redirect_stdout(io.StringIO()):  # the package prints
            observation, reward, terminated, _, _ = self._game.step(action)
        return observation, reward, terminated


class AgentGymTextCraftService(AgentGymService):
    """agentenv_textcraft's `TextCraft_Wrapper` and FastAPI routes over Flywheel's game."""

    hello_text = "This is environment TextCraft."
    dialect = TEXTCRAFT

    def __init__(
        self,
        env,
        session_ttl_s: float = 3600,
        sequential_ids: bool = False,
        options: CompatOptions = CompatOptions(),  # noqa: B008 (frozen)
    ) -> None:
        self.textcraft = agentgym_textcraft(options)
        super().__init__(env, list(self.textcraft.task_ids), session_ttl_s, sequential_ids)

    def routes(self) -> list[tuple[str, str, Any, str | None]]:
        return [
            *self.common_routes(),
            ("/create", "POST", self.create, "body"),
            ("/step", "POST", self.step, "body"),
            ("/reset", "POST", self.reset, "body"),
            ("/observation", "GET", self.observation, "query"),
            ("/detail", "GET", self.detail, "query"),
            ("/close", "POST", self.close, "body"),
        ]

    def _check_id(self, env_id: int) -> None:  # env_wrapper.py, _check_id
        if env_id not in self.sessions.info:
            raise NameError(f"The id {env_id} is not valid.")
        self.sessions.touch(env_id)
        if self.sessions.info[env_id]["deleted"]:
            raise NameError(f"The task with environment {env_id} has been deleted.")

    def create(self, body: Any) -> Any:
        validated_body(TextCraftCreate, body)  # commands and goal: read, and then ignored
        env_id = self.sessions.new_id()
        try:
            game = self.textcraft.new_game(data_idx=env_id)
            ob = game.observation
            payload = {"id": env_id, "observation": ob, "done": False, "reward": 0}
            self.sessions.games[env_id] = game
            self.sessions.info[env_id] = {"observation": ob, "done": False, "reward": 0,
                                          "deleted": False}  # fmt: skip
        except Exception as error:
            payload = {"error": f"{error}"}
        return payload

    def step(self, body: Any) -> Any:
        request = validated_body(StepBody, body)
        try:
            self._check_id(request.id)
            ob, reward, done = self.sessions.games[request.id].step(request.action)
            payload = {"observation": ob, "reward": reward, "done": done}
            self.sessions.info[request.id].update(payload)
        except Exception as error:
            payload = agentgym_error(error)
        return payload

    def reset(self, body: Any) -> Any:
        request = validated_body(TextCraftReset, body)
        try:
            self._check_id(request.id)
            game = self.textcraft.new_game(data_idx=request.data_idx)
            self.sessions.games[request.id] = game
            ob = game.observation
            payload = {"id": request.id, "observation": ob, "done": False, "reward": 0}
            self.sessions.info[request.id].update(
                {"observation": ob, "done": False, "reward": 0, "deleted": False}
            )
        except Exception as error:
            payload = agentgym_error(error)
        return payload

    def observation(self, query: dict) -> Any:
        return self._query(query, lambda env_id: self.sessions.info[env_id]["observation"])

    def detail(self, query: dict) -> Any:
        return self._query(query, lambda env_id: self.sessions.info[env_id])

    def close(self, body: Any) -> bool:
        request = validated_body(CloseBody, body)
        with self.sessions.lock:
            known = request.id in self.sessions.info
            self.sessions.info.pop(request.id, None)
            self.sessions.games.pop(request.id, None)
            self.sessions.last_used.pop(request.id, None)
        return known  # AgentGym: True, or False when the id is unknown (or already closed)
