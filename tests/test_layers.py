"""The packages are layers, and imports only run downward (docs/architecture.md).

Every import in the source counts, a lazy one inside a function too: a lower layer that imports
an upper one, or two modules that import each other, fail here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. A package may import its own modules and those of any lower layer; packages on
# one layer (envs, training) import neither each other nor anything above.
LAYERS = [
    ["flywheel"],  # core: records, settings, storage, tracking, the stage decorator
    ["envs", "training"],  # environments; trainer entry points
    ["agents"],  # acting in environments: rollouts, tree search, trajectory formats
    ["tasks"],  # stages
    ["ops"],  # how recipes run: driver, runner, campaigns, locks, services, cli
    ["flows"],  # recipes
    # Benchmarks and measurements; examples of what users write (an environment plugin): each
    # may import any package below, and nothing imports them.
    ["bench", "examples"],
    # Experiments: scripts that reproduce one claim of docs/ (experiments/README.md); they may
    # reuse a bench's measuring code, and nothing imports them.
    ["experiments"],
]
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def imported_modules(source: str) -> list[tuple[str, int]]:
    """(module, line) for every absolute import in `source`, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_sources() -> dict[str, str]:
    """Module name -> source, for every module of every layer."""
    return {
        module_name(path): path.read_text()
        for package in RANK
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def upward_imports(sources: dict[str, str]) -> list[str]:
    problems = []
    for module, source in sources.items():
        package = module.split(".")[0]
        for imported, line in imported_modules(source):
            target = imported.split(".")[0]
            if target in RANK and target != package and RANK[target] >= RANK[package]:
                problems.append(f"{module}:{line} imports {imported}")
    return problems


def import_cycles(sources: dict[str, str]) -> list[list[str]]:
    """Cycles among the modules' imports (a module importing a package counts as importing
    its `__init__`)."""
    graph = {
        module: {imported for imported, _ in imported_modules(source) if imported in sources}
        for module, source in sources.items()
    }
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_layer_imports_a_layer_above_it():
    assert upward_imports(project_sources()) == []


def test_no_two_modules_import_each_other():
    assert import_cycles(project_sources()) == []


def test_every_package_is_on_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == set(RANK)


@pytest.mark.parametrize(
    "sources, expected",
    [
        ({"flywheel.storage": "def f():\n    from ops.runner import run_tracked\n"}, 1),
        ({"envs.textcraft": "import training.launch\n"}, 1),  # one layer, two packages
        ({"flows.eto": "from tasks.sft import sft_stage\nimport flywheel.stage\n"}, 0),
        ({"ops.cli": "def f():\n    from bench.sizing import H100\n"}, 1),  # nothing imports bench
        ({"bench.gpu_checklist": "import bench.sizing\nfrom flows.eto import ETO\n"}, 0),
        ({"examples.counter_env": "from envs.base import Environment\n"}, 0),
        ({"envs.registry": "def f():\n    import examples.counter_env\n"}, 1),
    ],
)
def test_the_check_sees_upward_and_sideways_imports(sources, expected):
    assert len(upward_imports(sources)) == expected


def private_imports(sources: dict[str, str]) -> list[str]:
    """`from a.b import _name` where a.b is another project module: a reach into its
    insides, which it may change without telling anyone."""
    problems = []
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] not in RANK or node.module == module:
                continue
            private = [a.name for a in node.names if a.name.startswith("_")]
            problems += [f"{module}:{node.lineno} imports {node.module}.{n}" for n in private]
    return problems


def test_no_module_imports_another_modules_private_names():
    assert private_imports(project_sources()) == []


def test_the_check_sees_a_private_import():
    sources = {"envs.a": "def f():\n    from envs.b import _pool, pool\n"}
    assert private_imports(sources) == ["envs.a:2 imports envs.b._pool"]


def test_the_check_sees_a_cycle():
    sources = {"envs.a": "from envs.b import x\n", "envs.b": "def f():\n    import envs.a\n"}
    assert import_cycles(sources) == [["envs.a", "envs.b", "envs.a"]]


def test_the_code_version_sees_every_package_and_no_stage_runs_ops_or_flows():
    """A stage's code version is its import closure among the project's packages
    (`flywheel/code_version.py`): it knows every package, and no stage's closure reaches ops/ or
    flows/, so a change there re-runs nothing."""
    from flywheel.code_version import PROJECT_PACKAGES, closure

    # bench/, examples/ and experiments/ are no stage's code: nothing below them may import
    # them, so no closure reaches them.
    assert set(PROJECT_PACKAGES) == set(RANK) - {"bench", "examples", "experiments"}
    stage_modules = tuple(f"tasks.{p.stem}" for p in (ROOT / "tasks").glob("*.py"))
    reached = {m.split(".")[0] for m in closure(stage_modules)}
    assert reached <= {p for p, rank in RANK.items() if rank < RANK["ops"]}
