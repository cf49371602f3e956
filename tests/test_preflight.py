"""Up-front checks: a run that cannot work is refused in seconds, with a message naming what to
fix (the file or override and the field), and the command exits 2. No vLLM, no trainer."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.eto import ETOConfig, main
from flywheel.config_files import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_malformed_yaml_in_a_config_file_names_the_file_and_line(tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text("rounds: 1\nenv:\n  name: [textcraft\n  max_steps: 3\n")
    with pytest.raises(ConfigError) as error:
        load_config(ETOConfig, str(config))
    message = str(error.value)
    assert str(config) in message and "not valid YAML" in message
    assert "line 4" in message and "max_steps: 3" in message and "name: [textcraft" in message


def test_malformed_yaml_in_an_override_names_the_override_and_field():
    with pytest.raises(ConfigError) as error:
        load_config(ETOConfig, None, ["env.train_tasks=[1,"])
    message = str(error.value)
    assert "override 'env.train_tasks=[1,'" in message and "value of env.train_tasks" in message


def test_cli_refuses_malformed_yaml_without_a_traceback(tmp_path, capsys):
    config = tmp_path / "broken.yaml"
    config.write_text("env:\n  test_tasks: 5: 3\n")
    done = subprocess.run(
        [sys.executable, "-m", "flows.eto", "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "test_tasks: 5: 3" in done.stderr
    assert main(["dpo.beta='x"]) == 2
    assert 'override "dpo.beta=\'x"' in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, available",
    [
        ("env.train_tasks=100000", "the train split of textcraft holds 99 tasks"),
        ("env.test_tasks=99", "the test split of textcraft holds 26 tasks"),
    ],
)
def test_cli_refuses_more_tasks_than_the_split_holds(tmp_path, capsys, override, available):
    database = tmp_path / "mlflow.db"
    code = main(
        [
            f"storage_url={tmp_path}/runs",
            f"mlflow_tracking_uri=sqlite:///{database}",
            "env.max_expert_steps=4",
            override,
        ]
    )
    error = capsys.readouterr().err
    assert code == 2, error
    field = override.split("=")[0]
    assert f"{override}:" in error and available in error and f"leave {field} unset" in error
    assert not database.exists()  # refused before the MLflow store was created


def test_all_tasks_of_the_split_may_be_asked_for(tmp_path):
    from envs import make_env
    from envs.task_selection import task_list

    cfg = load_config(ETOConfig, None, ["env.max_expert_steps=4", "env.test_tasks=26"])
    assert len(task_list(make_env(cfg.env), "test", cfg.env, cfg.seed)) == 26


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cli_refuses_an_mlflow_server_that_is_down_within_seconds(tmp_path, capsys, monkeypatch):
    uri = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    started = time.monotonic()
    code = main([f"storage_url={tmp_path}/runs"])
    elapsed = time.monotonic() - started
    error = capsys.readouterr().err
    assert code == 2, error
    assert uri in error and "MLFLOW_TRACKING_URI" in error and "mlflow_tracking_uri" in error
    assert elapsed < 60  # trl's import is most of it; MLflow's own retries took 272 s


def test_an_mlflow_server_that_never_answers_times_out_in_seconds(tmp_path):
    from ops.runner import MLFLOW_CHECK_TIMEOUT_S, check_mlflow

    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        cfg = ETOConfig(mlflow_tracking_uri=uri, storage_url=str(tmp_path))
        started = time.monotonic()
        with pytest.raises(ConfigError, match="does not answer within"):
            check_mlflow(cfg)
    assert time.monotonic() - started < MLFLOW_CHECK_TIMEOUT_S + 5


def test_a_fresh_sqlite_store_opened_by_processes_at_once_stays_usable(tmp_path):
    """Without the lock next to the database, one of two processes creating it at the same
    moment crashes in MLflow's migration."""
    database, go = tmp_path / "mlflow.db", tmp_path / "go"
    # Each process imports MLflow, says so, then waits for the others: they open the store together.
    script = (
        "import os, time; from flywheel.tracking import Tracker; print('ready', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
        f"t = Tracker('sqlite:///{database}', 'flywheel'); print('experiment', t.experiment_id)"
    )
    repo = Path(__file__).resolve().parent.parent
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(3)
    ]
    try:
        ready = [p.stdout.readline() for p in processes]
    finally:
        go.touch()  # also when one failed to start: the others must not wait for ever
    outputs = [p.communicate(timeout=120) for p in processes]
    assert ready == [b"ready\n"] * 3, [err.decode()[-2000:] for _, err in outputs]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err.decode()[-2000:]
    assert {out.decode().split()[-1] for out, _ in outputs} == {"1"}  # one experiment, shared


def test_frozen_layers_the_model_lacks_are_refused_before_any_work(tmp_path):
    """The CPU demo's config on the 2-layer model: refused in preflight, naming the setting and
    the model's depth (it failed 1.5 min in, inside the SFT trainer)."""
    from ops.runner import preflight

    database = tmp_path / "mlflow.db"
    cfg = load_config(
        ETOConfig,
        str(ROOT / "configs" / "eto_textcraft.yaml"),
        [
            "model.base=tiny",
            f"storage_url={tmp_path}/runs",
            f"mlflow_tracking_uri=sqlite:///{database}",
        ],
    )
    started = time.monotonic()
    with pytest.raises(ConfigError) as error:
        preflight(cfg)
    assert time.monotonic() - started < 5
    assert str(error.value).startswith(
        "sft.frozen_layers=20 but model.base='tiny' has 2 layers: lower sft.frozen_layers"
    )
    assert not database.exists()


def test_a_share_of_the_layers_scales_with_the_model():
    from flywheel.model import BUILTIN_SHAPES
    from flywheel.settings import DPOSettings, SFTSettings
    from ops.model_checks import check_frozen_layers

    share = SFTSettings(frozen_layers=0.67)
    assert [share.frozen_layer_count(n) for n in (30, 28, 2)] == [20, 18, 1]
    assert SFTSettings(frozen_layers=20).frozen_layer_count(30) == 20  # a count stays a count
    for wrong in (1.0, 20.0, 1.5):
        with pytest.raises(ValueError, match="a count of layers is an integer"):
            DPOSettings(frozen_layers=wrong)
    tiny = load_config(ETOConfig, str(ROOT / "configs" / "eto_textcraft.yaml"),
                       ["model.base=tiny", "sft.frozen_layers=0.67", "dpo.frozen_layers=2"])  # fmt: skip
    check_frozen_layers(tiny, BUILTIN_SHAPES["tiny"])  # 1 and 2 of 2 layers: fine


def test_the_built_in_models_shapes_are_those_of_their_folders(base_model_dir, tiny_model_dir):
    import json

    from flywheel.model import BUILTIN_SHAPES, shape_from_config

    for name, folder in [("smollm2-135m", base_model_dir), ("tiny", tiny_model_dir)]:
        config = json.loads((folder / "config.json").read_text())
        assert shape_from_config(config) == BUILTIN_SHAPES[name], name


def large_model_folder(tmp_path) -> Path:
    """Qwen2.5-1.5B's config.json alone: what preflight reads of a model."""
    import json

    folder = tmp_path / "qwen-1.5b"
    folder.mkdir()
    fields = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, vocab_size=151936)  # fmt: skip
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def test_a_cpu_demo_config_on_a_large_model_warns_naming_the_gpu_config(tmp_path, capsys):
    from ops.model_checks import check_model_shape

    folder = large_model_folder(tmp_path)
    demo = load_config(
        ETOConfig, str(ROOT / "configs" / "eto_textcraft.yaml"), [f"model.base={folder}"]
    )
    assert check_model_shape(demo)
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and warning.startswith("warning: model.base=")
    assert "~1.5B parameters" in warning and "sft.frozen_layers=20" in warning
    assert "sft.learning_rate=0.00045" in warning and "inference.max_tokens=48" in warning
    assert "configs/gpu/eto_textcraft_qwen1.5b.yaml" in warning
    gpu = load_config(
        ETOConfig,
        str(ROOT / "configs" / "gpu" / "eto_textcraft_qwen1.5b.yaml"),
        [f"model.base={folder}"],
    )
    assert check_model_shape(gpu)
    assert capsys.readouterr().err == ""
    small = load_config(
        ETOConfig, str(ROOT / "configs" / "eto_textcraft.yaml")
    )  # the demo's own model
    assert check_model_shape(small) and capsys.readouterr().err == ""
