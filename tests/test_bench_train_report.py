"""bench/train_throughput.py's table: each trainer against the bound of the format it ran in and
against the fastest format's bound, both timed in the same run."""

from __future__ import annotations

from bench.train_throughput import Measured, report


def test_trainers_are_read_against_their_formats_bound_and_the_fastest():
    sft = Measured(variant="sft", trainer="sft", rows=4, real_tokens=1000, processed_tokens=1000,
                   seconds=10.0, steps=2, final_loss=0.5, flops=60e9)  # fmt: skip
    info = {
        "model": "tiny", "layers": 2, "frozen_layers": 1, "max_length": 1024, "threads": 2,
        "cpus": 2, "load": 0.1, "torch": "2.13.0", "trl": "1.16", "date": "today",
        "command": "python bench/train_throughput.py", "matmul_size": 1024,
        "matmul_bounds": {"float32": 24e9, "bfloat16": 120e9}, "precision": "float32",
    }  # fmt: skip
    table = report([sft], info)
    # 6 GFLOP/s: 25% of float32's 24, 5% of bfloat16's 120.
    assert "| sft | 4 | 1,000 | 0.0% | 2 | 10.0 | 100.0 | 6.0 | 25.0% | 5.0% | 0.5000 |" in table
    assert "| of the float32 bound | of the fastest bound |" in table
    assert "| float32 | 24.0 | 1.00x | ran in |" in table
    assert "| bfloat16 | 120.0 | 5.00x | fastest |" in table
    assert "The trainers ran in float32" in table
