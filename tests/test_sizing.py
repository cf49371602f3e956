"""bench/sizing.py's formulas reproduce the CPU benches' own figures given the CPU's bound.

Figures from bench/results-rollout-throughput.md (2026-11-25 run) and
bench/results-train-throughput.md (run 4).
"""

from __future__ import annotations

import pytest

from bench.sizing import (
    H100,
    SHAPES,
    compute_decode_bound,
    decode_bound,
    train_seconds,
    training_flops,
    training_memory,
)

SMOL = SHAPES["smollm2-135m"]


def test_smollm2_parameters_as_the_rollout_bench_counted_them():
    # "134.5M parameters; FLOPs a token = 2 x (106.2M non-embedding + 28.3M lm_head)", 269.0 M
    assert round(SMOL.non_embedding / 1e6, 1) == 106.2
    assert round(SMOL.lm_head / 1e6, 1) == 28.3
    assert round(SMOL.parameters / 1e6, 1) == 134.5
    assert round(SMOL.flops_per_token / 1e6, 1) == 269.0


def test_decode_bound_at_the_cpu_matmul_bound_is_the_rollout_bench_figure():
    # "decode bound at 269.0 MFLOPs a token (tokens/s)": 366 at 98.4 GFLOP/s, 706 at 190.0
    assert round(compute_decode_bound(SMOL, 98.4e9)) == 366
    assert round(compute_decode_bound(SMOL, 190.0e9)) == 706


def test_rollout_model_flops_fraction_is_the_bench_figure():
    # 16,246 prompt tokens computed + 8,927 generated in 66.0 s: 54.0% of 190.0 GFLOP/s
    work = SMOL.flops_per_token * (16_246 + 8_927)
    assert round(work / 66.0 / 190.0e9, 3) == 0.540


@pytest.mark.parametrize(
    "tokens, projected, extra_forward, seconds, flops_per_s",
    [
        (8_032, 2_075, 0, 23.7, 130.1e9),  # sft: 20 of 30 layers frozen
        (round(7_598 / (1 - 0.019)), 2_164, 1, 20.2, 235.3e9),  # dpo: + the reference forward
    ],
)
def test_training_flops_give_the_train_bench_flop_rate(
    tokens, projected, extra_forward, seconds, flops_per_s
):
    flops = training_flops(SMOL, tokens, projected, frozen_layers=20)
    flops += extra_forward * (2 * SMOL.non_embedding * tokens + 2 * SMOL.lm_head * projected)
    assert flops / seconds == pytest.approx(flops_per_s, rel=0.005)


def test_train_seconds_at_the_measured_fraction_of_the_bound_is_the_bench_time():
    # sft at 50.0% of the 260.4 GFLOP/s matmul bound took 23.7 s
    flops = training_flops(SMOL, 8_032, 2_075, frozen_layers=20)
    assert train_seconds(flops, 260.4e9, 0.500) == pytest.approx(23.7, abs=0.1)


def test_full_training_is_six_n_per_token_and_lora_four():
    shape = SHAPES["7b"]
    full = training_flops(shape, 1000, 0)
    lora = training_flops(shape, 1000, 0, lora=True)
    assert full == 6 * shape.non_embedding * 1000
    assert lora == 4 * shape.non_embedding * 1000


def test_memory_by_hand_for_7b():
    shape = SHAPES["7b"]
    n = shape.parameters
    one = training_memory(shape, 1, 0, False, 0, 0)
    assert (one.weights, one.optimizer) == (2 * n, 14 * n)  # bf16 + (bf16 grads + fp32 Adam)
    zero3 = training_memory(shape, 8, 3, False, 0, 0)
    assert (zero3.weights, zero3.optimizer) == (2 * n / 8, 14 * n / 8)


def test_decode_at_batch_one_is_weights_over_bandwidth():
    shape = SHAPES["7b"]
    assert decode_bound(shape, H100, 1, 0) == pytest.approx(H100.bandwidth / (2 * shape.parameters))
