"""The Agent-R1 bench's cheap parts: its arithmetic and tables, the tool microbenchmarks, and (slow)
the estimators part on the tiny model with two estimators, the rollout part on the tiny model."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import tiny_tool_recipe

from bench import agent_r1

ROOT = Path(__file__).resolve().parents[1]


def test_percentile_interpolates_between_sorted_values():
    assert agent_r1.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert agent_r1.percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9) == 9.1
    assert agent_r1.percentile([5.0], 0.9) == 5.0


def estimator_run(estimator, solved, kl):
    return {
        "estimator": estimator, "flow_seconds": 120.0,
        "stages": ["untrained", "warm-start", "rl-round-1"],
        "evaluations": {
            "untrained": {"exact_match": 0.0, "ci95": [0.0, 0.3], "solved": 0, "n": 10},
            "warm-start": {"exact_match": 0.2, "ci95": [0.06, 0.51], "solved": 2, "n": 10},
            "rl-round-1": {"exact_match": solved / 10, "ci95": [0.1, 0.7], "solved": solved,
                           "n": 10},
        },
        "rounds": [{"round": 1, "rl_seconds": 30.0, "tokens_trained": 1000,
                    "loss_tokens_trained": 200, "kl": kl, "clip_fraction": 0.01,
                    "reward_mean": 0.4}],
        "notes": [],
    }  # fmt: skip


def test_the_estimators_table_has_the_warm_start_and_a_row_per_estimator():
    part = {
        "runs": [estimator_run("grpo", 4, 0.002), estimator_run("rloo", 3, None)],
        "warm_start": {"tokens_trained": 5000, "loss_tokens_trained": 900, "seconds": 60.0},
    }
    lines = agent_r1.estimators_table(part)
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert rows[0].startswith("| untrained (few-shot prompt) | 0.0% | 0.0%–30.0% | 0/10 | 0 / 0")
    assert rows[1].startswith("| warm start (SFT) | 20.0% | 6.0%–51.0% | 2/10 | 5,000 / 900 | 60")
    assert rows[2] == (
        "| grpo (rl-round-1) | 40.0% | 10.0%–70.0% | 4/10 | 1,000 / 200 | 30 | 0.0020 | 0.010 "
        "| 0.400 | 59.4 |"
    )
    assert rows[3].startswith("| rloo (rl-round-1) | 30.0% |") and "| – |" in rows[3]
    assert lines[-1].endswith("grpo 2.0 min, rloo 2.0 min.")


def test_tool_microbenchmarks_time_the_sandbox_and_the_search(tmp_path):
    args = agent_r1.parse_args(
        ["--parts", "tools", "--python-runs", "3", "--search-queries", "20", "--search-batch", "8"]
    )
    part = agent_r1.tools_part(args, agent_r1.load_cfg(args))
    for way in ("execute", "execute_batch"):
        timing = part["python"][way]
        assert timing["calls"] == 3 and 0 < timing["median_ms"] <= timing["p90_ms"]
    assert part["search"]["documents"] > 100
    assert part["search"]["single"]["calls"] == part["search"]["batched"]["calls"] == 20
    table = "\n".join(agent_r1.tools_table(part))
    assert "| python `print(1)` | execute_batch (2 workers; ms: each call) | 3 |" in table
    assert "execute_batch, 8 a call" in table


def test_help_explains_the_parts(capsys):
    with pytest.raises(SystemExit):
        agent_r1.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "estimators:" in text and "decode bound" in text and "--questions" in text


@pytest.mark.extended
@pytest.mark.slow
def test_two_estimators_share_the_warm_start_then_the_rollout_part(tmp_path, tiny_model_dir):
    """The tiny random model never answers, so its groups carry no reward variance: each run
    stops before the RL update and says so; the second run recomputes nothing."""
    config = tiny_tool_recipe("bench-tiny", tmp_path, rl={"batch_size": 2, "max_length": 2048})
    del config["storage_url"]  # the bench's --out decides
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(config))
    out = tmp_path / "results.md"
    argv = [
        "--parts", "estimators", "rollout", "--config", str(config_file),
        "--estimators", "grpo", "rloo", "--store", str(tmp_path / "store"),
        "--model", "tiny", "--questions", "2", "--out", str(out),
        "--json", str(tmp_path / "results.json"),
    ]  # fmt: skip
    assert agent_r1.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    runs = results["estimators"]["runs"]
    assert [r["estimator"] for r in runs] == ["grpo", "rloo"]
    for run in runs:
        assert run["stages"] == ["untrained", "warm-start"]
        assert run["evaluations"]["warm-start"]["n"] == 2
        assert "no RL update" in run["notes"][0]
    assert results["estimators"]["warm_start"]["tokens_trained"] > 0
    kept = json.loads((tmp_path / "store" / "bench-tiny" / "bench-estimators.json").read_text())
    assert [r["estimator"] for r in kept] == ["grpo", "rloo"]
    rollout = results["rollout"]
    assert rollout["questions"] == 2 and rollout["generated_tokens"] > 0
    assert rollout["generate_seconds"] <= rollout["seconds"]
    text = out.read_text()
    assert text.startswith("# Agent-R1 bench")
    assert "| warm start (SFT) |" in text and "| grpo | no RL update |" in text
    assert "decode bound at" in text and "python -m bench.agent_r1 --parts estimators" in text
