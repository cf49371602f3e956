"""The artifact store: every stage reads and writes URLs through fsspec (`file://`, `s3://`, ...).

A stage writes its files under its own prefix and its `_MANIFEST.json` last: a prefix without a
manifest is an unfinished stage, whatever else it holds, and is redone.

A manifest is also the stage's cache entry. It records the size and sha256 of every file the stage
published and the key it was computed for: the stage's settings, the content digests of the
artifacts it read (never only their URLs: a redone stage keeps its URL) and the version of the
code the stage runs (`flywheel.code_version`: its import closure's syntax trees and the library
versions). A manifest for another key, or whose files no longer match, is removed and the stage
redone. Reads verify what they read against the manifest that covers it, and local
copies of remote artifacts are keyed on that content, so nothing stale or damaged is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import fsspec
from pydantic import BaseModel, ValidationError

from flywheel.code_version import StageCode
from flywheel.records import FileDigest, Manifest

MANIFEST = "_MANIFEST.json"
FAILED = "_FAILED.json"  # why the stage's last attempt failed; see flywheel.stage
BOOKKEEPING = (MANIFEST, FAILED)  # files of a stage folder that are not its output
VARIANTS = ".variants"  # results of a stage's other keys, parked by key (ArtifactStore.park)
CHUNK = 1 << 20
Record = TypeVar("Record", bound=BaseModel)


class CorruptArtifact(RuntimeError):
    """A stored file does not match the manifest of the stage that wrote it."""


def normalise_url(url: str) -> str:
    """Plain paths become absolute file:// URLs, so every process agrees on them."""
    if "://" not in url:
        return "file://" + str(Path(url).expanduser().resolve())
    return url.rstrip("/")


def cache_root() -> Path:
    """Where this machine keeps what it can rebuild (models, local copies, gold paths):
    `$FLYWHEEL_CACHE`, default ~/.cache/flywheel."""
    return Path(os.environ.get("FLYWHEEL_CACHE", "~/.cache/flywheel")).expanduser()


def digest_of_entries(entries: dict[str, str]) -> str:
    """One digest for named file contents (name -> sha256)."""
    text = json.dumps(sorted(entries.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_LOCAL_HASHES: dict[tuple, FileDigest] = {}  # (path, size, mtime_ns, inode) -> digest


def hash_local_file(path: str) -> FileDigest:
    """sha256 of a local file, remembered for this process while its size and mtime hold."""
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _LOCAL_HASHES:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
        _LOCAL_HASHES[key] = FileDigest(size=stat.st_size, sha256=digest.hexdigest())
    return _LOCAL_HASHES[key]


class ArtifactStore:
    def __init__(self, root_url: str, cache_dir: str | None = None):
        self.root = normalise_url(root_url)
        self.fs, self._root_path = fsspec.core.url_to_fs(self.root)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else cache_root()

    def check_writable(self) -> None:
        """Fail early, naming the URL, when the store cannot be written."""
        probe = self.url(".flywheel-write-check")
        try:
            self.fs.makedirs(self._path(self.root), exist_ok=True)
            with self.fs.open(self._path(probe), "w") as f:
                f.write("ok")
            self.fs.rm(self._path(probe))
        except Exception as error:
            raise OSError(f"storage_url {self.root!r} is not writable: {error}") from error

    def url(self, *parts: str) -> str:
        return "/".join([self.root, *(p.strip("/") for p in parts)])

    def _path(self, url: str) -> str:
        return fsspec.core.url_to_fs(url)[1]

    @property
    def is_local(self) -> bool:
        return self.root.startswith("file://")

    def exists(self, url: str) -> bool:
        return self.fs.exists(self._path(url))

    def remove(self, url: str) -> None:
        if self.exists(url):
            self.fs.rm(self._path(url))

    def clear_stage_folder(self, url: str, keep: tuple[str, ...] = ()) -> list[str]:
        """Remove what an earlier attempt left in a stage's folder, so a redone stage publishes
        only what it writes now. Entries named in `keep` stay (a trainer's keyed checkpoints,
        which it resumes from), and so does any folder below holding a published stage."""
        url = url.rstrip("/")
        removed = [f for f in self.own_files(url) if f[len(url) + 1 :].split("/", 1)[0] not in keep]
        for f in removed:
            self.remove(f)
        return removed

    def write_text(self, url: str, text: str) -> str:
        self.fs.makedirs(self._path(url).rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(self._path(url), "w") as f:
            f.write(text)
        return url

    def write_bytes(self, url: str, data: bytes) -> str:
        self.fs.makedirs(self._path(url).rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(self._path(url), "wb") as f:
            f.write(data)
        return url

    def read_text(self, url: str) -> str:
        """A file's text, checked against its stage's manifest when one covers it."""
        with open(self.local_file(url)) as f:
            return f.read()

    def write_records(self, url: str, records: list[BaseModel]) -> str:
        return self.write_text(url, "".join(r.model_dump_json() + "\n" for r in records))

    def read_records(self, url: str, model: type[Record]) -> list[Record]:
        records = []
        for number, line in enumerate(self.read_text(url).splitlines(), 1):
            if not line:
                continue
            try:
                records.append(model.model_validate_json(line))
            except ValidationError as error:
                raise CorruptArtifact(
                    f"{url}, line {number}: not a {model.__name__} record "
                    f"({error.error_count()} errors; first: {error.errors()[0]['msg']})"
                ) from None
        return records

    def write_json(self, url: str, data) -> str:
        return self.write_text(url, json.dumps(data, indent=2))

    def read_json(self, url: str):
        return json.loads(self.read_text(url))

    def top_folder(self, url: str) -> str:
        """The first folder of `url` below the store's root ("" when `url` is not inside it)."""
        if not url.startswith(self.root + "/"):
            return ""
        return url[len(self.root) + 1 :].split("/", 1)[0]

    def list_files(self, url: str) -> list[str]:
        """URLs of every file under `url`, or `url` itself when it is a file (none when absent).
        A folder's URL may end in "/"; the files' URLs never hold "//"."""
        url = url.rstrip("/")
        if not self.exists(url):
            return []
        fs, path = fsspec.core.url_to_fs(url)
        # Named as `url` names them: fsspec's own spelling of a protocol can differ.
        return sorted(url if p == path else f"{url}/{p[len(path) + 1 :]}" for p in fs.find(path))

    # Stages: manifests are the cache -------------------------------------------------------

    def stage_key(self, inputs: dict, code: StageCode | None = None) -> tuple[str, dict[str, str]]:
        """The key a stage's result is cached under, and the content digest of every artifact
        URL among `inputs` (its upstream). Settings enter as their JSON, the stage's code as its
        version (`flywheel.code_version`; None: a caller outside a stage keys on inputs only)."""
        resolved, upstream = self.resolve_inputs(inputs)
        return key_of(resolved, upstream, code), upstream

    def resolve_inputs(self, inputs: dict) -> tuple[dict, dict[str, str]]:
        """`inputs` as JSON, and the content digest of every artifact URL among them."""
        upstream: dict[str, str] = {}

        def resolve(value):
            if isinstance(value, BaseModel):
                return resolve(value.model_dump(mode="json"))
            if isinstance(value, dict):
                return {str(k): resolve(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [resolve(v) for v in value]
            if isinstance(value, str) and self.is_artifact_url(value):
                upstream[value] = self.content_digest(value)
            return value

        return resolve(inputs), upstream

    def is_artifact_url(self, value: str) -> bool:
        return value.startswith((self.root + "/", "file://"))

    def manifest(
        self, stage_url: str, inputs: dict | None = None, code: StageCode | None = None
    ) -> Manifest | None:
        """The finished stage's manifest, or None if the stage has to be (re)done.

        With `inputs` (and the stage's `code`), a result published for another key (a changed
        setting, input or code) is parked under its key (`park`), never removed, and the result
        kept for this key, if one is parked, is moved back and served (`restore`). One whose
        files no longer match its manifest is redone (the message names the file)."""
        found = self.read_manifest(stage_url)
        if inputs is None:
            return found
        wanted = self.stage_key(inputs, code)[0]
        if found is not None and found.inputs_digest != wanted:
            self.park(found)
            found = None
        if found is None and (found := self.restore(stage_url, wanted)) is None:
            return None
        if problems := self.check_files(found):
            print(f"stage {found.stage} ({stage_url}) is redone: " + "; ".join(problems))
            self.remove(f"{stage_url}/{MANIFEST}")
            return None
        found._served_from_store = True
        return found

    # Variants: a stage's results for other keys, parked under the key ----------------------
    #
    # A stage's folder holds the result of the key the run last asked for, where downstream
    # manifests and trajectories name its files. A result for another key is moved to
    # `<store>/.variants/<stage path>/<key>/` with its manifest, and moved back when its key is
    # asked for again: a retried old flow run, a setting switched back, or a sweep under one run
    # name never removes what another key published. Moves go files first and manifest last,
    # so a move cut short is finished by the next one. Only `flywheel gc` deletes variants.

    def variant_url(self, stage_url: str, key: str = "") -> str | None:
        """Where the stage at `stage_url` parks its result for `key` (its variants' folder
        without one); None for a stage outside the store's root."""
        if not stage_url.startswith(self.root + "/"):
            return None
        folder = f"{self.root}/{VARIANTS}/{stage_url[len(self.root) + 1 :].rstrip('/')}"
        return f"{folder}/{key}" if key else folder

    def park(self, manifest: Manifest) -> str | None:
        """Move a published stage's own files (not those of stages nested in its folder) and
        then its manifest to its variant folder; returns that folder's URL."""
        target = self.variant_url(manifest.url, manifest.inputs_digest)
        if target is None:  # outside the store: as before, the stale result is redone
            self.remove(f"{manifest.url}/{MANIFEST}")
            return None
        for url in self.own_files(manifest.url):
            if not url.endswith("/" + MANIFEST):
                self.move(url, target + url[len(manifest.url) :])
        self.move(f"{manifest.url}/{MANIFEST}", f"{target}/{MANIFEST}")
        print(f"stage {manifest.stage} ({manifest.url}): its result for key "
              f"{manifest.inputs_digest[:12]} is kept at {target}")  # fmt: skip
        return target

    def restore(self, stage_url: str, key: str) -> Manifest | None:
        """The result parked for `key`, moved back into the stage's folder (None if none is).
        What an unfinished attempt left there goes first, but its keyed checkpoints, and files
        a restore cut short already moved back."""
        source = self.variant_url(stage_url, key)
        if source is None or (parked := self.read_manifest(source)) is None:
            return None
        stage_url = stage_url.rstrip("/")
        restoring = {parked.absolute(name) for name in parked.checksums}
        for url in self.own_files(stage_url):
            part = url[len(stage_url) + 1 :].split("/", 1)[0]
            if part not in ("checkpoint", FAILED) and url not in restoring:
                self.remove(url)
        for url in self.list_files(source):
            if not url.endswith("/" + MANIFEST):
                self.move(url, stage_url + url[len(source) :])
        self.move(f"{source}/{MANIFEST}", f"{stage_url}/{MANIFEST}")
        print(f"stage {parked.stage} ({stage_url}): served from its kept result for key {key[:12]}")
        return self.read_manifest(stage_url)

    def variants(self, stage_url: str) -> dict[str, Manifest]:
        """Key -> manifest of every result parked for the stage at `stage_url`."""
        folder = self.variant_url(stage_url)
        if folder is None or not self.exists(folder):
            return {}
        keys = {self._path(p).rsplit("/", 1)[-1] for p in self.fs.ls(self._path(folder))}
        found = {k: self.read_manifest(f"{folder}/{k}") for k in sorted(keys)}
        return {k: m for k, m in found.items() if m is not None}

    def own_files(self, stage_url: str) -> list[str]:
        """Files under a stage's folder, but those of stages published in folders below it."""
        url = stage_url.rstrip("/")
        files = self.list_files(url)
        nested = {f.rsplit("/", 1)[0] for f in files if f.endswith("/" + MANIFEST)} - {url}
        return [f for f in files if not any(f.startswith(folder + "/") for folder in nested)]

    def move(self, source: str, target: str) -> None:
        """Move one file (a rename on a local disk; copy, then delete, on object stores)."""
        self.fs.makedirs(self._path(target).rsplit("/", 1)[0], exist_ok=True)
        self.fs.mv(self._path(source), self._path(target))

    def read_manifest(self, stage_url: str) -> Manifest | None:
        """The manifest at `stage_url`, unchecked; an unreadable one counts as absent."""
        url = f"{stage_url}/{MANIFEST}"
        if not self.exists(url):
            return None
        try:
            with self.fs.open(self._path(url)) as f:
                return Manifest.model_validate_json(f.read())
        except (ValidationError, ValueError) as error:
            print(f"{url} is unreadable ({str(error).splitlines()[0]}); the stage is redone")
            self.remove(url)
            return None

    def publish(
        self, manifest: Manifest, inputs: dict | None = None, code: StageCode | None = None
    ) -> Manifest:
        """Mark a stage finished: called after every file of the stage is written. Records the
        key it was computed for and what it was computed from (settings, what it read, each
        module of its code), and the size and sha256 of each of its files."""
        update: dict = {
            "checksums": self.file_digests(manifest),
            "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if code is not None:
            update |= {"code_version": code.version, "code": code.modules}
            update["libraries"] = code.libraries
        if inputs is not None:
            resolved, upstream = self.resolve_inputs(inputs)
            update["inputs_digest"] = key_of(resolved, upstream, code)
            update |= {"upstream": upstream, "key_inputs": resolved}
        manifest = manifest.model_copy(update=update)
        self.write_text(f"{manifest.url}/{MANIFEST}", manifest.model_dump_json(indent=2))
        self.remove(f"{manifest.url}/{FAILED}")  # an earlier attempt's failure is history now
        return manifest

    def file_digests(self, manifest: Manifest) -> dict[str, FileDigest]:
        """Size and sha256 of every file under the stage's folder, and of files it names
        outside it (a model folder used in place). Keys are relative to the stage's folder."""
        urls = set(self.list_files(manifest.url))
        for named in manifest.files.values():
            if not named.startswith(manifest.url + "/"):
                urls.update(self.list_files(named))
        return {
            manifest.relative(u): self.hash_file(u)
            for u in sorted(urls)
            if u.rsplit("/", 1)[-1] not in BOOKKEEPING
        }

    def hash_file(self, url: str, expected: FileDigest | None = None) -> FileDigest:
        """Size and sha256 of a file; a remote one is copied here on the way (`_blob`, which
        trusts a copy already here for `expected`), so the stage that reads it next finds it."""
        if url.startswith("file://"):
            return hash_local_file(self._path(url))
        return self._blob(url, expected)[1]

    def check_files(self, manifest: Manifest, under: str | None = None) -> list[str]:
        """What no longer matches the manifest: files missing, resized or changed (only those
        under the URL `under`, when given). Remote files are checked as they are copied here."""
        problems = []
        for name, expected in manifest.checksums.items():
            url = manifest.absolute(name)
            if under and not (url == under or url.startswith(under + "/")):
                continue
            try:
                found = self.hash_file(url, expected)
            except FileNotFoundError:
                problems.append(f"{url} is missing")
                continue
            if found.size != expected.size:
                problems.append(f"{url} has {found.size} bytes, its manifest says {expected.size}")
            elif found.sha256 != expected.sha256:
                problems.append(
                    f"{url} has changed (sha256 {found.sha256[:12]}, manifest {expected.sha256[:12]})"
                )
        return problems

    def covering_manifest(self, url: str) -> Manifest | None:
        """The manifest of the stage whose folder holds `url` (None for unmanaged URLs)."""
        if not url.startswith(self.root + "/"):
            return None
        folder = url
        while len(folder) > len(self.root):
            found = self.read_manifest(folder)
            if found is not None:
                return found
            folder = folder.rsplit("/", 1)[0]
        return None

    def content_digest(self, url: str) -> str:
        """A digest of what `url` (a file or folder) holds: from its stage's manifest when one
        covers it, else by reading it."""
        owner = self.covering_manifest(url)
        if owner is not None and (digest := manifest_digest(owner, url)) is not None:
            return digest
        files = self.list_files(url)
        if not files:
            return "absent"
        return digest_of_entries({u[len(url) :]: self.hash_file(u).sha256 for u in files})

    def verified(self, url: str) -> Manifest | None:
        """The manifest of the stage that wrote `url` (None for unmanaged URLs). Raises
        `CorruptArtifact` when `url` does not match it; that manifest is removed, so the next run
        redoes the stage."""
        owner = self.covering_manifest(url)
        if owner is None:
            return None
        if problems := self.check_files(owner, under=url):
            self.remove(f"{owner.url}/{MANIFEST}")
            raise CorruptArtifact(
                f"{'; '.join(problems)}: written by stage {owner.stage!r} ({owner.url}), whose "
                "manifest is now removed; run again to redo that stage"
            )
        return owner

    # Local copies ------------------------------------------------------------------------

    def write_dir(self, url: str) -> Path:
        """The local folder a stage writes `url` into (local stores only)."""
        assert self.is_local, "write_dir is for file:// stores"
        return Path(self._path(url))

    def upload_dir(self, local_dir: Path, url: str) -> str:
        local_dir = Path(local_dir)
        for file in sorted(local_dir.rglob("*")):
            if file.is_file():
                target = self._path(f"{url}/{file.relative_to(local_dir).as_posix()}")
                self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                self.fs.put_file(str(file), target)
        return url

    def local_dir(self, url: str) -> Path:
        """A local folder holding `url`'s files, checked against their manifest: the folder
        itself on file://, else a copy keyed on the files' content."""
        owner = self.verified(url)
        if url.startswith("file://"):
            return Path(self._path(url))
        expected = owner.checksums if owner else {}
        blobs = {}
        for u in self.list_files(url):
            blobs[u[len(url) + 1 :]] = self._blob(
                u, expected.get(owner.relative(u)) if owner else None
            )
        tree = digest_of_entries({name: digest.sha256 for name, (_, digest) in blobs.items()})
        target = self.cache_dir / "downloads" / f"tree-{tree}"
        if not (target / ".complete").exists():
            for name, (blob, _) in blobs.items():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                link_or_copy(blob, target / name)
            (target / ".complete").touch()
        return target

    def local_file(self, url: str) -> Path:
        """A local path holding `url`, checked against its manifest (a content-keyed copy for
        remote stores)."""
        owner = self.verified(url)
        if url.startswith("file://"):
            return Path(self._path(url))
        expected = owner.checksums.get(owner.relative(url)) if owner else None
        return self._blob(url, expected)[0]

    def _blob(self, url: str, expected: FileDigest | None = None) -> tuple[Path, FileDigest]:
        """A local copy of the remote file `url`, stored under its sha256. With `expected`, a
        copy already here is used without downloading."""
        blobs = self.cache_dir / "downloads" / "blobs"
        name = url.rsplit("/", 1)[-1]
        if expected is not None:
            known = blobs / expected.sha256 / name
            if known.exists() and known.stat().st_size == expected.size:
                return known, expected
        blobs.mkdir(parents=True, exist_ok=True)
        part = blobs / f".{uuid.uuid4().hex}.part"
        try:
            self.fs.get_file(self._path(url), str(part))
            digest = hash_local_file(str(part))
            target = blobs / digest.sha256 / name
            target.parent.mkdir(exist_ok=True)
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)
        return target, digest


def manifest_digest(owner: Manifest, url: str) -> str | None:
    """The content digest of `url` (a file or folder of `owner`'s stage) from `owner`'s
    checksums, as `ArtifactStore.content_digest` computes it; None where no file matches."""
    entries = {}
    for name, digest in owner.checksums.items():
        full = owner.absolute(name)
        if full == url or full.startswith(url + "/"):
            entries[full[len(url) :]] = digest.sha256
    return digest_of_entries(entries) if entries else None


def key_of(resolved: dict, upstream: dict[str, str], code: StageCode | None) -> str:
    """A stage's cache key from its inputs as JSON, their content and its code."""
    text = json.dumps([resolved, upstream, code.version if code else ""], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def link_or_copy(source: Path, target: Path) -> None:
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
