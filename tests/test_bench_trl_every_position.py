"""bench/trl_every_position.py runs a trainer module as `python -m` would, with trl's own CPU
choice left alone (the shipped trainers' `score_loss_positions_only` replaced by nothing)."""

from __future__ import annotations

import subprocess
import sys

from bench import trl_every_position


def test_the_named_trainer_runs_as_main_with_the_positions_patch_off(tmp_path):
    (tmp_path / "probe_trainer.py").write_text(
        "import sys\nimport training.job\n"
        "if __name__ == '__main__':\n"
        "    training.job.score_loss_positions_only()  # would patch trl; here it must do nothing\n"
        "    import trl.trainer.utils as u\n"
        "    print(sys.argv[1:], getattr(u._use_triton, 'compacts_on_cpu', False))\n"
    )
    env = {trl_every_position.TRAINER_VARIABLE: "probe_trainer", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.trl_every_position", "--config", "job.json"],
        env=env | {"PATH": "/usr/bin:/bin"}, cwd=trl_every_position.__file__.rsplit("/", 2)[0],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "['--config', 'job.json'] False"
