"""experiments/episode_progress.py: where failed TextCraft episodes stop, counted from observations."""

import json

import pytest

from experiments import episode_progress


def episode(observations: list[str], success: bool = False) -> dict:
    messages = [{"role": "system", "content": "..."}, {"role": "user", "content": "Goal: x"}]
    for text in observations:
        messages += [
            {"role": "assistant", "content": "Action: a"},
            {"role": "user", "content": text},
        ]
    return {"task_id": "t", "success": success, "messages": messages}


def write(store, run, stage, episodes, folder="evaluate-harder"):
    played = store / run / folder / stage
    played.mkdir(parents=True)
    (played / "trajectories.jsonl").write_text("\n".join(json.dumps(e) for e in episodes))


def test_outcomes_are_counted_per_episode_and_pooled_over_seeds(tmp_path):
    got, crafted = "Observation: Got 2 oak logs", "Observation: Crafted 4 oak planks"
    refused = "Observation: Could not find a valid recipe for 1 oak door"
    write(tmp_path, "efficacy-eto-seed0", "sft", [episode([got, crafted, refused, refused])])
    write(tmp_path, "efficacy-eto-seed1", "sft", [episode([got, got, crafted], success=True)])
    write(tmp_path, "efficacy-eto-seed1", "sft", [episode([got])], folder="evaluate")
    progress = episode_progress.stage_progress(tmp_path, "harder")
    # Two episodes: 3 gets, 2 crafts, 2 refusals, 1 solved; the greedy folder not read.
    assert progress == {
        ("eto", "sft"): {"episodes": 2, "solved": 1, "got": 1.5, "crafted": 1.0, "refused": 1.0}
    }
    assert "| eto | sft | 2 | 1 | 1.50 | 1.00 | 1.00 |" in episode_progress.table(progress)


def test_a_store_without_the_variant_is_an_error_that_names_it(tmp_path):
    with pytest.raises(SystemExit, match="no harder evaluation episodes under"):
        episode_progress.main([str(tmp_path), "--variant", "harder"])
