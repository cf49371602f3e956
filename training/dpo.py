"""DPO on trajectory pairs with trl's DPOTrainer, observation tokens masked out of the loss.

ETO's DPO scores only the agent's own turns of a multi-turn continuation. trl's collator marks the
whole continuation, so `MaskedPreferenceCollator` narrows its `completion_mask` to the loss masks
our records carry, and `TokenizedDPOTrainer` takes the already tokenized rows as they are.
Run alone (`python -m training.dpo --config job.json`) or under `accelerate launch`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import DPOConfig, DPOTrainer
from trl.trainer.dpo_trainer import DataCollatorForPreference

from flywheel.chat import ChatTokenizer
from flywheel.records import Pair
from flywheel.settings import DPOSettings
from training.datasets import dpo_rows, token_counts
from training.job import (
    TrainingJob,
    computes_in_bf16,
    load_model,
    new_adapters,
    parse_job,
    report_metrics,
    train_and_save,
    trainer_defaults,
)


@dataclass
class MaskedPreferenceCollator(DataCollatorForPreference):
    """trl's collator, with `completion_mask` set from the rows' own `chosen_mask` and
    `rejected_mask` (1 = the agent's tokens), cut from the same end trl cuts the ids from.

    Rows from `dpo_rows` already fit in `max_length`; the cut only matters for longer ones.
    """

    def torch_call(self, examples: list[dict]) -> dict:
        batch = super().torch_call(examples)  # raises on an unknown truncation_mode
        masks = [[0] * len(e["prompt_ids"]) + e["chosen_mask"] for e in examples]
        masks += [[0] * len(e["prompt_ids"]) + e["rejected_mask"] for e in examples]
        if self.max_length is not None:  # the parent's cut: the first or the last max_length
            kept = (
                slice(-self.max_length, None)
                if self.truncation_mode == "keep_end"
                else slice(None, self.max_length)
            )
            masks = [m[kept] for m in masks]
        width = batch["completion_mask"].shape[1]
        padded = torch.zeros((len(masks), width), dtype=batch["completion_mask"].dtype)
        for row, mask in enumerate(masks):
            padded[row, : len(mask)] = torch.tensor(mask[:width], dtype=padded.dtype)
        batch["completion_mask"] = padded
        return batch


class TokenizedDPOTrainer(DPOTrainer):
    """Rows arrive tokenized (prompt/chosen/rejected ids and masks); skip trl's text tokenising."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        return dataset

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        self._signature_columns = [*self._signature_columns, "chosen_mask", "rejected_mask"]


def load_reference(job: TrainingJob[DPOSettings]):
    """DPO's reference where it is not the policy (`job.reference_dir`), frozen: in bf16 where
    the job computes in bf16 (it is never trained), an adapter folder merged into its base."""
    if job.reference_dir is None:
        return None
    from transformers import AutoModelForCausalLM

    from flywheel.model import lora_adapter

    adapter = lora_adapter(job.reference_dir)
    model = AutoModelForCausalLM.from_pretrained(
        adapter.base if adapter else job.reference_dir,
        dtype="bfloat16" if computes_in_bf16(job.settings) else "float32",
    )
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter.folder)).merge_and_unload()
    return model.eval().requires_grad_(False)


def pair_margins(trainer: DPOTrainer) -> dict:
    """The trained policy on its own pairs: mean log-probabilities of the chosen and rejected
    sides, DPO's implicit rewards (beta x log-ratio to the reference; a chosen reward below 0 is
    the expert's actions losing likelihood) and their margin, and how often chosen wins."""
    # The true pairs: an expert trajectory paired with itself (IPR's SFT rows) has no margin.
    # The reference log-probabilities are in the training rows already.
    trainer.eval_dataset = trainer.train_dataset.filter(
        lambda row: row["chosen_ids"] != row["rejected_ids"]
    )
    if len(trainer.eval_dataset) == 0:
        return {}
    measured = trainer.evaluate(metric_key_prefix="pairs")
    names = ("logps/chosen", "logps/rejected", "rewards/chosen", "rewards/rejected",
             "rewards/margins", "rewards/accuracies")  # fmt: skip
    # trl names its own DPO metrics "eval_..." whatever the prefix
    found = {n: measured.get(f"pairs_{n}", measured.get(f"eval_{n}")) for n in names}
    return {f"pairs_{n}": float(value) for n, value in found.items() if value is not None}


def train(job: TrainingJob[DPOSettings]) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    chat = ChatTokenizer(tokenizer)
    with open(job.data_file) as f:
        pairs = [Pair.model_validate_json(line) for line in f if line.strip()]
    max_length = job.settings.max_length
    rows, counts = dpo_rows(pairs, chat, max_length)
    if not rows:
        raise ValueError(f"no pair fits in max_length={max_length} ({job.data_file}: {counts})")
    defaults = trainer_defaults(job)
    # The pairs are scored once trained (`pair_margins`) in the batches they trained in.
    defaults.setdefault("per_device_eval_batch_size", defaults["per_device_train_batch_size"])
    config = DPOConfig(max_length=max_length, **defaults)
    model = load_model(job)
    collator = MaskedPreferenceCollator(
        pad_token_id=tokenizer.pad_token_id,
        max_length=config.max_length,
        truncation_mode=config.truncation_mode,
    )
    trainer = TokenizedDPOTrainer(
        model=model,
        ref_model=load_reference(job),
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=new_adapters(model, job),
        data_collator=collator,
    )
    if config.precompute_ref_log_probs:
        trainer.ref_model = None  # its log-probabilities are in the rows now: free its memory
    metrics = train_and_save(trainer, tokenizer, job, len(rows), measure=pair_margins)
    return {**metrics, **counts.as_metrics(), **token_counts(rows)} if metrics else metrics


def main(argv: list[str] | None = None) -> None:
    report_metrics(train(parse_job(__doc__.splitlines()[0], DPOSettings, argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
