"""Supervised fine-tuning on trajectories with trl's SFTTrainer, loss on marked turns only.

Run alone (`python -m training.sft --config job.json`) or on several processes
(`accelerate launch -m training.sft --config job.json`). Writes the final model to
`job.output_dir` (rank 0); no intermediate checkpoints are kept.
"""

from __future__ import annotations

import sys

from datasets import Dataset
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer

from flywheel.chat import ChatTokenizer
from flywheel.records import Trajectory
from flywheel.settings import SFTSettings
from training.datasets import sft_rows, token_counts
from training.job import (
    TrainingJob,
    load_model,
    new_adapters,
    parse_job,
    report_metrics,
    train_and_save,
    trainer_defaults,
)


def train(job: TrainingJob[SFTSettings]) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    chat = ChatTokenizer(tokenizer)
    with open(job.data_file) as f:
        trajectories = [Trajectory.model_validate_json(line) for line in f if line.strip()]
    max_length = job.settings.max_length
    rows, counts = sft_rows(trajectories, chat, max_length)
    if not rows:
        raise ValueError(
            f"{job.data_file}: no trajectory has tokens to learn from within "
            f"max_length={max_length} ({counts})"
        )
    config = SFTConfig(max_length=max_length, **trainer_defaults(job))
    model = load_model(job)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=new_adapters(model, job),
    )
    metrics = train_and_save(trainer, tokenizer, job, len(rows))
    return {**metrics, **counts.as_metrics(), **token_counts(rows)} if metrics else metrics


def main(argv: list[str] | None = None) -> None:
    report_metrics(train(parse_job(__doc__.splitlines()[0], SFTSettings, argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
