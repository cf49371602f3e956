"""Episode recovery against what AgentGym's own servers answer. A small fake speaks their exact
text, `{"error": "The id N is not valid."}` with HTTP 200 for an id the server does not know, as
recorded from AgentGym's real TextCraft and SciWorld servers (tests/data/agentgym, checked below);
the tests that restart a real server restart our compat server, which answers the same (its
answers are checked against the same recordings in tests/test_serve_agentgym_compat.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from json_server import ScriptedJSONServer

from envs.agentgym.client import (
    AgentGymError,
    ClientSettings,
    RemoteEpisode,
    ServerPool,
    ServerUnavailable,
)
from envs.agentgym.dialects import DIALECTS

FAST = ClientSettings(timeout_s=2.0, connect_timeout_s=0.5, retries=0, backoff_s=0.01)


class AgentGymTextCraftFake(ScriptedJSONServer):
    """AgentGym's TextCraft server in miniature: ids it created, and its error texts. `restart()`
    forgets every id, as a restarted server does; `goal` is its task text (hash-seed dependent
    on the real server)."""

    GONE_TEXT = "The id {id} is not valid."  # AgentGym's, for an id it does not know

    def __init__(self, goal: str = "Goal: craft x.", gone_text: str = GONE_TEXT):
        self.goal, self.gone_text = goal, gone_text
        self.known: set[int] = set()
        self.next_id = 0
        super().__init__()

    def answer(self, path: str, body: dict) -> object:
        if path == "/create":
            env_id, self.next_id = self.next_id, self.next_id + 1
            self.known.add(env_id)
            return {"id": env_id, "observation": self.goal, "done": False, "reward": 0}
        if body["id"] not in self.known:
            return {"error": self.gone_text.format(id=body["id"])}
        if path == "/reset":
            return {"id": body["id"], "observation": self.goal, "done": False, "reward": 0}
        if path == "/step":
            return {"observation": f"did {body['action']}", "reward": 0, "done": False}
        return True  # /close

    def restart(self) -> None:
        self.known.clear()


@pytest.fixture
def fakes():
    made: list[AgentGymTextCraftFake] = []

    def make(**kwargs) -> AgentGymTextCraftFake:
        made.append(AgentGymTextCraftFake(**kwargs))
        return made[-1]

    yield make
    for fake in made:
        fake.close()


def recorded_errors(server: str) -> list[str]:
    """The error texts AgentGym's `server` answered in the recordings (session ids named)."""
    path = Path(__file__).parent / "data" / "agentgym" / f"{server}.json.gz"
    with gzip.open(path, "rt", encoding="utf-8") as file:
        sequences = json.load(file)["sequences"]
    return [
        entry["body"]["error"]
        for entries in sequences.values()
        for entry in entries
        if entry["status"] == 200 and isinstance(entry["body"], dict) and "error" in entry["body"]
    ]


@pytest.mark.parametrize("server", ["textcraft", "sciworld"])
def test_the_fakes_texts_are_agentgyms(server):
    unknown = 10**15 + 7  # the recordings' unknown id
    errors = recorded_errors(server)
    assert AgentGymTextCraftFake.GONE_TEXT.format(id=unknown) in errors
    if server == "textcraft":  # a closed session is forgotten
        assert AgentGymTextCraftFake.GONE_TEXT.format(id="s0") in errors
    else:  # a closed session is kept, deleted
        assert "The task with environment s0 has been deleted." in errors


def test_agentgym_unknown_id_text_counts_as_a_lost_episode_and_is_replayed(fakes):
    server = fakes()
    episode = RemoteEpisode(ServerPool([server.url], DIALECTS["textcraft"], FAST), "t", 0)
    episode.step("inventory")
    server.restart()
    server.next_id = 7  # the fresh process hands out other ids
    assert episode.step("get 1 y").observation == "did get 1 y"
    assert episode.recoveries == 1 and episode.env_id == 7


@pytest.mark.parametrize(
    "gone_text",
    [
        "The task with environment {id} has been deleted.",  # a real error, not a restart
        "The id {id} is not valid. Try again",
        "the id {id} is not valid.",
    ],
)
def test_other_error_texts_stay_errors_and_do_not_loop(fakes, gone_text):
    server = fakes(gone_text=gone_text)
    episode = RemoteEpisode(ServerPool([server.url], DIALECTS["textcraft"], FAST), "t", 0)
    server.restart()
    with pytest.raises(AgentGymError, match="answered an error: ") as error:
        episode.step("inventory")
    assert episode.recoveries == 0
    assert not isinstance(error.value, ServerUnavailable)


def test_a_replay_onto_a_server_with_another_hash_seed_says_how_to_pin_it(fakes):
    first, second = fakes(goal="Crafting commands: a, b"), fakes(goal="Crafting commands: b, a")
    pool = ServerPool([first.url, second.url], DIALECTS["textcraft"], FAST)
    episode = RemoteEpisode(pool, "t", 0)
    assert episode.server.url == first.url
    episode.step("inventory")
    first.close()  # gone: the episode moves to the second server, whose text differs
    with pytest.raises(AgentGymError, match="starts differently on replay") as error:
        episode.step("get 1 y")
    assert "PYTHONHASHSEED" in str(error.value) and second.url in str(error.value)


# Against `serve-env --compat agentgym`, which answers as AgentGym's servers do (checked against
# recordings of theirs in tests/test_serve_agentgym_compat.py): the same texts, the same hash-seed
# dependence.


def compat_server(monkeypatch, hash_seed: str):
    from envs.agentgym.server import LocalServer

    monkeypatch.setenv("PYTHONHASHSEED", hash_seed)  # the child process inherits it
    return LocalServer("--env", "textcraft", "--compat", "agentgym")


def test_a_restarted_agentgym_server_loses_the_episode_and_it_is_replayed(monkeypatch):
    import httpx

    server = compat_server(monkeypatch, "0")
    try:
        episode = RemoteEpisode(ServerPool([server.url], DIALECTS["textcraft"], FAST), "300", 300)
        first = episode.step("inventory")
        old_id = episode.env_id
        server.restart()  # the same seed: the same texts
        gone = httpx.post(f"{server.url}/step", json={"id": old_id, "action": "inventory"})
        assert gone.status_code == 200 and gone.json() == {
            "error": f"The id {old_id} is not valid."
        }
        assert episode.step("inventory") == first
        assert episode.recoveries == 1 and episode.env_id != old_id
    finally:
        server.kill()


def test_a_replay_onto_an_agentgym_server_with_another_hash_seed_says_so(monkeypatch):
    first, second = compat_server(monkeypatch, "0"), compat_server(monkeypatch, "1")
    try:
        pool = ServerPool([first.url, second.url], DIALECTS["textcraft"], FAST)
        episode = RemoteEpisode(pool, "300", 300)
        assert episode.server.url == first.url
        episode.step("inventory")
        first.kill()  # the episode moves to the second server, whose text is another
        with pytest.raises(AgentGymError, match="starts differently on replay") as error:
            episode.step("inventory")
        assert "PYTHONHASHSEED=0 textcraft" in str(error.value)
        assert "PYTHONHASHSEED=0 flywheel serve-env --compat agentgym" in str(error.value)
    finally:
        first.kill()
        second.kill()
