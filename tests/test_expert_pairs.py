"""IPR's SFT term as DPO pairs (`tasks.expert_pairs`): an expert trajectory paired with itself has
a preference term of log 2 and no gradient, so without the NLL term it moves nothing and with it
it is SFT on the expert's turns; the pairs' margins count only the true pairs. Real trl runs on
the tiny model, and the round's wiring (`flows.eto`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from flywheel.records import Message, Trajectory
from tasks.expert_pairs import expert_pairs, is_self_pair, self_pair


def expert(task: str, success: bool = True) -> Trajectory:
    return Trajectory(
        task_id=task, env="textcraft",
        messages=[
            Message(role="system", content="s"), Message(role="user", content=f"craft {task}"),
            Message(role="assistant", content="Act: get 1 log", loss=True),
            Message(role="user", content="Got 1 log"),
            Message(role="assistant", content="Act: craft 1 " + task, loss=True),
            Message(role="user", content="Crafted"),
        ],
        episode_start=1, reward=1.0 if success else 0.0, success=success, n_steps=2,
    )  # fmt: skip


def test_an_expert_trajectory_pairs_with_itself_ending_on_its_last_turn():
    pair = self_pair(expert("stick"))
    assert is_self_pair(pair) and pair.step is None
    assert [m.content for m in pair.prompt] == ["s", "craft stick"]
    # the last observation is cut: a pair's sides end on an agent turn
    assert [m.content for m in pair.chosen] == ["Act: get 1 log", "Got 1 log", "Act: craft 1 stick"]
    assert pair.chosen_reward == pair.rejected_reward == 1.0


def test_the_draw_takes_successes_only_seeded_without_replacement_then_again():
    trajectories = [expert(f"t{i}") for i in range(4)] + [expert("failed", success=False)]
    three = expert_pairs(trajectories, 3, seed=0)
    assert len({p.task_id for p in three}) == 3 and "failed" not in {p.task_id for p in three}
    assert three == expert_pairs(trajectories, 3, seed=0)  # the seed's draw
    six = expert_pairs(trajectories, 6, seed=1)
    assert len(six) == 6 and {p.task_id for p in six[:4]} == {"t0", "t1", "t2", "t3"}
    assert expert_pairs([], 5, seed=0) == []


def self_pair_job(tmp_path: Path, model_dir: Path, nll_weight: float, with_true_pair: bool):
    from test_dpo_entry import make_pair, write_pairs

    import training.dpo as dpo
    from flywheel.settings import DPOSettings
    from tasks.dpo import dpo_trl_args
    from training.job import TrainingJob

    true = make_pair(3, 2)
    own = true.model_copy(update={"rejected": true.chosen, "rejected_reward": 1.0})
    pairs = [own, own] + ([true] if with_true_pair else [])
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = write_pairs(tmp_path / "pairs.jsonl", pairs)
    settings = DPOSettings(max_length=512, epochs=1, learning_rate=1e-3, nll_weight=nll_weight)
    trl_args = {**dpo_trl_args(settings), "output_dir": str(tmp_path / "work"),
                "report_to": "none", "disable_tqdm": True}  # fmt: skip
    job = TrainingJob[DPOSettings](
        model_dir=str(model_dir), data_file=data, output_dir=str(tmp_path / "model"),
        settings=settings, seed=3, trl_args=trl_args,
    )  # fmt: skip
    return dpo.train(job), tmp_path / "model"


def grad_norms(trainer) -> list[float]:
    return [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]


def test_a_self_pair_gives_dpo_no_gradient_and_the_nll_term_one(
    tmp_path, tiny_model_dir, monkeypatch
):
    pytest.importorskip("trl")
    from test_lora import built_dpo_trainers

    built = built_dpo_trainers(monkeypatch)
    metrics, _ = self_pair_job(tmp_path / "plain", tiny_model_dir, 0.0, False)
    assert metrics["train_loss"] == pytest.approx(math.log(2), abs=1e-4)
    # the two sides' log-probabilities agree to rounding: a gradient of rounding noise (Adam
    # would still scale it to a step: the SFT term, not this, moves the weights)
    assert max(grad_norms(built[0])) < 1e-3
    assert "pairs_rewards/margins" not in metrics  # no true pair to score
    metrics, _ = self_pair_job(tmp_path / "nll", tiny_model_dir, 1.0, False)
    assert min(grad_norms(built[1])) > 0.1  # the NLL term: SFT on the expert's turns
    metrics, _ = self_pair_job(tmp_path / "mixed", tiny_model_dir, 1.0, True)
    # the margins are the one true pair's: it won or lost, never a self-pair's tie
    assert metrics["pairs_rewards/accuracies"] in (0.0, 1.0)


def test_the_round_adds_expert_pairs_in_proportion_and_refuses_them_without_nll():
    from flows.eto import ETOConfig

    base = {"env": {"name": "textcraft"}, "model": {"base": "smollm2-135m"}}
    with pytest.raises(ValueError, match="set dpo.nll_weight > 0"):
        ETOConfig.model_validate({**base, "explore": {"expert_sft_ratio": 1.0}})
    config = ETOConfig.model_validate(
        {**base, "explore": {"expert_sft_ratio": 1.5}, "dpo": {"nll_weight": 1.0}}
    )
    assert config.explore.expert_sft_ratio == 1.5
