"""`flywheel gc`: delete the results a run's stages parked for other keys.

A stage's folder holds the result of the key its run last asked for; results for other keys (an
earlier setting, a retried old flow run) are parked under `<store>/.variants/` and served again
when their key comes back (`flywheel.storage`, "Variants"). Nothing deletes them but this
command, and only what no current stage reads: a parked result whose content a stage in the run's
folder was computed from (a downstream stage not yet redone) stays.

    flywheel gc runs/eto-textcraft            # what would be deleted, and how much
    flywheel gc runs/eto-textcraft --yes      # delete it
"""

from __future__ import annotations

import argparse
import sys

from pydantic import BaseModel

from flywheel.records import Manifest
from flywheel.storage import MANIFEST, VARIANTS, ArtifactStore, manifest_digest, normalise_url
from ops.status import stage_folders


class ParkedResult(BaseModel):
    stage_url: str  # where the stage publishes
    key: str
    url: str  # the parked folder
    bytes: int
    published_at: str
    read_by: list[str] = []  # current stages computed from its content: kept


def readers(parked: Manifest, current: list[Manifest]) -> list[str]:
    """The current stages whose upstream digest matches the parked result's content."""
    return [
        m.url
        for m in current
        for url, digest in m.upstream.items()
        if url.startswith(parked.url.rstrip("/") + "/") or url == parked.url
        if manifest_digest(parked, url) == digest
    ]


def collect(store: ArtifactStore, run_url: str) -> list[ParkedResult]:
    """Every result parked for a stage under `run_url`, and who still reads it."""
    folder = store.variant_url(run_url.rstrip("/"))
    if folder is None:
        raise ValueError(f"{run_url} is not inside the store {store.root}")
    current = [m for m in stage_folders(store, run_url).values() if m is not None]
    parked = []
    for url in store.list_files(folder):
        if not url.endswith("/" + MANIFEST):
            continue
        variant = url.rsplit("/", 1)[0]
        manifest = store.read_manifest(variant)
        if manifest is None:
            continue
        parked.append(
            ParkedResult(
                stage_url=manifest.url, key=variant.rsplit("/", 1)[-1], url=variant,
                bytes=sum(d.size for d in manifest.checksums.values()),
                published_at=manifest.published_at, read_by=readers(manifest, current),
            )
        )  # fmt: skip
    return parked


def delete(store: ArtifactStore, result: ParkedResult) -> None:
    for url in store.list_files(result.url):
        if not url.endswith("/" + MANIFEST):
            store.remove(url)
    store.remove(f"{result.url}/{MANIFEST}")  # last: a cut-short delete is no servable result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flywheel gc",
        description="Delete the results a run's stages parked for other keys (settings switched, "
        "old flow runs retried). Without --yes, only lists them.",
    )
    parser.add_argument(
        "run", help="the run's folder (a path or URL: s3://bucket/runs/eto-textcraft)"
    )
    parser.add_argument("--store", help="the store's root (default: the run folder's parent)")
    parser.add_argument("--yes", action="store_true", help="delete, not only list")
    args = parser.parse_args(argv)
    run_url = normalise_url(args.run)
    store = ArtifactStore(args.store or run_url.rpartition("/")[0])
    try:
        parked = collect(store, run_url)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    doomed = [p for p in parked if not p.read_by]
    for p in parked:
        where = p.stage_url[len(run_url) + 1 :]
        if p.read_by:
            print(f"keeps          {where}  key {p.key[:12]}  (read by {', '.join(p.read_by)})")
        else:
            verb = "deletes" if args.yes else "would delete"
            print(f"{verb:<14} {where}  key {p.key[:12]}  {p.bytes / 2**20:,.1f} MiB, "
                  f"published {p.published_at}")  # fmt: skip
    if args.yes:
        for p in doomed:
            delete(store, p)
    total = sum(p.bytes for p in doomed) / 2**20
    action = "deleted" if args.yes else "would be deleted (--yes deletes)"
    print(f"{len(doomed)} parked results, {total:,.1f} MiB, {action}; {VARIANTS} of {run_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
