"""A trainer run with trl's own CPU behaviour: every position projected through the LM head.

    FLYWHEEL_BENCH_TRAINER=training.sft python -m bench.trl_every_position --config job.json

The shipped trainers project only the positions that carry a loss (`training.job.
score_loss_positions_only`); bench/train_throughput.py measures what that saves by running the
same job through this module, which leaves trl's choice alone and then runs the trainer named by
`FLYWHEEL_BENCH_TRAINER` as `python -m` would.
"""

from __future__ import annotations

import os
import runpy

import training.job

TRAINER_VARIABLE = "FLYWHEEL_BENCH_TRAINER"


def main() -> None:
    training.job.score_loss_positions_only = lambda: None  # load_model calls it by this name
    runpy.run_module(os.environ[TRAINER_VARIABLE], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
