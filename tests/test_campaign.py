"""Campaign mechanics with a cheap round: state in the store, one round per run, runs of one
campaign never overlapping (Prefect's concurrency limit), nothing new → a clean end. The real ETO
round on a deployment is in test_deployments.py."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from prefect import flow
from prefect.client.orchestration import get_client

from flows.eto import ETOConfig
from flywheel.records import Campaign, CampaignRound, Manifest
from flywheel.storage import ArtifactStore
from ops.campaign import load_campaign, new_round, run_campaign, slot_name

spans: list[tuple[int, float, float]] = []


def slow_round(cfg, store, tracking, campaign: Campaign) -> Campaign:
    """A round that takes a second and publishes a policy named after it."""
    number = len(campaign.rounds)
    begin = time.monotonic()
    time.sleep(1.0)
    spans.append((number, begin, time.monotonic()))
    published = new_round(number, store.url(f"policy-{number}"), [], [f"round {number}"])
    return campaign.model_copy(update={"rounds": [*campaign.rounds, published]})


@flow(name="toy-campaign")
def toy_campaign(config: dict):
    return run_campaign(ETOConfig.model_validate(config), "toy", slow_round)


def test_runs_take_turns_and_each_publishes_one_round(tmp_path):
    config = {"run_name": "toy", "storage_url": str(tmp_path / "store"), "rounds": 2,
              "env": {"train_tasks": 2, "test_tasks": 1}}  # fmt: skip
    spans.clear()
    with get_client(sync_client=True) as client:
        client.hello()  # the ephemeral API server starts once, before two runs race to start it
    states = []
    threads = [
        threading.Thread(target=lambda: states.append(toy_campaign(config, return_state=True)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(s.is_completed() for s in states)
    (first, a0, a1), (second, b0, b1) = sorted(spans)
    assert (first, second) == (0, 1)
    assert b0 >= a1, "the two runs overlapped"
    campaign = load_campaign(ArtifactStore(config["storage_url"]), "toy", "toy")
    assert [r.round for r in campaign.rounds] == [0, 1]
    assert campaign.rounds[1].policy.endswith("/policy-1")

    third = toy_campaign(config, return_state=True)
    assert "published round 2" in third.message
    fourth = toy_campaign(config, return_state=True)
    assert fourth.is_completed() and "nothing new to do" in fourth.message
    assert len(spans) == 3  # the fourth ran no round


def test_a_campaign_of_another_recipe_is_refused(tmp_path):
    store = ArtifactStore(str(tmp_path))
    store.write_text(
        store.url("x", "campaign.json"), Campaign(name="x", recipe="eto").model_dump_json()
    )
    with pytest.raises(ValueError, match="belongs to a eto campaign"):
        load_campaign(store, "x", "agent-r")


def test_slot_names_differ_per_store_and_run(tmp_path):
    a, b = ArtifactStore(str(tmp_path / "a")), ArtifactStore(str(tmp_path / "b"))
    # "eto/x" and "eto-x" read the same once made a valid name: only the digest tells them apart.
    runs = ["eto/x", "eto-x", "eto/y"]
    names = [slot_name(store, run) for store in (a, b) for run in runs]
    assert len(set(names)) == 6, names
    # The same campaign on the same store always takes the same slot.
    assert slot_name(ArtifactStore(str(tmp_path / "a")), "eto/x") == names[0]
    assert names[0].startswith("flywheel-campaign-eto-x-") and "/" not in names[0]


class Recorder:
    """What `run_campaign` takes and in which order: the slot, the run lock, the round."""

    def __init__(self, monkeypatch, store):
        import ops.campaign as campaign_module

        self.events: list = []
        self.store = store
        events = self.events

        @contextmanager
        def slot(store_, run_name):
            events.append(("slot", store_.root, run_name))
            yield
            events.append(("slot freed",))

        class Lock:
            def __init__(self, root, run_name):
                events.append(("lock", root, run_name))

            @contextmanager
            def hold(self, break_lock):
                events.append(("hold", break_lock))
                yield
                events.append(("lock freed",))

        def tracked(cfg, next_round, campaign, *extra, store, locked, attempted):
            events.append(("tracked", store is self.store, locked, attempted, *extra))
            return next_round(cfg, store, "tracking", campaign, *extra)

        monkeypatch.setattr(campaign_module, "preflight", lambda cfg: store)
        monkeypatch.setattr(campaign_module, "campaign_slot", slot)
        monkeypatch.setattr(campaign_module, "RunLock", Lock)
        monkeypatch.setattr(campaign_module, "run_tracked", tracked)


def quick_round(cfg, store, tracking, campaign: Campaign) -> Campaign:
    number = len(campaign.rounds)
    published = CampaignRound(round=number, policy=f"policy-{number}", published_at="t")
    return campaign.model_copy(update={"rounds": [*campaign.rounds, published]})


def test_a_campaign_run_publishes_one_round_under_its_slot_and_lock(tmp_path, monkeypatch, capsys):
    store = ArtifactStore(str(tmp_path))
    recorder = Recorder(monkeypatch, store)
    cfg = SimpleNamespace(run_name="camp", rounds=1, break_lock=True)
    state = run_campaign(cfg, "eto", quick_round)
    assert state.is_completed() and state.message == "campaign 'camp': published round 0"
    assert state.data == {"round": 0, "policy": "policy-0", "evaluations": [], "notes": [],
                          "flow_run_id": None, "published_at": "t"}  # fmt: skip
    assert recorder.events == [
        ("slot", store.root, "camp"), ("lock", store.root, "camp"), ("hold", True),
        ("tracked", True, True, "round 0"), ("lock freed",), ("slot freed",),
    ]  # fmt: skip
    assert capsys.readouterr().out == "campaign 'camp': published round 0\n"
    saved = store.url("camp", "campaign.json")
    assert load_campaign(store, "camp", "eto") == Campaign(
        name="camp",
        recipe="eto",
        rounds=[CampaignRound(round=0, policy="policy-0", published_at="t")],
    )
    assert store.read_text(saved) == load_campaign(store, "camp", "eto").model_dump_json(indent=2)
    assert store.list_files(store.url("camp")) == [saved]  # no temporary file left

    second = run_campaign(cfg, "eto", quick_round)
    assert second.message == "campaign 'camp': published round 1"
    assert [r.round for r in load_campaign(store, "camp", "eto").rounds] == [0, 1]
    recorder.events.clear()
    capsys.readouterr()
    done = run_campaign(cfg, "eto", quick_round)  # rounds 0..1 exist
    message = (
        "campaign 'camp': rounds 0..1 are published; nothing new to do (raise `rounds` to "
        "continue it)"
    )
    assert done.is_completed() and done.message == message and done.data is None
    assert capsys.readouterr().out == message + "\n"
    assert not [event for event in recorder.events if event[0] == "tracked"]
    assert len(load_campaign(store, "camp", "eto").rounds) == 2


def test_a_round_is_published_as_json_and_the_recipe_gets_its_extra_arguments(
    tmp_path, monkeypatch
):
    store = ArtifactStore(str(tmp_path))
    recorder = Recorder(monkeypatch, store)
    evaluation = Manifest(stage="evaluate", url="s3://b/eval", metrics={"success_rate": 0.25})

    def evaluated_round(cfg, store, tracking, campaign, label):
        published = CampaignRound(
            round=0, policy="p", evaluations=[(label, evaluation)], published_at="t"
        )
        return campaign.model_copy(update={"rounds": [published]})

    cfg = SimpleNamespace(run_name="camp", rounds=0, break_lock=False)
    state = run_campaign(cfg, "eto", evaluated_round, "sft")
    assert ("tracked", True, True, "round 0", "sft") in recorder.events
    # Prefect keeps the state's data as JSON: pairs as lists, the manifest as a plain dict
    assert state.data["evaluations"] == [["sft", evaluation.model_dump(mode="json")]]
    assert json.loads(json.dumps(state.data)) == state.data


def test_a_new_round_records_the_flow_run_it_was_published_from(monkeypatch):
    monkeypatch.setattr("prefect.runtime.flow_run.get_id", lambda: "run-42")
    evaluation = ("sft", Manifest(stage="evaluate", url="u"))
    published = new_round(1, "p", iter([evaluation]))
    assert published.flow_run_id == "run-42" and published.evaluations == [evaluation]


def test_a_new_round_records_its_policy_evaluations_notes_and_time():
    before = datetime.now(UTC).replace(microsecond=0)
    published = new_round(3, "s3://b/policy", iter([]), ("a", "b"))
    assert (published.round, published.policy, published.evaluations, published.notes) == (
        3, "s3://b/policy", [], ["a", "b"]
    )  # fmt: skip
    assert published.flow_run_id is None  # outside a flow run
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", published.published_at)
    after = datetime.now(UTC)
    assert before <= datetime.fromisoformat(published.published_at) <= after
    assert new_round(0, "p", []).notes == []


def test_a_campaign_not_started_is_empty_and_the_slot_name_is_the_run_and_a_digest(tmp_path):
    store = ArtifactStore(str(tmp_path))
    assert load_campaign(store, "new", "agent-r") == Campaign(name="new", recipe="agent-r")
    digest = hashlib.sha1(f"file://{tmp_path}/eto/x y".encode()).hexdigest()[:8]
    assert slot_name(store, "eto/x y") == f"flywheel-campaign-eto-x-y-{digest}"
    assert slot_name(store, "ETO-Run").startswith("flywheel-campaign-ETO-Run-")
    assert slot_name(store, "a.b_c-d") == (
        "flywheel-campaign-a.b_c-d-" + hashlib.sha1(store.url("a.b_c-d").encode()).hexdigest()[:8]
    )
