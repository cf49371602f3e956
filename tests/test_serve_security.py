"""`flywheel serve-env` against clients that are careless or hostile: session ids nobody can
guess, the bearer token, bad requests answered with their HTTP status and their exact message,
bounded body size and nesting. Real `python -m envs.agentgym.server` processes on loopback, as in
tests/test_agentgym.py; Starlette's TestClient where only the app's logic is under test."""

from __future__ import annotations

import itertools
import json
import socket

import httpx
import pytest

from envs import make_env
from envs.agentgym.client import TOKEN_ENV, AgentGymError, RemoteEnv
from envs.agentgym.server import MAX_BODY_BYTES, MAX_JSON_DEPTH, LocalServer, create_app
from flywheel.settings import EnvSettings

TOKEN = "correct horse battery staple"


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.url) as client:
        yield client


def new_session(http, data_idx: int | None = 0) -> int:
    env_id = http.post("/create").json()["id"]
    if data_idx is not None:
        http.post("/reset", json={"id": env_id, "data_idx": data_idx}).raise_for_status()
    return env_id


def test_session_ids_are_random_large_and_exact_in_json(textcraft):
    from starlette.testclient import TestClient

    by_dialect = [("textcraft", lambda a: a["id"]), ("sciworld", lambda a: a["id"]),
                  ("webshop", lambda a: a)]  # fmt: skip
    for dialect, id_of in by_dialect:
        client = TestClient(create_app(textcraft, dialect))
        ids = [id_of(client.post("/create").json()) for _ in range(50)]
        assert len(set(ids)) == 50
        # Random 53-bit numbers: one below 2**24 has a chance of 2**-29.
        assert all(2**24 <= i < 2**53 for i in ids), ids
        gaps = {b - a for a, b in itertools.pairwise(sorted(ids))}
        assert gaps != {1}


def test_a_client_cannot_step_or_close_another_clients_session_by_guessing(http):
    victim = new_session(http)
    mine = new_session(http)
    guesses = {*range(50), *range(mine - 50, mine + 51)} - {mine}
    for guess in sorted(guesses):
        for path in ("/step", "/close"):
            answer = http.post(path, json={"id": guess, "action": "inventory"})
            assert answer.status_code == 404, (path, guess, answer.text)
            assert answer.json() == {
                "error": f"unknown environment id {guess} (the server may have restarted)"
            }
    step = http.post("/step", json={"id": victim, "action": "inventory"})
    assert step.status_code == 200 and step.json()["observation"].startswith("Inventory")


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def nested_objects(depth: int) -> bytes:
    return b'{"a": ' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        ("/step", nested(10_000), 400, "the request body nests deeper than 32 levels"),
        ("/flywheel/step", nested_objects(10_000), 400,
         "the request body nests deeper than 32 levels"),
        ("/flywheel/step", b"[1]", 400, "the request body must be a JSON object, not an array"),
        ("/reset", b'"text"', 400, "the request body must be a JSON object, not a string"),
        ("/step", b"7", 400, "the request body must be a JSON object, not a number"),
        ("/create", b"{not json", 400,
         "the request body is not JSON: Expecting property name enclosed in double quotes: "
         "line 1 column 2 (char 1)"),
        ("/step", b'{"id": "x", "action": "inventory"}', 400, "the request needs an integer 'id'"),
        ("/step", b'{"id": true, "action": "inventory"}', 400,
         "the request needs an integer 'id'"),
        ("/flywheel/step", b'{"steps": 3}', 400, "'steps' must be a list of /step request bodies"),
    ],
)  # fmt: skip
def test_bad_requests_get_400_and_the_exact_message(http, path, body, status, error):
    answer = http.post(path, content=body)
    assert (answer.status_code, answer.json()) == (status, {"error": error})


def test_session_errors_keep_their_status_and_quotes(http):
    env_id = new_session(http, data_idx=None)

    def post(path, body):
        answer = http.post(path, json=body)
        return answer.status_code, answer.json()

    assert post("/step", {"id": env_id, "action": 3}) == (
        400, {"error": "'action' must be a string"}
    )  # fmt: skip
    assert post("/step", {"id": env_id, "action": "inventory"}) == (
        409, {"error": f"environment {env_id} has no task: call /reset first"}
    )  # fmt: skip
    assert post("/reset", {"id": env_id, "data_idx": -1}) == (
        400, {"error": "data_idx must be a task index in [0, 419)"}
    )  # fmt: skip
    # An entry of a batch is answered in its place; the batch itself succeeds.
    assert post("/flywheel/step", {"steps": [[env_id]]}) == (
        200, {"results": [{"error": "a /step body must be a JSON object, not an array"}]}
    )  # fmt: skip
    for text in ("x", "²", "9" * 5000):
        observation = http.get("/observation", params={"id": text})
        assert observation.status_code == 400, text
        assert observation.json() == {"error": "the request needs an integer 'id'"}
    observation = http.get("/observation", params={"id": str(env_id)})
    assert (observation.status_code, observation.json()) == (200, "")


def test_an_environment_failure_is_a_500_with_its_message_intact(textcraft):
    from starlette.testclient import TestClient

    app = create_app(textcraft)
    client = TestClient(app)
    env_id = client.post("/create").json()["id"]
    client.post("/reset", json={"id": env_id, "data_idx": 0}).raise_for_status()

    def fail(action):
        raise KeyError(f"no item called {action!r}")

    app.state.service._sessions[env_id].episode.step = fail
    answer = client.post("/step", json={"id": env_id, "action": "get 'x'"})
    assert answer.status_code == 500
    assert answer.json() == {"error": """KeyError: no item called "get 'x'\""""}


def test_a_body_is_bounded_in_size_and_nesting_but_not_below_the_limits(http):
    env_id = new_session(http)
    step = json.dumps({"id": env_id, "action": "inventory"}).encode()
    too_large = {"error": f"the request body is over {MAX_BODY_BYTES} bytes"}

    exactly = http.post("/step", content=step.ljust(MAX_BODY_BYTES))
    assert exactly.status_code == 200, exactly.text
    over = http.post("/step", content=step.ljust(MAX_BODY_BYTES + 1))
    assert (over.status_code, over.json()) == (413, too_large)

    def chunks():  # no content-length: the server counts as it reads
        yield step
        for _ in range(64):
            yield b" " * (64 << 10)

    chunked = http.post("/step", content=chunks())
    assert (chunked.status_code, chunked.json()) == (413, too_large)

    # Nesting up to the limit is allowed, and brackets inside strings are not nesting.
    body = json.dumps({"id": env_id, "action": "inventory", "x": _depth(MAX_JSON_DEPTH - 1)})
    assert http.post("/step", content=body).status_code == 200
    body = json.dumps({"id": env_id, "action": "inventory", "x": _depth(MAX_JSON_DEPTH)})
    assert http.post("/step", content=body).status_code == 400
    text = json.dumps({"id": env_id, "action": "inventory", "x": "[{" * 10_000})
    assert http.post("/step", content=text).status_code == 200


def test_a_body_declared_too_large_is_refused_before_it_is_sent(server):
    """The server answers 413 on the headers alone, so it neither waits for nor reads a body
    that would only be refused (here the client never sends it)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(
            b"POST /step HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1073741824\r\n\r\n{"
        )
        answer = b""
        while not answer.endswith(b"}") and (chunk := connection.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert answer.decode().endswith(
        json.dumps({"error": f"the request body is over {MAX_BODY_BYTES} bytes"})
    )


def _depth(levels: int):
    """A value `levels` deep: lists of lists, with strings of brackets inside."""
    value: object = "]]}}[[{{"
    for _ in range(levels):
        value = [value]
    return value


@pytest.fixture(scope="module", params=["--token", TOKEN_ENV])
def guarded(request):
    """A server that needs TOKEN, given on its command line or in its environment."""
    if request.param == "--token":
        server = LocalServer("--env", "textcraft", "--token", TOKEN)
    else:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(TOKEN_ENV, TOKEN)
            server = LocalServer("--env", "textcraft")
    yield server
    server.kill()
    assert TOKEN not in server.process.stdout.read()  # never printed


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/flywheel"), ("GET", "/tasks"), ("POST", "/create"), ("POST", "/reset"),
     ("POST", "/step"), ("POST", "/close"), ("POST", "/flywheel/step"),
     ("GET", "/observation"), ("GET", "/detail")],
)  # fmt: skip
def test_a_guarded_server_refuses_requests_without_the_right_token(guarded, method, path):
    missing = {"error": f"this server needs 'Authorization: Bearer <token>' (${TOKEN_ENV})"}
    for headers, error in [
        ({}, missing),
        ({"Authorization": f"Basic {TOKEN}"}, missing),
        ({"Authorization": "Bearer"}, missing),
        ({"Authorization": "Bearer wrong"}, {"error": "wrong bearer token"}),
        ({"Authorization": f"Bearer {TOKEN[:-1]}"}, {"error": "wrong bearer token"}),
    ]:
        answer = httpx.request(method, f"{guarded.url}{path}", headers=headers, json={})
        assert (answer.status_code, answer.json()) == (401, error), headers
        assert answer.headers["www-authenticate"] == "Bearer"
    # With the token the request gets through to the protocol (which wants an id, or not).
    answer = httpx.request(method, f"{guarded.url}{path}", headers=_bearer(TOKEN), json={})
    assert answer.status_code in (200, 400)
    # The greeting says nothing and needs no token: health checks and readiness probes use it.
    assert httpx.get(f"{guarded.url}/").status_code == 200


def _bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_the_flywheel_client_sends_the_token_from_its_environment(guarded, textcraft, monkeypatch):
    settings = EnvSettings(servers=[guarded.url])
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"HTTP 401: .*; set \${TOKEN_ENV}"):
        make_env(settings).check()  # refused before any work
    monkeypatch.setenv(TOKEN_ENV, "wrong")
    with pytest.raises(ValueError, match=rf"HTTP 401: wrong bearer token; check \${TOKEN_ENV}"):
        make_env(settings).check()

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    remote = make_env(settings)
    remote.check()
    task_id = textcraft.task_ids("train")[0]
    episode = remote.start(task_id)
    for _, action in textcraft.expert_plan(task_id):
        result = episode.step(action)
    episode.close()
    assert result.done and result.reward == 1.0
    # The token lives in the environment only: not in the settings runs dump and key caches on.
    assert TOKEN not in settings.model_dump_json() + json.dumps(settings.identity())


def test_a_batch_refused_as_too_large_is_stepped_one_by_one_without_moving(textcraft):
    """A 4xx answer to a whole batch means no step in it was taken: the client steps each episode
    on its own, on the same server, instead of re-creating and replaying them elsewhere."""
    server = LocalServer("--env", "textcraft", "--max-body-bytes", "120")
    try:
        remote = RemoteEnv(textcraft, [server.url])
        tasks = textcraft.task_ids("train")[:3]
        episodes = [remote.start(t) for t in tasks]
        moves = [(e, "inventory") for e in episodes]
        results = remote.step_all(moves)
        assert all(r.observation.startswith("Inventory") for r in results), results
        assert [e.recoveries for e in episodes] == [0, 0, 0]
        with pytest.raises(AgentGymError, match="answered HTTP 413: the request body is over"):
            remote.pool.servers[0].post("/step", {"action": "x" * 200}, episodes[0].env_id)
    finally:
        server.kill()
