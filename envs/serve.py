"""Serve a Flywheel environment over AgentGym's HTTP protocol.

    python -m envs.serve --env textcraft --port 36001
    python -m envs.serve --config configs/eto_scienceworld.yaml --port 36002

AgentGym's own clients can use it (TextCraft and SciWorld servers' fields; `--dialect webshop`
speaks WebShop's), and so can Flywheel's (`env.servers` in a recipe config). `data_idx` indexes
the environment's train tasks followed by its test tasks. Beyond AgentGym's endpoints it answers
`GET /flywheel` (environment, dialect, a digest of the task list: clients check they agree),
`GET /tasks` (the task ids in `data_idx` order) and `POST /flywheel/step` (many sessions' steps in
one request: `{"steps": [<a /step body>, ...]}` answers `{"results": [<its /step answer>, ...]}`).
Errors come back as HTTP 200 with an `error` field, as AgentGym's servers do. Bound to 127.0.0.1
unless `--host` says otherwise: the protocol has no authentication.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from envs.agentgym import DIALECTS, UNKNOWN_ID, dialect_of, served_task_ids, tasks_digest
from envs.base import Environment, Episode


@dataclass
class _Session:
    episode: Episode | None = None
    observation: str = ""
    score: float = 0.0
    done: bool = False
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

    def __init__(self, env: Environment, dialect: str, session_ttl_s: float = 3600) -> None:
        self.env = env
        # A client that lost track of a session (it timed out and moved the episode elsewhere)
        # never closes it: sessions idle this long are closed when the next one is created.
        self.session_ttl_s = session_ttl_s
        self.dialect = DIALECTS[dialect]
        self.tasks = served_task_ids(env)
        self.digest = tasks_digest(self.tasks)
        self._sessions: dict[int, _Session] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def info(self) -> dict:
        return {
            "env": self.env.name,
            "dialect": self.dialect.name,
            "tasks": len(self.tasks),
            "tasks_sha1": self.digest,
        }

    def hello(self) -> str:
        return f"This is environment {self.env.name} (Flywheel)."

    def task_list(self) -> list[str]:
        return self.tasks

    def create(self, body: dict | None = None) -> Any:
        with self._lock:
            env_id = next(self._ids)
            self._sessions[env_id] = _Session()
            cutoff = time.monotonic() - self.session_ttl_s
            idle = [i for i, s in self._sessions.items() if s.last_used < cutoff]
            expired = [self._sessions.pop(i) for i in idle]
        for session in expired:
            session.end_episode()
        if self.dialect.name == "webshop":
            return env_id
        if self.dialect.name == "sciworld":
            return {"id": env_id}
        return {"id": env_id, "observation": "", "done": False, "reward": 0}

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
            session.observation, session.score, session.done = (
                session.episode.instruction,
                0.0,
                False,
            )
        return self._reset_answer(env_id, index, session.observation)

    def _reset_answer(self, env_id: int, index: int, instruction: str) -> Any:
        if self.dialect.name == "webshop":
            return [instruction, None]
        if self.dialect.name == "sciworld":
            description, _, observation = instruction.partition("\n")
            return {
                "task_name": self.tasks[index], "var_num": index, "task_description": description,
                "observation": observation, "reward": 0, "score": 0, "deleted": False,
                "done": False,
            }  # fmt: skip
        return {"id": env_id, "observation": instruction, "done": False, "reward": 0}

    def step(self, body: dict) -> dict:
        env_id, session = self._session(body)
        action = body.get("action")
        if not isinstance(action, str):
            raise _ClientError("'action' must be a string")
        with session.lock:
            if session.episode is None:
                raise _ClientError(f"environment {env_id} has no task: call /reset first")
            if session.done:
                raise _ClientError(f"The task with environment {env_id} has finished.")
            result = session.episode.step(action)
            session.observation, session.done = result.observation, result.done
            session.score += result.reward
        if self.dialect.name == "webshop":
            return {"state": result.observation, "reward": result.reward, "done": result.done,
                    "info": None}  # fmt: skip
        answer = {"observation": result.observation, "reward": result.reward, "done": result.done}
        if self.dialect.name == "sciworld":
            answer["score"] = session.score
        return answer

    def step_many(self, body: dict) -> dict:
        """Flywheel's extension: many sessions' `/step` bodies in one request (a lockstep rollout
        steps all its episodes on a server at once), each answered as `/step` would answer it."""
        steps = body.get("steps")
        if not isinstance(steps, list):
            raise _ClientError("'steps' must be a list of /step request bodies")
        return {"results": self.env.in_parallel(functools.partial(_answer, self.step), steps)}

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
        env_id = body.get(key) if isinstance(body, dict) else None
        if isinstance(env_id, str) and env_id.isdigit():
            env_id = int(env_id)  # query strings arrive as text
        if isinstance(env_id, bool) or not isinstance(env_id, int):
            raise _ClientError(f"the request needs an integer {key!r}")
        session = self._sessions.get(env_id)
        if session is None:
            raise _ClientError(f"{UNKNOWN_ID} {env_id} (the server may have restarted)")
        session.last_used = time.monotonic()
        return env_id, session


class _ClientError(ValueError):
    """A request the protocol does not allow; answered as `{"error": ...}`."""


def create_app(env: Environment, dialect: str | None = None, session_ttl_s: float = 3600):
    """The service as an ASGI app (Starlette: the protocol is small enough that FastAPI's request
    validation would only add latency; bodies are checked by `EnvService`)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response
    from starlette.routing import Route

    service = EnvService(env, dialect or dialect_of(env.name), session_ttl_s)
    # Environments that step in microseconds (TextCraft) are stepped on the event loop; slow or
    # out-of-process ones (ScienceWorld, step_workers > 1) in a thread pool, so one session's
    # step never holds up the others'.
    inline = env.step_workers == 1

    def endpoint(call, reads: str | None = "body"):
        """`call` gets the JSON body ("body"), the query parameters ("query") or nothing."""

        async def handle(request):
            args = ()
            if reads == "query":
                args = (dict(request.query_params),)
            elif reads == "body":
                raw = await request.body()
                try:
                    args = (json.loads(raw) if raw else {},)
                except ValueError:
                    return _json({"error": "the request body is not JSON"})
            result = (
                _answer(call, *args) if inline else await run_in_threadpool(_answer, call, *args)
            )
            return _json(result)

        return handle

    def _json(value) -> Response:
        return Response(json.dumps(value), media_type="application/json")

    routes = [
        Route("/", endpoint(service.hello, None), methods=["GET"]),
        Route("/flywheel", endpoint(service.info, None), methods=["GET"]),
        Route("/tasks", endpoint(service.task_list, None), methods=["GET"]),
        Route("/create", endpoint(service.create), methods=["POST"]),
        Route("/reset", endpoint(service.reset), methods=["POST"]),
        Route("/step", endpoint(service.step), methods=["POST"]),
        Route("/close", endpoint(service.close), methods=["POST"]),
        Route("/flywheel/step", endpoint(service.step_many), methods=["POST"]),
        Route("/observation", endpoint(service.observation, "query"), methods=["GET"]),
        Route("/detail", endpoint(service.detail, "query"), methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.service = service
    return app


def _answer(call, *args):
    try:
        return call(*args)
    except (_ClientError, KeyError) as error:
        return {"error": str(error).strip("'\"")}
    except Exception as error:  # the environment failed; the server keeps serving
        return {"error": f"{type(error).__name__}: {error}"}


class LocalServer:
    """`python -m envs.serve ARGS` as a child process on a loopback port (a free one unless
    given), ready when constructed: for benchmarks, tests and single-machine fan-out."""

    def __init__(self, *args: str, port: int | None = None, ready_timeout_s: float = 120) -> None:
        import socket
        import subprocess
        import sys

        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.args, self.port, self.url = args, port, f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "envs.serve", *args, "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._wait_ready(ready_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server {self.args} exited: {self.process.stdout.read()}")
            try:
                httpx.get(f"{self.url}/flywheel", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"server {self.args} did not come up in {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL: no goodbye to the clients, as when a machine dies."""
        self.process.kill()
        self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.__init__(*self.args, port=self.port)


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
        choices=SERVABLE,
        help="environment, with its default settings (default: textcraft)",
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
        "--session-ttl",
        type=float,
        default=3600,
        help="close sessions idle this many seconds (clients that moved an episode elsewhere "
        "never close its old session; default: 3600)",
    )
    return parser.parse_args(argv)


SERVABLE = ("textcraft", "scienceworld")


def env_settings(args: argparse.Namespace):
    """The environment to serve: a config's `env` section (without its servers), or a name."""
    from flywheel.settings import ConfigError, EnvSettings, load_config_section

    if not args.config:
        return EnvSettings(name=args.env)
    settings = load_config_section(EnvSettings, args.config, "env")
    if settings.name not in SERVABLE:
        raise ConfigError(f"{args.config}: env.name {settings.name!r} cannot be served here")
    return settings.model_copy(update={"servers": []})


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from envs import make_env
    from flywheel.settings import ConfigError

    args = parse_args(argv)
    try:
        env = make_env(env_settings(args))
        env.check()
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    app = create_app(env, args.dialect, args.session_ttl)
    service = app.state.service
    print(
        f"serving {env.name} ({service.dialect.name} dialect, {len(service.tasks)} tasks) "
        f"on http://{args.host}:{args.port}",
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
