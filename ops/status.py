"""`flywheel status`: what a run would do now, before it is started. For each stage: `cached` (a
run serves it from the store), `would re-run` and why (the settings, upstream artifacts, modules
or libraries that changed), or `never run`. Read-only: nothing in the store is written or
removed, nothing is trained or sampled.

    flywheel status eto --config configs/eto_textcraft.yaml dpo.beta=0.2   # a plan: exact
    flywheel status runs/eto-textcraft                                     # a folder: no settings

Given a recipe and its config, status plans the run: it calls the recipe's rounds as a run does,
but each stage is answered by `Planner` from its manifest (the stage's own key, computed as the
run would: settings, upstream content, code) instead of running, so every setting is compared
exactly as the run keys it. A stage that never finished stops the plan: what follows it reads
its output. Given only a run folder (no config), status reads every manifest under it and
compares what needs no config: the upstream artifacts' content and the stage's modules and
libraries; settings are not compared.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Literal

from pydantic import BaseModel, Field

from flywheel.code_version import StageCode, entry_digest, library_version
from flywheel.records import FailedStage, Manifest
from flywheel.stage import StageOutput, planning
from flywheel.storage import FAILED, MANIFEST, ArtifactStore, key_of

State = Literal["cached", "would re-run", "never run", "not planned"]


class StageStatus(BaseModel):
    url: str  # the stage's folder
    stage: str
    state: State
    reasons: list[str] = Field(default_factory=list)


class ReadOnlyStore(ArtifactStore):
    """The store as status sees it: it reads and never writes. An unreadable manifest is left
    where it is (a run would remove it and redo the stage; status says so)."""

    def remove(self, url: str) -> None:
        pass

    def write_text(self, url: str, text: str) -> str:
        raise PermissionError(f"flywheel status does not write to the store ({url})")

    def write_bytes(self, url: str, data: bytes) -> str:
        raise PermissionError(f"flywheel status does not write to the store ({url})")

    def upload_dir(self, local_dir, url: str) -> str:
        raise PermissionError(f"flywheel status does not write to the store ({url})")

    def move(self, source: str, target: str) -> None:
        raise PermissionError(f"flywheel status does not write to the store ({source})")

    # A stage a run would serve from its kept result reads, for the plan, as if moved back:
    # what reads it downstream is keyed on that result's content, as the run would key it.
    served_from_variants: dict[str, Manifest]

    def read_manifest(self, stage_url: str) -> Manifest | None:
        kept = getattr(self, "served_from_variants", {}).get(stage_url.rstrip("/"))
        return kept if kept is not None else super().read_manifest(stage_url)


class NotFinished(Exception):
    """The plan reached a stage with no manifest: what follows reads its output."""


# What changed -------------------------------------------------------------------------------


def short(value) -> str:
    if isinstance(value, list) and len(value) > 3:
        return f"{len(value)} items"
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def setting_changes(recorded: dict, now: dict, path: str = "") -> list[str]:
    """`setting a.b: 1 → 2` for each leaf where two keyed inputs (as JSON) differ."""
    changes = []
    for key in sorted(set(recorded) | set(now)):
        where = f"{path}{key}"
        old, new = recorded.get(key, "(unset)"), now.get(key, "(unset)")
        if isinstance(old, dict) and isinstance(new, dict):
            changes += setting_changes(old, new, where + ".")
        elif old != new:
            changes.append(f"setting {where}: {short(old)} → {short(new)}")
    return changes


def code_changes(found: Manifest, modules: dict[str, str], libraries: dict[str, str]) -> list[str]:
    """The modules, data files and libraries whose digest or version differs from the
    manifest's."""
    if not (found.code or found.libraries):  # (a stage outside the project has no modules)
        return ["code: recorded before per-stage code versions (one digest of every module)"]
    changes = []
    for name in sorted(set(found.code) | set(modules)):
        old, new = found.code.get(name), modules.get(name)
        if old == new:
            continue
        if old is None:
            changes.append(f"module {name}: newly imported")
        elif new is None or new == "absent":
            changes.append(f"module {name}: no longer imported")
        else:
            changes.append(f"module {name} changed")
    for name in sorted(set(found.libraries) | set(libraries)):
        old, new = found.libraries.get(name, "absent"), libraries.get(name, "absent")
        if old != new:
            changes.append(f"library {name}: {old} → {new}")
    return changes


def upstream_changes(found: Manifest, now: dict[str, str], remade: dict[str, str]) -> list[str]:
    """The artifacts read whose content differs from what the stage read, and those whose stage
    re-runs first (`remade`: URL -> the folder of the stage that re-makes it)."""
    changes = []
    for url in sorted(set(found.upstream) | set(now)):
        if url in remade:  # re-runs unless that stage writes the same bytes again
            changes.append(f"upstream {url}: the stage at {remade[url]} re-runs first")
        elif url not in found.upstream:
            changes.append(f"upstream {url}: newly read")
        elif url not in now:
            changes.append(f"upstream {url}: no longer read")
        elif found.upstream[url] != now[url]:
            changes.append(f"upstream {url} changed (content {found.upstream[url]} → {now[url]})")
    return changes


def last_failure(store: ArtifactStore, url: str) -> FailedStage | None:
    """The stage's last failure (`_FAILED.json`), when one is recorded."""
    record = f"{url}/{FAILED}"
    if not store.exists(record):
        return None
    return FailedStage.model_validate_json(store.read_text(record))


def failure_note(store: ArtifactStore, url: str) -> list[str]:
    """The first line of the stage's last failure, when one is recorded."""
    if (failed := last_failure(store, url)) is None:
        return []
    return [f"last attempt failed at {failed.failed_at}: {failed.message.splitlines()[0][:200]}"]


def stage_name(store: ArtifactStore, url: str, found: Manifest | None) -> str:
    """The stage's name from its manifest, else from its failure record ("?" without either)."""
    if found is not None:
        return found.stage
    failed = last_failure(store, url)
    return failed.stage if failed else "?"


# A plan: the recipe's rounds, each stage answered from its manifest ---------------------------


class Planner:
    """Answers each stage of a planned run with its manifest, recording its status."""

    def __init__(self, store: ArtifactStore):
        self.store = store
        self.statuses: dict[str, StageStatus] = {}

    def __call__(self, name: str, keyed: dict, code: StageCode, out: StageOutput) -> Manifest:
        found = self.store.read_manifest(out.url)
        resolved, upstream = self.store.resolve_inputs(keyed)
        remade = remade_upstream(upstream, self.statuses)
        wanted = key_of(resolved, upstream, code)
        stale = found is None or found.inputs_digest != wanted
        if stale and not remade and (kept := self.store.variants(out.url).get(wanted)):
            return self.served_from_variant(name, out.url, kept)
        if found is None:
            self.statuses[out.url] = StageStatus(
                url=out.url, stage=name, state="never run",
                reasons=failure_note(self.store, out.url),
            )  # fmt: skip
            raise NotFinished(out.url)
        reasons = upstream_changes(found, upstream, remade)
        if found.key_inputs:
            reasons = setting_changes(found.key_inputs, resolved) + reasons
        reasons += code_changes(found, code.modules, code.libraries)
        if wanted == found.inputs_digest and not remade:
            state, reasons = "cached", []
        else:
            state = "would re-run"
            reasons = reasons or ["its key differs (a manifest that recorded no settings)"]
        self.statuses[out.url] = StageStatus(url=out.url, stage=name, state=state, reasons=reasons)
        return found

    def served_from_variant(self, name: str, url: str, kept: Manifest) -> Manifest:
        """A stage whose result for this key is parked: the run moves it back and serves it."""
        if isinstance(self.store, ReadOnlyStore):
            self.store.served_from_variants = {
                **getattr(self.store, "served_from_variants", {}),
                url.rstrip("/"): kept,
            }
        when = kept.published_at or "date unknown"
        note = f"served from its kept result (published {when}, key {kept.inputs_digest[:12]})"
        self.statuses[url] = StageStatus(url=url, stage=name, state="cached", reasons=[note])
        return kept


def remade_upstream(upstream, statuses: dict[str, StageStatus]) -> dict[str, str]:
    """Upstream URLs inside the folder of a stage that re-runs: URL -> that folder."""
    rerun = [s.url for s in statuses.values() if s.state != "cached"]
    return {
        url: folder
        for url in upstream
        for folder in rerun
        if url == folder or url.startswith(folder + "/")
    }


def plan(recipe_class, cfg, store: ArtifactStore) -> list[StageStatus]:
    """The status of every stage a run of `cfg` would reach (all rounds, as `flywheel
    <recipe>` runs them), then of the other stage folders under the run's."""
    from ops.driver import RoundState, evaluated

    planner = Planner(store)
    with planning(planner):
        try:
            recipe = recipe_class(cfg, store, None)
            start = evaluated(recipe, 0, recipe.start())
            policy = start.policy
            for round_no in range(1, cfg.rounds + 1):
                state = RoundState(
                    round=round_no, policy=policy, start_policy=start.policy, carry=start.carry
                )
                result = evaluated(recipe, round_no, recipe.round(state))
                if result.policy is None:
                    break
                policy = result.policy
        except NotFinished as stopped:  # what follows reads its output: not planned further
            planner.statuses[str(stopped)].reasons.append(
                "a run starts here; the stages after it read its output (not planned further)"
            )
    statuses = list(planner.statuses.values())
    for url, manifest in stage_folders(store, store.url(cfg.run_name)).items():
        if url not in planner.statuses:
            why = "a run of this config does not reach it (other settings or rounds, or after "
            why += "a stage that never finished)"
            statuses.append(
                StageStatus(
                    url=url, stage=stage_name(store, url, manifest), state="not planned",
                    reasons=[why] + failure_note(store, url),
                )
            )  # fmt: skip
    return statuses


# A folder: every manifest under it, compared without a config ---------------------------------


def stage_folders(store: ArtifactStore, run_url: str) -> dict[str, Manifest | None]:
    """Every stage folder under `run_url`: finished (its manifest) or failed (None)."""
    folders: dict[str, Manifest | None] = {}
    for url in store.list_files(run_url):
        folder, _, name = url.rpartition("/")
        if name == MANIFEST:
            folders[folder] = store.read_manifest(folder)
        elif name == FAILED:
            folders.setdefault(folder, None)
    return dict(sorted(folders.items()))


def folder_status(store: ArtifactStore, run_url: str) -> list[StageStatus]:
    """Each stage folder under `run_url` (and the stages outside it they read, the base model),
    upstream first: its upstream content and code now against its manifest. Settings are not
    compared (there is no config to compare them with)."""
    statuses: dict[str, StageStatus] = {}

    def status_of(url: str, found: Manifest | None) -> StageStatus:
        if url in statuses:
            return statuses[url]
        if found is None:
            statuses[url] = StageStatus(
                url=url, stage=stage_name(store, url, None), state="never run",
                reasons=failure_note(store, url),
            )  # fmt: skip
            return statuses[url]
        for upstream_url in found.upstream:  # upstream stages first: a re-run there shows here
            owner = store.covering_manifest(upstream_url)
            if owner is not None and owner.url != url:
                status_of(owner.url, owner)
        now = {u: store.content_digest(u) for u in found.upstream}
        modules = {name: entry_digest(name) for name in found.code}
        libraries = {name: library_version(name) for name in found.libraries}
        reasons = upstream_changes(found, now, remade_upstream(now, statuses))
        reasons += code_changes(found, modules, libraries)
        state = "would re-run" if reasons else "cached"
        statuses[url] = StageStatus(url=url, stage=found.stage, state=state, reasons=reasons)
        return statuses[url]

    for url, found in stage_folders(store, run_url).items():
        status_of(url, found)
    return list(statuses.values())  # upstream first, with those outside the run's folder


# The command ------------------------------------------------------------------------------


def recipe_class_of(command: str):
    """The Recipe subclass that the flow of recipe command `command` defines."""
    from ops.cli import recipe_commands
    from ops.driver import Recipe

    module = importlib.import_module(recipe_commands()[command][0])
    return next(
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, Recipe)
        and value.__module__ == module.__name__
    )  # fmt: skip


def render(statuses: list[StageStatus], run_url: str) -> str:
    """One line per stage (folders inside the run's relative to it), its reasons below it."""
    lines = [f"run {run_url}"]
    for s in statuses:
        where = s.url[len(run_url) + 1 :] if s.url.startswith(run_url + "/") else s.url
        lines.append(f"{s.state:<13} {s.stage:<20} {where}")
        lines += [f"{'':<14}- {reason.replace(run_url + '/', '')}" for reason in s.reasons]
    counts = {state: sum(s.state == state for s in statuses) for state in State.__args__}
    lines.append(", ".join(f"{n} {state}" for state, n in counts.items() if n) or "no stages")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from flywheel.config_files import ConfigError, load_config
    from ops.cli import recipe_commands

    parser = argparse.ArgumentParser(
        prog="flywheel status",
        description="For each stage of a run: cached, would re-run (and why) or never run. "
        "Reads the store, writes nothing.",
        epilog="A recipe and its config (as given to `flywheel RECIPE`) compare every setting; "
        "a run folder alone (a path or URL: s3://bucket/runs/eto-textcraft) compares the "
        "upstream artifacts and code, not the settings.",
    )
    parser.add_argument("target", help=f"a recipe ({', '.join(recipe_commands())}) or a run URL")
    parser.add_argument("--config", help="the recipe's YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="settings to override")
    parser.add_argument("--json", action="store_true", help="one JSON object per stage")
    args = parser.parse_intermixed_args(argv)  # `eto --config FILE a=1`: overrides after it
    try:
        if args.target in recipe_commands():
            recipe_class = recipe_class_of(args.target)
            cfg = load_config(recipe_class.config_class, args.config, args.overrides)
            store = ReadOnlyStore(cfg.storage_url)
            run_url = store.url(cfg.run_name)
            statuses = plan(recipe_class, cfg, store)
        else:
            if args.config or args.overrides:
                parser.error(f"{args.target!r} is no recipe; --config needs one")
            parent, _, name = args.target.rstrip("/").rpartition("/")
            store = ReadOnlyStore(parent or ".")
            run_url = store.url(name)
            statuses = folder_status(store, run_url)
    except (ConfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print("\n".join(s.model_dump_json() for s in statuses))
    else:
        print(render(statuses, run_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
