"""bench/train_repeat.py: the weight comparison, torch's warnings as parsed, and the modes' hook."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from bench.train_repeat import MODE_ENV, SITECUSTOMIZE, WARNING, compare, with_setting
from flywheel.settings import SFTSettings
from training.job import TrainingJob


def saved(folder, tensors):
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_compare_counts_differing_tensors_and_the_largest_difference(tmp_path):
    a = {"w": torch.zeros(3), "b": torch.ones(2)}
    first = saved(tmp_path / "a", a)
    assert compare(first, saved(tmp_path / "same", dict(a))) == {
        "tensors": 2, "differing": 0, "max_abs_diff": 0.0,
    }  # fmt: skip
    changed = {"w": torch.tensor([0.0, 0.25, 0.0]), "b": torch.ones(2)}
    assert compare(first, saved(tmp_path / "changed", changed)) == {
        "tensors": 2, "differing": 1, "max_abs_diff": 0.25,
    }  # fmt: skip


def test_compare_refuses_a_folder_without_weights(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no \\*.safetensors"):
        compare(tmp_path / "empty", tmp_path / "empty")


def test_both_of_torchs_wordings_name_the_op():
    log = (
        "graph.py:869: UserWarning: Flash Attention defaults to a non-deterministic algorithm. To\n"
        "x.py:3: UserWarning: index_add_cuda_ does not have a deterministic implementation, but\n"
        "y.py:1: UserWarning: something else entirely\n"
    )  # the first as an H200 printed it (torch 2.11), the second torch's other form
    assert WARNING.findall(log) == ["Flash Attention", "index_add_cuda_"]


@pytest.mark.parametrize(
    "mode, expected",
    [("default", "False False True"), ("deterministic", "True True True"),
     ("deterministic-strict", "True False True"), ("deterministic-math", "True True False")],
)  # fmt: skip
def test_each_mode_reaches_the_trainers_process(tmp_path, mode, expected):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    probe = (
        "import torch; print(torch.are_deterministic_algorithms_enabled(), "
        "torch.is_deterministic_algorithms_warn_only_enabled(), "
        "torch.backends.cuda.flash_sdp_enabled())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_BENCH")}
    env |= MODE_ENV[mode] | {"PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.stdout.split() == expected.split(), out.stderr


def prepared_sft_job(tmp_path):
    """A prepared folder as `gpu_checklist --prepare` writes it, holding one SFT job."""
    prepared = tmp_path / "prep"
    (prepared / "jobs").mkdir(parents=True)
    (prepared / "plan.json").write_text(json.dumps({"sft": {"trainer": "sft"}}))
    (prepared / "sft.jsonl").write_text("{}\n")
    job = TrainingJob(model_dir="@WORK@/model", data_file="@PREPARED@/sft.jsonl",
                      output_dir="@WORK@/sft", settings=SFTSettings(), seed=3)  # fmt: skip
    job.save(prepared / "jobs" / "sft.json")
    return prepared, job


def test_the_setting_mode_trains_copies_of_the_jobs_that_ask_for_it(tmp_path):
    prepared, job = prepared_sft_job(tmp_path)
    copy = with_setting(prepared, tmp_path / "copy")
    read = TrainingJob[SFTSettings].load(str(copy / "jobs" / "sft.json"))
    assert read.settings.deterministic and (copy / "sft.jsonl").is_file()
    assert read.model_dump(exclude={"settings"}) == job.model_dump(exclude={"settings"})
    original = TrainingJob[SFTSettings].load(str(prepared / "jobs" / "sft.json"))
    assert not original.settings.deterministic  # the prepared folder is left as it was


def test_main_trains_the_setting_mode_from_the_copy_and_writes_each_row_as_it_ends(
    tmp_path, monkeypatch
):
    from bench import train_repeat

    prepared, _ = prepared_sft_job(tmp_path)
    work = tmp_path / "work"
    (work / "model").mkdir(parents=True)
    (work / "model" / "config.json").write_text("{}")  # no model to build
    asked = []

    def run_job(jobs, name, folder, model, env):
        read = TrainingJob[SFTSettings].load(str(jobs / "jobs" / f"{name}.json"))
        asked.append((folder.name, read.settings.deterministic))
        (folder / name / "model").mkdir(parents=True)
        save_file({"w": torch.ones(2)}, str(folder / name / "model" / "model.safetensors"))
        return {"train_s": 1.0, "peak_gpu_gb": None, "train_loss": 0.5, "nondeterministic_ops": []}

    monkeypatch.setattr(train_repeat, "run_job", run_job)
    out = tmp_path / "repeat.md"
    argv = [str(prepared), "--work", str(work), "--jobs", "sft", "--out", str(out)]
    assert train_repeat.main(argv) == 0
    assert asked == [("default-1", False), ("default-2", False),
                     ("setting-1", True), ("setting-2", True)]  # fmt: skip
    rows = out.read_text().splitlines()[2:]
    assert [row.split(" | ")[:2] for row in rows] == [["| sft", "default"], ["| sft", "setting"]]
