"""Record what AgentGym's own TextCraft and SciWorld servers answer, for the compatibility tests.

`flywheel serve-env --compat agentgym` must answer as AgentGym's servers do. AgentGym's code is not
part of this repository, so the tests (tests/test_serve_agentgym_compat.py) replay requests recorded
here, from AgentGym's real servers, against our compat server and compare status and body exactly.

This script needs a local copy of https://github.com/WooooDyy/AgentGym (a checkout, or a `git
archive` export of `agentenv-textcraft`, `agentenv-sciworld` and `agentenv/agentenv`) and a Python
with fastapi, uvicorn, requests, gymnasium, scienceworld and torch/transformers (AgentGym's client
package imports them), e.g. the project's venv. It runs AgentGym's FastAPI apps in this process,
drives them with the tests' request sequences (and with AgentGym's own `TextCraftEnvClient` over
loopback HTTP), and writes every request and answer to tests/data/agentgym/{textcraft,sciworld}
.json.gz with the AgentGym commit, the hash seed and the date.

AgentGym's TextCraft texts depend on the server's hash seed (Python sets), so the script re-runs
itself under PYTHONHASHSEED=--hash-seed; the tests start our server with the recorded seed. AgentGym
reads its recipe files in the filesystem's order; the script makes it read them in name order, as
our server always does, so recordings do not depend on the machine.

Session ids in the files are names ("s0", "s1": the n-th /create of a sequence), in requests
(`"session": "s0"`: put this session's id in the body, or the query, as `id`) and in answers;
a /create's entry keeps AgentGym's own id as `agentgym_id`.

Example:
  git -C /tmp clone https://github.com/WooooDyy/AgentGym && git -C /tmp/AgentGym checkout 3ef9235
  python scripts/record_agentgym.py /tmp/AgentGym --commit 3ef9235d23e68e7c2920c5422ad957dc8ced5c6c
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from urllib.parse import parse_qsl

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "agentgym"
UNKNOWN = 10**15 + 7  # an id no server hands out (AgentGym counts from 0; ours are below 2**53)
TEXTCRAFT_DATA_IDXS = [*range(544), 544, 1000, -1]
EPISODE_DATA_IDXS = (0, 130, 300, 540)
CLIENT_DATA_IDXS = (7, 222)
WRONG_ACTIONS = [
    "inventory",
    "get 1 oak planks",
    "craft 1 stick using 9 dirt",
    "dance",
    "get 2 dirt",
]
JSON = {"content-type": "application/json"}

# The malformed and unknown-id requests: (method, path, keyword arguments of httpx's request).
TEXTCRAFT_BAD_REQUESTS = [
    ("POST", "/create", {}),  # no body: FastAPI's "missing"
    ("POST", "/create", {"json": [1]}),
    ("POST", "/create", {"content": b"{bad", "headers": JSON}),
    ("POST", "/step", {"json": {"id": 0}}),
    ("POST", "/step", {"json": {"id": "x", "action": 3}}),
    ("POST", "/step", {"json": {"action": "inventory"}}),
    ("POST", "/step", {"json": {"id": UNKNOWN, "action": "inventory"}}),
    ("POST", "/step", {"json": {"id": str(UNKNOWN), "action": "inventory"}}),
    ("POST", "/step", {"content": b"", "headers": JSON}),
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
]
SCIWORLD_BAD_REQUESTS = [
    ("POST", "/close", {"json": {"id": UNKNOWN}}),
    ("POST", "/step", {"json": {"id": UNKNOWN, "action": "look around"}}),
    ("POST", "/reset", {"json": {"id": UNKNOWN}}),
    ("GET", "/action_hint", {"params": {"id": UNKNOWN}}),
    ("GET", "/goals", {}),
    ("GET", "/", {}),
]
SCIWORLD_ACTIONS = ("look around", "open door to kitchen", "go to kitchen", "dance", "inventory")


# ---- recording --------------------------------------------------------------------------------


class Recorder:
    """An ASGI wrapper around AgentGym's app that writes down every request and its answer, in
    sequences; each sequence names the sessions its /creates opened."""

    def __init__(self, app) -> None:
        self.app = app
        self.sequences: dict[str, list[dict]] = {}
        self.current: list[dict] | None = None
        self.names: dict[int, str] = {}
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def sequence(self, name: str):
        assert name not in self.sequences, name
        self.current, self.names = [], {}
        try:
            yield
        finally:
            self.sequences[name], self.current = self.current, None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        answer: dict = {"status": None, "headers": [], "body": b""}

        async def receive_recorded():
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        async def send_recorded(message):
            if message["type"] == "http.response.start":
                answer["status"], answer["headers"] = message["status"], message["headers"]
            elif message["type"] == "http.response.body":
                answer["body"] += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receive_recorded, send_recorded)
        finally:  # an HTTP 500 is sent, then raised
            with self.lock:
                self.record(scope, b"".join(chunks), answer)

    def record(self, scope, body: bytes, answer: dict) -> None:
        if self.current is None:
            raise RuntimeError(f"request outside a sequence: {scope['method']} {scope['path']}")
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        request: dict = {"method": scope["method"], "path": scope["path"]}
        query = dict(parse_qsl(scope["query_string"].decode(), keep_blank_values=True))
        content_type = headers.get("content-type")
        parsed = _json_or_none(body) if content_type == "application/json" else None
        if parsed is not None:
            if isinstance(parsed, dict) and self.session_of(parsed.get("id")):
                request["session"] = self.session_of(parsed.pop("id"))
            request["json"] = parsed
        elif body or content_type:
            request["content"] = body.decode()
            request["content_type"] = content_type
        if "id" in query and self.session_of(query["id"]):
            request["session"] = self.session_of(query.pop("id"))
        if query:
            request["params"] = query
        kind = dict((k.decode().lower(), v.decode()) for k, v in answer["headers"])
        kind = kind.get("content-type", "").split(";")[0]
        text = answer["body"].decode()
        value = json.loads(text) if kind == "application/json" else text
        entry = {"request": request, "status": answer["status"], "type": kind}
        if request["path"] == "/create" and isinstance(value, dict) and "id" in value:
            self.names[value["id"]] = f"s{len(self.names)}"
            entry["agentgym_id"] = value["id"]  # AgentGym's own id (it counts from 0)
        entry["body"] = name_sessions(value, self.names) if kind == "application/json" else text
        self.current.append(entry)

    def session_of(self, value) -> str | None:
        if isinstance(value, bool):
            return None
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        return self.names.get(value) if isinstance(value, int) else None


def _json_or_none(body: bytes):
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def name_sessions(value, names: dict[int, str]):
    """`value` with session ids replaced by their names: `id` fields and AgentGym's error texts.
    The tests name our server's (random) ids the same way before they compare."""

    def walk(v, key=None):
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if key == "id" and isinstance(v, int) and not isinstance(v, bool) and v in names:
            return names[v]
        if isinstance(v, str):
            for env_id, name in names.items():
                v = v.replace(f"The id {env_id} is", f"The id {name} is")
                v = v.replace(f"environment {env_id} has", f"environment {name} has")
        return v

    return walk(value)


# ---- AgentGym's code, loaded from the checkout -------------------------------------------------


def bare_package(name: str, path: Path) -> None:
    """Register package `name` at `path` without running its __init__.py (AgentGym's import
    every server or every environment client, with their data)."""
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    sys.modules[name] = module


@contextlib.contextmanager
def listdir_in_name_order():
    real = os.listdir
    os.listdir = lambda path=".": sorted(real(path))
    try:
        yield
    finally:
        os.listdir = real


def agentgym_textcraft_app(checkout: Path):
    """agentenv_textcraft.server:app; its wrapper reads `agentenv_textcraft/recipes` under the
    working directory when imported."""
    import importlib

    here = os.getcwd()
    os.chdir(checkout / "agentenv-textcraft")
    bare_package("agentenv_textcraft", checkout / "agentenv-textcraft" / "agentenv_textcraft")
    try:
        with listdir_in_name_order(), contextlib.redirect_stdout(io.StringIO()):
            return importlib.import_module("agentenv_textcraft.server").app
    finally:
        os.chdir(here)


def agentgym_sciworld_app(checkout: Path):
    import importlib

    bare_package("agentenv_sciworld", checkout / "agentenv-sciworld" / "agentenv_sciworld")
    with contextlib.redirect_stdout(io.StringIO()):
        server = importlib.import_module("agentenv_sciworld.server")
    return server.app, len(importlib.import_module("agentenv_sciworld.environment").server.games)


def agentgym_textcraft_client(checkout: Path):
    bare_package("agentenv", checkout / "agentenv" / "agentenv")
    bare_package("agentenv.envs", checkout / "agentenv" / "agentenv" / "envs")
    from agentenv.envs.textcraft import TextCraftEnvClient  # type: ignore[import-not-found]

    return TextCraftEnvClient


@contextlib.contextmanager
def serving(app):
    """`app` on a loopback port (uvicorn in a thread), for AgentGym's HTTP client."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# ---- the sequences -----------------------------------------------------------------------------


def expert_actions(instruction: str) -> list[str]:
    from envs.textcraft import tag_members
    from envs.textcraft_expert import solve

    return [step.action for step in solve(instruction, tag_members())]


def record_textcraft(checkout: Path) -> dict[str, list[dict]]:
    from starlette.testclient import TestClient

    recorder = Recorder(agentgym_textcraft_app(checkout))
    client = TestClient(recorder)

    def session(body=None) -> int:
        return client.post("/create", **({} if body is None else {"json": body})).json()["id"]

    with contextlib.redirect_stdout(io.StringIO()):  # AgentGym's server prints every request
        with recorder.sequence("every_data_idx"):
            env_id = session({"commands": None, "goal": None})
            for data_idx in TEXTCRAFT_DATA_IDXS:
                client.post("/reset", json={"id": env_id, "data_idx": data_idx})
            client.post("/reset", json={"id": env_id})  # data_idx defaults to 0
            client.post("/reset", json={"id": env_id, "data_idx": None})
        with recorder.sequence("creates"):  # each /create answers the task of its own id
            for _ in range(3):
                session({})
        for data_idx in EPISODE_DATA_IDXS:
            with recorder.sequence(f"episode_{data_idx}"):
                env_id = session({"commands": None, "goal": None})
                reset = client.post("/reset", json={"id": env_id, "data_idx": data_idx}).json()
                plan = expert_actions(reset["observation"])
                for action in [*WRONG_ACTIONS, *plan, "inventory", plan[-1], "get 1 dirt"]:
                    client.post("/step", json={"id": env_id, "action": action})
                    client.get("/observation", params={"id": env_id})
                    client.get("/detail", params={"id": env_id})
                client.post("/close", json={"id": env_id})
                client.post("/close", json={"id": env_id})
                client.post("/step", json={"id": env_id, "action": "inventory"})
                client.get("/detail", params={"id": env_id})
                client.post("/reset", json={"id": env_id, "data_idx": 0})
        with recorder.sequence("bad_requests"):
            for method, path, kwargs in TEXTCRAFT_BAD_REQUESTS:
                client.request(method, path, **kwargs)
        client_class = agentgym_textcraft_client(checkout)
        with recorder.sequence("agentgym_client"), serving(recorder) as url:
            env = client_class(env_server_base=url, data_len=544)
            for data_idx in CLIENT_DATA_IDXS:
                env.reset(data_idx)
                plan = expert_actions(env.observe())
                for action in ["get 1 dirt", *plan, "inventory"]:
                    env.step(f"Thought:\nnext.\n\nAction:\n{action}")
            env.close()
    return recorder.sequences


def record_sciworld(checkout: Path) -> dict[str, list[dict]]:
    from starlette.testclient import TestClient

    app, games = agentgym_sciworld_app(checkout)
    recorder = Recorder(app)
    client = TestClient(recorder, raise_server_exceptions=False)
    with contextlib.redirect_stdout(io.StringIO()):
        with recorder.sequence("answers"):
            env_id = client.post("/create").json()["id"]
            for data_idx in (0, 500, games - 1, -1, games, 3):
                client.post("/reset", json={"id": env_id, "data_idx": data_idx})
            for action in SCIWORLD_ACTIONS:
                client.post("/step", json={"id": env_id, "action": action})
                client.get("/observation", params={"id": env_id})
                client.get("/detail", params={"id": env_id})
            client.get("/action_hint", params={"id": env_id})
            client.get("/goals", params={"id": env_id})
            client.post("/close", json={"id": env_id})
            client.post("/step", json={"id": env_id, "action": "look around"})  # deleted
            client.post("/close", json={"id": env_id})  # HTTP 500
        with recorder.sequence("bad_requests"):
            for method, path, kwargs in SCIWORLD_BAD_REQUESTS:
                client.request(method, path, **kwargs)
        with recorder.sequence("episode_end"):  # a wrong focus fails the task
            env_id = client.post("/create").json()["id"]
            client.post("/reset", json={"id": env_id, "data_idx": 0})
            client.post("/step", json={"id": env_id, "action": "focus on picture"})
            client.post("/step", json={"id": env_id, "action": "look around"})  # finished
            client.post("/close", json={"id": env_id})
    return recorder.sequences


# ---- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/record_agentgym.py",
        description="Record AgentGym's TextCraft and SciWorld servers' answers to the compat "
        "tests' requests (tests/data/agentgym/*.json.gz). Needs a local AgentGym checkout; runs "
        "its servers in this process under PYTHONHASHSEED=--hash-seed (re-running itself).",
        epilog="Example: python scripts/record_agentgym.py /tmp/AgentGym --commit 3ef9235d23e6"
        "8e7c2920c5422ad957dc8ced5c6c",
    )
    parser.add_argument(
        "checkout",
        type=Path,
        help="local copy of github.com/WooooDyy/AgentGym (a checkout, or a `git archive` export "
        "of agentenv-textcraft, agentenv-sciworld and agentenv/agentenv)",
    )
    parser.add_argument(
        "--commit",
        help="the AgentGym commit the copy is at, written into the files (default: the "
        "checkout's HEAD; required for an export)",
    )
    parser.add_argument(
        "--hash-seed",
        default="0",
        help="PYTHONHASHSEED for AgentGym's servers (its TextCraft texts depend on it); the "
        "tests start our server with the same one (default: 0)",
    )
    parser.add_argument("--only", choices=("textcraft", "sciworld"), help="record one server")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default: {OUT})")
    return parser.parse_args(argv)


def head_commit(checkout: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def write(path: Path, meta: dict, sequences: dict) -> None:
    data = {"agentgym": meta, "sequences": sequences}
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as packed:
        packed.write(text.encode())
    print(f"{path}: {sum(map(len, sequences.values()))} exchanges, {path.stat().st_size} bytes")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != args.hash_seed:
        env = {**os.environ, "PYTHONHASHSEED": args.hash_seed}
        return subprocess.call([sys.executable, __file__, *sys.argv[1:]], env=env)
    checkout = args.checkout.resolve()
    commit = args.commit or head_commit(checkout)
    if not commit:
        print("--commit is needed: the checkout is not a git work tree", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    meta = {
        "repository": "https://github.com/WooooDyy/AgentGym",
        "commit": commit,
        "pythonhashseed": args.hash_seed,
        "recorded": datetime.date.today().isoformat(),
        "recorder": "scripts/record_agentgym.py",
        "recipes": "read in name order (AgentGym reads them in the filesystem's order)",
    }
    if args.only in (None, "textcraft"):
        write(args.out / "textcraft.json.gz", meta, record_textcraft(checkout))
    if args.only in (None, "sciworld"):
        write(args.out / "sciworld.json.gz", meta, record_sciworld(checkout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
