"""The rollout bench's verdicts, on hand-made results: the speed-up, the fraction of the
all-cores decode bound, and the most that fraction can be at the workload's prefill share."""

from bench import rollout_throughput as bench

# 100 MFLOPs a token: 2 x (40M non-embedding + 10M lm_head)
SHAPE = bench.ModelShape(
    parameters=50_000_000, non_embedding=40_000_000, lm_head=10_000_000, layers=2,
    attention_width=64,
)  # fmt: skip


def way(name: str, seconds: float, generated: int = 300, computed: int = 700) -> bench.WayResult:
    return bench.WayResult(
        way=name, episodes=10, steps=30, successes=0, seconds=seconds, generate_calls=3,
        generated_tokens=generated, engine_generated_tokens=generated, prompt_tokens=5000,
        prompt_tokens_computed=computed, prompt_tokens_computed_measured=True,
        prompt_tokens_new=computed, attention_flops=0,
    )  # fmt: skip


def info(flops_all: float) -> dict:
    return {
        "model": "m", "max_steps": 3, "max_tokens": 48, "few_shot": 1, "block_size": 32,
        "cpus": 2, "threads": 2, "load": 0.0, "flops_1": flops_all / 2, "flops_all": flops_all,
        "vllm": "v", "torch": "t", "shape": SHAPE,
    }  # fmt: skip


def test_both_targets_pass_when_batched_is_5x_and_decodes_at_30_percent_of_the_bound():
    # batched: 300 tokens in 1 s = 300 tok/s; bound 100 GFLOP/s / 100 MFLOPs = 1000 tok/s: 30%
    table, results = bench.report(info(100e9), way("sequential", 5.0), way("batched", 1.0))
    assert "5.00x the sequential way" in table and "PASS against the >= 5x target" in table
    assert "30.0% of the 2-thread decode bound: PASS against the >= 30% target" in table
    assert results["speedup_episodes_per_s"] == 5.0 and results["pass"]
    assert round(results["batched_fraction_of_decode_bound"]["2"], 6) == 0.3
    assert results["pass_decode_fraction"]
    assert results["generated_share_of_computed"] == 0.3  # 300 / (700 + 300)


def test_each_target_fails_on_its_own_just_below_its_line():
    table, results = bench.report(info(101e9), way("sequential", 4.99), way("batched", 1.0))
    assert not results["pass"] and not results["pass_decode_fraction"]
    assert "FAIL against the >= 5x target" in table
    assert "29.7% of the 2-thread decode bound: FAIL against the >= 30% target" in table
    assert "(at most 30.0% with this workload's prefill share)" in table


def test_the_engine_decoding_alone_is_reported_against_the_same_bound():
    # 250 tok/s alone; bound 100 GFLOP/s / 100 MFLOPs = 1000 tok/s: 25%
    alone = {"tokens_per_s": 250.0, "batch": 10, "mean_context": 1234.4}
    table, results = bench.report(
        info(100e9) | {"decode_alone": alone, "kv_cache_dtype": "fp8"},
        way("sequential", 5.0),
        way("batched", 1.0),
    )
    assert "engine decoding alone, batch 10 at a mean context of 1,234 tokens" in table
    assert "| 250, 50.0% | 250, 25.0% |" in table  # 1 thread: half the FLOP/s
    assert "decoding alone at the batched way's batch and context reaches 25.0%" in table
    assert "(KV cache: fp8)" in table
    assert results["decode_alone_fraction_of_decode_bound"] == {"1": 0.5, "2": 0.25}
    _, without = bench.report(info(100e9), way("sequential", 5.0), way("batched", 1.0))
    assert without["decode_alone_fraction_of_decode_bound"] is None


def test_the_decode_alone_prompts_are_the_middle_calls():
    requests = [
        bench.Request(prompt=[call, i], cached=0, generated=[], call=call)
        for call in range(5)
        for i in range(2)
    ]
    assert bench.middle_call_prompts(requests) == [[2, 0], [2, 1]]
    assert bench.middle_call_prompts(requests[:4]) == [[1, 0], [1, 1]]  # calls 0, 1: the later


def test_the_bench_explores_with_the_demo_config_inference_settings():
    args = bench.parse_args([])
    assert (args.max_tokens, args.block_size, args.kv_cache_dtype) == (
        bench.DEMO_INFERENCE.max_tokens,
        bench.DEMO_INFERENCE.block_size,
        bench.DEMO_INFERENCE.kv_cache_dtype,
    )
    assert bench.DEMO_INFERENCE.max_tokens == 48  # configs/eto_textcraft.yaml
