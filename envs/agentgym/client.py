"""Episodes on environment servers that speak AgentGym's HTTP protocol.

AgentGym's servers (`/create`, `/reset`, `/step`, `/observation`, `/close`) differ per
environment; each family's rules are one `Dialect` (envs/agentgym/dialects/).

Errors: AgentGym servers answer many errors as HTTP 200 with an `error` field (Flywheel's with a
4xx or 5xx status and the same field); those, other HTTP statuses and answers that are not the
expected JSON raise `AgentGymError` naming the server, the endpoint and what came back. A server
started with a token (`serve-env --token`) is sent `$FLYWHEEL_ENV_TOKEN` as a bearer token: it is
read from the environment only, never from a config, so it stays out of run parameters, logs and
cache keys. Connection failures are retried with back-off; a server that stays
down, hangs past the timeout or restarted (it no longer knows the episode's id) does not end the
episode: it is re-created on a live server (the same one once it is back), its actions so far are
replayed and checked against the observations already seen, and the step is retried there.
Only when no server can continue does the step raise `ServerUnavailable`.

A restarted server never mixes episodes. AgentGym's servers number sessions 0, 1, 2, ... from
each start, so after a restart a new session can get the id another live episode still holds,
and that episode's next step would land in it without any error. So a server counts as
restarted as soon as any sign of it is seen (an id it forgot, a failed or timed-out request, or a
`/create` answering an id one of our live sessions holds), and every session created before that
is stale: its episode is re-created and replayed before its next request, and nothing more is sent
to its old id (not even `/close`). `/create` and requests that name a session never overlap on one
server, so a session handed out by a restarted server is seen as such before any other request
can reach it. This holds for the sessions of one client process; two clients sharing a server
that numbers its sessions cannot tell each other's sessions apart after a restart.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from envs.agentgym.dialects import DIALECTS, dialect_serving
from envs.agentgym.expert import PROMPT_ACKNOWLEDGEMENT
from envs.agentgym.protocol import AgentGymError, Dialect, served_task_ids, tasks_digest
from envs.base import Environment, EnvironmentUnavailable, Episode, Split, StepResult


class ServerUnavailable(EnvironmentUnavailable):
    """No server could be reached (or answered in time) to run the request."""


class LostEpisode(RuntimeError):
    """The server no longer knows the episode (it restarted)."""


class StaleSession(LostEpisode):
    """The episode's session was created before its server restarted: its id may now be another
    session's, so nothing more is sent to it."""


# What Flywheel's server answers for an id it does not know (it restarted). Matched exactly:
# a looser match would turn an environment's own errors into endless recoveries.
UNKNOWN_ID = "unknown environment id"
# What AgentGym's TextCraft and SciWorld servers answer (HTTP 200, `error` field) for an id they
# do not know (agentenv_textcraft/env_wrapper.py and agentenv_sciworld/environment.py, `_check_id`;
# their only such text: `/close` answers `false` or HTTP 500, which `close` ignores): the whole
# message, so "has been deleted" or "has finished" stay errors.
AGENTGYM_UNKNOWN_ID = re.compile(r"The id -?\d+ is not valid\.")
# The bearer token Flywheel's servers require when started with one; the client sends it too.
TOKEN_ENV = "FLYWHEEL_ENV_TOKEN"


@dataclass(frozen=True)
class ClientSettings:
    """How hard the client tries. `timeout_s` bounds every request, so a hung server fails a
    request instead of stalling the flow."""

    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    retries: int = 3  # per request, on connection errors, with back-off 0.2 s, 0.4 s, 0.8 s, ...
    backoff_s: float = 0.2
    recoveries: int = 3  # per episode: failed tries (each followed by re-create and replay)
    down_for_s: float = 5.0  # a failed server is skipped this long before it is tried again


class _Phases:
    """Two kinds of requests that never overlap on one server: `/create`s, and requests that name
    a session. Each kind runs side by side with its own; a waiting `/create` holds back new
    session requests, so it cannot wait forever."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._creating = self._creates_waiting = self._in_sessions = 0

    @contextlib.contextmanager
    def creating(self):
        with self._changed:
            self._creates_waiting += 1
            self._changed.wait_for(lambda: self._in_sessions == 0)
            self._creates_waiting -= 1
            self._creating += 1
        try:
            yield
        finally:
            with self._changed:
                self._creating -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def in_sessions(self):
        with self._changed:
            self._changed.wait_for(lambda: self._creating == 0 and self._creates_waiting == 0)
            self._in_sessions += 1
        try:
            yield
        finally:
            with self._changed:
                self._in_sessions -= 1
                self._changed.notify_all()


class Server:
    """One server URL: requests with timeouts, retries on connection errors, health state, and
    its restarts as this client has seen them (`generation`; see the module docstring)."""

    def __init__(self, url: str, dialect: Dialect, settings: ClientSettings) -> None:
        self.url = url.rstrip("/")
        self.dialect = dialect
        self.settings = settings
        self.live_episodes = 0
        self.down_until = 0.0
        # The check this server missed when the run began (it did not answer), run before it
        # gets an episode (`passes_pending_check`); None once passed.
        self.pending_check: Callable[[Server], None] | None = None
        self.generation = 0  # restarts seen so far; a session belongs to the one it was made in
        self._live_ids: set[int] = set()  # this generation's sessions that episodes hold
        self._ids_lock = threading.Lock()
        self._phases = _Phases()
        timeout = httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s)
        self._http = httpx.Client(
            base_url=self.url,
            timeout=timeout,
            limits=httpx.Limits(max_connections=256),
            headers=_auth_headers(),
        )

    def post(self, path: str, body: dict, env_id: int | None = None) -> Any:
        if env_id is not None:
            body = {self.dialect.id_field: env_id, **body}
        return self._request("POST", path, json=body)

    def get(self, path: str, env_id: int | None = None) -> Any:
        params = {self.dialect.id_field: env_id} if env_id is not None else None
        return self._request("GET", path, params=params)

    def _request(self, method: str, path: str, **kwargs) -> Any:
        for attempt in range(self.settings.retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                # The request never reached the server, so sending it again is safe.
                if attempt == self.settings.retries:
                    self.down_until = time.monotonic() + self.settings.down_for_s
                    raise ServerUnavailable(f"{self.url}{path}: {error}") from error
                time.sleep(self.settings.backoff_s * 2**attempt)
            except httpx.TransportError as error:
                # It may have reached the server (a read timed out, the connection dropped):
                # not repeated here; the episode recovers by replaying on a fresh environment.
                self.down_until = time.monotonic() + self.settings.down_for_s
                raise ServerUnavailable(
                    f"{self.url}{path}: {type(error).__name__}: {error}"
                ) from error
        return self._answer(path, response)

    def _answer(self, path: str, response: httpx.Response) -> Any:
        where, status = f"{self.url}{path}", response.status_code
        if status in (502, 503, 504):  # a proxy or balancer without its server
            self.down_until = time.monotonic() + self.settings.down_for_s
            raise ServerUnavailable(f"{where} answered HTTP {status}")
        if status == 200:
            try:
                answer = response.json()
            except ValueError:
                raise AgentGymError(f"{where} answered non-JSON: {response.text[:120]!r}") from None
            if not (isinstance(answer, dict) and "error" in answer):
                return answer
            message = str(answer["error"])
        else:
            message = _error_message(response)
        if _is_unknown_id(status, message):
            raise LostEpisode(f"{where}: {message}")
        if status == 401:
            hint = "check" if os.environ.get(TOKEN_ENV) else "set"
            raise AgentGymError(f"{where} answered HTTP 401: {message}; {hint} ${TOKEN_ENV}", 401)
        if status != 200:
            raise AgentGymError(f"{where} answered HTTP {status}: {message}", status)
        raise AgentGymError(f"{where} answered an error: {message}")

    def create(self) -> tuple[int, int]:
        """A new session: its id and the generation it belongs to. An id that one of this
        generation's live sessions holds means the server restarted (it counts from 0 again)."""
        with self._phases.creating():
            generation = self.generation
            try:
                env_id = _parsed(self, self.dialect.parse_id, self.post("/create", {}))
            except ServerUnavailable:
                self.restarted(generation)
                raise
            with self._ids_lock:
                if env_id in self._live_ids:
                    self._new_generation()
                self._live_ids.add(env_id)
                return env_id, self.generation

    def session_post(
        self, path: str, body: dict, generations: list[int], env_id: int | None = None
    ) -> Any:
        """POST a request for sessions made in `generations` (`env_id`: the one it names, put
        into the body), refused with StaleSession if any was made before a restart. A failed
        request or a forgotten id means the server restarted."""
        with self._phases.in_sessions():
            generation = self.generation
            if any(made != generation for made in generations):
                raise StaleSession(f"{self.url} restarted since the session was created")
            try:
                return self.post(path, body, env_id)
            except (ServerUnavailable, LostEpisode):
                self.restarted(generation)
                raise

    def restarted(self, seen_generation: int) -> None:
        """The server restarted (or may have) while `seen_generation` was current: every session
        made until then is stale. Many episodes notice the same restart; it counts once."""
        with self._ids_lock:
            if seen_generation == self.generation:
                self._new_generation()

    def _new_generation(self) -> None:
        self.generation += 1
        self._live_ids.clear()

    def forget(self, env_id: int, generation: int) -> None:
        """An episode let go of its session (an id of an older generation may be a new one's)."""
        with self._ids_lock:
            if generation == self.generation:
                self._live_ids.discard(env_id)

    def available(self) -> bool:
        return time.monotonic() >= self.down_until

    def probe(self, path: str) -> Any:
        """GET `path` before any work; a failure is a ValueError saying the server is unusable
        (`ServerUnreachable` where no answer came at all)."""
        try:
            return self.get(path)
        except ServerUnavailable as error:
            raise ServerUnreachable(
                f"environment server {self.url} is not usable: {error}"
            ) from None
        except (AgentGymError, LostEpisode) as error:
            raise ValueError(f"environment server {self.url} is not usable: {error}") from None

    def passes_pending_check(self) -> bool:
        """Whether episodes may go here: a server that could not be checked when the run began
        is checked when it is next considered (`check_servers`); one that answers for another
        environment stops the run."""
        if self.pending_check is None:
            return True
        if not self.available():
            return False
        try:
            self.pending_check(self)
        except ServerUnreachable:
            return False  # still down: it sits out `down_for_s` again
        self.pending_check = None
        return True


class ServerUnreachable(ValueError):
    """A server gave no answer at all when checked (down, restarting, unreachable)."""


def check_servers(pool: ServerPool, check_one: Callable[[Server], None]) -> None:
    """`check_one` on every server before any work. A server that answers wrongly stops the run;
    one that does not answer sits out until it answers and passes (a server restarting as a stage
    starts must not fail the stage the others can play); none answering stops the run."""
    unreachable = []
    for server in pool.servers:
        try:
            check_one(server)
        except ServerUnreachable as error:
            unreachable.append(str(error))
            server.pending_check = check_one
    if len(unreachable) == len(pool.servers):
        raise ValueError("no environment server is usable: " + "; ".join(unreachable))
    for error in unreachable:
        print(f"warning: {error}; its episodes go to the others until it answers", file=sys.stderr)


class ServerPool:
    """The servers episodes are spread over: each new episode goes to the live server with the
    fewest live episodes."""

    def __init__(self, urls: list[str], dialect: Dialect, settings: ClientSettings) -> None:
        if not urls:
            raise ValueError("no environment servers given")
        self.servers = [Server(url, dialect, settings) for url in urls]
        self.dialect = dialect
        self.settings = settings
        self._lock = threading.Lock()

    def assign(self) -> Server:
        with self._lock:
            # When all failed recently, try them anyway: one may have restarted. Never one whose
            # check is pending: it may serve another environment.
            checked = [s for s in self.servers if s.passes_pending_check()]
            candidates = [s for s in checked if s.available()] or checked or self.servers
            server = min(candidates, key=lambda s: s.live_episodes)
            server.live_episodes += 1
            return server

    def release(self, server: Server) -> None:
        with self._lock:
            server.live_episodes -= 1


@dataclass
class _Remote:
    server: Server
    env_id: int
    generation: int  # the server's generation the session was made in
    score: float = 0.0

    def post(self, path: str, body: dict) -> Any:
        return self.server.session_post(path, body, [self.generation], self.env_id)


@dataclass
class RemoteEpisode(Episode):
    """One episode on a server; survives the server's death by moving to another one."""

    pool: ServerPool
    task_id: str
    index: int
    instruction: str = ""
    reset_answer: Any = None  # the server's first `/reset` answer (SciWorld's names the task)
    recoveries: int = 0  # times this episode, already running, was re-created and replayed
    _failures: int = 0  # failed tries of any request, against ClientSettings.recoveries
    _actions: list[str] = field(default_factory=list)
    _results: list[StepResult] = field(default_factory=list)
    _remote: _Remote | None = None

    def __post_init__(self) -> None:
        self._with_recovery(lambda: None)

    @property
    def server(self) -> Server | None:
        return self._remote.server if self._remote else None

    @property
    def env_id(self) -> int | None:
        return self._remote.env_id if self._remote else None

    @property
    def generation(self) -> int | None:
        return self._remote.generation if self._remote else None

    def step(self, action: str) -> StepResult:
        result = self._with_recovery(lambda: self._step_on_server(action))
        self._actions.append(action)
        self._results.append(result)
        return result

    def close(self) -> None:
        remote = self._remote
        self._drop_remote()
        if remote is not None:
            # Best effort: the episode is over whether or not the server frees it now. A stale
            # session is not closed: its id may be another episode's now.
            with contextlib.suppress(AgentGymError, ServerUnavailable, LostEpisode):
                remote.post("/close", {})

    def _with_recovery(self, request: Callable[[], StepResult | None]) -> Any:
        """`request()` on the episode's server; when that server is unreachable or forgot the
        episode, re-create it on a live one (replaying its steps) and try again, within the
        episode's budget of `ClientSettings.recoveries` failures."""
        while True:
            try:
                if self._remote is None:
                    self._open()
                return request()
            except (ServerUnavailable, LostEpisode) as error:
                was_running = self._remote is not None or bool(self._actions)
                self._drop_remote()  # a failed server sits out `down_for_s`; see ServerPool
                # A session made stale by another episode's finding is not this one's failure.
                self._failures += not isinstance(error, StaleSession)
                if self._failures > self.pool.settings.recoveries:
                    raise ServerUnavailable(
                        f"task {self.task_id}: no environment server could continue the "
                        f"episode after {self._failures} failed tries; last error: {error}"
                    ) from None
                self.recoveries += was_running

    def _open(self) -> None:
        server = self.pool.assign()
        dialect = self.pool.dialect
        try:
            env_id, generation = server.create()
        except BaseException:
            self.pool.release(server)
            raise
        self._remote = _Remote(server, env_id, generation)
        try:
            answer = self._remote.post("/reset", {dialect.reset_index_field: self.index})
            self._replay(server, _parsed(server, dialect.first_observation, answer))
            if self.reset_answer is None:
                self.reset_answer = answer
        except AgentGymError:
            self.close()  # not recoverable: free the server's session now
            raise

    def _replay(self, server: Server, observation: str) -> None:
        """Bring a fresh server-side episode to where this one was, checking every answer."""
        if self.instruction and observation != self.instruction:
            raise AgentGymError(
                f"{server.url}: task {self.task_id} starts differently on replay"
                + self._mismatch_hint()
            )
        self.instruction = observation
        for action, seen in zip(self._actions, self._results, strict=True):
            if self._step_on_server(action) != seen:
                raise AgentGymError(
                    f"{server.url}: replaying task {self.task_id} gave a different result for "
                    f"{action!r}; the environment is not deterministic, so the episode cannot move"
                    + self._mismatch_hint()
                )

    def _mismatch_hint(self) -> str:
        hint = self.pool.dialect.replay_hint
        return f"; {hint}" if hint else ""

    def _step_on_server(self, action: str) -> StepResult:
        remote = self._remote
        answer = remote.post("/step", {"action": action})
        result, remote.score = _parsed(
            remote.server, self.pool.dialect.parse_step, answer, remote.score
        )
        return result

    def settle(self, action: str, answer: Any) -> StepResult:
        """Take a step its server already answered (in a batched request, `RemoteEnv.step_all`)."""
        remote = self._remote
        result, remote.score = _parsed(
            remote.server, self.pool.dialect.parse_step, answer, remote.score
        )
        self._actions.append(action)
        self._results.append(result)
        return result

    def abandon_server(self) -> None:
        """Its server failed mid-request, so the episode's state there is unknown: the next step
        re-creates it on a live server and replays it."""
        self._drop_remote()
        self._failures += 1
        self.recoveries += 1

    def _drop_remote(self) -> None:
        remote, self._remote = self._remote, None
        if remote is not None:
            remote.server.forget(remote.env_id, remote.generation)
            self.pool.release(remote.server)


def _is_unknown_id(status: int, message: str) -> bool:
    """The server no longer knows the episode's id. Flywheel's servers answer 404, AgentGym's 200."""
    if status == 200 and AGENTGYM_UNKNOWN_ID.fullmatch(message):
        return True
    return status in (200, 404) and message.startswith(UNKNOWN_ID)


def _error_message(response: httpx.Response) -> str:
    """An error answer's `error` field (Flywheel's servers send one), else the start of its text."""
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "error" in answer:
        return str(answer["error"])
    return response.text[:200]


def _auth_headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _parsed(server: Server, parse: Callable, *args):
    """`parse(*args)`, its protocol errors naming the server (the dialect knows only fields)."""
    try:
        return parse(*args)
    except AgentGymError as error:
        raise AgentGymError(f"{server.url}{error}") from None


class AgentGymEnv(Environment):
    """An AgentGym server family as a Flywheel environment; tasks are the servers' indices.

    `train` and `test` are index ranges [start, stop) of the server's task list: AgentGym's
    servers publish no split, so the user names one. TextCraft's and SciWorld's prompt is
    AgentGym's client's own task prompt, sent as its client sends it (the first user turn,
    answered "OK. ..."); TextCraft and SciWorld have an expert, TextCraft an oracle
    (`envs.agentgym.expert`), both read from a task's first answer, kept per task.
    """

    step_workers = 64  # steps are HTTP round trips: many can be in flight at once

    def __init__(
        self,
        dialect: str,
        servers: list[str],
        train: tuple[int, int],
        test: tuple[int, int],
        client: ClientSettings | None = None,
    ) -> None:
        self.dialect = DIALECTS[dialect]
        self.name = f"agentgym-{dialect}"
        self.reward_range = self.dialect.reward_range
        self.splits = {"train": range(*train), "test": range(*test)}
        self.pool = ServerPool(servers, self.dialect, client or ClientSettings())
        if self.dialect.system_prompt is not None:  # as AgentGym's client: a user turn, then "OK"
            self.system_prompt = self.dialect.system_prompt
            self.prompt_acknowledgement = PROMPT_ACKNOWLEDGEMENT
        self._openings: dict[str, tuple[str, Any]] = {}  # task id -> (instruction, /reset answer)

    def check(self) -> None:
        check_servers(self.pool, lambda server: server.probe("/"))

    def task_ids(self, split: Split) -> list[str]:
        return [str(i) for i in self.splits[split]]

    def start(self, task_id: str) -> Episode:
        if not task_id.isdigit():
            raise KeyError(f"{self.name} task ids are server indices, not {task_id!r}")
        episode = RemoteEpisode(self.pool, task_id, int(task_id))
        self._openings.setdefault(task_id, (episode.instruction, episode.reset_answer))
        return episode

    def opening(self, task_id: str) -> tuple[str, Any]:
        """A task's first observation and `/reset` answer, from an episode started on a server
        once (closed again when none has run yet)."""
        if task_id not in self._openings:
            self.start(task_id).close()
        return self._openings[task_id]

    def task_goal(self, task_id: str) -> str | None:
        """A task's goal (TextCraft's item, `acacia_boat`), from its text on the servers, where
        the dialect reads one: AgentGym's numbering depends on the server's machine."""
        if not self.dialect.reads("task_goal"):
            return None
        return self.dialect.task_goal(self.opening(task_id)[0])

    def expert_plan(self, task_id: str) -> list[tuple[str, str]] | None:
        if not self.dialect.reads("expert_plan"):
            return None
        return self.dialect.expert_plan(*self.opening(task_id))

    def mistakes(self, task_id: str, actions: list[str | None]) -> list[bool] | None:
        if not self.dialect.reads("mistakes"):
            return None
        return self.dialect.mistakes(self.opening(task_id)[0], actions)


class RemoteEnv(Environment):
    """A Flywheel environment whose episodes run on Flywheel environment servers (`serve-env`).

    Everything but the episodes (tasks, expert, prompts, oracle) comes from the local `catalog`;
    `check` makes sure every server serves the same environment with the same task list.
    """

    step_workers = 64

    def __init__(
        self, catalog: Environment, servers: list[str], client: ClientSettings | None = None
    ) -> None:
        self.catalog = catalog
        self.name = catalog.name
        self.reward_range = catalog.reward_range
        self.system_prompt = catalog.system_prompt
        self.prompt_acknowledgement = catalog.prompt_acknowledgement
        self.noop_action = catalog.noop_action
        self.agent_format, self.tool_arguments = catalog.agent_format, catalog.tool_arguments
        self.validation = catalog.validation  # its task lists are the catalog's
        self.max_live_episodes = catalog.max_live_episodes  # its sessions, on the servers
        self.served_tasks = served_task_ids(catalog)
        self._index = {t: i for i, t in enumerate(self.served_tasks)}
        self.pool = ServerPool(servers, dialect_serving(catalog.name), client or ClientSettings())

    def check(self) -> None:
        """Every server that answers serves this environment's tasks (raises ValueError if one
        does not); one that does not answer is checked before it gets an episode."""
        expected = {"env": self.name, "tasks_sha1": tasks_digest(self.served_tasks)}

        def serves_this(server: Server) -> None:
            info = server.probe("/flywheel")
            found = {k: info.get(k) for k in expected} if isinstance(info, dict) else info
            if found != expected:
                raise ValueError(
                    f"environment server {server.url} serves {found}, this run needs {expected}: "
                    "start it with the same Flywheel version and environment settings"
                )

        check_servers(self.pool, serves_this)

    def task_ids(self, split: Split) -> list[str]:
        return self.catalog.task_ids(split)

    def step_all(self, moves: list[tuple[Episode, str]]) -> list[StepResult | Exception]:
        """One `POST /flywheel/step` per server for all its episodes' steps; whatever that does
        not settle (an error answer, a failed server) goes the one-step way, with recovery."""
        results: list[StepResult | Exception | None] = [None] * len(moves)
        groups: dict[Server, list[int]] = {}
        for k, (episode, _) in enumerate(moves):
            if episode.server is not None:
                groups.setdefault(episode.server, []).append(k)

        def step_on(group: tuple[Server, list[int]]) -> None:
            server, ks = group
            answers = self._batch(server, [moves[k] for k in ks])
            for k, answer in zip(ks, answers, strict=True):
                if answer is not None:
                    try:
                        results[k] = moves[k][0].settle(moves[k][1], answer)
                    except AgentGymError as error:
                        results[k] = error

        self.in_parallel(step_on, list(groups.items()))
        rest = [k for k, result in enumerate(results) if result is None]
        for k, result in zip(rest, super().step_all([moves[k] for k in rest]), strict=True):
            results[k] = result
        return results

    def _batch(self, server: Server, moves: list[tuple[RemoteEpisode, str]]) -> list[Any]:
        """The servers' answers to `moves`, None where a move still has to be made."""
        id_field = self.pool.dialect.id_field
        bodies = [{id_field: episode.env_id, "action": action} for episode, action in moves]
        generations = [episode.generation for episode, _ in moves]
        try:
            answer = server.session_post("/flywheel/step", {"steps": bodies}, generations)
        except StaleSession:
            return [None] * len(moves)  # not sent; each episode recovers on its own way
        except AgentGymError as error:
            # 404, 405: not a Flywheel server after all; other 4xx: the request was refused as
            # a whole, before any step (too large, say). Either way no step was taken: one by one.
            if 400 <= error.status < 500:
                return [None] * len(moves)
            answer = None  # it failed somewhere in the batch: which steps were taken is unknown
        except (ServerUnavailable, LostEpisode):
            answer = None
        answers = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(answers, list) or len(answers) != len(moves):
            for episode, _ in moves:
                episode.abandon_server()  # re-created elsewhere and replayed, checked
            return [None] * len(moves)
        # An error answer means the step was not taken there (unknown id, finished episode).
        return [None if isinstance(a, dict) and "error" in a else a for a in answers]

    def start(self, task_id: str) -> Episode:
        if task_id not in self._index:
            raise KeyError(f"unknown {self.name} task {task_id!r}")
        return RemoteEpisode(self.pool, task_id, self._index[task_id])

    def expert_plan(self, task_id: str):
        return self.catalog.expert_plan(task_id)

    def mistakes(self, task_id: str, actions):
        return self.catalog.mistakes(task_id, actions)
