"""A stage's code version covers the code that stage runs (its import closure in the project and
the trainers it launches), and nothing a comment or docstring changes (flywheel/code_version.py).

The flow-level promises are checked at the key level: each real stage's code version computed on
a copy of the project, before and after an edit of the copy."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from flywheel import code_version as cv
from flywheel.code_version import StageCode, closure, stage_code

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("flywheel", "envs", "training", "agents", "tasks", "configs/accelerate")


def declared_stages(project: Path) -> dict[str, tuple[str, ...]]:
    """Stage name -> the modules its closure starts at, read from each `@stage(...)` in tasks/
    (as the decorator computes them: the body's module, then `launches`)."""
    stages = {}
    for path in sorted((project / "tasks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "id", "") == "stage":
                    launches = next((k.value for k in deco.keywords if k.arg == "launches"), None)
                    extra = ast.literal_eval(launches) if launches is not None else ()
                    stages[deco.args[0].value] = (f"tasks.{path.stem}", *extra)
    return stages


@pytest.fixture
def project(tmp_path):
    """A copy of the project's stage code, and a function: each stage's code version there."""
    for folder in COPIED:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__py*"))
    stages = declared_stages(tmp_path)

    def versions() -> dict[str, str]:
        return {name: stage_code(roots, tmp_path).version for name, roots in stages.items()}

    return tmp_path, versions


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_the_stages_are_read_as_the_decorator_reads_them():
    from tasks.sft import sft_stage

    stages = declared_stages(ROOT)
    assert stages["sft"] == sft_stage.code_roots == ("tasks.sft", "training.sft")
    assert stages["dpo"] == ("tasks.dpo", "training.dpo")
    assert stages["rl"] == ("tasks.rl", "training.rl")
    assert {"prepare-model", "expert-trajectories", "explore-shard", "evaluate"} <= set(stages)


def test_comments_docstrings_and_layout_keep_every_stage_cached(project):
    root, versions = project
    before = versions()
    for path in root.rglob("*.py"):
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text), clean=False)
        if doc:  # the module's docstring edited, not removed
            text = text.replace(doc, doc + " (edited)", 1)
        path.write_text(commented(text))
        ast.parse(path.read_text())
    # Docstrings of a function and of a class.
    edit(root / "training" / "launch.py", '"""Run the trainer', '"""Edited. Run the trainer')
    edit(root / "flywheel" / "records.py", '"""One episode:', '"""Edited. One episode:')
    # A setting's docstring (its --help text) is no code either.
    edit(root / "flywheel" / "settings.py", '"""DPO\'s beta', '"""Edited. DPO\'s beta')
    assert versions() == before


def commented(text: str) -> str:
    """`text` with a comment and a blank line after every logical line (the same syntax tree)."""
    import io
    import tokenize

    ends = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type == tokenize.NEWLINE}  # fmt: skip
    lines = text.splitlines()
    return "\n".join(f"{line}  # note\n" if n in ends else line for n, line in
                     enumerate(lines, 1)) + "\n"  # fmt: skip


def test_an_edit_to_the_report_keeps_sft_exploration_and_dpo_cached(project):
    root, versions = project
    before = versions()
    with open(root / "tasks" / "report.py", "a") as f:
        f.write("\nROWS_SHOWN = 10  # a real change\n")
    after = versions()
    assert after == before  # no stage runs tasks/report.py (a plain task, uncached)
    assert {"sft", "explore-shard", "dpo"} <= set(after)


def test_an_edit_to_the_sft_trainer_re_runs_sft_and_nothing_upstream(project):
    root, versions = project
    before = versions()
    with open(root / "training" / "sft.py", "a") as f:
        f.write("\nDEFAULT_WARMUP = 0.1\n")
    after = versions()
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"sft"}
    # Upstream of SFT: the base model and the expert's trajectories keep their keys. Downstream
    # (explore, DPO, evaluate) keep their code versions and re-run because what they read, the
    # SFT model, changes content (their keys hold it: test_downstream_keys_follow_...).
    assert before["prepare-model"] == after["prepare-model"]
    assert before["expert-trajectories"] == after["expert-trajectories"]


def test_downstream_keys_follow_the_content_of_what_a_re_run_stage_wrote(tmp_path):
    from flywheel.records import Manifest
    from flywheel.storage import ArtifactStore

    store = ArtifactStore(str(tmp_path))
    sft, explore = store.url("run", "sft"), store.url("run", "round-1", "explore")
    explore_code = StageCode({"tasks.explore": "e1"}, {})
    store.write_text(f"{sft}/model/w.bin", "weights of the old trainer")
    store.publish(Manifest(stage="sft", url=sft), {"n": 1}, StageCode({"training.sft": "a"}, {}))
    inputs = {"model_url": f"{sft}/model", "seed": 0}
    store.publish(Manifest(stage="explore", url=explore), inputs, explore_code)
    assert store.manifest(explore, inputs, explore_code) is not None
    store.write_text(f"{sft}/model/w.bin", "weights of the edited trainer")  # SFT re-ran
    store.publish(Manifest(stage="sft", url=sft), {"n": 1}, StageCode({"training.sft": "b"}, {}))
    assert store.manifest(explore, inputs, explore_code) is None


def test_a_launched_trainer_is_covered_by_its_entry_modules_closure(project):
    root, versions = project
    # The stage's module does not import the trainer: only `launches` brings it in.
    assert "training.sft" not in closure(("tasks.sft",), root)
    assert {"training.sft", "training.job", "training.datasets"} <= set(
        closure(("tasks.sft", "training.sft"), root)
    )
    before = versions()
    edit(root / "training" / "dpo.py", "from __future__ import annotations", "import os\n")
    assert {n for n, v in versions().items() if before[n] != v} == {"dpo"}
    # A module only the trainers import, and their accelerate configs, re-run every trainer.
    edit(root / "training" / "job.py", "from __future__ import annotations", "import os\n")
    assert {n for n, v in versions().items() if before[n] != v} == {"sft", "dpo", "rl"}
    edit(root / "training" / "job.py", "import os\n", "from __future__ import annotations")
    with open(root / "configs" / "accelerate" / "ddp.yaml", "a") as f:
        f.write("num_machines: 2\n")
    assert {n for n, v in versions().items() if before[n] != v} == {"sft", "dpo", "rl"}


def test_every_trainer_a_stage_starts_is_declared():
    """A stage module that passes `"training.x"` to `trained_model` declares it in `launches`."""
    stages = declared_stages(ROOT)
    for path in (ROOT / "tasks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "trained_model":
                entry = node.args[1].value
                declared = [roots for roots in stages.values() if roots[0] == f"tasks.{path.stem}"]
                assert any(entry in roots for roots in declared), (path.name, entry)


def test_a_launched_module_must_exist():
    from flywheel.stage import stage

    with pytest.raises(ValueError, match="training.sftt"):
        stage("sft", launches=("training.sftt",))


def test_the_closure_follows_every_kind_of_import(tmp_path):
    files = {
        "tasks/__init__.py": "",
        "tasks/a.py": "from . import b\nfrom tasks.c import name\n"
        "def f():\n    import agents.lazy\n",
        "tasks/b.py": "from .sub import d\n",
        "tasks/c.py": "name = 1\n",
        "tasks/sub/__init__.py": "",
        "tasks/sub/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    import flywheel.typing_only\nelse:\n    import flywheel.runtime\n",
        "tasks/unused.py": "",
        "agents/lazy.py": "import numpy\n",  # no agents/__init__.py: a namespace package
        "flywheel/__init__.py": "",
        "flywheel/typing_only.py": "",
        "flywheel/runtime.py": "",
        "envs/sandbox.py": "",  # runs envs/sandbox_child.py by its file (MODULE_RUNS)
        "envs/sandbox_child.py": "",
        "tasks/tool.py": "import envs.sandbox\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert closure(("tasks.a",), tmp_path) == [
        "agents.lazy", "flywheel", "flywheel.runtime", "tasks", "tasks.a", "tasks.b",
        "tasks.c", "tasks.sub", "tasks.sub.d",
    ]  # fmt: skip
    assert closure(("tasks.tool",), tmp_path) == [
        "envs.sandbox",
        "envs.sandbox_child",
        "tasks",
        "tasks.tool",
    ]
    assert closure(("tests.test_x",), tmp_path) == []  # outside the project: not followed


def test_library_versions_and_data_files_are_part_of_the_version(project, monkeypatch):
    root, versions = project
    before = versions()
    code = stage_code(("tasks.sft", "training.sft"), root)
    assert "configs/accelerate/ddp.yaml" in code.modules and "trl" in code.libraries
    assert "configs/accelerate/ddp.yaml" not in stage_code(("tasks.explore",), root).modules
    monkeypatch.setattr(cv, "library_version", lambda name: "0.0.0")
    assert all(before[n] != v for n, v in versions().items())


def test_keying_a_stage_again_reads_its_files_but_parses_only_what_changed(tmp_path, monkeypatch):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "a.py").write_text("x = 1\n")
    before = stage_code(("tasks.a",), tmp_path)
    (tmp_path / "tasks" / "a.py").write_text("x = 2\n")  # same size, maybe the same mtime
    assert stage_code(("tasks.a",), tmp_path).modules != before.modules
    roots = ("tasks.sft", "training.sft")
    first = stage_code(roots)
    parsed = []
    real_parse = cv.ast.parse
    monkeypatch.setattr(cv.ast, "parse", lambda *a, **k: parsed.append(1) or real_parse(*a, **k))
    for _ in range(3):
        assert stage_code(roots) == first
    assert parsed == []  # unchanged files are read again, not parsed again (no timing: noisy)


def test_a_stages_key_follows_the_trainer_it_launches_and_only_its_code(project, monkeypatch):
    """Through the `@stage` decorator (its `launches`) to the key the store publishes under: the
    SFT stage never imports training/sft.py, which it runs as a process of its own."""
    import flywheel.stage
    from flywheel.settings import SFTSettings
    from flywheel.stage import StageOutput, planning
    from flywheel.storage import ArtifactStore
    from tasks.sft import SFTInputs, sft_stage

    root, _ = project
    monkeypatch.setattr(flywheel.stage, "stage_code", lambda roots: stage_code(roots, root))
    store = ArtifactStore(str(root / "store"))
    out = StageOutput(store_url=store.root, url=store.url("run", "sft"))
    inputs = SFTInputs(model_url="m", data_url="d", settings=SFTSettings(), seed=0)

    def key() -> str:
        keys = []
        with planning(lambda name, keyed, code, out: keys.append(store.stage_key(keyed, code)[0])):
            sft_stage.fn(inputs, out)
        return keys[0]

    before = key()
    trainer = root / "training" / "sft.py"
    doc = ast.get_docstring(ast.parse(trainer.read_text()), clean=False)
    edit(trainer, doc, doc + " (edited)")
    trainer.write_text(commented(trainer.read_text()))
    assert key() == before  # a docstring and comments
    with open(root / "training" / "dpo.py", "a") as f:
        f.write("\nDEFAULT_WARMUP = 0.1\n")
    assert key() == before  # another stage's trainer
    with open(trainer, "a") as f:
        f.write("\nDEFAULT_WARMUP = 0.1\n")
    assert key() != before
