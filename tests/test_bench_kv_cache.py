"""The KV-cache agreement bench's counts, on hand-made episodes."""

from bench import kv_cache_agreement as bench

REFERENCE = {
    "a": ([[1, 2], [3], [4]], True),
    "b": ([[5], [6]], False),
    "c": ([[7]], False),
    "d": ([[1], [2], [3]], False),
}


def test_identical_episodes_and_steps_agreeing_before_the_first_difference():
    other = {
        "a": ([[1, 2], [3], [4]], True),  # all 3 steps the same
        "b": ([[5], [9], [6]], True),  # 1 step, then differs; solved here only
        "c": ([[8]], False),  # differs at once
        "d": ([[1], [0], [3]], False),  # 1 step: a later step that agrees again does not count
    }
    got = bench.agreement(REFERENCE, other)
    assert got == {
        "tasks": 4,
        "identical": 1,
        "steps": 9,
        "agreeing_steps": 5,
        "solved_differently": ["b"],
    }
    assert bench.agreement(REFERENCE, REFERENCE)["agreeing_steps"] == 9


def test_a_longer_episode_agreeing_on_every_shared_step_is_not_identical():
    other = {"a": ([[1, 2], [3], [4], [5]], True)}
    got = bench.agreement(REFERENCE, other)
    assert (got["tasks"], got["identical"], got["agreeing_steps"], got["steps"]) == (1, 0, 3, 3)


def test_the_table_prints_each_rate_with_n_and_its_interval():
    results = [
        {"dtype": "auto", "solved": 4, "n": 26, "seconds": 35.04,
         "agreement": bench.agreement(REFERENCE, REFERENCE)},
        {"dtype": "fp8", "solved": 0, "n": 26, "seconds": 30.0,
         "agreement": {"tasks": 26, "identical": 3, "steps": 148, "agreeing_steps": 56,
                       "solved_differently": ["x", "y"]}},
    ]  # fmt: skip
    lines = bench.table(results).splitlines()
    assert lines[2] == "| auto | 4/26 | 15.4% | 6.2%–33.5% | 35.0 | 4/4 | 9/9 | - |"
    assert lines[3] == "| fp8 | 0/26 | 0.0% | 0.0%–12.9% | 30.0 | 3/26 | 56/148 | x, y |"


def test_a_folder_without_a_model_is_refused_before_any_engine_starts(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        bench.parse_args(["--model-dir", str(tmp_path)])
    assert "holds no config.json" in capsys.readouterr().err
