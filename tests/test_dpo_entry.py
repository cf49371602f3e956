"""The DPO entry point (`training.dpo.train`, `main`) without a training run: what it hands the
trainer (rows, collator, config, tokenizer), what it returns, and what it refuses. The trainer
itself is replaced by a recorder; the real run is in the slow flow tests."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

import training.dpo as dpo  # noqa: E402
from flywheel.records import Message, Pair  # noqa: E402
from flywheel.settings import DPOSettings  # noqa: E402
from training.datasets import dpo_rows  # noqa: E402
from training.job import TrainingJob  # noqa: E402


def dpo_job(model_dir: str, data_file: str, output_dir, trl_args=None, **settings) -> TrainingJob:
    """A DPO job; `settings` unchecked, so that a test may fit nothing in a short max_length."""
    return TrainingJob[DPOSettings](
        model_dir=model_dir, data_file=data_file, output_dir=str(output_dir), seed=0,
        settings=DPOSettings().model_copy(update=settings), trl_args=trl_args or {},
    )  # fmt: skip


SYSTEM = Message(role="system", content="You craft items.")
TASK = Message(role="user", content="Goal: craft x.")


def side(steps: int, verb: str, final: str) -> list[Message]:
    messages = []
    for i in range(steps - 1):
        messages += [
            Message(
                role="assistant", content=f"Thought: step {i}\nAction: {verb} {i} a", loss=True
            ),
            Message(role="user", content=f"Observation: Got {i} a"),
        ]
    return [*messages, Message(role="assistant", content=f"Action: {final}", loss=True)]


def make_pair(chosen: int, rejected: int) -> Pair:
    return Pair(task_id="x", prompt=[SYSTEM, TASK], chosen=side(chosen, "get", "craft 1 x"),
                rejected=side(rejected, "fetch", "inventory"), chosen_reward=1.0,
                rejected_reward=0.0)  # fmt: skip


class Recorder:
    """Stands in for TokenizedDPOTrainer: keeps what it was built with."""

    built: list[dict] = []

    def __init__(self, **kwargs):
        Recorder.built.append(kwargs)


@pytest.fixture
def recorded(monkeypatch, chat, base_model_dir):
    """`train` with the trainer and the model replaced; the tokenizer has no pad token."""
    from transformers import AutoTokenizer

    Recorder.built = []
    saved, loaded = [], []
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    tokenizer.pad_token = None
    monkeypatch.setattr(
        dpo.AutoTokenizer, "from_pretrained", lambda path: loaded.append(path) or tokenizer
    )
    monkeypatch.setattr(dpo, "load_model", lambda job: ("model", job))
    monkeypatch.setattr(dpo, "TokenizedDPOTrainer", Recorder)

    def fake_train_and_save(trainer, tok, job, rows, measure=None):
        saved.append((trainer, tok, job, rows))
        return {"train_loss": 0.25, "rows": rows}

    monkeypatch.setattr(dpo, "train_and_save", fake_train_and_save)
    return tokenizer, saved, loaded


def write_pairs(path, pairs: list[Pair]) -> str:
    path.write_text("".join(p.model_dump_json() + "\n\n" for p in pairs))  # blank lines skipped
    return str(path)


def test_train_hands_the_trainer_masked_rows_and_a_collator_cut_like_trl(tmp_path, recorded, chat):
    tokenizer, saved, loaded = recorded
    pairs = [make_pair(3, 2), make_pair(2, 4)]
    prompt_len = len(chat.encode(pairs[0].prompt)[0])
    long = make_pair(12, 1)  # shortened to fit, still kept
    pairs.append(long)
    max_length = prompt_len + 120
    data = write_pairs(tmp_path / "p.jsonl", pairs)
    job = dpo_job("m", data, tmp_path / "out", max_length=max_length, frozen_layers=1)
    metrics = dpo.train(job)

    want_rows, counts = dpo_rows(pairs, chat, max_length)
    assert counts.rows == 3 and counts.rows_shortened == 1
    (kwargs,) = Recorder.built
    assert kwargs["model"] == ("model", job)
    assert kwargs["train_dataset"].to_list() == want_rows
    assert kwargs["processing_class"] is tokenizer
    # No pad token of its own: the end-of-sequence token pads.
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    config = kwargs["args"]
    assert config.max_length == max_length and config.truncation_mode == "keep_start"
    assert config.remove_unused_columns is False and config.per_device_train_batch_size == 1
    collator = kwargs["data_collator"]
    assert isinstance(collator, dpo.MaskedPreferenceCollator)
    assert collator.pad_token_id == tokenizer.eos_token_id == tokenizer.pad_token_id
    assert collator.max_length == max_length and collator.truncation_mode == "keep_start"
    ((trainer, tok, saved_job, rows),) = saved
    assert isinstance(trainer, Recorder) and loaded == ["m"]
    assert tok is tokenizer and saved_job is job and rows == 3
    # Each side is forwarded with the prompt: the prompt counts twice per row.
    tokens = sum(2 * len(r["prompt_ids"]) + len(r["chosen_ids"]) + len(r["rejected_ids"])
                 for r in want_rows)  # fmt: skip
    learned = sum(sum(r["chosen_mask"]) + sum(r["rejected_mask"]) for r in want_rows)
    assert metrics == {"train_loss": 0.25, "rows": 3, "rows_shortened": 1,
                       "rows_dropped_too_long": 0, "rows_dropped_no_loss": 0,
                       "tokens_per_epoch": tokens, "loss_tokens_per_epoch": learned}  # fmt: skip
    assert 0 < learned < tokens


def test_train_keeps_a_pad_token_the_tokenizer_has(tmp_path, monkeypatch, recorded):
    tokenizer, _, loaded = recorded
    tokenizer.pad_token = "<|endoftext|>"  # not the end-of-sequence token
    data = write_pairs(tmp_path / "p.jsonl", [make_pair(2, 2)])
    job = dpo_job("m", data, tmp_path, trl_args={"truncation_mode": "keep_end"})
    dpo.train(job)
    (kwargs,) = Recorder.built
    assert tokenizer.pad_token == "<|endoftext|>" and loaded == ["m"]
    # trl cuts from the end here: the collator cuts the masks from the same end.
    assert kwargs["args"].truncation_mode == kwargs["data_collator"].truncation_mode == "keep_end"
    assert kwargs["data_collator"].pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert kwargs["data_collator"].pad_token_id != tokenizer.eos_token_id


def test_train_returns_no_metrics_off_rank_zero(tmp_path, monkeypatch, recorded):
    monkeypatch.setattr(dpo, "train_and_save", lambda *a, **k: {})
    job = dpo_job("m", write_pairs(tmp_path / "p.jsonl", [make_pair(2, 2)]), tmp_path)
    assert dpo.train(job) == {}


def test_train_refuses_data_with_no_pair_that_fits(tmp_path, recorded, chat):
    pairs = [make_pair(2, 2), make_pair(3, 3)]
    job = dpo_job("m", write_pairs(tmp_path / "p.jsonl", pairs), tmp_path, max_length=8)
    message = (
        f"no pair fits in max_length=8 ({job.data_file}: RowCounts(rows=0, rows_shortened=0, "
        f"rows_dropped_too_long=2, rows_dropped_no_loss=0))"
    )
    with pytest.raises(ValueError) as error:
        dpo.train(job)
    assert str(error.value) == message
    assert Recorder.built == []


def test_main_reads_the_job_file_and_reports_trains_metrics(tmp_path, monkeypatch, capsys):
    job = dpo_job("model", "data.jsonl", tmp_path / "out", max_length=77)
    config = job.save(tmp_path / "job.json")
    seen = []
    monkeypatch.setattr(dpo, "train", lambda j: seen.append(j) or {"train_loss": 1.5})
    target = tmp_path / "metrics.json"
    monkeypatch.setenv("FLYWHEEL_METRICS_FILE", str(target))
    dpo.main(["--config", str(config)])
    assert seen == [job]
    assert json.loads(target.read_text()) == {"train_loss": 1.5}
    with pytest.raises(SystemExit):
        dpo.main(["--help"])
    assert "DPO on trajectory pairs with trl's DPOTrainer" in capsys.readouterr().out


def test_the_trainer_keeps_the_mask_columns_and_takes_rows_as_they_are():
    trainer = object.__new__(dpo.TokenizedDPOTrainer)
    trainer._signature_columns = None
    trainer._is_vision_dataset = False
    trainer._set_signature_columns_if_needed()
    assert trainer._signature_columns == [
        "prompt_ids", "chosen_ids", "rejected_ids", "ref_chosen_logps", "ref_rejected_logps",
        "chosen_mask", "rejected_mask",
    ]  # fmt: skip
    rows = object()
    assert trainer._prepare_dataset(rows, None, None, "train") is rows
