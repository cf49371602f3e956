"""AgentGym's protocol over real HTTP on loopback: Flywheel's client against Flywheel's server
(real `python -m envs.agentgym.server` processes), servers killed and restarted for real, and answers no
real server gives (garbage, silence) from a small fake, the one fault we cannot cause otherwise."""

from __future__ import annotations

import http.server
import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from scripted_policy import NoisyExpertBackend

from agents.episode_metrics import ending_counts
from agents.rollout import RolloutSettings, agent_prefix, run_batched
from envs import make_env
from envs.agentgym.client import (
    AgentGymError,
    ClientSettings,
    LostEpisode,
    RemoteEnv,
    ServerPool,
    ServerUnavailable,
    served_task_ids,
)
from envs.agentgym.dialects import DIALECTS
from envs.agentgym.server import LocalServer
from flywheel.config_files import ConfigError
from flywheel.settings import EnvSettings
from tasks.episodes import EpisodesLost, raise_if_lost

FAST = ClientSettings(timeout_s=2.0, connect_timeout_s=0.5, retries=1, backoff_s=0.05)


def play_expert(env, task_id):
    episode = env.start(task_id)
    seen = [episode.instruction]
    for _, action in env.expert_plan(task_id):
        result = episode.step(action)
        seen.append(result)
        if result.done:
            break
    episode.close()
    return seen


def test_remote_episodes_match_in_process_ones(textcraft, server):
    remote = RemoteEnv(textcraft, [server.url], FAST)
    remote.check()
    for task_id in textcraft.task_ids("train")[:4] + textcraft.task_ids("test")[:2]:
        played = play_expert(remote, task_id)
        assert played == play_expert(textcraft, task_id)
        assert played[-1].done and played[-1].reward == 1.0


def test_server_speaks_agentgym_textcraft_fields(textcraft, server):
    """What AgentGym's own TextCraft client sends and reads."""
    http = httpx.Client(base_url=server.url)
    env_id = http.post("/create", json={"commands": None, "goal": None}).json()["id"]
    index = 5
    reset = http.post("/reset", json={"id": env_id, "data_idx": index}).json()
    task_id = served_task_ids(textcraft)[index]
    assert reset["observation"] == textcraft.start(task_id).instruction
    assert reset["done"] is False and reset["id"] == env_id
    step = http.post("/step", json={"id": env_id, "action": "inventory"}).json()
    assert set(step) == {"observation", "reward", "done"}
    assert http.get("/observation", params={"id": env_id}).json() == step["observation"]
    assert http.post("/close", json={"id": env_id}).json() == {"closed": True}
    gone = http.post("/step", json={"id": env_id, "action": "inventory"}).json()
    assert "unknown environment id" in gone["error"]


def test_agentgym_client_uses_task_indices(textcraft, server):
    env = make_env(
        EnvSettings(
            name="agentgym-textcraft",
            servers=[server.url],
            agentgym={"train": [0, 3], "test": [3, 5]},
        )
    )
    assert env.task_ids("test") == ["3", "4"]
    episode = env.start("3")
    assert episode.instruction == textcraft.start(served_task_ids(textcraft)[3]).instruction
    episode.close()


def test_webshop_dialect_round_trip(textcraft):
    """WebShop's fields (env_idx, bare-int create, [obs, null] reset, `state`) end to end."""
    webshop = LocalServer("--env", "textcraft", "--dialect", "webshop")
    try:
        http = httpx.Client(base_url=webshop.url)
        env_idx = http.post("/create").json()
        assert isinstance(env_idx, int)
        reset = http.post("/reset", json={"env_idx": env_idx, "session_id": 0}).json()
        assert isinstance(reset, list) and reset[1] is None
        step = http.post("/step", json={"env_idx": env_idx, "action": "inventory"}).json()
        assert set(step) == {"state", "reward", "done", "info"}

        settings = EnvSettings(
            name="agentgym-webshop",
            servers=[webshop.url],
            agentgym={"train": [0, 2], "test": [2, 3]},
        )
        env = make_env(settings)
        task_id = served_task_ids(textcraft)[1]
        episode = env.start("1")
        for _, action in textcraft.expert_plan(task_id):
            result = episode.step(action)
        assert result.done and result.reward == 1.0
    finally:
        webshop.kill()


def test_error_answers_raise_clear_errors(server):
    pool = ServerPool([server.url], DIALECTS["textcraft"], FAST)
    (remote,) = pool.servers
    with pytest.raises(LostEpisode, match="unknown environment id 999"):
        remote.post("/step", {"action": "inventory"}, 999)
    env_id = remote.post("/create", {})["id"]
    with pytest.raises(AgentGymError, match="call /reset first"):
        remote.post("/step", {"action": "inventory"}, env_id)
    with pytest.raises(AgentGymError, match=r"data_idx must be a task index in \[0, 419\)"):
        remote.post("/reset", {"data_idx": 10_000}, env_id)


def test_kill_a_server_mid_exploration_loses_and_repeats_nothing(textcraft, chat):
    """Two real servers; one is SIGKILLed after the second step. Every episode ends exactly once,
    the moved ones are counted, and the results equal an in-process run's."""
    tasks = textcraft.task_ids("train")[:8]
    prefix = agent_prefix(textcraft, [])
    settings = RolloutSettings(max_steps=8)
    expected = run_batched(
        textcraft, tasks, NoisyExpertBackend(textcraft, chat.tokenizer), chat, prefix, settings,
        progress=False,
    )  # fmt: skip

    doomed, survivor = LocalServer("--env", "textcraft"), LocalServer("--env", "textcraft")
    try:
        remote = RemoteEnv(textcraft, [doomed.url, survivor.url], FAST)
        backend = KillAfter(NoisyExpertBackend(remote, chat.tokenizer), calls=2, server=doomed)
        played = run_batched(remote, tasks, backend, chat, prefix, settings, progress=False)
    finally:
        doomed.kill()
        survivor.kill()

    assert [t.task_id for t in played] == tasks
    assert [t.messages for t in played] == [t.messages for t in expected]
    assert [(t.reward, t.finish_reason) for t in played] == [
        (t.reward, t.finish_reason) for t in expected
    ]
    counts = ending_counts(played)
    # Half the episodes started on the killed server; those still running when it died moved.
    assert 1 <= counts["retried"] <= 4 and counts["recoveries"] == counts["retried"]


def test_a_restarted_server_gets_the_episode_recreated_and_replayed(textcraft):
    server = LocalServer("--env", "textcraft")
    try:
        remote = RemoteEnv(textcraft, [server.url], FAST)
        task_id = textcraft.task_ids("train")[0]
        plan = [a for _, a in textcraft.expert_plan(task_id)]
        episode = remote.start(task_id)
        episode.step(plan[0])
        server.restart()  # same port, fresh process: the episode's id is gone
        results = [episode.step(action) for action in plan[1:]]
        assert results[-1].done and results[-1].reward == 1.0
        assert episode.recoveries == 1
    finally:
        server.kill()


def test_a_server_killed_with_a_step_in_flight_moves_the_episode_and_applies_the_step_once(
    textcraft,
):
    """A real kill meeting a request: the episode's server is stopped (SIGSTOP) so that its next
    step request is surely in flight, unanswered, then SIGKILLed. The client sees the connection
    die, re-creates the episode on the other server, replays the earlier step and sends the
    in-flight one once: the results equal an undisturbed episode's."""
    task_id = textcraft.task_ids("train")[0]
    plan = [a for _, a in textcraft.expert_plan(task_id)]
    undisturbed = textcraft.start(task_id)
    expected = [undisturbed.step(a) for a in plan]

    doomed, survivor = LocalServer("--env", "textcraft"), LocalServer("--env", "textcraft")
    try:
        remote = RemoteEnv(textcraft, [doomed.url, survivor.url], FAST)
        episode = remote.start(task_id)
        assert episode.server.url == doomed.url  # the first server takes the first episode
        results = [episode.step(plan[0])]
        doomed.process.send_signal(signal.SIGSTOP)  # accepts connections, answers nothing
        in_flight = threading.Thread(target=lambda: results.append(episode.step(plan[1])))
        in_flight.start()
        time.sleep(0.5)  # well inside FAST's 2 s timeout: the request waits on the stopped server
        assert in_flight.is_alive(), "the step was answered before the kill"
        doomed.kill()
        in_flight.join(10)
        results += [episode.step(a) for a in plan[2:]]
    finally:
        doomed.kill()
        survivor.kill()
    assert episode.server.url == survivor.url and episode.recoveries == 1
    assert [(r.observation, r.reward, r.done) for r in results] == [
        (r.observation, r.reward, r.done) for r in expected
    ]


def test_a_server_down_when_a_stage_starts_sits_out_until_it_answers_and_passes(textcraft, capsys):
    """Found by the chaos bench: a server restarting as a stage began failed the stage ("not
    usable") though the other could play it. Now it sits out with a warning, takes no episode
    while down, and is checked before its first one once it answers."""
    quick = ClientSettings(timeout_s=2.0, connect_timeout_s=0.5, retries=0, down_for_s=0.2)
    down, up = LocalServer("--env", "textcraft"), LocalServer("--env", "textcraft")
    try:
        down.kill()
        remote = RemoteEnv(textcraft, [down.url, up.url], quick)
        remote.check()
        assert f"{down.url} is not usable" in capsys.readouterr().err
        task_ids = textcraft.task_ids("train")[:2]
        first = [remote.start(t) for t in task_ids]
        assert {e.server.url for e in first} == {up.url}  # not the one that never answered
        down.restart()  # back, on its port
        time.sleep(0.3)  # past down_for_s
        later = remote.start(task_ids[0])
        assert later.server.url == down.url  # checked, then the least loaded
        assert remote.pool.servers[0].pending_check is None
        for episode in [*first, later]:
            episode.close()
        down.kill()
        up.kill()
        with pytest.raises(ValueError, match="no environment server is usable"):
            RemoteEnv(textcraft, [down.url, up.url], quick).check()
    finally:
        down.kill()
        up.kill()


def test_all_servers_gone_records_every_episode_as_lost(textcraft, chat):
    server = LocalServer("--env", "textcraft")
    tasks = textcraft.task_ids("train")[:3]
    remote = RemoteEnv(textcraft, [server.url], FAST)
    backend = KillAfter(NoisyExpertBackend(remote, chat.tokenizer), calls=1, server=server)
    prefix = agent_prefix(textcraft, [])
    played = run_batched(remote, tasks, backend, chat, prefix, RolloutSettings(8), progress=False)
    assert [t.task_id for t in played] == tasks
    assert all(t.finish_reason.startswith("lost: ServerUnavailable") for t in played)
    with pytest.raises(EpisodesLost, match="3 of 3 episodes were lost"):
        raise_if_lost(played, "store/run/explore/trajectories.jsonl")
    # And a run that starts without its servers stops before any work.
    with pytest.raises(ValueError, match=f"{server.url} is not usable"):
        remote.check()


def test_a_server_for_another_environment_is_refused(server):
    from envs.scienceworld import ScienceWorldEnv

    catalog = ScienceWorldEnv(["lifespan-longest-lived"], variations=1)
    with pytest.raises(ValueError, match="serves .*'env': 'textcraft'.* this run needs"):
        RemoteEnv(catalog, [server.url], FAST).check()


class KillAfter:
    """A backend that kills `server` after `calls` generate calls (a machine dying mid-run)."""

    def __init__(self, backend, calls: int, server: LocalServer):
        self.backend, self.calls, self.server = backend, calls, server

    def generate(self, prompts, sampling):
        if len(self.backend.calls) == self.calls:
            self.server.kill()
        return self.backend.generate(prompts, sampling)


class FakeServer:
    """Answers /create and /reset as a TextCraft server would, then every other request with
    `status` and `body`, or never (`hang`)."""

    def __init__(self, status: int = 200, body: bytes = b"", hang: bool = False):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                status, body = fake.status, fake.body
                if self.path in ("/create", "/reset"):
                    status, body = 200, json.dumps({"id": 0, "observation": "Goal: x."}).encode()
                elif fake.hang:
                    time.sleep(30)
                    return
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

            def log_message(self, *args):
                pass

        self.status, self.body, self.hang = status, body, hang
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (200, b"<html>oops</html>", "/step answered non-JSON: '<html>oops</html>'"),
        (200, json.dumps({"reward": 0, "done": False}).encode(), "/step answer lacks 'observation'"),
        (200, json.dumps({"observation": "o", "reward": "1", "done": False}).encode(),
         "/step answered reward='1'; expected a number"),
        (200, json.dumps({"observation": "o", "reward": 0, "done": "no"}).encode(),
         "/step answered done='no'; expected true or false"),
        (200, json.dumps({"error": "disk full"}).encode(), "/step answered an error: disk full"),
        (500, b"Internal Server Error", "/step answered HTTP 500"),
        (409, json.dumps({"error": "The task with environment 0 has finished."}).encode(),
         r"/step answered HTTP 409: The task with environment 0 has finished\.$"),
    ],
)  # fmt: skip
def test_malformed_step_answers_name_the_server_and_what_came_back(status, body, message):
    fake = FakeServer(status, body)
    try:
        pool = ServerPool([fake.url], DIALECTS["textcraft"], FAST)
        with pytest.raises(AgentGymError, match=message) as error:
            _episode(pool)
        assert fake.url in str(error.value)
    finally:
        fake.close()


def _episode(pool):
    from envs.agentgym.client import RemoteEpisode

    episode = RemoteEpisode(pool, "t", 0)  # create + reset
    return episode.step("inventory")


def test_a_hanging_server_times_out_with_a_clear_error():
    fake = FakeServer(hang=True)
    settings = ClientSettings(timeout_s=0.5, connect_timeout_s=0.5, retries=0, recoveries=1)
    try:
        pool = ServerPool([fake.url], DIALECTS["textcraft"], settings)
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match="no environment server could continue"):
            _episode(pool)  # /step hangs: timeout, re-create and replay, hangs again: given up
        assert time.monotonic() - started < 10  # two timed-out tries, not a stuck flow
    finally:
        fake.close()


def test_server_settings_are_checked_kept_by_the_cli_and_out_of_cache_keys():
    from flows.eto import ETOConfig
    from flywheel.config_files import load_config, validate_config
    from flywheel.storage import ArtifactStore

    def key(env):  # as stages key on their environment
        return ArtifactStore("memory://keys").stage_key({"env": env.identity(), "tasks": ["a"]})

    one = EnvSettings(servers=["http://10.0.0.1:36001"])
    other = EnvSettings(servers=["http://10.0.0.2:36001", "http://10.0.0.3:36001"], test_tasks=3)
    assert key(one) == key(other) == key(EnvSettings())
    assert key(EnvSettings(name="scienceworld")) != key(EnvSettings())
    assert key(EnvSettings(name="scienceworld", scienceworld={"task_names": ["boil"]})) != key(
        EnvSettings(name="scienceworld")
    )
    # The command line hands the flow `cfg.model_dump()`: the servers must survive it.
    servers = "env.servers=[http://10.0.0.1:36001, http://10.0.0.2:36001]"
    cfg = load_config(ETOConfig, "configs/eto_textcraft.yaml", [servers])
    assert validate_config(ETOConfig, cfg.model_dump()).env.servers == cfg.env.servers
    assert len(cfg.env.servers) == 2

    with pytest.raises(ValueError, match="must be an http:// or https:// URL"):
        EnvSettings(servers=["10.0.0.1:36001"])
    with pytest.raises(ValueError, match="set env.servers"):
        EnvSettings(name="agentgym-webshop")
    with pytest.raises(ValueError, match="set env.agentgym.train and env.agentgym.test"):
        EnvSettings(name="agentgym-webshop", servers=["http://127.0.0.1:1"])


def test_a_run_on_an_agentgym_server_without_expert_is_refused_before_work(server, tmp_path):
    from flows.eto import ETOConfig
    from flywheel.config_files import validate_config
    from ops.runner import preflight

    config = {
        "storage_url": str(tmp_path / "store"),
        "model": {"base": "tiny"},
        "env": {
            "name": "agentgym-webshop",  # no expert for WebShop (TextCraft's: test_agentgym_expert)
            "servers": [server.url],
            "agentgym": {"train": [0, 4], "test": [4, 6]},
        },
    }
    with pytest.raises(ConfigError, match="has no expert trajectories"):
        preflight(validate_config(ETOConfig, config))
    # Imported trajectories are an expert too.
    imported = Path(__file__).parent / "samples" / "agenttraj_mixed.json"
    preflight(validate_config(ETOConfig, {**config, "expert_file": str(imported)}))


def test_batched_steps_answer_each_entry_and_recover_after_a_restart(textcraft):
    server = LocalServer("--env", "textcraft")
    try:
        http = httpx.Client(base_url=server.url)
        env_id = http.post("/create").json()["id"]
        http.post("/reset", json={"id": env_id, "data_idx": 0})
        steps = [{"id": 999, "action": "inventory"}, {"id": env_id, "action": "inventory"}]
        results = http.post("/flywheel/step", json={"steps": steps}).json()["results"]
        assert "unknown environment id 999" in results[0]["error"]
        assert results[1]["observation"].startswith("Inventory")

        remote = RemoteEnv(textcraft, [server.url], FAST)
        tasks = textcraft.task_ids("train")[:2]
        plans = [[a for _, a in textcraft.expert_plan(t)] for t in tasks]
        episodes = [remote.start(t) for t in tasks]
        paths = []
        post = remote.pool.servers[0].post
        remote.pool.servers[0].post = lambda path, *a, **k: (
            paths.append(path) or post(path, *a, **k)
        )
        remote.step_all([(e, p[0]) for e, p in zip(episodes, plans, strict=True)])
        assert paths == ["/flywheel/step"]  # both episodes' steps in one request
        server.restart()
        last = [None, None]
        for k in range(1, max(map(len, plans))):
            moves = [(e, p[k]) for e, p in zip(episodes, plans, strict=True) if k < len(p)]
            for (episode, _), result in zip(moves, remote.step_all(moves), strict=True):
                last[episodes.index(episode)] = result
        assert all(r.done and r.reward == 1.0 for r in last)
        assert [e.recoveries for e in episodes] == [1, 1]
    finally:
        server.kill()


def test_serve_env_refuses_bad_settings_before_serving(tmp_path, capsys):
    from ops.cli import main

    config = tmp_path / "bad.yaml"
    config.write_text("env:\n  name: scienceworld\n  scienceworld:\n    task_names: [nope]\n")
    assert main(["serve-env", "--config", str(config)]) == 2
    assert "unknown ScienceWorld task names ['nope']" in capsys.readouterr().err
    config.write_text("env:\n  name: textcraft\n  max_steps: 0\n")
    assert main(["serve-env", "--config", str(config)]) == 2
    assert "section 'env'" in (err := capsys.readouterr().err) and "max_steps" in err
    assert main([]) == 2 and "serve-env" in capsys.readouterr().out


def test_a_gateway_without_its_server_counts_as_unavailable_not_as_an_answer():
    fake = FakeServer(503, b"Service Unavailable")
    try:
        pool = ServerPool([fake.url], DIALECTS["textcraft"], FAST)
        with pytest.raises(ServerUnavailable, match="answered HTTP 503"):
            _episode(pool)
    finally:
        fake.close()


def test_sessions_a_client_abandoned_are_closed_after_their_ttl(textcraft):
    from envs.agentgym.server import EnvService

    service = EnvService(textcraft, DIALECTS["textcraft"], session_ttl_s=0.05)
    abandoned = service.create({})["id"]
    service.reset({"id": abandoned, "data_idx": 0})
    episode = service._sessions[abandoned].episode
    closed = []
    episode.close = lambda: closed.append(True)
    time.sleep(0.1)
    fresh = service.create({})["id"]
    assert closed == [True]
    with pytest.raises(ValueError, match=f"unknown environment id {abandoned}"):
        service.step({"id": abandoned, "action": "inventory"})
    service.reset({"id": fresh, "data_idx": 1})  # the new session is untouched


def test_an_expert_episode_whose_server_dies_moves_and_counts_its_move(textcraft):
    """Found by the chaos bench: the expert's episodes run on the servers too, and one killed
    under them moved without a trace. The trajectory is the undisturbed one's, with its move
    counted in memory for the stage's counts, and stored as the undisturbed one."""
    from agents.rollout import expert_trajectory

    task_id = textcraft.task_ids("train")[0]
    expected = expert_trajectory(textcraft, task_id, [])
    doomed, survivor = LocalServer("--env", "textcraft"), LocalServer("--env", "textcraft")

    class KilledAfterStart:
        """The remote environment, with the first episode's server killed once it started."""

        def __init__(self, env):
            self.env = env

        def __getattr__(self, name):
            return getattr(self.env, name)

        def start(self, task_id):
            episode = self.env.start(task_id)
            assert episode.server.url == doomed.url
            doomed.kill()
            return episode

    try:
        remote = RemoteEnv(textcraft, [doomed.url, survivor.url], FAST)
        moved = expert_trajectory(KilledAfterStart(remote), task_id, [])
    finally:
        doomed.kill()
        survivor.kill()
    assert moved.recoveries == 1 and expected.recoveries == 0
    # Stored, the moved episode is the undisturbed one byte for byte: the move is a fault's
    # record (the stage's counts), so it changes no file and no cache key downstream.
    assert moved.model_dump_json() == expected.model_dump_json()
