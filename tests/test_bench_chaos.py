"""bench/chaos.py's own logic on hand-made inputs: the store comparison (what is excluded, what
is named when files differ) and the seeded choice of victims."""

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from bench import chaos


def manifest(published_at: str, sha: str = "aa") -> str:
    return json.dumps(
        {"stage": "dpo", "published_at": published_at,
         "checksums": {"model/model.safetensors": {"size": 3, "sha256": sha}}}
    )  # fmt: skip


def campaign(published_at: str, flow_run_id: str, policy: str = "p") -> str:
    evaluation = ["sft", {"stage": "evaluate", "published_at": published_at, "metrics": {"s": 1}}]
    return json.dumps(
        {"name": "c", "rounds": [{"round": 0, "policy": policy, "flow_run_id": flow_run_id,
                                  "published_at": published_at, "evaluations": [evaluation]}]}
    )  # fmt: skip


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def store(root: Path, **changes) -> Path:
    files = {
        "run/dpo/_MANIFEST.json": manifest("2026-01-01T00:00:00"),
        "run/dpo/model/model.safetensors": b"\x00\x01\x02",
        "run/campaign.json": campaign("2026-01-01T00:00:00", "id-1"),
        "run/explore/trajectories.jsonl": '{"task_id": "a", "recoveries": 0}\n'
        '{"task_id": "b", "recoveries": 0}\n',
    }
    return write(root, {**files, **changes})


def test_stores_that_differ_only_in_publication_times_and_flow_run_ids_are_equal(tmp_path):
    reference = store(tmp_path / "a")
    candidate = store(
        tmp_path / "b",
        **{"run/dpo/_MANIFEST.json": manifest("2027-05-05T10:00:00"),
           "run/campaign.json": campaign("2027-05-05T10:00:00", "id-2")},
    )  # fmt: skip
    assert chaos.compare_stores(reference, candidate) == {}


def test_a_changed_weight_file_and_its_checksum_are_named(tmp_path):
    reference = store(tmp_path / "a")
    candidate = store(
        tmp_path / "b",
        **{"run/dpo/model/model.safetensors": b"\x00\x01\x03",
           "run/dpo/_MANIFEST.json": manifest("2026-01-01T00:00:00", sha="bb")},
    )  # fmt: skip
    assert chaos.compare_stores(reference, candidate) == {
        "run/dpo/_MANIFEST.json": ["checksums.model/model.safetensors.sha256"],
        "run/dpo/model/model.safetensors": ["bytes differ (3 and 3 bytes)"],
    }


def test_a_trajectory_field_a_policy_and_missing_or_extra_files_are_named(tmp_path):
    reference = store(tmp_path / "a")
    candidate = store(
        tmp_path / "b",
        **{"run/explore/trajectories.jsonl": '{"task_id": "a", "recoveries": 0}\n'
           '{"task_id": "b", "recoveries": 1}\n',
           "run/campaign.json": campaign("2026-01-01T00:00:00", "id-1", policy="q"),
           "run/dpo/optimizer.pt": b"left"},
    )  # fmt: skip
    (candidate / "run/dpo/model/model.safetensors").unlink()
    assert chaos.compare_stores(reference, candidate) == {
        "run/campaign.json": ["rounds[0].policy"],
        "run/dpo/model/model.safetensors": ["missing"],
        "run/dpo/optimizer.pt": ["extra"],
        "run/explore/trajectories.jsonl": ["line 2: recoveries"],
    }


def test_victims_are_spread_over_every_kind_and_seeded():
    planner = chaos.KillPlanner(seed=3)
    plans = [planner.next() for _ in range(12)]
    for block in range(3):
        assert sorted(p.victim for p in plans[4 * block : 4 * block + 4]) == sorted(chaos.KINDS)
    again = chaos.KillPlanner(seed=3)
    assert [again.next() for _ in range(12)] == plans
    other = chaos.KillPlanner(seed=4)
    assert [other.next() for _ in range(12)] != plans
    limits = {"flow": 60.0, "trainer": 10.0, "vllm": 15.0, "server": 10.0}
    assert all(0 <= p.delay_s <= limits[p.victim] for p in plans)


def test_trainers_and_vllm_engines_are_told_from_other_processes():
    trainer = "python3 /work/.venv/bin/python -m training.dpo --config /tmp/fw-x/job.json"
    engine = "VLLM::EngineCore "
    flow = "python -m flows.eto --campaign --config training.yaml"  # a name, not a trainer
    watchdog = "python -m flywheel.watchdog 1234"
    assert [chaos.is_victim("trainer", d) for d in (trainer, engine, flow, watchdog)] == [
        True, False, False, False,
    ]  # fmt: skip
    assert [chaos.is_victim("vllm", d) for d in (trainer, engine, flow, watchdog)] == [
        False, True, False, False,
    ]  # fmt: skip


def test_differences_in_timing_and_recovery_records_are_listed_apart_from_the_others():
    differences = {
        "run/sft/train.log": ["bytes differ (10 and 11 bytes)"],
        "run/sft/_MANIFEST.json": [
            "checksums.train.log.sha256", "metrics.train_runtime", "metrics.resumed_from_step",
        ],
        "run/dpo/train.log": ["missing"],
        "run/campaign.json": ["rounds[0].evaluations[1][1].metrics.seconds", "rounds[0].policy"],
        "run/explore/_MANIFEST.json": ["counts.recoveries", "counts.retried", "counts.episodes"],
        "run/explore/trajectories.jsonl": ["line 2: recoveries", "line 2: reward"],
    }  # fmt: skip
    assert chaos.split_differences(differences) == (
        {"run/sft/train.log": ["bytes differ (10 and 11 bytes)"],
         "run/sft/_MANIFEST.json": ["checksums.train.log.sha256", "metrics.train_runtime"],
         "run/campaign.json": ["rounds[0].evaluations[1][1].metrics.seconds"]},
        {"run/explore/_MANIFEST.json": ["counts.recoveries", "counts.retried"]},
        {"run/sft/_MANIFEST.json": ["metrics.resumed_from_step"],
         "run/dpo/train.log": ["missing"], "run/campaign.json": ["rounds[0].policy"],
         "run/explore/_MANIFEST.json": ["counts.episodes"],
         "run/explore/trajectories.jsonl": ["line 2: recoveries", "line 2: reward"]},
    )  # fmt: skip


def test_a_data_file_differing_in_recoveries_is_a_difference_in_earnest():
    """A trajectory's `recoveries` is never stored: a server kill under the expert's episodes
    may change its manifest's counts only. A data file (and so its checksum and the digests of
    the stages that read it) differing in them means the record leaked into the data."""
    expert = "file:///w/run/store/c/expert/expert.jsonl"
    differences = {
        "c/expert/expert.jsonl": ["line 4: recoveries"],
        "c/expert/_MANIFEST.json": ["checksums.expert.jsonl.sha256", "counts.recoveries"],
        "c/sft/_MANIFEST.json": ["inputs_digest", f"upstream.{expert}"],
    }
    timing, recovery, other = chaos.split_differences(differences)
    assert timing == {}
    assert recovery == {"c/expert/_MANIFEST.json": ["counts.recoveries"]}
    assert other == {
        "c/expert/expert.jsonl": ["line 4: recoveries"],
        "c/expert/_MANIFEST.json": ["checksums.expert.jsonl.sha256"],
        "c/sft/_MANIFEST.json": ["inputs_digest", f"upstream.{expert}"],
    }


def test_runs_saved_as_json_load_back_with_their_plans(tmp_path):
    from dataclasses import asdict

    runs = [
        chaos.Attempt(1, chaos.KillPlan("vllm", 3.5), killed="vllm pid 7", exit_code=1),
        chaos.Attempt(2, None, exit_code=0, rounds_after=2),
    ]
    path = tmp_path / "attempts.json"
    path.write_text(json.dumps([asdict(a) for a in runs]))
    assert chaos.load_attempts(path) == runs


def test_episode_recoveries_are_summed_over_the_stores_manifests(tmp_path):
    write(
        tmp_path,
        {"a/_MANIFEST.json": json.dumps({"counts": {"retried": 2, "recoveries": 3}}),
         "b/_MANIFEST.json": json.dumps({"counts": {"retried": 1, "recoveries": 1}}),
         "c/_MANIFEST.json": json.dumps({"counts": {}})},
    )  # fmt: skip
    assert chaos.episode_recoveries(tmp_path) == (3, 4)


def test_a_run_still_going_at_the_run_timeout_is_counted_hung_and_its_group_killed(tmp_path):
    """A hung run (the chaos bench met one: a flow that never exited) must not stall the bench:
    at the run timeout its whole process group is killed and the attempt says hung."""
    campaign = chaos.Campaign(tmp_path, 1, [], tmp_path / "config.yaml", run_timeout_s=1.0)
    child_pid = tmp_path / "child.pid"
    campaign.flow_command = lambda: [
        "sh",
        "-c",
        f"sleep 300 & echo $! > {child_pid}; wait",  # a child in the run's group
    ]
    attempt = campaign.run_once(None, tmp_path / "chaos.log")
    assert attempt.hung and attempt.exit_code == -9 and attempt.seconds < 30
    pid = int(child_pid.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_frozen_server_holds_requests_in_flight_until_killed_and_comes_back(tmp_path):
    """The server victim: frozen once an episode on it has taken a step (its next step then
    waits, unanswered), killed, restarted on its port, answering again. An open session alone
    does not count: the server counts it before its `/create` answer is sent."""
    import httpx

    config = tmp_path / "config.yaml"
    config.write_text("env: {name: textcraft}\n")
    port = chaos.free_ports(1)[0]
    server = chaos.EnvServer(config, port, tmp_path / "server.log", dict(os.environ))
    try:
        assert server.running_episodes() == 0
        env_id = httpx.post(server.url + "/create", json={}, timeout=5.0).json()["id"]
        httpx.post(server.url + "/reset", json={"id": env_id, "data_idx": 0}, timeout=5.0)
        assert server.running_episodes() == 0  # open, not stepped
        run, frozen = subprocess.Popen(["sleep", "30"]), threading.Event()
        watcher = threading.Thread(target=server.freeze_when_running, args=(run, frozen))
        watcher.start()
        time.sleep(0.3)
        assert not frozen.is_set()
        step = httpx.post(server.url + "/step", json={"id": env_id, "action": "inventory"})
        assert step.status_code == 200
        watcher.join(timeout=5.0)
        run.kill()
        assert frozen.is_set()
        with pytest.raises(httpx.TimeoutException):
            httpx.get(server.url + "/", timeout=1.0)
        # Unanswered is unknown, not "none" (a busy server answers late while episodes run)
        assert server.running_episodes(timeout_s=0.5) is None
        assert {running for _, running, _ in server.polls} == {0, 1}
        assert server.polls[-1][1] == 1
        assert ", 0 unanswered" in server.poll_summary()
        assert re.search(r"answers: 0 from [.\d]+ s, 1 from [.\d]+ s$", server.poll_summary())
        assert re.search(
            r"frozen at \d\d:\d\d:\d\d\.\d{3} UTC \(1 running\)", server.poll_summary()
        )
        server.polls = [
            (0.0, 0, 0.1),
            (0.2, 0, 0.1),
            (0.4, None, 10.0),
            (10.5, 0, 0.1),
            (11.0, 2, 0.1),
        ]
        assert server.poll_changes() == "0 from 0.0 s, - from 0.4 s, 0 from 10.5 s, 2 from 11.0 s"
        assert server.poll_changes(most=2) == "0 from 0.0 s, - from 0.4 s, ... (2 more)"
        assert "running episodes first seen at 11.0 s" in server.poll_summary()
        first = server.process.pid
        server.kill()
        server.start()
        assert server.process.pid != first
        assert httpx.get(server.url + "/", timeout=5.0).status_code == 200
        assert server.running_episodes() == 0  # a fresh process: the episode is gone
    finally:
        server.thaw()
        server.stop()


def test_the_results_file_lists_each_server_watcher_line():
    """The watcher's line (when it froze the server, how its answers changed) is the evidence
    that a server kill met a running episode: it goes into the results file, not only stdout."""
    from argparse import Namespace

    campaign = chaos.Campaign.__new__(chaos.Campaign)
    campaign.attempts = [
        chaos.Attempt(1, chaos.KillPlan("server", 1.0), killed="server :1 (down 2.0 s)",
                      exit_code=0, watcher="9 polls, 0 unanswered; answers: 0 from 0.0 s"),
        chaos.Attempt(2, chaos.KillPlan("flow", 3.0), killed="flow pid 7", exit_code=-9),
    ]  # fmt: skip
    text = chaos.results_markdown(Namespace(seed=0, rounds=1), [], campaign, None, 0, "cmd")
    assert "- run 1: 9 polls, 0 unanswered; answers: 0 from 0.0 s" in text
    assert "- run 2" not in text


def test_the_campaign_config_validates_as_the_eto_recipe_and_names_its_model(tmp_path):
    import yaml

    from flows.eto import ETOConfig
    from flywheel.config_files import validate_config

    text = chaos.campaign_config('["http://127.0.0.1:1"]', 2, "smollm2-135m")
    config = validate_config(ETOConfig, yaml.safe_load(text))
    assert config.model.base == "smollm2-135m" and config.rounds == 2
    assert config.inference.max_tokens == 48  # a real model's reply is ~30 tokens
    assert config.env.few_shot == 1  # the untrained model steps only with the worked example
    assert config.env.servers == ["http://127.0.0.1:1"]
    tiny = validate_config(ETOConfig, yaml.safe_load(chaos.campaign_config("[]", 1)))
    assert tiny.model.base == "tiny" and tiny.env.few_shot == 0


def test_a_missed_plan_is_tried_again_after_the_other_kinds_of_its_block():
    planner = chaos.KillPlanner(seed=3)
    first = planner.next()
    planner.missed(first)  # its run ended before its moment came
    rest = [planner.next().victim for _ in range(len(chaos.KINDS))]
    # The other kinds of the block first, then the missed one: never the same victim twice in a
    # row while others wait.
    assert sorted(rest[:-1]) == sorted(k for k in chaos.KINDS if k != first.victim)
    assert rest[-1] == first.victim


def test_watchdog_lines_after_a_flow_kill_are_its_job_and_after_any_other_run_a_leak():
    line = ["flywheel watchdog: stopped 1 processes the flow left: 7 python -m training.dpo"]
    attempts = [
        chaos.Attempt(1, chaos.KillPlan("flow", 2.0), killed="flow pid 5", watchdog_lines=line),
        chaos.Attempt(2, chaos.KillPlan("flow", 9.0), killed="", watchdog_lines=line),  # missed
        chaos.Attempt(3, chaos.KillPlan("vllm", 1.0), killed="vllm pid 8", watchdog_lines=line),
        chaos.Attempt(4, None),
    ]
    assert chaos.watchdog_lines(attempts) == (1, 2)
