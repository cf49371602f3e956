"""On a GPU the trainers batch a step's sequences instead of accumulating them one at a time
(training/job.py `batched_on_gpu`): the same sequences per optimizer step, one forward."""

from __future__ import annotations

from training.job import batched_on_gpu


def test_a_gpu_runs_the_accumulated_sequences_as_one_batch():
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "seed": 0}
    assert batched_on_gpu(args, gpu=True, set_by_user=False) == {
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "seed": 0,
    }  # fmt: skip


def test_a_cpu_keeps_one_sequence_at_a_time():
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}
    assert batched_on_gpu(args, gpu=False, set_by_user=False) == args


def test_a_batch_the_user_set_is_kept():
    args = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}
    assert batched_on_gpu(args, gpu=True, set_by_user=True) == args
