"""The artifact store: every stage reads and writes URLs through fsspec (`file://`, `s3://`, ...).

A stage writes its files under its own prefix and its `_MANIFEST.json` last: a prefix without a
manifest is an unfinished stage, whatever else it holds, and is redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import TypeVar

import fsspec
from pydantic import BaseModel

from flywheel.records import Manifest

MANIFEST = "_MANIFEST.json"
FAILED = "_FAILED.json"  # why the stage's last attempt failed; see flywheel.stage
STORE_ID = ".flywheel-store-id"
Record = TypeVar("Record", bound=BaseModel)


def normalise_url(url: str) -> str:
    """Plain paths become absolute file:// URLs, so every process agrees on them."""
    if "://" not in url:
        return "file://" + str(Path(url).expanduser().resolve())
    return url.rstrip("/")


def inputs_digest(inputs: dict) -> str:
    """A stable digest of a stage's inputs (records and settings included)."""

    def encode(value):
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        raise TypeError(f"cannot digest {type(value).__name__}")

    text = json.dumps(inputs, sort_keys=True, default=encode)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_root() -> Path:
    """Where this machine keeps what it can rebuild (models, local copies, gold paths):
    `$FLYWHEEL_CACHE`, default ~/.cache/flywheel."""
    return Path(os.environ.get("FLYWHEEL_CACHE", "~/.cache/flywheel")).expanduser()


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
        with self.fs.open(self._path(url), "r") as f:
            return f.read()

    def write_records(self, url: str, records: list[BaseModel]) -> str:
        return self.write_text(url, "".join(r.model_dump_json() + "\n" for r in records))

    def read_records(self, url: str, model: type[Record]) -> list[Record]:
        return [
            model.model_validate_json(line) for line in self.read_text(url).splitlines() if line
        ]

    def write_json(self, url: str, data) -> str:
        return self.write_text(url, json.dumps(data, indent=2))

    def read_json(self, url: str):
        return json.loads(self.read_text(url))

    def identity(self, folder: str = "") -> str:
        """A random id written once into `folder` of the store (its root by default). Stage cache
        keys include the id of the run folder they write to, so a deleted run folder or store
        (`rm -rf runs/my-run`) never serves cached results whose files are gone."""
        url = self.url(folder, STORE_ID) if folder else self.url(STORE_ID)
        if not self.exists(url):
            self.write_text(url, uuid.uuid4().hex)
        return self.read_text(url).strip()

    def top_folder(self, url: str) -> str:
        """The first folder of `url` below the store's root ("" when `url` is not inside it)."""
        if not url.startswith(self.root + "/"):
            return ""
        return url[len(self.root) + 1 :].split("/", 1)[0]

    # Stages -------------------------------------------------------------------------------

    def manifest(self, stage_url: str, inputs: dict | None = None) -> Manifest | None:
        """The finished stage's manifest, or None if the stage has not finished.

        With `inputs`, a manifest published for other inputs (a changed setting, a new model) is
        removed and None returned, so the stage is redone rather than silently reused.
        """
        url = f"{stage_url}/{MANIFEST}"
        if not self.exists(url):
            return None
        found = Manifest.model_validate_json(self.read_text(url))
        if inputs is not None and found.inputs_digest != inputs_digest(inputs):
            self.fs.rm(self._path(url))
            return None
        return found

    def publish(self, manifest: Manifest, inputs: dict | None = None) -> Manifest:
        """Mark a stage finished: called after every file of the stage is written."""
        if inputs is not None:
            manifest = manifest.model_copy(update={"inputs_digest": inputs_digest(inputs)})
        self.write_text(f"{manifest.url}/{MANIFEST}", manifest.model_dump_json(indent=2))
        if self.exists(failed := f"{manifest.url}/{FAILED}"):
            self.fs.rm(self._path(failed))  # an earlier attempt's failure is history now
        return manifest

    def list_files(self, url: str) -> list[str]:
        """URLs of every file under `url` (none when it does not exist)."""
        if not self.exists(url):
            return []
        return sorted(self.fs.unstrip_protocol(p) for p in self.fs.find(self._path(url)))

    # Directories (model checkpoints) --------------------------------------------------------

    def upload_dir(self, local_dir: Path, url: str) -> str:
        local_dir = Path(local_dir)
        for file in sorted(local_dir.rglob("*")):
            if file.is_file():
                target = self._path(f"{url}/{file.relative_to(local_dir).as_posix()}")
                self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                self.fs.put_file(str(file), target)
        return url

    def local_dir(self, url: str) -> Path:
        """A local folder holding `url`'s files: the folder itself on file://, else a cached copy."""
        if url.startswith("file://"):
            return Path(self._path(url))
        digest = hashlib.sha1(url.encode()).hexdigest()[:16]
        target = self.cache_dir / "downloads" / digest
        done = target / ".complete"
        if not done.exists():
            self.fs.get(self._path(url).rstrip("/") + "/", str(target) + "/", recursive=True)
            done.touch()
        return target

    def local_file(self, url: str) -> Path:
        if url.startswith("file://"):
            return Path(self._path(url))
        digest = hashlib.sha1(url.encode()).hexdigest()[:16]
        target = self.cache_dir / "downloads" / f"{digest}-{url.rsplit('/', 1)[-1]}"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(self._path(url), str(target) + ".part")
            os.replace(str(target) + ".part", target)
        return target
