"""A server restarted under live episodes never mixes them (issue 36, item 2).

AgentGym's servers number their sessions 0, 1, 2, ... from each start. After a restart the first
episode to recover gets id 0 again, and an episode that still holds id 0 would step into that
session with no error. These tests restart servers that number sessions the same way
(`serve-env --sequential-ids`, and AgentGym's own TextCraft server where a checkout is given) with
several live episodes, as a crash does (kill -9, then a fresh process on the same port), and check
that every episode continues its own task to the same results as an undisturbed run.

The real AgentGym server runs when $FLYWHEEL_AGENTGYM_DIR names an AgentGym checkout (or a `git
archive` export holding agentenv-textcraft), e.g. `git clone https://github.com/WooooDyy/AgentGym
/tmp/AgentGym`; it needs fastapi, uvicorn and gymnasium, which the project's venv has.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from json_server import ScriptedJSONServer
from starlette.testclient import TestClient

from envs import make_env
from envs.agentgym.client import (
    AgentGymEnv,
    ClientSettings,
    RemoteEnv,
    RemoteEpisode,
    ServerPool,
)
from envs.agentgym.dialects import DIALECTS
from envs.agentgym.server import LocalServer, create_app

FAST = ClientSettings(timeout_s=10.0, connect_timeout_s=0.5, retries=1, backoff_s=0.05)
AGENTGYM_DIR = os.environ.get("FLYWHEEL_AGENTGYM_DIR")


@pytest.fixture(scope="module")
def textcraft():
    return make_env("textcraft")


def plans(env, task_ids: list[str]) -> dict[str, list[str]]:
    return {t: [action for _, action in env.expert_plan(t)] for t in task_ids}


def undisturbed(env, task_id: str, actions: list[str]) -> list:
    episode = env.start(task_id)
    results = [episode.step(action) for action in actions]
    episode.close()
    return results


def test_sequential_ids_count_from_zero_on_every_start(textcraft):
    for compat in (None, "agentgym"):
        for _ in range(2):  # a new app is a restarted server
            app = create_app(textcraft, compat=compat, sequential_ids=True)
            with TestClient(app) as client:
                ids = [client.post("/create", json={}).json()["id"] for _ in range(3)]
            assert ids == [0, 1, 2]
    with TestClient(create_app(textcraft)) as client:  # random by default
        assert client.post("/create", json={}).json()["id"] >= 3


def test_a_restart_under_live_episodes_mixes_none_of_them(textcraft):
    """Four episodes hold ids 0-3; after kill -9 and a restart the last one recovers first and
    gets id 0. Each episode must go on with its own task, to the undisturbed results."""
    tasks = textcraft.task_ids("train")[:4]
    actions = {t: ["inventory", *plan] for t, plan in plans(textcraft, tasks).items()}
    expected = {t: undisturbed(textcraft, t, actions[t]) for t in tasks}
    server = LocalServer("--env", "textcraft", "--sequential-ids")
    try:
        remote = RemoteEnv(textcraft, [server.url], FAST)
        episodes = {t: remote.start(t) for t in tasks}
        assert [e.env_id for e in episodes.values()] == [0, 1, 2, 3]
        results = {t: [episodes[t].step(actions[t][0])] for t in tasks}
        server.restart()  # SIGKILL, then a fresh process on the same port
        for k in range(1, max(map(len, actions.values()))):
            for t in reversed(tasks):  # the holder of id 3 recovers first and gets id 0
                if k < len(actions[t]):
                    results[t].append(episodes[t].step(actions[t][k]))
        assert results == expected
        assert [e.recoveries for e in episodes.values()] == [1, 1, 1, 1]
        assert sorted(e.env_id for e in episodes.values()) == [0, 1, 2, 3]
    finally:
        server.kill()


def test_an_episode_started_after_a_restart_takes_no_live_episodes_session(textcraft):
    """A new episode's `/create` on the restarted server answers id 0, which a live episode
    holds: the server counts as restarted then, before the old holder steps into it."""
    tasks = textcraft.task_ids("train")[:3]
    actions = plans(textcraft, tasks)
    expected = {t: undisturbed(textcraft, t, actions[t]) for t in tasks}
    server = LocalServer("--env", "textcraft", "--sequential-ids")
    try:
        remote = RemoteEnv(textcraft, [server.url], FAST)
        old = {t: remote.start(t) for t in tasks[:2]}
        results = {t: [old[t].step(actions[t][0])] for t in tasks[:2]}
        server.restart()
        new = remote.start(tasks[2])
        assert new.env_id == 0 and new.recoveries == 0  # AgentGym's numbering, from 0 again
        results[tasks[2]] = []
        episodes = {**old, tasks[2]: new}
        for k in range(max(map(len, actions.values()))):
            for t in tasks:
                if len(results[t]) == k and k < len(actions[t]):
                    results[t].append(episodes[t].step(actions[t][k]))
        assert results == expected
        assert [episodes[t].recoveries for t in tasks] == [1, 1, 0]
    finally:
        server.kill()


def test_many_episodes_stepped_at_once_across_a_restart_keep_their_own_tasks(textcraft):
    """Eight episodes stepped in lockstep (one batched request per step, then one by one on
    their own threads while they recover) across a restart."""
    tasks = textcraft.task_ids("train")[:8]
    actions = plans(textcraft, tasks)
    expected = {t: undisturbed(textcraft, t, actions[t]) for t in tasks}
    server = LocalServer("--env", "textcraft", "--sequential-ids")
    try:
        remote = RemoteEnv(textcraft, [server.url], FAST)
        episodes = dict(zip(tasks, remote.in_parallel(remote.start, tasks), strict=True))
        results = {t: [] for t in tasks}
        for k in range(max(map(len, actions.values()))):
            if k == 1:
                server.restart()
            moves = [(episodes[t], actions[t][k]) for t in tasks if k < len(actions[t])]
            for (episode, _), result in zip(moves, remote.step_all(moves), strict=True):
                results[episode.task_id].append(result)
        assert results == expected
        assert all(e.recoveries == 1 for e in episodes.values())
    finally:
        server.kill()


class SequentialIdsServer(ScriptedJSONServer):
    """A server that numbers sessions 0, 1, 2, ... as AgentGym's do, whose observations name the
    session's task and step count (so a step in another episode's session shows), and which can
    hold a step in flight: a step with action "hold" waits, once it has arrived, until
    `release` is set (or 2 s pass)."""

    def __init__(self) -> None:
        self.sessions: dict[int, dict] = {}
        self.next_id = 0
        self.arrived, self.release = threading.Event(), threading.Event()
        super().__init__()

    def answer(self, path: str, body: dict):
        if path == "/create":
            env_id, self.next_id = self.next_id, self.next_id + 1
            self.sessions[env_id] = {"task": None, "steps": 0}
            return {"id": env_id, "observation": "", "done": False, "reward": 0}
        if body.get("action") == "hold":
            self.arrived.set()
            self.release.wait(2)
        session = self.sessions.get(body["id"])
        if session is None:
            return {"error": f"The id {body['id']} is not valid."}
        if path == "/reset":
            session.update(task=body["data_idx"], steps=0)
            return {"id": body["id"], "observation": f"task {session['task']}", "done": False,
                    "reward": 0}  # fmt: skip
        if path == "/step":
            session["steps"] += 1
            seen = f"task {session['task']} step {session['steps']}: {body['action']}"
            return {"observation": seen, "reward": 0, "done": False}
        return True  # /close

    def restart(self) -> None:
        self.sessions.clear()
        self.next_id = 0


def test_no_session_is_created_while_a_step_for_an_old_one_is_in_flight():
    """Episode A's step (id 0) reaches the restarted server and is held there; meanwhile episode
    B finds its id gone and recovers. Were B's `/create` sent now, it would get id 0 and A's held
    step would land in B's new session; so it waits until A's step has been answered."""
    server = SequentialIdsServer()
    try:
        pool = ServerPool([server.url], DIALECTS["textcraft"], FAST)
        a, b = RemoteEpisode(pool, "7", 7), RemoteEpisode(pool, "9", 9)
        assert (a.env_id, b.env_id) == (0, 1)
        server.restart()
        held = {}
        thread = threading.Thread(target=lambda: held.update(result=a.step("hold")))
        thread.start()
        assert server.arrived.wait(5)
        threading.Timer(0.3, server.release.set).start()
        assert b.step("x").observation == "task 9 step 1: x"
        thread.join(5)
        assert held["result"].observation == "task 7 step 1: hold"
        assert b.step("y").observation == "task 9 step 2: y"
        assert a.step("z").observation == "task 7 step 2: z"
    finally:
        server.close()


# ---- AgentGym's own numbering and texts: the compat server, and AgentGym's real server --------


def play_agentgym(env: AgentGymEnv, restart, tasks: list[str], actions: dict, restart_after: int):
    """Every task's episode started, stepped `restart_after` times, the server restarted, then
    stepped on with the last-started episode first. Returns the results, the episodes and the
    ids they held when the server was restarted."""
    episodes = {t: env.start(t) for t in tasks}
    results = {t: [episodes[t].step(a) for a in actions[t][:restart_after]] for t in tasks}
    held = sorted(e.env_id for e in episodes.values())
    restart()
    for k in range(restart_after, max(map(len, actions.values()))):
        for t in reversed(tasks):
            if k < len(actions[t]):
                results[t].append(episodes[t].step(actions[t][k]))
    return results, episodes, held


def agentgym_case(env: AgentGymEnv, tasks: list[str]):
    """Each task's actions (a wrong one, then the expert's) and its undisturbed results on `env`'s
    server."""
    actions = {t: ["get 1 dirt", *[a for _, a in env.expert_plan(t)]] for t in tasks}
    return actions, {t: undisturbed(env, t, actions[t]) for t in tasks}


def test_a_restarted_compat_server_with_agentgyms_numbering_mixes_no_episodes(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # the same texts after the restart
    server = LocalServer("--env", "textcraft", "--compat", "agentgym", "--sequential-ids")
    try:
        env = AgentGymEnv("textcraft", [server.url], (0, 544), (0, 0), FAST)
        tasks = ["5", "130", "300", "540"]
        actions, expected = agentgym_case(env, tasks)
        server.restart()  # ids from 0 again for the episodes below
        results, episodes, held = play_agentgym(env, server.restart, tasks, actions, 2)
        assert held == [0, 1, 2, 3]
        assert results == expected
        assert all(expected[t][-1].reward == 1.0 for t in tasks)  # the expert's plans succeed
        assert [e.recoveries for e in episodes.values()] == [1, 1, 1, 1]
    finally:
        server.kill()


class AgentGymTextCraftServer:
    """AgentGym's own TextCraft server (agentenv_textcraft, FastAPI) from a checkout, as a child
    process on a loopback port: started as AgentGym's `textcraft` command starts it (uvicorn,
    `agentenv_textcraft:app`, from the agentenv-textcraft folder), killed with SIGKILL."""

    def __init__(self, checkout: Path) -> None:
        self.folder = checkout / "agentenv-textcraft"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        command = [sys.executable, "-m", "uvicorn", "agentenv_textcraft:app"]
        self.process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self.folder,  # it reads agentenv_textcraft/recipes from the working folder
            env={**os.environ, "PYTHONHASHSEED": "0"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"AgentGym's server exited: {self.process.stderr.read()}")
            try:
                httpx.get(self.url, timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.kill()
        raise TimeoutError("AgentGym's TextCraft server did not answer in 120 s")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.mark.skipif(not AGENTGYM_DIR, reason="set FLYWHEEL_AGENTGYM_DIR to an AgentGym checkout")
def test_agentgyms_own_server_restarted_under_live_episodes_mixes_none_of_them():
    server = AgentGymTextCraftServer(Path(AGENTGYM_DIR))
    try:
        env = AgentGymEnv("textcraft", [server.url], (0, 544), (0, 0), FAST)
        tasks = ["5", "130", "300", "540"]
        actions, expected = agentgym_case(env, tasks)
        server.restart()  # its ids start from 0 again
        results, episodes, held = play_agentgym(env, server.restart, tasks, actions, 2)
        assert held == [0, 1, 2, 3]  # AgentGym's own numbering
        assert sorted(e.env_id for e in episodes.values()) == [0, 1, 2, 3]  # reused after it
        assert results == expected
        assert all(expected[t][-1].reward == 1.0 for t in tasks)
        assert [e.recoveries for e in episodes.values()] == [1, 1, 1, 1]
    finally:
        server.kill()
