"""`flywheel serve-env --compat agentgym` against recordings of AgentGym's own servers.

tests/data/agentgym/{textcraft,sciworld}.json.gz hold requests sent to AgentGym's real TextCraft
and SciWorld servers (WooooDyy/AgentGym, the commit named in each file) and their answers: every
TextCraft `data_idx` and the edge ones, played episodes, malformed and unknown-id requests, the
requests AgentGym's own `TextCraftEnvClient` sends, SciWorld's sequences. Each test replays them
against our compat server and compares HTTP status, content type and body exactly: key for key,
index for index, with the same types (1, not 1.0). Session ids are compared by name ("s0" is the
first /create of a sequence), as AgentGym's count from 0 and ours are random.

AgentGym's TextCraft texts depend on its server's hash seed, so our TextCraft server runs as a
child process with the seed the recording names. To record again (needs an AgentGym checkout):
`python scripts/record_agentgym.py --help`."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import os
import sys
import time
import types
from pathlib import Path

import pytest

from envs import make_env
from envs.agentgym.compat import AgentGymService, CompatOptions, compat_service
from envs.agentgym.protocol import Dialect
from envs.agentgym.server import LocalServer, create_app, main

DATA = Path(__file__).parent / "data" / "agentgym"
# The recorder names AgentGym's session ids; replays name ours with the same function.
sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
from record_agentgym import name_sessions  # noqa: E402


@functools.cache
def recording(server: str) -> dict:
    with gzip.open(DATA / f"{server}.json.gz", "rt", encoding="utf-8") as file:
        return json.load(file)


def sequence(server: str, name: str) -> list[dict]:
    return recording(server)["sequences"][name]


class Replay:
    """Recorded requests sent to our server, each session's id put where AgentGym's was."""

    def __init__(self, client, task_text=None) -> None:
        """`task_text(id)`: AgentGym's TextCraft task text for `data_idx` = id, which its
        `/create` answers (it resets a new environment to its own id, and ours are not its)."""
        self.client, self.task_text = client, task_text
        self.ids: dict[str, int] = {}  # session name -> our id
        self.names: dict[int, str] = {}

    def send(self, request: dict):
        kwargs: dict = {}
        body, params = request.get("json"), dict(request.get("params", {}))
        if "session" in request:
            if request["method"] == "POST":
                body = {**body, "id": self.ids[request["session"]]}
            else:
                params["id"] = self.ids[request["session"]]
        if "json" in request:
            kwargs["json"] = body
        if "content" in request:
            kwargs["content"] = request["content"].encode()
            kwargs["headers"] = {"content-type": request["content_type"]}
        if params:
            kwargs["params"] = params
        return self.client.request(request["method"], request["path"], **kwargs)

    def answer(self, request: dict) -> dict:
        """Our answer to `request`, in the recording's form."""
        response = self.send(request)
        kind = response.headers.get("content-type", "").split(";")[0]
        body = response.json() if kind == "application/json" else response.text
        if request["path"] == "/create" and isinstance(body, dict) and "id" in body:
            self.names[body["id"]] = name = f"s{len(self.names)}"
            self.ids[name] = body["id"]
        if kind == "application/json":
            body = name_sessions(body, self.names)
        return {"status": response.status_code, "type": kind, "body": body}

    def check(self, entry: dict) -> dict:
        """Our answer to the recorded request must be AgentGym's, as JSON text (so that 1 and
        1.0, and the order of keys, differ)."""
        ours = self.answer(entry["request"])
        theirs = copy.deepcopy({key: entry[key] for key in ("status", "type", "body")})
        if "agentgym_id" in entry and "observation" in theirs["body"]:
            our_id = self.ids[theirs["body"]["id"]]
            theirs["body"]["observation"] = self.task_text(our_id)
        assert json.dumps(ours, indent=1) == json.dumps(theirs, indent=1), entry["request"]
        return ours

    def check_all(self, entries: list[dict]) -> None:
        for entry in entries:
            self.check(entry)


def bodies(entries: list[dict], path: str) -> list:
    return [entry["body"] for entry in entries if entry["request"]["path"] == path]


# ---- TextCraft ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def textcraft_server():
    """Our compat TextCraft server, a child process with the recording's hash seed."""
    seed = recording("textcraft")["agentgym"]["pythonhashseed"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONHASHSEED", seed)  # the child process inherits it
        server = LocalServer("--env", "textcraft", "--compat", "agentgym")
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def textcraft(textcraft_server):
    import httpx

    with httpx.Client(base_url=textcraft_server.url, timeout=60) as client:
        yield client


def textcraft_replay(client) -> Replay:
    texts = agentgym_task_texts()
    return Replay(client, task_text=lambda env_id: texts[env_id % 544])


def test_every_data_idx_resets_to_agentgyms_task_and_text(textcraft):
    entries = sequence("textcraft", "every_data_idx")
    resets = [e for e in entries if e["request"]["path"] == "/reset"]
    assert [e["request"]["json"].get("data_idx", "default") for e in resets] == [
        *range(544),
        544,
        1000,
        -1,
        "default",
        None,
    ]
    assert all(e["body"]["observation"].startswith("Crafting commands:") for e in resets[:-1])
    assert "error" in resets[-1]["body"]  # a None data_idx: AgentGym's TypeError text
    textcraft_replay(textcraft).check_all(entries)
    assert len(textcraft.get("/tasks").json()) == 544


@functools.cache
def agentgym_task_texts() -> dict[int, str]:
    """AgentGym's `/reset` text for each `data_idx` of the recording."""
    resets = [
        e for e in sequence("textcraft", "every_data_idx") if e["request"]["path"] == "/reset"
    ]
    return {
        e["request"]["json"]["data_idx"]: e["body"]["observation"]
        for e in resets
        if isinstance(e["request"]["json"].get("data_idx"), int)
    }


def test_create_answers_the_task_of_its_own_id_as_agentgym_does(textcraft):
    texts = agentgym_task_texts()
    creates = [
        entry
        for entries in recording("textcraft")["sequences"].values()
        for entry in entries
        if entry["request"]["path"] == "/create" and entry["status"] == 200
    ]
    assert len(creates) >= 8
    for entry in creates:  # AgentGym's /create resets to its own id
        assert entry["body"]["observation"] == texts[entry["agentgym_id"]]
    created = textcraft.post("/create", json={"commands": None, "goal": "ignored"}).json()
    assert list(created) == list(creates[0]["body"]) == ["id", "observation", "done", "reward"]
    assert created["observation"] == texts[created["id"] % 544]
    assert created["done"] is False and type(created["reward"]) is int


@pytest.mark.parametrize("data_idx", [0, 130, 300, 540])
def test_a_played_episode_answers_as_agentgyms_to_every_request(textcraft, data_idx):
    entries = sequence("textcraft", f"episode_{data_idx}")
    steps = bodies(entries, "/step")
    goal = next(i for i, step in enumerate(steps) if step.get("reward") == 1)
    assert steps[goal]["done"] is True and "minecraft:" in steps[goal]["observation"]
    after = steps[goal + 1]  # the game has no end: the step is played
    assert after["observation"].startswith("Inventory: ") and after["done"] is False
    assert bodies(entries, "/close") == [True, False]
    assert steps[-1] == {"error": "The id s0 is not valid."}  # a step after /close
    textcraft_replay(textcraft).check_all(entries)


@pytest.mark.parametrize(
    "entry",
    sequence("textcraft", "bad_requests"),
    ids=lambda e: f"{e['request']['method']} {e['request']['path']}",
)
def test_bad_requests_get_agentgyms_status_and_answer(textcraft, entry):
    textcraft_replay(textcraft).check(entry)


def test_agentgyms_textcraft_client_requests_get_the_same_answers(textcraft):
    """What AgentGym's `TextCraftEnvClient` sent (create, reset 7 and 222, a wrong step, the
    expert's plan, inventory, close) and AgentGym's server answered."""
    entries = sequence("textcraft", "agentgym_client")
    assert entries[0]["request"]["json"]["minecraft_dir"] == "agentenv_textcraft/"
    assert {"reward": 1, "done": True}.items() <= next(
        step for step in bodies(entries, "/step") if step["reward"]
    ).items()
    assert bodies(entries, "/close") == [True]
    textcraft_replay(textcraft).check_all(entries)


def test_serve_env_compat_flag_starts_and_refuses_what_it_cannot_serve(textcraft, capsys):
    assert textcraft.get("/").json() == "This is environment TextCraft."
    info = textcraft.get("/flywheel").json()
    assert info["compat"] == "agentgym" and info["tasks"] == 544
    assert main(["--env", "textcraft", "--compat", "agentgym", "--dialect", "webshop"]) == 2
    assert "textcraft and sciworld dialects" in capsys.readouterr().err
    assert main(["--env", "textcraft", "--compat", "agentgym", "--dialect", "sciworld"]) == 2
    assert "need the scienceworld environment" in capsys.readouterr().err


# ---- Which emulation answers: the one the dialect names -----------------------------------------


class OneTaskDialect(Dialect):
    """A family that no file in envs/agentgym/ knows: its emulation lives in this module."""

    name = "onetask"
    served_env = "onetask"
    emulation = f"{__name__}:OneTaskService"


class UnemulatedDialect(OneTaskDialect):
    name = "unemulated"
    emulation = None


class OneTaskService(AgentGymService):
    """The least an emulation has: a greeting, one task, the routes every emulation answers."""

    hello_text = "This is environment OneTask."
    dialect = OneTaskDialect()

    def __init__(self, env, session_ttl_s, sequential_ids=False, options=None):
        super().__init__(env, ["the-task"], session_ttl_s, sequential_ids)


def test_compat_serves_the_emulation_its_dialect_names():
    env = types.SimpleNamespace(name="onetask")
    service = compat_service("agentgym", env, OneTaskService.dialect, session_ttl_s=60)
    assert type(service) is OneTaskService
    assert service.hello() == "This is environment OneTask."
    assert service.info()["dialect"] == "onetask" and service.tasks == ["the-task"]
    spoken = "speaks the textcraft and sciworld dialects, not 'unemulated'"
    with pytest.raises(ValueError, match=spoken):
        compat_service("agentgym", env, UnemulatedDialect(), session_ttl_s=60)


def test_flywheels_own_clients_refuse_a_compat_server(textcraft_server):
    from envs.agentgym.client import RemoteEnv

    with pytest.raises(ValueError, match="serves"):
        RemoteEnv(make_env("textcraft"), [textcraft_server.url]).check()


def test_the_recordings_name_their_source():
    for server in ("textcraft", "sciworld"):
        meta = recording(server)["agentgym"]
        assert meta["repository"] == "https://github.com/WooooDyy/AgentGym"
        assert len(meta["commit"]) == 40 and meta["pythonhashseed"] and meta["recorded"]
    assert (
        os.path.getsize(DATA / "textcraft.json.gz") + os.path.getsize(DATA / "sciworld.json.gz")
        < 2_000_000
    )


# ---- TextCraft's numbering: recipe files read in name order, or in the folder's own ------------

# Four recipes and a cycle (a from b, b from a), each in its own file.
RECIPES = {
    "button": ({"minecraft:stone": 1}, "minecraft:stone_button"),
    "planks": ({"minecraft:oak_log": 1}, "minecraft:oak_planks"),
    "stick": ({"minecraft:oak_planks": 2}, "minecraft:stick"),
    "torch": ({"minecraft:coal": 1, "minecraft:stick": 1}, "minecraft:torch"),
    "a": ({"minecraft:b": 1}, "minecraft:a"),
    "b": ({"minecraft:a": 1}, "minecraft:b"),
}


def recipes_folder_with(tmp_path: Path) -> Path:
    folder = tmp_path / "agentenv_textcraft" / "recipes"
    folder.mkdir(parents=True)
    for name, (ingredients, result) in RECIPES.items():
        items = [{"item": item} for item, n in ingredients.items() for _ in range(n)]
        recipe = {"type": "minecraft:crafting_shapeless", "ingredients": items,
                  "result": {"item": result}}  # fmt: skip
        (folder / f"{name}.json").write_text(json.dumps(recipe))
    return folder.parent


def test_directory_listing_numbers_goals_in_the_folders_own_order(tmp_path, monkeypatch):
    """AgentGym's goals are sorted by depth, stably: goals of equal depth keep the order their
    files were read in, and of a cycle the file read first keeps its recipe."""
    from envs.agentgym.compat.textcraft import agentgym_textcraft

    checkout = str(recipes_folder_with(tmp_path))
    by_name = agentgym_textcraft(CompatOptions(checkout, "name"))
    # a, b: b's recipe closes a cycle and is dropped; depth 1, 1, 1, then 2, 3
    assert by_name.task_ids == ("a", "stone_button", "oak_planks", "stick", "torch")
    real_listdir = os.listdir
    folder_order = ["torch.json", "b.json", "stick.json", "planks.json", "button.json", "a.json"]
    monkeypatch.setattr(os, "listdir", lambda path: folder_order)
    by_folder = agentgym_textcraft(CompatOptions(checkout + "/recipes", "directory"))
    monkeypatch.setattr(os, "listdir", real_listdir)
    assert by_folder.task_ids == ("b", "oak_planks", "stone_button", "stick", "torch")
    assert by_folder.new_game(0).observation.endswith("Goal: craft b.")


def test_recipe_options_are_refused_where_they_mean_nothing(tmp_path, capsys):
    assert main(["--env", "textcraft", "--recipe-listing", "directory"]) == 2
    assert "need --compat agentgym" in capsys.readouterr().err
    assert main(["--env", "textcraft", "--compat", "agentgym", "--recipes", str(tmp_path)]) == 2
    assert "no TextCraft recipe files" in capsys.readouterr().err


@pytest.mark.skipif(
    not os.environ.get("FLYWHEEL_AGENTGYM_DIR"),
    reason="set FLYWHEEL_AGENTGYM_DIR to an AgentGym checkout to compare with its real server",
)
def test_directory_listing_numbers_tasks_as_agentgyms_own_server_on_this_machine(monkeypatch):
    """AgentGym's real TextCraft server and ours, reading the same recipe files on the same
    machine in the folder's order: the same task at every index, with the same text."""
    import httpx
    from test_agentgym_restart import AgentGymTextCraftServer

    from envs.agentgym.client import AgentGymEnv

    checkout = Path(os.environ["FLYWHEEL_AGENTGYM_DIR"])
    recipes = checkout / "agentenv-textcraft" / "agentenv_textcraft"
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    ours = LocalServer("--env", "textcraft", "--compat", "agentgym",
                       "--recipe-listing", "directory", "--recipes", str(recipes))  # fmt: skip
    theirs = AgentGymTextCraftServer(checkout)
    try:
        texts = []
        for server in (ours, theirs):
            with httpx.Client(base_url=server.url, timeout=30) as client:
                env_id = client.post("/create", json={}).json()["id"]
                texts.append([
                    client.post("/reset", json={"id": env_id, "data_idx": i}).json()["observation"]
                    for i in range(544)
                ])  # fmt: skip
        assert texts[0] == texts[1]
        goals = [AgentGymEnv("textcraft", [s.url], (0, 544), (0, 0)).task_goal("0")
                 for s in (ours, theirs)]  # fmt: skip
        assert goals[0] == goals[1] and goals[0] is not None
    finally:
        ours.kill()
        theirs.kill()


# ---- SciWorld ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sciworld():
    """Our compat SciWorld server (Flywheel's pool of ScienceWorld processes), in this process:
    ScienceWorld's texts do not depend on the hash seed."""
    from starlette.testclient import TestClient

    with TestClient(create_app(make_env("scienceworld"), compat="agentgym")) as client:
        yield client


def test_sciworld_answers_as_agentgyms_server(sciworld):
    entries = sequence("sciworld", "answers")
    games = sciworld.get("/tasks").json()
    assert games[0] == "boil/0" and len(games) > 1000
    resets = [e for e in entries if e["request"]["path"] == "/reset"]
    assert [e["request"]["json"]["data_idx"] for e in resets] == [
        0, 500, len(games) - 1, -1, len(games), 3
    ]  # fmt: skip
    assert (resets[-1]["body"]["task_name"], resets[-1]["body"]["var_num"]) == ("boil", 3)
    assert bodies(entries, "/close")[0] is True and entries[-1]["status"] == 500
    Replay(sciworld).check_all(entries)


@pytest.mark.parametrize(
    "entry",
    sequence("sciworld", "bad_requests"),
    ids=lambda e: f"{e['request']['method']} {e['request']['path']}",
)
def test_sciworld_bad_requests_get_agentgyms_status_and_answer(sciworld, entry):
    Replay(sciworld).check(entry)


def test_a_sciworld_episode_ends_as_agentgyms_does(sciworld):
    """A wrong focus fails the task (score -100, done); AgentGym then refuses further steps."""
    entries = sequence("sciworld", "episode_end")
    steps = bodies(entries, "/step")
    assert steps[0]["done"] is True
    assert steps[1] == {"error": "The task with environment s0 has finished."}
    Replay(sciworld).check_all(entries)


# Our compat SciWorld server as a real process: answering `GET /` waits for a ScienceWorld Java
# process (the task list), about 2 s on idle cores but 30 s to 3 minutes measured on 2 busy ones
# (load 7 to 9); its first `/reset` loads a task, 0.5 s idle and up to a minute busy.
SCIWORLD_READY_S = 600
SCIWORLD_TASK = "lifespan-longest-lived/2"  # a 4-step gold path


@pytest.mark.slow
def test_a_sciworld_compat_server_process_plays_an_episode_for_flywheels_own_client():
    """`flywheel serve-env --env scienceworld --compat agentgym` in its own process, driven through
    `envs.agentgym.client` (agentgym-sciworld): reset to a data_idx, the task's gold path to score 100."""
    from envs.agentgym.expert import sciworld_plan
    from flywheel.settings import EnvSettings

    started = time.monotonic()
    server = LocalServer(
        "--env", "scienceworld", "--compat", "agentgym", ready_timeout_s=SCIWORLD_READY_S
    )
    try:
        print(f"SciWorld compat server ready after {server.ready_after_s:.1f} s")
        import httpx

        data_idx = httpx.get(f"{server.url}/tasks", timeout=60).json().index(SCIWORLD_TASK)
        settings = EnvSettings(
            name="agentgym-sciworld",
            servers=[server.url],
            agentgym={"train": (data_idx, data_idx + 1), "test": (0, 1)},
            request_timeout_s=SCIWORLD_READY_S,  # a reset on busy cores takes up to a minute
        )
        env = make_env(settings)
        env.check()
        episode = env.start(str(data_idx))
        answer = episode.reset_answer
        assert (answer["task_name"], answer["var_num"]) == ("lifespan-longest-lived", 2)
        assert episode.instruction == f"{answer['task_description']}\n{answer['observation']}"
        assert "longest" in answer["task_description"]
        plan = sciworld_plan(answer)
        assert plan == env.expert_plan(str(data_idx)) and len(plan) == 5
        assert plan[2][1] == "look around"  # the expert looks before it focuses
        results = []
        for _, action in plan:  # the gold path ends with a `wait1` the task may not need
            results.append(episode.step(action))
            if results[-1].done:
                break
        episode.close()
    finally:
        server.kill()
    assert results[-1].done and not any(r.done for r in results[:-1]) and len(results) >= 3
    assert sum(r.reward for r in results) == 100.0 and results[-1].reward > 0
    print(f"episode played {time.monotonic() - started:.1f} s after the server was started")
