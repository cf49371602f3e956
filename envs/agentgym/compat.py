"""`flywheel serve-env --compat agentgym`: answer as AgentGym's own servers do, index for index.

By default `serve-env` numbers the project's tasks (`data_idx` indexes its train tasks, then its
test tasks), tidies TextCraft's text and answers errors with HTTP statuses. With `--compat
agentgym` it answers AgentGym's requests as AgentGym's TextCraft and SciWorld servers do
(agentenv-textcraft/agentenv_textcraft/{env_wrapper,environment}.py and
agentenv-sciworld/agentenv_sciworld/environment.py at WooooDyy/AgentGym 3ef9235), so AgentGym's
clients and evaluation scripts can use it unchanged:

TextCraft
- `data_idx` i is AgentGym's goal `i % 544`: the craftable items of recipe depth >= 1, sorted by
  depth (a stable sort, so ties keep the crafting tree's order, which is the order its recipe
  files are read in: see the end); the instruction is built as AgentGym's `TextCraftEnv.reset(seed=42)` builds
  it, from Python sets, so it depends on the server's hash seed, as AgentGym's does: start it with
  the same `PYTHONHASHSEED` as the AgentGym server it stands in for.
- `/create` answers the task at `data_idx` = the new id (AgentGym resets every new environment
  to its own id); observations keep `minecraft:` (`Crafted 1 minecraft:oak_planks`); rewards are
  integers; a step after the goal is played like any other (the game has no end); `/detail` answers
  `{observation, done, reward, deleted}`; `/close` answers `true`, then `false`.
SciWorld
- `data_idx` indexes every variation of every ScienceWorld task but AgentGym's exceptions (task
  keys 5-1, 5-2, 9-1, 9-2, 9-3, 10-1, 10-2), in ScienceWorld's task order, loaded without
  simplifications; `/reset` reports the task name and the variation (`var_num`);
  `/action_hint` and `/goals` answer; a step after the end, or on a closed environment, is an error;
  `/close` of a closed or unknown environment is an HTTP 500, as AgentGym's.
Both
- Errors are HTTP 200 `{"error": message}` with AgentGym's messages ("The id N is not valid.");
  malformed requests are HTTP 422 `{"detail": [...]}` as FastAPI (which AgentGym's servers run on)
  words them.

What stays Flywheel's: session ids are random (AgentGym counts from 0; clients treat ids as
opaque, and a guessable id would let one client step another's episode; `--sequential-ids`
counts from 0 as AgentGym does, for testing clients against restarts), `--token` and
`--max-body-bytes` still apply, bodies nested deeper than `MAX_JSON_DEPTH` are still refused
(HTTP 400), idle sessions are closed after `--session-ttl`, and `GET /flywheel` and `GET /tasks`
still answer (the task ids in `data_idx` order). There is no `POST /flywheel/step`: Flywheel's own
clients need the project's numbering, so they refuse a compat server (its task list differs).
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
import json
import os
import secrets
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from envs.agentgym.dialects.sciworld import SCIWORLD
from envs.agentgym.dialects.textcraft import TEXTCRAFT
from envs.agentgym.protocol import Dialect

COMPAT_MODES = ("agentgym",)

# AgentGym's TextCraft goals: items of recipe depth at least 1 (Flywheel's own tasks need 2).
AGENTGYM_MIN_DEPTH = 1
AGENTGYM_SEED = 42  # TextCraftEnv.reset's default seed, which its server always uses
MAX_DISTRACTORS = 10  # decoy recipes shown at most
USES_PER_INGREDIENT = 10  # decoys drawn per ingredient at most
# agentenv_sciworld/environment.py, SciWorldEnv.__init__: task keys AgentGym leaves out.
SCIWORLD_EXCEPTIONS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
SESSION_ID_BITS = 53  # as envs.agentgym.server's: random, exact in every JSON parser


class HTTPReply(Exception):
    """An answer other than HTTP 200 with a JSON value: the server replies with it as it is."""

    def __init__(self, status: int, value: Any = None, text: str | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.value, self.text = status, value, text

    def response(self):
        from starlette.responses import Response

        if self.text is not None:
            return Response(self.text, status_code=self.status, media_type="text/plain")
        return Response(json.dumps(self.value), self.status, media_type="application/json")


# ---- FastAPI's request validation, as AgentGym's servers answer it (HTTP 422) -----------------

MISSING = object()  # no request body at all


class TextCraftCreate(BaseModel):  # agentenv_textcraft/model.py
    commands: str | None = None
    goal: str | None = None


class TextCraftReset(BaseModel):
    id: int
    data_idx: int | None = 0


class SciWorldReset(BaseModel):  # agentenv_sciworld/model.py
    id: int
    data_idx: int


class StepBody(BaseModel):  # both servers' StepRequestBody
    id: int
    action: str


class CloseBody(BaseModel):
    id: int


@functools.cache
def _adapter(model: type) -> TypeAdapter:
    return TypeAdapter(model)


def _unprocessable(errors: list[dict]) -> HTTPReply:
    return HTTPReply(422, {"detail": errors})


def _error_dicts(error: ValidationError, prefix: tuple) -> list[dict]:
    """Pydantic's errors as FastAPI lists them: `loc` under `body` or `query`, no `url`."""
    out = []
    for e in error.errors(include_url=False):
        item = {
            "type": e["type"],
            "loc": [*prefix, *e["loc"]],
            "msg": e["msg"],
            "input": e["input"],
        }
        if "ctx" in e:
            item["ctx"] = {k: v if _is_json(v) else str(v) for k, v in e["ctx"].items()}
        out.append(item)
    return out


def _is_json(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def validated_body(model: type, body: Any):
    """`body` as FastAPI hands a single body parameter to an endpoint, or its HTTP 422."""
    if body is MISSING:
        raise _unprocessable(
            [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]
        )
    try:
        # FastAPI validates with from_attributes, so a list is "model_attributes_type".
        return _adapter(model).validate_python(body, from_attributes=True)
    except ValidationError as error:
        raise _unprocessable(_error_dicts(error, ("body",))) from None


def validated_id(query: dict) -> int:
    """A GET endpoint's `id: int` query parameter, or FastAPI's HTTP 422."""
    if "id" not in query:
        raise _unprocessable(
            [{"type": "missing", "loc": ["query", "id"], "msg": "Field required", "input": None}]
        )
    try:
        return _adapter(int).validate_python(query["id"])
    except ValidationError as error:
        raise _unprocessable(_error_dicts(error, ("query", "id"))) from None


def parse_json_body(raw: bytes) -> Any:
    """A request body as FastAPI parses it: none is MISSING, bad JSON FastAPI's HTTP 422."""
    if not raw:
        return MISSING
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise _json_invalid(error.pos, error.msg) from None
    except ValueError as error:  # not UTF-8
        raise _json_invalid(0, str(error)) from None


def _json_invalid(position: int, message: str) -> HTTPReply:
    error = {"type": "json_invalid", "loc": ["body", position], "msg": "JSON decode error"}
    return _unprocessable([{**error, "input": {}, "ctx": {"error": message}}])


# ---- TextCraft ---------------------------------------------------------------------------------

# How the recipe files are listed: "name" (sorted: the same everywhere) or "directory" (the
# folder's own order, `os.listdir`, as AgentGym's server reads them: machine-dependent).
LISTINGS = ("name", "directory")


@dataclass(frozen=True)
class CompatOptions:
    """How `--compat agentgym` builds AgentGym's TextCraft task list: from the recipe files in
    `recipes` (a folder of recipe JSON files, or one holding them in `recipes/`, as AgentGym's
    `agentenv_textcraft/`; None: the `textcraft` package's own, the same 860 files), listed in
    `listing` order."""

    recipes: str | None = None
    listing: str = "name"

    def __post_init__(self) -> None:
        if self.listing not in LISTINGS:
            raise ValueError(f"recipe listing {self.listing!r}: expected one of {LISTINGS}")
        if self.recipes is not None:
            recipes_folder(self.recipes)  # refused now, before any game is built


def recipes_folder(path: str) -> Path:
    """The `recipes/` folder at `path` or in it (AgentGym's `agentenv_textcraft/` holds one); it
    has to be named so: the crafting tree reads `<folder above>/recipes/`."""
    folder = Path(path)
    if folder.name != "recipes":
        folder = folder / "recipes"
    if not folder.is_dir() or not any(folder.glob("*.json")):
        raise ValueError(
            f"{path}: no TextCraft recipe files (recipes/*.json); give the folder that holds "
            "recipes/ (AgentGym's agentenv-textcraft/agentenv_textcraft) or recipes/ itself"
        )
    return folder


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


class _Sessions:
    """Random ids (sequential ones, 0, 1, 2, ..., as AgentGym's, with `sequential_ids`), and
    sessions idle past the TTL dropped when the next one is created."""

    def __init__(self, session_ttl_s: float, sequential_ids: bool = False) -> None:
        self.session_ttl_s = session_ttl_s
        self._next_ids = itertools.count() if sequential_ids else None
        self.info: dict[int, dict] = {}  # AgentGym's per-id info dict, answered by /detail
        self.games: dict[int, Any] = {}
        self.last_used: dict[int, float] = {}
        self.lock = threading.Lock()

    def new_id(self) -> int:
        with self.lock:
            if self._next_ids is not None:
                env_id = next(self._next_ids)
            else:
                while (env_id := secrets.randbits(SESSION_ID_BITS)) in self.last_used:
                    pass
            self.last_used[env_id] = time.monotonic()
            cutoff = time.monotonic() - self.session_ttl_s
            idle = [i for i, used in self.last_used.items() if used < cutoff]
            gone = [(self.games.pop(i, None), self.info.pop(i, None)) for i in idle]
            for i in idle:
                del self.last_used[i]
        for game, _ in gone:
            close = getattr(game, "close", None)
            if close is not None:
                close()
        return env_id

    def touch(self, env_id: int) -> None:
        if env_id in self.last_used:
            self.last_used[env_id] = time.monotonic()


def _agentgym_error(error: Exception) -> dict:
    return {"error": str(error)}


class _AgentGymService:
    """What AgentGym's TextCraft and SciWorld servers share: the greeting, Flywheel's `/flywheel`
    and `/tasks`, the session table, and queries that answer for a checked id."""

    hello_text = ""
    dialect: Dialect  # the family whose server this one answers as

    def __init__(
        self, env, tasks: list[str], session_ttl_s: float, sequential_ids: bool = False
    ) -> None:
        self.env, self.tasks = env, tasks
        self.sessions = _Sessions(session_ttl_s, sequential_ids)

    def info(self) -> dict:
        from envs.agentgym.protocol import tasks_digest

        return {"env": self.env.name, "dialect": self.dialect.name, "compat": "agentgym",
                "tasks": len(self.tasks), "tasks_sha1": tasks_digest(self.tasks)}  # fmt: skip

    def common_routes(self) -> list[tuple[str, str, Any, str | None]]:
        return [
            ("/", "GET", self.hello, None),
            ("/flywheel", "GET", self.info, None),
            ("/tasks", "GET", lambda: self.tasks, None),
        ]

    def hello(self) -> str:
        return self.hello_text

    def _check_id(self, env_id: int) -> None:
        raise NotImplementedError

    def _query(self, query: dict, answer) -> Any:
        env_id = validated_id(query)
        try:
            self._check_id(env_id)
            return answer(env_id)
        except Exception as error:
            return _agentgym_error(error)


class AgentGymTextCraftService(_AgentGymService):
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
            payload = _agentgym_error(error)
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
            payload = _agentgym_error(error)
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


# ---- SciWorld ----------------------------------------------------------------------------------


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


class AgentGymSciWorldService(_AgentGymService):
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
            return _agentgym_error(error)

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
            return _agentgym_error(error)

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


# The AgentGym servers answered as they answer, one for each family the project plays itself.
EMULATED = (AgentGymTextCraftService, AgentGymSciWorldService)


def compat_service(
    compat: str,
    env,
    dialect: Dialect,
    session_ttl_s: float,
    sequential_ids: bool = False,
    options: CompatOptions = CompatOptions(),  # noqa: B008 (frozen)
):
    """The service that answers as `compat`'s servers do for `dialect`, over `env`."""
    if compat != "agentgym":
        raise ValueError(f"unknown compatibility mode {compat!r}; expected one of {COMPAT_MODES}")
    service = next((s for s in EMULATED if s.dialect is dialect), None)
    if service is None:
        spoken = " and ".join(s.dialect.name for s in EMULATED)
        raise ValueError(f"--compat agentgym speaks the {spoken} dialects, not {dialect.name!r}")
    if env.name != dialect.served_env:
        raise ValueError(
            f"--compat agentgym serves AgentGym's {dialect.name} tasks, which need the "
            f"{dialect.served_env} environment, not {env.name}"
        )
    return service(env, session_ttl_s, sequential_ids, options)
