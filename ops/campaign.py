"""Campaigns: a recipe run one round at a time, one round per flow run (a scheduled deployment).

The campaign's state is `<run>/campaign.json` in the artifact store: the rounds published so far.
A run takes the campaign's Prefect concurrency slot (a global limit of 1, named after the store
and run), reads the state, runs exactly one more round and publishes it, so two runs of one
campaign never overlap and a crashed run leaves the last published round as it was. The slot is
a lease: a run killed while holding it frees it when the lease runs out. Without a Prefect server
each run's temporary server keeps the lease in its memory, which dies with a killed run while the
slot stays taken in the database: the holder's record in the store (`SLOT_HOLDER`) lets the next
run free the slot of a holder that no longer runs (`release_dead_holder`).
"""

from __future__ import annotations

import hashlib
import re
from contextlib import contextmanager, suppress
from datetime import UTC, datetime

from pydantic import BaseModel

from flywheel.records import Campaign, CampaignRound
from flywheel.storage import ArtifactStore
from ops.run_lock import RunLock, process_alive, process_started
from ops.runner import preflight, run_tracked

STATE_FILE = "campaign.json"
SLOT_HOLDER = ".flywheel-campaign-slot.json"  # who holds the slot, while it is held
LEASE_S = 600  # renewed while the run lives; how long a killed run blocks the next one


def run_campaign(cfg, recipe: str, next_round, *extra):
    """Run `next_round(cfg, store, tracking, campaign, *extra) -> Campaign` once, under the
    campaign's slot, and publish what it returns. Nothing to do once rounds 0..`cfg.rounds`
    exist."""
    from prefect.states import Completed, State

    store = preflight(cfg)
    # The slot orders the campaign's runs; the run lock (taken second, always in this order, so
    # no deadlock) keeps out a plain run of the same run_name for the round.
    with campaign_slot(store, cfg.run_name), RunLock(store.root, cfg.run_name).hold(cfg.break_lock):
        campaign = load_campaign(store, cfg.run_name, recipe)
        if len(campaign.rounds) > cfg.rounds:
            message = (
                f"campaign {cfg.run_name!r}: rounds 0..{cfg.rounds} are published; nothing new "
                f"to do (raise `rounds` to continue it)"
            )
            print(message)
            return Completed(message=message)
        campaign = run_tracked(
            cfg, next_round, campaign, *extra, store=store, locked=True,
            attempted=f"round {len(campaign.rounds)}",
        )  # fmt: skip
        if isinstance(campaign, State):  # the round failed: nothing to publish
            return campaign
        save_campaign(store, cfg.run_name, campaign)
        latest = campaign.rounds[-1]
        message = f"campaign {cfg.run_name!r}: published round {latest.round}"
        print(message)
        return Completed(message=message, data=latest.model_dump(mode="json"))


def new_round(number: int, policy: str, evaluations, notes: list[str] = ()) -> CampaignRound:
    from prefect.runtime import flow_run

    return CampaignRound(
        round=number,
        policy=policy,
        evaluations=list(evaluations),
        notes=list(notes),
        flow_run_id=flow_run.get_id(),
        published_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def load_campaign(store: ArtifactStore, run_name: str, recipe: str) -> Campaign:
    url = store.url(run_name, STATE_FILE)
    if not store.exists(url):
        return Campaign(name=run_name, recipe=recipe)
    campaign = Campaign.model_validate_json(store.read_text(url))
    if campaign.recipe != recipe:
        raise ValueError(f"{url} belongs to a {campaign.recipe} campaign, not {recipe}")
    return campaign


def save_campaign(store: ArtifactStore, run_name: str, campaign: Campaign) -> None:
    """One object written whole (an S3 put, or a file replaced): readers see the old state or
    the new one."""
    url = store.url(run_name, STATE_FILE)
    store.write_text(url + ".tmp", campaign.model_dump_json(indent=2))
    store.fs.mv(store._path(url + ".tmp"), store._path(url))


def slot_name(store: ArtifactStore, run_name: str) -> str:
    """The campaign's concurrency limit: readable, and unique per store and run."""
    digest = hashlib.sha1(store.url(run_name).encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"flywheel-campaign-{run_name}-{digest}")


@contextmanager
def campaign_slot(store: ArtifactStore, run_name: str):
    """Hold the campaign's one slot (a Prefect global concurrency limit, created on first use);
    a second run waits here until the first has published."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    name = slot_name(store, run_name)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with suppress(ObjectAlreadyExists):  # another run of the campaign created it first
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1)
                )
        release_dead_holder(client, store, run_name, name)
    print(f"waiting for campaign slot {name!r}")
    with concurrency(name, occupy=1, strict=True, lease_duration=LEASE_S):
        holder = store.url(run_name, SLOT_HOLDER)
        store.write_text(holder, SlotHolder.of_this_process(name).model_dump_json())
        print(f"holding campaign slot {name!r}")
        try:
            yield
        finally:  # before the slot is given back: a record never names a free slot's holder
            with suppress(OSError):
                store.remove(holder)


class SlotHolder(BaseModel):
    """The process holding a campaign's slot (`SLOT_HOLDER` in the run's folder)."""

    slot: str
    host: str
    pid: int
    process_started: float  # a pid reused later is another process
    flow_run_id: str | None
    since: str

    @classmethod
    def of_this_process(cls, slot: str) -> SlotHolder:
        import os
        import socket

        from prefect.runtime import flow_run

        return cls(
            slot=slot, host=socket.gethostname(), pid=os.getpid(),
            process_started=process_started(os.getpid()), flow_run_id=flow_run.get_id(),
            since=datetime.now(UTC).isoformat(timespec="seconds"),
        )  # fmt: skip

    def is_dead(self) -> bool:
        """Certainly gone: a process of this host that no longer runs (another host's may be
        alive; its lease frees its slot on the server both use)."""
        import socket

        return self.host == socket.gethostname() and not process_alive(
            self.pid, self.process_started
        )


def release_dead_holder(client, store: ArtifactStore, run_name: str, name: str) -> None:
    """Free the slot of a holder that was killed (its record left, its process gone) when this
    run has no Prefect server: the lease died with the killed run's temporary server, and
    nothing else would ever give the slot back. With a server, its lease runs out instead."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.settings import get_current_settings

    url = store.url(run_name, SLOT_HOLDER)
    if get_current_settings().api.url or not store.exists(url):
        return
    holder = SlotHolder.model_validate_json(store.read_text(url))
    if holder.slot != name or not holder.is_dead():
        return
    taken = client.read_global_concurrency_limit_by_name(name).active_slots
    if taken:
        client.update_global_concurrency_limit(
            name, GlobalConcurrencyLimitUpdate(active_slots=taken - 1)
        )
        print(
            f"campaign slot {name!r}: released the slot held by pid {holder.pid} on "
            f"{holder.host} (flow run {holder.flow_run_id}, since {holder.since}), which no "
            "longer runs"
        )
    store.remove(url)
