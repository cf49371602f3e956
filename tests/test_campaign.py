"""Campaign mechanics with a cheap round: state in the store, one round per run, runs of one
campaign never overlapping (Prefect's concurrency limit), nothing new → a clean end. The real ETO
round on a deployment is in test_deployments.py."""

from __future__ import annotations

import threading
import time

import pytest
from prefect import flow
from prefect.client.orchestration import get_client

from flywheel.records import Campaign
from flywheel.settings import ETOConfig
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
