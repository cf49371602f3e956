"""Chaos campaign: the tiny ETO campaign (3 rounds after round 0) on environment servers, with the
flow, a trainer, vLLM's engine and the servers killed at seeded random moments, resumed each time
until the campaign is complete; then its store is compared with an undisturbed run's.

    python -m bench.chaos --kills 12 --seed 0 --out bench/results-chaos.md

Both campaigns run in the same folders (the undisturbed store is moved aside once complete), so
paths written into files are equal. Each campaign run is `python -m flows.eto --campaign
--config <tiny config>` in a process group of its own; it publishes one round. A kill:

- flow: SIGKILL to the flow's process group (its watchdog must stop what it left);
- trainer: SIGKILL to a running `training.*` process (the stage fails; the run fails);
- vllm: SIGKILL to vLLM's engine process (the stage fails; the run fails);
- server: SIGKILL to one environment server, restarted on its port a moment later (episodes
  move to the other server or recover on the restarted one; the run goes on).

After every run: no process the run started may still be alive (30 s allowed for its watchdog)
and no `$TMPDIR/fw-*` folder may be left. What is compared is in `compare_stores`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN_NAME = "eto-chaos"
KINDS = ("flow", "trainer", "vllm", "server")
CONFIG = """\
run_name: {run_name}
model: {{base: {model}}}
env: {{train_tasks: 4, test_tasks: 3, max_steps: 3, few_shot: {few_shot}, servers: {servers}}}
inference: {{max_tokens: {max_tokens}, kv_cache_gib: 1}}
rounds: {rounds}
sft: {{epochs: 1, batch_size: 2, max_length: 1024}}
dpo: {{epochs: 1, max_length: 1024}}
explore: {{shards: 2}}
"""
LEFTOVER_WAIT_S = 30  # the watchdog's snapshot, SIGTERM grace and SIGKILL fit in this
POLL_TIMEOUT_S = 10.0  # a server victim's watcher waits this long for `GET /flywheel`
POLL_EVERY_S = 0.01  # and asks this often: the tiny model's episodes last under a second
SERVER_DOWN_S = (1.0, 8.0)  # how long a killed environment server stays down
# A run still going after this long is hung (the tiny campaign's slowest run took 19 min on 2
# loaded cores): its process group is killed and the run counted as hung.
RUN_TIMEOUT_S = 45 * 60

# Fields excluded from the comparison, each for a stated reason (see docs/chaos.md).
# - `published_at` (every manifest, each campaign round): the wall-clock time of publication.
# - `flow_run_id` (each campaign round): Prefect's id of the flow run that published the round,
#   new for every run by design.
VOLATILE_KEYS = {"published_at", "flow_run_id"}
# Wall-clock measurements the store keeps: they differ between any two runs, undisturbed ones
# too, so differences in them are listed apart from the others (never hidden): a trainer's log
# (`train.log`: progress bars with rates, trl's runtime summary), its checksum in the manifest,
# and the timing metrics of a training stage's manifest.
TIMING_FILES = {"train.log"}
# A stage's `metrics.<name>` (in its manifest, and in campaign.json's copies of evaluations).
TIMING_METRICS = (
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "checkpoint_seconds",
    "seconds", "generated_tokens_per_s",
)  # fmt: skip


# What a fault cost, recorded where it was met: an episode's moves to another environment server
# (`recoveries` on its trajectory line; `counts.retried` and `counts.recoveries` in its stage's
# manifest). They differ from an undisturbed run exactly where a kill met a running episode, so
# they are listed apart (never hidden), like timing.
RECOVERY_KEYS = ("recoveries", "retried")


def is_recovery_record(problem: str) -> bool:
    """Whether a difference (`counts.retried`, `counts.recoveries`) names a recovery count."""
    return problem.rsplit(": ", 1)[-1].rsplit(".", 1)[-1] in RECOVERY_KEYS


def is_timing(path: str) -> bool:
    """Whether a key path names a wall-clock record: a timing metric, or train.log's checksum."""
    parts = path.split(".")
    return (len(parts) >= 2 and parts[-2].endswith("metrics") and parts[-1] in TIMING_METRICS) or (
        path.startswith("checksums.train.log.")
    )


# Comparison -------------------------------------------------------------------------------------


def without_volatile(value):
    """A JSON value with every VOLATILE_KEYS entry removed, at any depth."""
    if isinstance(value, dict):
        return {k: without_volatile(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [without_volatile(v) for v in value]
    return value


def json_differences(expected, found, where: str = "") -> list[str]:
    """Key paths at which two JSON values differ (`a.b[2].c`)."""
    if isinstance(expected, dict) and isinstance(found, dict):
        paths = []
        for key in sorted(set(expected) | set(found)):
            inner = f"{where}.{key}" if where else str(key)
            if key not in expected or key not in found:
                paths.append(f"{inner} ({'extra' if key not in expected else 'missing'})")
            else:
                paths += json_differences(expected[key], found[key], inner)
        return paths
    if isinstance(expected, list) and isinstance(found, list) and len(expected) == len(found):
        return [p for i, (e, f) in enumerate(zip(expected, found, strict=True)) for p in
                json_differences(e, f, f"{where}[{i}]")]  # fmt: skip
    return [] if expected == found else [where or "(whole value)"]


def is_json_record(name: str) -> bool:
    """Files compared as JSON with VOLATILE_KEYS removed: manifests, failure records and the
    campaign's state, the only files the store writes with times or flow-run ids in them."""
    return name.startswith("_") and name.endswith(".json") or name == "campaign.json"


def file_differences(expected: Path, found: Path) -> list[str]:
    """Why two files differ ([] when equal): JSON records key by key, everything else by bytes
    (JSON lines line by line, to name the field)."""
    expected_bytes, found_bytes = expected.read_bytes(), found.read_bytes()
    if is_json_record(expected.name):
        return json_differences(
            without_volatile(json.loads(expected_bytes)), without_volatile(json.loads(found_bytes))
        )
    if expected_bytes == found_bytes:
        return []
    if expected.suffix == ".jsonl":
        old, new = expected_bytes.splitlines(), found_bytes.splitlines()
        if len(old) != len(new):
            return [f"{len(old)} lines, now {len(new)}"]
        return [f"line {i + 1}: {p}" for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b
                for p in json_differences(json.loads(a), json.loads(b))]  # fmt: skip
    return [f"bytes differ ({len(expected_bytes)} and {len(found_bytes)} bytes)"]


def store_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def compare_stores(reference: Path, candidate: Path) -> dict[str, list[str]]:
    """Every file of both stores: relative path -> its differences ([] for none shown)."""
    expected, found = store_files(reference), store_files(candidate)
    differences = {name: ["missing"] for name in sorted(expected - found)}
    differences |= {name: ["extra"] for name in sorted(found - expected)}
    for name in sorted(expected & found):
        if problems := file_differences(reference / name, candidate / name):
            differences[name] = problems
    return differences


def split_differences(differences: dict[str, list[str]]) -> tuple[dict, dict, dict]:
    """(timing, recovery, other): the differences in wall-clock measurements (TIMING_FILES,
    is_timing), in a manifest's recovery counts (is_recovery_record), and all the others, file
    by file. A data file holds no recovery record (a trajectory's `recoveries` is never
    stored), so any difference in one, and so in its checksum and its readers' digests, is
    another difference."""
    timing, recovery, other = {}, {}, {}
    for name, problems in differences.items():
        file = name.rsplit("/", 1)[-1]
        if file in TIMING_FILES and problems not in (["missing"], ["extra"]):
            timing[name] = problems
            continue
        for problem in problems:
            if is_timing(problem):
                kind = timing
            elif is_json_record(file) and is_recovery_record(problem):
                kind = recovery
            else:
                kind = other
            kind.setdefault(name, []).append(problem)
    return timing, recovery, other


# Kill plans -------------------------------------------------------------------------------------


@dataclass
class KillPlan:
    victim: str  # one of KINDS
    delay_s: float  # after the trigger: the victim's appearance, or the run's start for `flow`


class KillPlanner:
    """Seeded victims spread evenly over the kinds (each block of len(KINDS) plans holds every
    kind once, in a seeded order), each with a seeded delay."""

    def __init__(self, seed: int, kinds=KINDS, max_delay_s: dict[str, float] | None = None):
        self.random = random.Random(seed)
        self.kinds = list(kinds)
        # A server is killed at most 3 s after episodes start: the tiny campaign's episodes
        # end within seconds, and a later kill met no request in flight (last stop's run 2).
        self.max_delay_s = {"flow": 60.0, "trainer": 10.0, "vllm": 15.0, "server": 3.0}
        self.max_delay_s |= max_delay_s or {}
        self._block: list[str] = []

    def next(self) -> KillPlan:
        if not self._block:
            self._block = self.kinds[:]
            self.random.shuffle(self._block)
        victim = self._block.pop()
        return KillPlan(victim, round(self.random.uniform(0, self.max_delay_s[victim]), 1))

    def missed(self, plan: KillPlan) -> None:
        """A plan whose moment never came (the run ended first) is tried again after the rest of
        its block: retried at once, a server plan on a campaign whose episodes end before a poll
        sees them took every run and left the other kinds unplanned (a whole campaign without a
        kill, 2026-11-27)."""
        self._block.insert(0, plan.victim)


def describe(process) -> str:
    import psutil

    try:
        return f"{process.name()} {' '.join(process.cmdline())}"
    except psutil.Error:
        return ""


def is_victim(kind: str, description: str) -> bool:
    """Whether a process (its `name cmdline`) is one a plan of `kind` kills; `flow` and `server`
    victims are known by pid instead."""
    if kind == "trainer":
        return " -m training." in description
    if kind == "vllm":
        return "EngineCore" in description.split(" ", 1)[0] or "VLLM::EngineCore" in description
    return False


# Processes --------------------------------------------------------------------------------------


class EnvServer:
    """`python -m envs.agentgym.server` on a fixed port, its own process group; restartable."""

    def __init__(self, config: Path, port: int, log: Path, env: dict):
        self.config, self.port, self.log, self.env = config, port, log, env
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None
        self.polls: list[tuple[float, int | None, float]] = []  # (at s, running, seconds taken)
        self.frozen_at = ""  # when its watcher froze it this run (wall clock), if it did
        self.start()

    def start(self) -> None:
        import httpx

        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "envs.agentgym.server", "--config", str(self.config),
                 "--port", str(self.port)],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server on {self.port} exited: see {self.log}")
            try:
                httpx.get(self.url + "/", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise RuntimeError(f"server on {self.port} never answered")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # a stopped process dies too
            self.process.wait()

    def running_episodes(self, client=None, timeout_s: float = POLL_TIMEOUT_S) -> int | None:
        """Episodes on it past their first step and unfinished (`GET /flywheel`, `running`): what
        a server kill is worth waiting for; None when it did not answer in `timeout_s`. The run's
        log cannot tell: a stage's progress bar reaches it only when the stage ends."""
        import httpx

        try:
            get = client.get if client is not None else httpx.get
            answer = get(self.url + "/flywheel", timeout=timeout_s).json()
            return int(answer["running"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def freeze_when_running(self, flow: subprocess.Popen, frozen: threading.Event) -> None:
        """Freeze it the moment an episode on it has taken a step, polling every POLL_EVERY_S
        from a thread of its own: the episode's next step follows within one generation, so it
        is in flight when the kill comes. Not at an open session: no episode may have run on it
        yet (the server counts a session before its `/create` answer is sent, and an episode
        whose replies are all invalid never steps), so there is nothing to move: what two
        campaigns' server kills met, docs/chaos.md. An unanswered poll is unknown, not "none".
        Every poll's answer and time go into `self.polls`, summed up in the run's record."""
        import httpx

        # One kept-alive connection: a new connection and a 50 ms pause per poll missed every
        # sub-second episode of a run.
        client = httpx.Client(timeout=POLL_TIMEOUT_S)
        started, self.polls, self.frozen_at = time.monotonic(), [], ""  # this run's only
        while flow.poll() is None:
            asked = time.monotonic()
            running = self.running_episodes(client)
            self.polls.append((round(asked - started, 2), running, time.monotonic() - asked))
            if running:
                self.freeze()
                # wall clock, to set beside the run log's timestamps (its episodes' progress)
                self.frozen_at = (
                    f"{datetime.now(UTC):%H:%M:%S.%f}"[:-3] + f" UTC ({running} running)"
                )
                frozen.set()
                break
            time.sleep(POLL_EVERY_S)
        client.close()

    def poll_summary(self) -> str:
        """What the watcher saw this run: polls, unanswered ones, the slowest answer, and when
        the first running episode was seen (s from the run's start)."""
        if not self.polls:
            return ""
        unanswered = sum(running is None for _, running, _ in self.polls)
        slowest = max(seconds for _, _, seconds in self.polls)
        seen = next((at for at, running, _ in self.polls if running), None)
        return (
            f"{len(self.polls)} polls, {unanswered} unanswered, slowest {slowest:.2f} s, "
            f"running episodes first seen at {seen if seen is not None else '-'} s"
            + (f", frozen at {self.frozen_at}" if self.frozen_at else "")
            + f"; answers: {self.poll_changes()}"
        )

    def poll_changes(self, most: int = 12) -> str:
        """The answers' run-length story: `0 from 0.0 s, - from 51.2 s, 0 from 53.0 s, 2 from
        121.5 s` ('-': unanswered); only its first `most` changes."""
        changes = [(at, n) for k, (at, n, _) in enumerate(self.polls)
                   if k == 0 or n != self.polls[k - 1][1]]  # fmt: skip
        text = ", ".join(f"{'-' if n is None else n} from {at} s" for at, n in changes[:most])
        return text + (f", ... ({len(changes) - most} more)" if len(changes) > most else "")

    def freeze(self) -> None:
        """SIGSTOP: it still accepts connections but answers nothing, so every request sent to it
        from now on is in flight when it is killed (an episode's step takes milliseconds, and a
        kill timed from the log alone met none in two campaigns)."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, number: int) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, number)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Attempt:
    """One campaign run (one flow process)."""

    number: int
    plan: KillPlan | None
    killed: str = ""  # what was killed, or "" (the run ended first, or no plan)
    killed_at_s: float | None = None
    exit_code: int | None = None
    seconds: float = 0.0
    rounds_after: int = 0
    left_processes: list[str] = field(default_factory=list)
    left_temp: list[str] = field(default_factory=list)
    watchdog_lines: list[str] = field(default_factory=list)
    hung: bool = False  # still running at the run timeout: its process group was killed
    watcher: str = ""  # a server victim's watcher: its polls (EnvServer.poll_summary)


def watchdog_lines(attempts: list[Attempt]) -> tuple[int, int]:
    """'flywheel watchdog: stopped' lines after runs whose flow was SIGKILLed (stopping what such
    a flow left is the watchdog's job) and after all other runs (where the flow itself should
    have stopped everything it started)."""
    killed = sum(len(a.watchdog_lines) for a in attempts if flow_was_killed(a))
    return killed, sum(len(a.watchdog_lines) for a in attempts) - killed


def flow_was_killed(attempt: Attempt) -> bool:
    return attempt.plan is not None and attempt.plan.victim == "flow" and bool(attempt.killed)


class Campaign:
    """The campaign's folders and environment; runs until every round is published."""

    def __init__(self, work: Path, rounds: int, servers: list[EnvServer], config: Path,
                 run_timeout_s: float = RUN_TIMEOUT_S):  # fmt: skip
        self.work, self.rounds, self.servers, self.config = work, rounds, servers, config
        self.run_timeout_s = run_timeout_s
        self.store = work / "store"
        self.temp = work / "tmp"  # the flows' TMPDIR: what is left in it was left behind
        self.temp.mkdir(parents=True, exist_ok=True)
        self.marker = uuid.uuid4().hex
        self.env = {
            **os.environ, "TMPDIR": str(self.temp), "FLYWHEEL_CHAOS": self.marker,
            # a new one for a campaign continued: a killed run may hold the slot in the last
            "PREFECT_HOME": str(work / f"prefect-{len(list(work.glob('prefect-*'))) + 1}"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
            # Prefect's temporary server gets 20 s to start by default: on a loaded 2-core
            # machine (load 10) every run failed with "Timed out while attempting to connect".
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
        }  # fmt: skip
        self.attempts: list[Attempt] = []
        self.prefect_homes = len(list(work.glob("prefect-*"))) + 1

    def rounds_published(self) -> int:
        state = self.store / RUN_NAME / "campaign.json"
        return len(json.loads(state.read_text())["rounds"]) if state.exists() else 0

    def complete(self) -> bool:
        return self.rounds_published() > self.rounds

    def run_once(self, plan: KillPlan | None, log: Path) -> Attempt:
        import psutil

        attempt = Attempt(len(self.attempts) + 1, plan)
        started = time.monotonic()
        with open(log, "a") as out:
            out.write(
                f"\n===== attempt {attempt.number}: plan {plan}, "
                f"started {datetime.now(UTC):%H:%M:%S} UTC =====\n"
            )
            out.flush()
            flow = subprocess.Popen(
                self.flow_command(),
                cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        seen: dict[int, float] = {}
        appeared: float | None = None
        frozen = threading.Event()
        if plan and plan.victim == "server":
            watcher = threading.Thread(
                target=self.target_server().freeze_when_running, args=(flow, frozen), daemon=True
            )
            watcher.start()
        while flow.poll() is None:
            if time.monotonic() - started > self.run_timeout_s:
                # A hang is a finding, not a reason to stop the bench: recorded, then killed.
                attempt.hung = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(flow.pid, signal.SIGKILL)
                flow.wait()
                break
            try:
                children = psutil.Process(flow.pid).children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                with contextlib.suppress(psutil.Error):
                    seen.setdefault(child.pid, child.create_time())
            if plan and not attempt.killed:
                now = time.monotonic() - started
                if plan.victim in ("flow", "server"):
                    # a server is worth killing once frozen with episodes open on it
                    ready = plan.victim == "flow" or frozen.is_set()
                    if ready and appeared is None:
                        appeared = now
                    if appeared is not None and now - appeared >= plan.delay_s:
                        attempt.killed = self.kill(plan.victim, flow)
                        attempt.killed_at_s = round(now, 1)
                else:
                    victims = [c for c in children if is_victim(plan.victim, describe(c))]
                    if victims and appeared is None:
                        appeared = now
                    if victims and now - appeared >= plan.delay_s:
                        victim = victims[0]
                        attempt.killed = f"{plan.victim} pid {victim.pid}"
                        attempt.killed_at_s = round(now, 1)
                        victim.kill()
            time.sleep(0.2)
        for server in self.servers:
            server.thaw()  # frozen for a kill the run ended before
        if plan and plan.victim == "server":
            attempt.watcher = self.target_server().poll_summary()
        attempt.exit_code = flow.returncode
        attempt.seconds = round(time.monotonic() - started, 1)
        attempt.left_processes = self.left_behind(seen, flow.pid)
        attempt.left_temp = sorted(p.name for p in self.temp.glob("fw-*"))
        attempt.rounds_after = self.rounds_published()
        text = log.read_text()
        section = text[text.rfind(f"===== attempt {attempt.number}:") :]
        attempt.watchdog_lines = [
            line for line in section.splitlines() if "flywheel watchdog:" in line
        ]
        self.attempts.append(attempt)
        return attempt

    def target_server(self) -> EnvServer:
        """The server this run's server plan freezes and kills: each in turn."""
        return self.servers[len(self.attempts) % len(self.servers)]

    def flow_command(self) -> list[str]:
        """One campaign run: the next round of the tiny ETO campaign."""
        return [sys.executable, "-m", "flows.eto", "--campaign", "--config", str(self.config),
                f"storage_url={self.store}",
                f"mlflow_tracking_uri=sqlite:///{self.work / 'mlflow.db'}"]  # fmt: skip

    def kill(self, victim: str, flow: subprocess.Popen) -> str:
        if victim == "flow":
            os.killpg(flow.pid, signal.SIGKILL)
            # The campaign slot of a killed run is never given back by Prefect's temporary
            # server: its leases live in memory and die with it, while the slot stays taken in
            # its database (docs/chaos.md). The next run gets a Prefect database of its own.
            self.prefect_homes += 1
            self.env["PREFECT_HOME"] = str(self.work / f"prefect-{self.prefect_homes}")
            return f"flow pid {flow.pid} (process group)"
        server = self.target_server()
        server.kill()
        down = random.Random(len(self.attempts)).uniform(*SERVER_DOWN_S)
        time.sleep(down)
        server.start()
        return f"server :{server.port} (down {down:.1f} s)"

    def left_behind(self, seen: dict[int, float], flow_pid: int) -> list[str]:
        """Processes of this run still alive after LEFTOVER_WAIT_S: those seen in its tree, and
        those carrying its marker (started too briefly to be seen); the servers are ours."""
        import psutil

        ours = {s.process.pid for s in self.servers if s.process}
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while True:
            left = []
            for process in psutil.process_iter():
                try:
                    if process.pid in ours or process.pid == flow_pid:
                        continue
                    started = seen.get(process.pid)
                    if (started is not None and abs(process.create_time() - started) < 1) or (
                        process.environ().get("FLYWHEEL_CHAOS") == self.marker
                    ):
                        left.append(process)
                except psutil.Error:
                    pass
            left = [p for p in left if not is_zombie(p)]
            if not left or time.monotonic() > deadline:
                return [f"{p.pid} {describe(p)[:160]}" for p in left]
            time.sleep(1)


def is_zombie(process) -> bool:
    """A zombie is dead (its parent has not read its exit yet); one that is gone is too."""
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def run_campaign(campaign: Campaign, planner: KillPlanner | None, kills: int, log: Path,
                 max_attempts: int, after_each=lambda: None) -> None:  # fmt: skip
    """Runs until every round is published; while kills remain, each run gets a plan."""
    while not campaign.complete():
        if len(campaign.attempts) >= max_attempts:
            raise RuntimeError(f"not complete after {max_attempts} runs; see {log}")
        done = sum(1 for a in campaign.attempts if a.killed)
        plan = planner.next() if planner and done < kills else None
        attempt = campaign.run_once(plan, log)
        print(
            f"attempt {attempt.number}: plan {plan}, killed {attempt.killed or '-'} at "
            f"{attempt.killed_at_s}, exit {attempt.exit_code}{' (hung)' if attempt.hung else ''}, "
            f"{attempt.seconds} s, rounds "
            f"{attempt.rounds_after}, left {attempt.left_processes} {attempt.left_temp}"
            + (f", watcher: {attempt.watcher}" if attempt.watcher else ""),
            flush=True,
        )
        if plan and not attempt.killed and planner:
            planner.missed(plan)
        after_each()


# Main -------------------------------------------------------------------------------------------


def campaign_config(servers_yaml: str, rounds: int, model: str = "tiny") -> str:
    """The campaign's YAML: the tiny ETO campaign on the servers, with `model` as its base."""
    # A real model's reply (`Thought: ... Action: craft ...`) needs ~30 tokens; the tiny one's
    # are noise, cut short. A real model also gets the demo's worked example: with it the
    # untrained 135M model writes `Action:` lines, so round 0's untrained evaluation steps (and a
    # server kill can meet it). Trained policies are prompted without examples, and SFT on the
    # campaign's 4 trajectories does not teach the format (docs/chaos.md).
    tiny = model == "tiny"
    return CONFIG.format(run_name=RUN_NAME, servers=servers_yaml, rounds=rounds, model=model,
                         max_tokens=24 if tiny else 48, few_shot=0 if tiny else 1)  # fmt: skip


def free_ports(n: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def compared(differences: dict[str, list[str]] | None) -> str:
    if differences is None:
        return "not compared yet"
    timing, recovery, other = split_differences(differences)
    return f"{len(other)}, {len(timing)}, {len(recovery)}"


def episode_recoveries(store: Path) -> tuple[int, int]:
    """(episodes that moved server or were re-created, moves): the sums of the `retried` and
    `recoveries` counts of the store's manifests."""
    retried = recoveries = 0
    for manifest in store.rglob("_MANIFEST.json"):
        counts = json.loads(manifest.read_text()).get("counts", {})
        retried += counts.get("retried", 0)
        recoveries += counts.get("recoveries", 0)
    return retried, recoveries


def load_attempts(path: Path) -> list[Attempt]:
    attempts = []
    for saved in json.loads(path.read_text()):
        plan = saved.pop("plan")
        attempts.append(Attempt(plan=KillPlan(**plan) if plan else None, **saved))
    return attempts


def results_markdown(args, reference: list[Attempt], chaos: Campaign,
                     differences: dict[str, list[str]] | None, files: int, command: str,
                     recoveries: tuple[tuple[int, int], tuple[int, int]] | None = None) -> str:  # fmt: skip
    """The results file; `differences` None while the chaos campaign still runs."""
    kills = [a for a in chaos.attempts if a.killed]
    by_kind = {k: sum(1 for a in kills if a.plan.victim == k) for k in KINDS}
    survived = sum(1 for a in kills if a.exit_code == 0)
    left = [a for a in reference + chaos.attempts if a.left_processes or a.left_temp]
    lines = [
        "# Chaos campaign: kills and resumes of the tiny ETO campaign",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}  ",
        f"Date: {datetime.now(UTC).isoformat(timespec='seconds')}  ",
        f"Seed {args.seed}, rounds 0..{args.rounds}, 2 environment servers (`envs.agentgym.server`).",
        "",
        "| | undisturbed | chaos |",
        "|---|---|---|",
        f"| campaign runs (flow processes) | {len(reference)} | {len(chaos.attempts)} |",
        f"| wall time, s | {sum(a.seconds for a in reference):.0f} | "
        f"{sum(a.seconds for a in chaos.attempts):.0f} |",
        f"| kills | 0 | {len(kills)} ({', '.join(f'{k} {n}' for k, n in by_kind.items())}) |",
        f"| kills the run survived (exit 0) | - | {survived} |",
        f"| runs that failed and were resumed | - | "
        f"{sum(1 for a in chaos.attempts if a.exit_code != 0)} |",
        f"| runs that hung (killed at the run timeout) | "
        f"{sum(a.hung for a in reference)} | {sum(a.hung for a in chaos.attempts)} |",
        f"| runs leaving a process or `$TMPDIR/fw-*` | "
        f"{sum(1 for a in reference if a in left)} | "
        f"{sum(1 for a in chaos.attempts if a in left)} |",
        f"| 'flywheel watchdog: stopped' lines: after a flow SIGKILL (the watchdog's job), after "
        f"any other run (a leak) | -, {watchdog_lines(reference)[1]} | "
        f"{', '.join(map(str, watchdog_lines(chaos.attempts)))} |",
        f"| store files compared | {files} | {files} |",
        f"| episodes recovered (moved to another server or re-created), moves | "
        f"{', '.join(map(str, recoveries[0])) if recoveries else '-'} | "
        f"{', '.join(map(str, recoveries[1])) if recoveries else '-'} |",
        f"| files that differ: in anything else, in timing, in recovery records | - | "
        f"{compared(differences)} |",
        "",
        "Compared: every file of both stores; `_MANIFEST.json`, `_FAILED.json` and "
        "`campaign.json` as JSON without `published_at` and `flow_run_id` (wall-clock time, "
        "Prefect's id of the publishing flow run), every other file byte for byte.",
        "",
        "## Runs of the chaos campaign",
        "",
        "| run | victim | delay s | killed | at s | exit | s | rounds | left |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a in chaos.attempts:
        lines.append(
            f"| {a.number} | {a.plan.victim if a.plan else '-'} | "
            f"{a.plan.delay_s if a.plan else '-'} | {a.killed or '-'} | {a.killed_at_s or '-'} "
            f"| {a.exit_code} | {a.seconds} | {a.rounds_after} | "
            f"{'; '.join(a.left_processes + a.left_temp) or '-'} |"
        )
    watched = [a for a in chaos.attempts if a.watcher]
    if watched:
        lines += [
            "",
            "Server watchers (a server victim is frozen once an episode on it has taken "
            f"a step, `GET /flywheel` polled every {POLL_EVERY_S * 1000:.0f} ms; then killed "
            "after the delay):",
            "",
        ]
        lines += [f"- run {a.number}: {a.watcher}" for a in watched]
    lines += ["", "## Differences from the undisturbed store", ""]
    if differences is None:
        lines.append("Not compared yet: the chaos campaign is still running.")
        return "\n".join(lines) + "\n"
    timing, recovery, other = split_differences(differences)
    for title, found in (
        ("Other than timing and recovery records", other),
        ("In wall-clock timing only", timing),
        (
            "In recovery records (a manifest's counts of the episodes a server kill moved or "
            "re-created, RECOVERY_KEYS)",
            recovery,
        ),
    ):
        lines += [f"{title} ({len(found)} files):", ""]
        for name, problems in found.items():
            shown = problems[:6] + ([f"... {len(problems) - 6} more"] if len(problems) > 6 else [])
            lines.append(f"- `{name}`: {'; '.join(shown)}")
        lines += ["None."] if not found else []
        lines.append("")
    return "\n".join(lines)


def report(args, command: str) -> int:
    """--phase report: the results file again, from finished work folders (`--work` the chaos
    campaign's, `--reference-work` the undisturbed one's)."""
    chaos = Campaign.__new__(Campaign)
    chaos.attempts = load_attempts(args.work / "run" / "attempts.json")
    reference = load_attempts(args.reference_work / "reference" / "attempts.json")
    reference_store, chaos_store = (
        args.reference_work / "reference" / "store",
        args.work / "run" / "store",
    )
    differences = compare_stores(reference_store, chaos_store)
    recoveries = (episode_recoveries(reference_store), episode_recoveries(chaos_store))
    args.out.write_text(
        results_markdown(args, reference, chaos, differences, len(store_files(reference_store)),
                         command, recoveries)
    )  # fmt: skip
    print(args.out.read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=12, help="kills to plan (default 12)")
    parser.add_argument("--seed", type=int, default=0, help="the kill planner's seed")
    parser.add_argument("--rounds", type=int, default=3, help="ETO rounds after round 0")
    parser.add_argument(
        "--run-timeout-s",
        type=float,
        default=RUN_TIMEOUT_S,
        help="a run still going after this long counts as hung and is killed",
    )
    parser.add_argument(
        "--model", default="tiny",
        help="the campaign's base model: 'tiny' (random: its replies never act, so only round "
        "0's expert episodes run on a server for a server kill to meet) or a built-in or Hub "
        "model (smollm2-135m: slower, and after the campaign's one epoch on 4 expert "
        "trajectories its replies are still invalid: docs/chaos.md)",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, default=None, help="default: a new temp folder")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results-chaos.md")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--phase", choices=["both", "reference", "chaos", "report"], default="both",
        help="'reference' runs the undisturbed campaign alone (into WORK/reference); 'chaos' "
        "compares with --reference-work's. Both must see their work folder at the same path "
        "(paths are part of stage keys): run them side by side in private mount namespaces",
    )  # fmt: skip
    parser.add_argument("--reference-work", type=Path, help="with --phase chaos")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"victims to choose from (default: {KINDS})"
    )
    args = parser.parse_args(argv)
    command = "python -m bench.chaos " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.phase == "report":
        return report(args, command)
    work = args.work or Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    ports = free_ports(2)
    config = work / "config.yaml"
    servers_yaml = json.dumps([f"http://127.0.0.1:{p}" for p in ports])
    config.write_text(campaign_config(servers_yaml, args.rounds, args.model))
    server_env = {**os.environ, "TMPDIR": str(work)}
    servers = [EnvServer(config, p, work / f"server-{p}.log", server_env) for p in ports]
    reference_work = args.reference_work or work
    try:
        # Both campaigns in the same folder `run`, so that paths written into files are equal.
        if args.phase in ("both", "reference"):
            reference = Campaign(work / "run", args.rounds, servers, config, args.run_timeout_s)
            run_campaign(reference, None, 0, work / "reference.log", max_attempts=args.rounds + 3)
            (work / "run" / "attempts.json").write_text(
                json.dumps([asdict(a) for a in reference.attempts], indent=1)
            )
            (work / "run").rename(work / "reference")
            if args.phase == "reference":
                return 0
        chaos = Campaign(work / "run", args.rounds, servers, config, args.run_timeout_s)
        planner = KillPlanner(args.seed, kinds=args.kinds.split(","))

        reference_done = reference_work / "reference" / "attempts.json"

        saved = work / "run" / "attempts.json"
        if saved.exists():  # a chaos campaign stopped before: go on from where it was
            chaos.attempts = load_attempts(saved)

        def write_results(differences=None, files=0, recoveries=None):
            saved.write_text(json.dumps([asdict(a) for a in chaos.attempts], indent=1))
            done = json.loads(reference_done.read_text()) if reference_done.exists() else []
            args.out.write_text(
                results_markdown(args, [Attempt(**a) for a in done], chaos, differences, files,
                                 command, recoveries)
            )  # fmt: skip

        run_campaign(chaos, planner, args.kills, work / "chaos.log",
                     max_attempts=len(chaos.attempts) + args.rounds + 3 + 3 * args.kills,
                     after_each=write_results)  # fmt: skip
        while not reference_done.exists():  # the reference may run beside this one
            time.sleep(10)
        reference_store = reference_work / "reference" / "store"
        write_results(
            compare_stores(reference_store, chaos.store), len(store_files(reference_store)),
            (episode_recoveries(reference_store), episode_recoveries(chaos.store)),
        )  # fmt: skip
        print(args.out.read_text())
    finally:
        for server in servers:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
