"""`model.precision`: auto reads the hardware (never a timing), and the benches' bound tables."""

from __future__ import annotations

import pytest

from bench.rollout_throughput import bound_lines
from flywheel.precision import cpu_flags, cpu_has_fast_bf16, resolve_precision

EPYC_AVX2 = "processor\t: 0\nflags\t\t: fpu sse avx2 fma f16c\n"
XEON_AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_cpu_flags_are_read_from_the_flags_line():
    assert cpu_flags(EPYC_AVX2) == {"fpu", "sse", "avx2", "fma", "f16c"}
    assert cpu_flags("") == frozenset()


@pytest.mark.parametrize(
    ("cpuinfo", "fast"),
    [(EPYC_AVX2, False), (XEON_AMX, True), ("flags : avx512_bf16\n", True), ("", False)],
)
def test_bf16_counts_as_fast_only_with_hardware_bf16_instructions(cpuinfo, fast):
    assert cpu_has_fast_bf16(cpu_flags(cpuinfo)) is fast


@pytest.mark.parametrize(
    ("setting", "gpu_bf16", "cpuinfo", "expected"),
    [
        ("auto", False, EPYC_AVX2, "float32"),
        ("auto", False, XEON_AMX, "bfloat16"),
        ("auto", True, EPYC_AVX2, "bfloat16"),  # the GPU computes, whatever the host CPU
        ("float32", True, XEON_AMX, "float32"),  # an explicit setting is never overridden
        ("bfloat16", False, EPYC_AVX2, "bfloat16"),
    ],
)
def test_auto_resolves_from_the_hardware_and_explicit_settings_stand(
    setting, gpu_bf16, cpuinfo, expected
):
    assert resolve_precision(setting, gpu_bf16=gpu_bf16, flags=cpu_flags(cpuinfo)) == expected


def test_an_unknown_precision_names_the_ones_that_work():
    with pytest.raises(ValueError, match="auto, float32, bfloat16"):
        resolve_precision("fp16", gpu_bf16=False, flags=frozenset())


def test_the_bound_table_marks_the_format_the_work_ran_in_and_the_fastest():
    lines = bound_lines({"float32": 24e9, "bfloat16": 0.5e9}, "float32", 2)
    assert lines[2] == "| float32 | 24.0 | 1.00x | ran in, fastest |"
    assert lines[3] == "| bfloat16 | 0.5 | 0.02x | |"
    lines = bound_lines({"float32": 60e9, "bfloat16": 420e9}, "float32", 1)
    assert lines[2] == "| float32 | 60.0 | 1.00x | ran in |"
    assert lines[3] == "| bfloat16 | 420.0 | 7.00x | fastest |"


def test_settings_resolve_auto_when_read_so_a_stages_key_holds_the_format(monkeypatch):
    import flywheel.precision as precision
    from flywheel.settings import DPOSettings, RLSettings, SFTSettings

    monkeypatch.setattr(precision, "cuda_has_bf16", lambda: False)
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: cpu_flags(XEON_AMX))
    assert SFTSettings().precision == "bfloat16"
    assert RLSettings(precision="auto").precision == "bfloat16"
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: cpu_flags(EPYC_AVX2))
    assert DPOSettings().precision == "float32"
    assert SFTSettings(precision="bfloat16").precision == "bfloat16"
    assert (
        SFTSettings().model_dump()["precision"]
        != SFTSettings(precision="bfloat16").model_dump()["precision"]
    )


def test_a_runs_report_opens_with_the_formats_it_computed_in():
    from flows.agent_r1 import AgentR1Config
    from flows.eto import ETOConfig
    from ops.driver import precision_line

    eto = ETOConfig(inference={"precision": "bfloat16"}, dpo={"precision": "float32"})
    assert precision_line(eto) == (
        f"Precision: inference bfloat16; trainers: sft {eto.sft.precision}, dpo float32."
    )
    assert "rl " in precision_line(AgentR1Config())
