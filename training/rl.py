"""Reinforcement learning on sampled trajectories: GRPO, Dr. GRPO, RLOO, REINFORCE++ or PPO.

Reads `Trajectory` records (JSON lines) sampled beforehand (group ids, rewards, generated token
ids and, where the sampler returned them, log-probabilities), builds one row per trajectory with
loss on the sampled tokens only (`training.datasets.rl_rows`), computes advantages once with the
chosen estimator (`training.advantages`), then runs `epochs` passes of PPO's clipped surrogate,
with a k3 KL term to the starting model in the loss (grpo, dr-grpo, rloo) or a k1 penalty in the
token rewards (reinforce++, ppo), and a clipped value loss for PPO's value head.

Before the first update one forward pass of the starting model gives, per token, the reference
log-probabilities (for the KL), the old log-probabilities where the sampler recorded none (the
end-of-turn token always; whole turns from backends without log-probabilities) and, for PPO, the
old values. A group baseline without a KL term needs none of these and skips the pass
(`needs_starting_pass`); rows whose advantage is zero everywhere are then skipped too
(`rows_with_signal`).

Our own loop, not trl's GRPOTrainer: the GRPOTrainer generates its own completions in its
training step (its `rollout_func` still hands generation to the trainer, one prompt and
completion per sample) and recomputes the old log-probabilities itself, while these
trajectories are already sampled, multi-turn, with tool output between the turns and the
sampler's log-probabilities on record; and trl has no REINFORCE++ or PPO with GAE for such data.
The loop is small: on a CPU one sequence per forward (no padding, as the SFT and DPO trainers
run there), on a GPU a step's sequences right-padded into forwards of up to `FORWARD_LENGTHS`
times `max_length` tokens (`forward_chunks`); gradients accumulated over `batch_size` sequences,
AdamW at a constant learning rate.

Run alone (`python -m training.rl --config job.json`) or under `accelerate launch` / torchrun
(DDP): every process computes the starting pass and advantages for all rows (cheap next to
training, and REINFORCE++ and PPO whiten over the whole batch), then trains on its share of each
optimizer batch. The model folder is written like the trl trainers' (rank 0), PPO's value head
in a folder of its own inside it (`value_head/`: vLLM loads every `*.safetensors` at the top of a
model folder as the model's weights), picked up again when the next stage starts from it.
"""

from __future__ import annotations

import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm import tqdm
from transformers import AutoTokenizer

from flywheel.chat import ChatTokenizer
from flywheel.records import Trajectory
from flywheel.settings import RLSettings
from training.advantages import (
    aggregate,
    clipped_policy_loss,
    clipped_value_loss,
    gae_advantages,
    gigpo_advantages,
    group_index,
    grpo_advantages,
    kl_k3,
    kl_token_rewards,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)
from training.checkpoint import (
    CheckpointClock,
    CheckpointPlan,
    download_checkpoint,
    load_state,
    publish_checkpoint,
    pull_checkpoint,
    save_state,
)
from training.datasets import rl_rows, token_counts
from training.job import (
    TrainingJob,
    computes_in_bf16,
    load_model,
    mlflow_step_logger,
    parse_job,
    report_metrics,
    save_trained,
    with_lora,
    write_history,
)
from training.pareto import mixed_group_ids

VALUE_HEAD_FILE = "value_head/head.safetensors"  # not at the top: see the docstring
POLICY_FILE = "policy.safetensors"  # a checkpoint's trainable weights
KL_IN_REWARD = ("reinforce++", "ppo")  # the other estimators put the KL in the loss
GROUP_BASELINES = ("grpo", "dr-grpo", "rloo", "gigpo")  # advantages from the rewards alone


class Policy(nn.Module):
    """The language model, and PPO's value head: a linear layer on its last hidden state."""

    def __init__(self, model, value_head: nn.Linear | None, temperature: float = 1.0):
        super().__init__()
        self.model, self.value_head, self.temperature = model, value_head, temperature

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """Log-probability of each next token (B, L-1) under the sampling temperature, and the
        value of the state before it (None without a value head)."""
        out = self.model(input_ids=input_ids, output_hidden_states=self.value_head is not None)
        logits = out.logits[:, :-1].float() / self.temperature
        targets = input_ids[:, 1:, None]
        logp = logits.gather(-1, targets).squeeze(-1) - logits.logsumexp(-1)
        if self.value_head is None:
            return logp, None
        # Detached: the value loss trains the head alone and never pulls the policy's weights
        # (Agent-R1 trains a separate critic model; a second model is too much on a CPU).
        states = out.hidden_states[-1][:, :-1].detach().float()
        return logp, self.value_head(states).squeeze(-1)


def value_head_for(model, model_dir: str) -> nn.Linear:
    """The value head saved with the model, or a new one valuing every state 0."""
    head = nn.Linear(model.config.hidden_size, 1)
    saved = Path(model_dir) / VALUE_HEAD_FILE
    if saved.is_file():
        head.load_state_dict(load_file(saved))
    else:
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
    return head


@dataclass
class Rows:
    """All rows, right-padded to one length, each position a predicted (next) token."""

    input_ids: list[Tensor]  # (L,) each, unpadded
    mask: Tensor  # (B, T) bool: the policy sampled this token
    recorded_logp: Tensor  # (B, T) the sampler's log-probability, nan where not recorded
    rewards: Tensor  # (B,)
    groups: Tensor  # (B,) group index
    start_logp: Tensor | None = None  # (B, T) under the starting model
    start_values: Tensor | None = None  # (B, T) PPO's value head before training
    # GiGPO: the sampled turn each position predicts a token of (else -1), (B, T); each turn's
    # environment state as an integer (-1 past the episode's last turn), (B, K)
    turn_of_token: Tensor | None = None
    turn_anchors: Tensor | None = None

    def select(self, keep: list[int]) -> Rows:
        """These rows only (before the starting pass)."""
        return Rows(
            input_ids=[self.input_ids[i] for i in keep], mask=self.mask[keep],
            recorded_logp=self.recorded_logp[keep], rewards=self.rewards[keep],
            groups=self.groups[keep],
            turn_of_token=None if self.turn_of_token is None else self.turn_of_token[keep],
            turn_anchors=None if self.turn_anchors is None else self.turn_anchors[keep],
        )  # fmt: skip

    @property
    def old_logp(self) -> Tensor:
        """The behaviour policy's log-probabilities: recorded where the sampler gave them, the
        starting model's elsewhere."""
        return torch.where(self.recorded_logp.isnan(), self.start_logp, self.recorded_logp)


def padded(values: list[list], fill) -> Tensor:
    width = max(len(v) for v in values)
    return torch.tensor([list(v) + [fill] * (width - len(v)) for v in values])


def as_tensors(rows: list[dict]) -> Rows:
    """Rows shifted by one: position t holds token t+1, the one predicted there."""
    logprobs = [[float("nan") if p is None else p for p in r["logprobs"][1:]] for r in rows]
    states: dict[str, int] = {}  # anchor digests as integers, equal across the batch
    anchors = [[states.setdefault(a, len(states)) for a in r["turn_anchors"]] for r in rows]
    return Rows(
        input_ids=[torch.tensor(r["input_ids"]) for r in rows],
        mask=padded([r["assistant_masks"][1:] for r in rows], 0).bool(),
        recorded_logp=padded(logprobs, float("nan")).float(),
        rewards=torch.tensor([float(r["reward"]) for r in rows]),
        groups=group_index([r["group_id"] for r in rows]),
        turn_of_token=padded([r["turn_of_token"][1:] for r in rows], -1),
        turn_anchors=padded(anchors, -1),
    )


def needs_starting_pass(settings: RLSettings) -> bool:
    """Whether training needs the starting model's log-probabilities of every token before the
    first update: for a KL term (in the loss or in the rewards) and for PPO's values. Without
    them (a group baseline, no KL) the pass is skipped: a third of the stage's compute on a CPU.
    The few tokens the sampler recorded no log-probability for (the turn's end token) then take
    the policy's own at the row's first visit (`first_visit_logp`)."""
    return settings.kl_beta > 0 or settings.estimator not in GROUP_BASELINES


def first_visit_logp(rows: Rows, index: int, logp: Tensor) -> Tensor:
    """The behaviour log-probabilities of row `index`: the sampler's where recorded, elsewhere the
    policy's at this row's first visit, kept for later epochs (ratio 1 at the first visit: the
    plain policy gradient on those tokens)."""
    width = logp.shape[1]
    recorded = rows.recorded_logp[index, :width]
    filled = torch.where(recorded.isnan(), logp.detach()[0].cpu(), recorded)
    rows.recorded_logp[index, :width] = filled
    return filled[None].to(logp.device)


# On a GPU a forward holds up to this many times `max_length` padded tokens: the envelope of the
# SFT trainer's batched step there (4 rows of up to max_length, training/job.py `batched_on_gpu`),
# so a GPU that runs a stage's SFT runs its RL. One sequence a forward on an H200 (1.7B model)
# kept the device idle while the host launched kernels (bench/results-gpu-checklist.md).
FORWARD_LENGTHS = 4


def forward_tokens(settings: RLSettings, device) -> int:
    """Padded tokens a forward may hold: 0 (one sequence each) on a CPU, where padding costs more
    than batching saves."""
    return FORWARD_LENGTHS * settings.max_length if torch.device(device).type == "cuda" else 0


def forward_chunks(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """`indices` in order, cut into runs whose count times longest length stays within `budget`
    tokens; one index a run when even two would not fit."""
    chunks: list[list[int]] = []
    longest = 0
    for index in indices:
        longest = max(longest, lengths[index])
        if chunks and (len(chunks[-1]) + 1) * longest <= budget:
            chunks[-1].append(index)
        else:
            chunks.append([index])
            longest = lengths[index]
    return chunks


def forward_rows(policy: Policy, rows: Rows, chunk: list[int], device) -> list[tuple]:
    """Each row's (log-probabilities (1, L-1), values or None) from one right-padded forward:
    causal attention never looks right, so padding after a row changes none of its positions."""
    ids = [rows.input_ids[i] for i in chunk]
    logp, values = policy(nn.utils.rnn.pad_sequence(ids, batch_first=True).to(device))
    return [
        (logp[j : j + 1, : len(t) - 1], None if values is None else values[j : j + 1, : len(t) - 1])
        for j, t in enumerate(ids)
    ]


@torch.no_grad()
def starting_pass(policy: Policy, rows: Rows, device, budget: int = 0) -> None:
    """The starting model's log-probabilities (and values) of every row, once."""
    policy.eval()
    width = rows.mask.shape[1]
    lengths = [len(t) for t in rows.input_ids]
    logps, values = [], []
    chunks = forward_chunks(list(range(len(lengths))), lengths, budget)
    for chunk in tqdm(chunks, desc="rl starting pass", unit="forward"):
        for logp, value in forward_rows(policy, rows, chunk, device):
            logps.append(nn.functional.pad(logp[0].cpu(), (0, width - logp.shape[1])))
            if value is not None:
                values.append(nn.functional.pad(value[0].cpu(), (0, width - value.shape[1])))
    rows.start_logp = torch.stack(logps)
    rows.start_values = torch.stack(values) if values else None
    policy.train()


def rows_with_signal(advantages: Tensor, mask: Tensor) -> list[int]:
    """Rows with a nonzero advantage on some loss token. The others (a group whose samples all
    earned the same reward) give the clipped surrogate no gradient; without a KL term in the
    loss they change nothing, so training skips them (as DAPO's dynamic sampling does) rather
    than spend a forward and a backward pass on each."""
    return [i for i in range(len(mask)) if bool((advantages[i][mask[i]] != 0).any())]


def estimate_advantages(settings: RLSettings, rows: Rows) -> tuple[Tensor, Tensor | None]:
    """Per-token advantages (B, T) of the chosen estimator, and PPO's value targets."""
    mask, estimator = rows.mask, settings.estimator
    if estimator in ("grpo", "dr-grpo"):
        scale = estimator == "grpo"  # Dr. GRPO drops the division by the group's std
        return grpo_advantages(rows.rewards, rows.groups, mask, scale_by_std=scale), None
    if estimator == "rloo":
        return rloo_advantages(rows.rewards, rows.groups, mask), None
    if estimator == "gigpo":
        advantages = gigpo_advantages(
            rows.rewards, rows.groups, mask, rows.turn_of_token, rows.turn_anchors,
            gamma=settings.gigpo_gamma, step_weight=settings.gigpo_step_weight,
        )  # fmt: skip
        return advantages, None
    if estimator == "reinforce++":
        advantages = reinforce_pp_advantages(
            rows.rewards, rows.old_logp, rows.start_logp, mask, settings.kl_beta, settings.gamma
        )
        return advantages, None
    if estimator == "ppo":
        token_rewards = outcome_token_rewards(rows.rewards, mask) + kl_token_rewards(
            rows.old_logp, rows.start_logp, mask, settings.kl_beta
        )
        advantages, returns = gae_advantages(
            token_rewards, rows.start_values, mask, settings.gamma, settings.gae_lambda
        )
        return whiten(advantages, mask), returns  # whitened over the batch, as verl's PPO does
    raise ValueError(f"unknown estimator {estimator!r}")


def sequence_weights(mask: Tensor, aggregation: str) -> Tensor:
    """Each sequence's share of a batch's loss, its own loss being the mean over its tokens:
    token-mean weighs a sequence by its loss tokens, sequence-mean weighs each the same."""
    counts = mask.sum(dim=1).float()
    if aggregation == "token-mean":
        return counts / counts.sum().clamp(min=1)
    if aggregation == "sequence-mean":
        return (counts > 0).float() / (counts > 0).sum().clamp(min=1)
    raise ValueError(f"unknown aggregation {aggregation!r}")


@dataclass
class Sums:
    """Token sums over the loss tokens trained, for the reported means."""

    loss: float = 0.0  # sum of per-sequence losses times their weight: per optimizer step
    steps: int = 0
    tokens: int = 0
    kl: float = 0.0
    clipped: float = 0.0

    def minus(self, earlier: Sums) -> Sums:
        """What was added since `earlier` (one optimizer step's)."""
        return Sums(
            loss=self.loss - earlier.loss, steps=self.steps - earlier.steps,
            tokens=self.tokens - earlier.tokens, kl=self.kl - earlier.kl,
            clipped=self.clipped - earlier.clipped,
        )  # fmt: skip


def chunk_losses(
    policy, settings: RLSettings, rows: Rows, chunk: list[int], advantages, returns, sums: Sums
) -> Tensor:
    """The losses (one per row of `chunk`) of one forward over those rows."""
    device = next(iter(policy.parameters())).device
    outputs = forward_rows(policy, rows, chunk, device)
    return torch.stack([
        sequence_loss(settings, rows, index, logp, values, advantages, returns, sums)
        for index, (logp, values) in zip(chunk, outputs, strict=True)
    ])  # fmt: skip


def sequence_loss(
    settings: RLSettings, rows: Rows, index: int, logp, values, advantages, returns, sums: Sums
) -> Tensor:
    """One sequence's loss from its log-probabilities and values: the mean over its loss tokens
    of the clipped surrogate, plus the KL term or PPO's value loss; `sums` collects its
    statistics."""
    device = logp.device

    def row(tensor: Tensor) -> Tensor:  # this sequence's positions, unpadded, by the model
        return tensor[index, : logp.shape[1]][None].to(device)

    mask, advantage = row(rows.mask), row(advantages)
    if rows.start_logp is None:  # no starting pass: see `needs_starting_pass`
        old_logp = first_visit_logp(rows, index, logp)
        kl = torch.zeros_like(logp)
    else:
        old_logp = row(rows.old_logp)
        kl = kl_k3(logp, row(rows.start_logp), mask)
    low, high = settings.clip_low, settings.clip_high
    loss = clipped_policy_loss(logp, old_logp, advantage, mask, low, high, "token-mean")
    if settings.kl_beta and settings.estimator not in KL_IN_REWARD:
        loss = loss + settings.kl_beta * aggregate(kl, mask, "token-mean")
    if values is not None:
        old_values, target = row(rows.start_values), row(returns)
        value_loss = clipped_value_loss(values, old_values, target, mask, settings.value_clip)
        loss = loss + settings.value_loss_weight * value_loss
    with torch.no_grad():
        ratio = torch.exp(torch.where(mask, logp - old_logp, 0.0))
        # Where the clipped branch of the minimum is taken: the token's gradient is cut off.
        clipped = (ratio < 1 - low) & (advantage < 0) | (ratio > 1 + high) & (advantage > 0)
        sums.tokens += int(mask.sum())
        sums.kl += float(kl.sum())
        sums.clipped += float((clipped & mask).sum())
    return loss


def optimizer_batches(count: int, batch_size: int, processes: int, seed: int) -> list[list[int]]:
    """Row indices of each optimizer step of one epoch, shuffled; every batch a multiple of
    `processes` long (a DDP step needs a sequence on every process), the rest left for the next
    epoch's shuffle."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    batches = [order[i : i + batch_size] for i in range(0, count, batch_size)]
    batches = [b[: len(b) - len(b) % processes] for b in batches]
    return [b for b in batches if b]


def optimise(policy, optimizer, accelerator, settings, rows, advantages, returns, progress) -> Sums:
    """`settings.epochs` passes over the rows, from `progress.step` on (0, or where a checkpoint
    left off); the statistics summed over all processes. Each optimizer step is logged
    (`progress.record`) and checkpointed when due (`checkpoint_every_steps`, `_minutes`)."""
    sums = progress.sums
    rank, processes = accelerator.process_index, accelerator.num_processes
    schedule = optimizer_schedule(settings, len(rows.input_ids), processes, progress.seed)
    bar = tqdm(
        schedule, desc="rl optimizer steps", disable=not accelerator.is_main_process,
        initial=progress.step,
    )  # fmt: skip
    lengths = [len(t) for t in rows.input_ids]
    budget = forward_tokens(settings, accelerator.device)
    for batch in batches_left(schedule, progress.step):
        started, before = time.perf_counter(), replace(sums)
        weights = sequence_weights(rows.mask[batch], settings.aggregation)
        share = list(range(rank, len(batch), processes))  # positions in the batch
        chunks = forward_chunks(share, [lengths[i] for i in batch], budget)
        for step, positions in enumerate(chunks):
            last = step == len(chunks) - 1
            # DDP averages gradients over processes; the weights already sum the batch.
            with contextlib.nullcontext() if last else accelerator.no_sync(policy):
                with accelerator.autocast():
                    losses = chunk_losses(
                        policy, settings, rows, [batch[p] for p in positions], advantages,
                        returns, sums,
                    )  # fmt: skip
                chunk_weights = weights[positions].to(losses.device)
                accelerator.backward((losses * chunk_weights).sum() * processes)
            sums.loss += float((losses.detach() * chunk_weights).sum())
        grad_norm = accelerator.clip_grad_norm_(policy.parameters(), settings.max_grad_norm)
        learning_rate = optimizer.param_groups[0]["lr"]
        optimizer.step()
        optimizer.zero_grad()
        sums.steps += 1
        progress.step += 1
        step_sums = summed_over_processes(sums.minus(before), accelerator)
        progress.record(
            step_metrics(rows, advantages, batch, step_sums, grad_norm, learning_rate, started)
            | {"epoch": progress.step / len(schedule) * settings.epochs}
        )
        if progress.step < len(schedule):
            progress.maybe_checkpoint(policy, optimizer, rows, accelerator)
        bar.update(1)
        bar.set_postfix(loss=f"{sums.loss / sums.steps:.4f}")
    bar.close()
    return summed_over_processes(sums, accelerator)


def optimizer_schedule(settings, count: int, processes: int, seed: int) -> list[list[int]]:
    """Every optimizer step's rows, all epochs: fixed by the seed, so a resumed run takes the
    same batches from the step it stopped at."""
    return [
        batch
        for epoch in range(settings.epochs)
        for batch in optimizer_batches(count, settings.batch_size, processes, seed + epoch)
    ]


def batches_left(schedule: list[list[int]], step: int) -> list[list[int]]:
    """The optimizer steps of `schedule` not trained yet when `step` steps are done (0, or where
    a checkpoint left off): a resumed run trains each batch once, in the uninterrupted order."""
    return schedule[step:]


def step_metrics(rows: Rows, advantages, batch, sums: Sums, grad_norm, lr, started) -> dict:
    """One optimizer step's numbers, named as trl's trainers log theirs where trl has them."""
    mask = rows.mask[batch]
    advantage = advantages[batch][mask]
    rewards = rows.rewards[batch]
    tokens_forwarded = sum(len(rows.input_ids[i]) for i in batch)
    loss_tokens = max(sums.tokens, 1)
    return {
        "loss": sums.loss,
        "kl": sums.kl / loss_tokens,
        "clip_ratio/region_mean": sums.clipped / loss_tokens,
        "grad_norm": float(grad_norm),
        "learning_rate": lr,
        "reward": float(rewards.mean()),
        "reward_std": float(rewards.std()) if len(batch) > 1 else 0.0,
        "advantages/mean": float(advantage.mean()) if advantage.numel() else 0.0,
        "advantages/std": float(advantage.std()) if advantage.numel() > 1 else 0.0,
        "advantages/min": float(advantage.min()) if advantage.numel() else 0.0,
        "advantages/max": float(advantage.max()) if advantage.numel() else 0.0,
        "step_tokens": tokens_forwarded,
        "tokens_per_second": tokens_forwarded / max(time.perf_counter() - started, 1e-9),
    }


def summed_over_processes(sums: Sums, accelerator) -> Sums:
    local = torch.tensor([sums.loss, sums.tokens, sums.kl, sums.clipped], dtype=torch.float64)
    total = accelerator.reduce(local.to(accelerator.device), reduction="sum").cpu().tolist()
    return Sums(
        loss=total[0], steps=sums.steps, tokens=int(total[1]), kl=total[2], clipped=total[3]
    )


@dataclass
class Progress:
    """Where training stands: optimizer steps done, the sums so far, every step's numbers; what
    a checkpoint holds and a resumed run starts from."""

    seed: int
    plan: CheckpointPlan | None = None
    step: int = 0
    sums: Sums = field(default_factory=Sums)
    history: list[dict] = field(default_factory=list)
    log_step: Callable[[dict], None] | None = None  # MLflow, on the main process
    checkpoints_saved: int = 0  # by this run (not counting a killed run's)
    checkpoint_seconds: float = 0.0
    clock: CheckpointClock | None = field(init=False, default=None, repr=False)

    def record(self, metrics: dict) -> None:
        """One optimizer step's numbers; `num_tokens` counts every token forwarded so far."""
        seen = self.history[-1]["num_tokens"] if self.history else 0
        step_tokens = metrics.pop("step_tokens")
        entry = {"step": self.step, **metrics, "num_tokens": seen + step_tokens}
        self.history.append(entry)
        if self.log_step is not None:
            self.log_step(entry)

    def __post_init__(self):
        self.clock = CheckpointClock(self.plan) if self.plan is not None else None

    def maybe_checkpoint(self, policy, optimizer, rows: Rows, accelerator) -> None:
        """Checkpoint when the plan says one is due (every process calls it at every step)."""
        if self.clock is not None and self.clock.due(self.step):
            started = time.perf_counter()
            save_checkpoint(self, policy, optimizer, rows, accelerator)
            self.clock.saved()
            self.checkpoints_saved += 1
            self.checkpoint_seconds += time.perf_counter() - started


def save_checkpoint(progress: Progress, policy, optimizer, rows: Rows, accelerator) -> None:
    """Publish the trainable weights, the optimizer's state, every process's sums, RNG and
    first-visit log-probabilities, and the step reached (`training.checkpoint`)."""
    own = {
        "sums": asdict(progress.sums),
        "recorded_logp": rows.recorded_logp,
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }
    ranks = gather_object([own]) if accelerator.num_processes > 1 else [own]
    if accelerator.is_main_process:
        trained = accelerator.unwrap_model(policy).named_parameters()
        weights = {n: p.detach().cpu().contiguous() for n, p in trained if p.requires_grad}
        state = {
            "step": progress.step, "history": progress.history, "ranks": ranks,
            "optimizer": optimizer.state_dict(),
            "start_logp": rows.start_logp, "start_values": rows.start_values,
        }  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="flywheel-rl-checkpoint-") as folder:
            save_file(weights, f"{folder}/{POLICY_FILE}")
            files = {p.name: p for p in save_state(state, Path(folder), "state")}
            publish_checkpoint(progress.plan, {**files, POLICY_FILE: Path(folder, POLICY_FILE)},
                               progress.step)  # fmt: skip
    accelerator.wait_for_everyone()


def resume(progress: Progress, policy, optimizer, rows: Rows, accelerator) -> None:
    """Continue from the stage's newest checkpoint for this key, if it has one: weights,
    optimizer, sums, RNG, first-visit and starting log-probabilities, step."""
    if progress.plan is None:
        return
    with tempfile.TemporaryDirectory(prefix="flywheel-rl-resume-") as folder:
        local = Path(folder) / "checkpoint"
        # The main process picks the checkpoint (setting damaged ones aside); the others pull it.
        pulled = pull_checkpoint(progress.plan, local) if accelerator.is_main_process else None
        found = [pulled[:2] if pulled else None]
        if accelerator.num_processes > 1:
            broadcast_object_list(found)
        if found[0] is None:
            return
        url, record = found[0]
        if not pulled:
            download_checkpoint(progress.plan, url, record, local)
        state = load_state(local, "state")
        weights = load_file(str(local / POLICY_FILE))
    unexpected = accelerator.unwrap_model(policy).load_state_dict(weights, strict=False)[1]
    if unexpected:
        raise ValueError(f"checkpoint {url} holds weights this policy lacks: {unexpected[:3]}")
    optimizer.load_state_dict(state["optimizer"])
    own = state["ranks"][accelerator.process_index]
    rows.recorded_logp = own["recorded_logp"]
    rows.start_logp, rows.start_values = state["start_logp"], state["start_values"]
    torch.set_rng_state(own["rng"])
    if own["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(own["cuda_rng"])
    progress.sums, progress.step = Sums(**own["sums"]), state["step"]
    progress.history = state["history"]
    print(f"resuming from checkpoint {url} (optimizer step {progress.step})")


def group_stats(rows: Rows) -> dict[str, int]:
    groups = rows.groups.unique()
    flat = sum(
        int(rows.rewards[rows.groups == g].max() == rows.rewards[rows.groups == g].min())
        for g in groups
    )
    return {"groups": len(groups), "groups_zero_reward_variance": flat}


def save_policy(policy: Policy, tokenizer, job: TrainingJob, output_dir: str) -> None:
    save_trained(policy.model, job, output_dir)
    tokenizer.save_pretrained(output_dir)
    if policy.value_head is not None:
        head = {k: v.detach().cpu().contiguous() for k, v in policy.value_head.state_dict().items()}
        target = Path(output_dir) / VALUE_HEAD_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        save_file(head, str(target))


def read_trajectories(path: str) -> list[Trajectory]:
    with open(path) as f:
        return [Trajectory.model_validate_json(line) for line in f if line.strip()]


def mixed_outcome_groups(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The trajectories of the groups that hold both a success and a failure, in their order
    (`rl.groups: mixed`); a trajectory without a group id is a group of one, never mixed."""
    mixed = mixed_group_ids((t.group_id, t.success) for t in trajectories)
    return [t for t in trajectories if t.group_id in mixed]


def train(job: TrainingJob[RLSettings]) -> dict:
    settings = job.settings
    # bf16 autocast as the trl trainers' `bf16` and the launcher's --mixed_precision: launched
    # alone (one GPU) nothing else sets it, and a 1.7B model's RL step ran its matmuls in fp32.
    precision = "bf16" if computes_in_bf16(settings) else "no"
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=precision)
    torch.manual_seed(job.seed)
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    sampled_trajectories = read_trajectories(job.data_file)
    trajectories = sampled_trajectories
    if settings.groups == "mixed":
        trajectories = mixed_outcome_groups(sampled_trajectories)
    found, counts = rl_rows(trajectories, ChatTokenizer(tokenizer), settings.max_length)
    if not found:
        raise ValueError(
            f"{job.data_file}: no trajectory has sampled tokens to learn from within "
            f"max_length={settings.max_length} ({counts})"
            + (
                f"; rl.groups=mixed kept {len(trajectories)} of {len(sampled_trajectories)} "
                "(no group held both a success and a failure: sample more episodes per "
                "question, or set rl.groups=all)"
                if settings.groups == "mixed" and not trajectories
                else ""
            )
        )
    model = with_lora(load_model(job), job)  # the starting pass precedes every update: the
    # adapters start at zero, so the reference log-probabilities are the base model's
    head = value_head_for(model, job.model_dir) if settings.estimator == "ppo" else None
    policy = Policy(model, head, settings.temperature).to(accelerator.device)
    rows, skipped, advantages = as_tensors(found), 0, None
    sampled = {"reward_mean": float(rows.rewards.mean()), **group_stats(rows)}  # all kept
    if settings.estimator in GROUP_BASELINES and not settings.kl_beta:
        advantages, _ = estimate_advantages(settings, rows)  # from the whole groups' rewards
        keep = rows_with_signal(advantages, rows.mask)
        skipped, rows, advantages = len(found) - len(keep), rows.select(keep), advantages[keep]
        found = [found[i] for i in keep]
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=0.0)
    wrapped, optimizer = accelerator.prepare(policy, optimizer)
    progress = Progress(
        seed=job.seed, plan=job.checkpoint,
        log_step=mlflow_step_logger() if accelerator.is_main_process else None,
    )  # fmt: skip
    sums, train_seconds = Sums(), 0.0
    if found:
        resume(progress, wrapped, optimizer, rows, accelerator)
        resumed_from = progress.step
        if needs_starting_pass(settings) and rows.start_logp is None:
            starting_pass(
                policy, rows, accelerator.device, forward_tokens(settings, accelerator.device)
            )
        if advantages is None:
            advantages, returns = estimate_advantages(settings, rows)
        else:
            returns = None
        started = time.perf_counter()  # the updates alone: what trl's train_runtime times
        sums = optimise(
            wrapped, optimizer, accelerator, settings, rows, advantages, returns, progress
        )
        train_seconds = time.perf_counter() - started
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        return {}
    save_policy(accelerator.unwrap_model(wrapped), tokenizer, job, job.output_dir)
    write_history(job, progress.history)
    return {
        "resumed_from_step": resumed_from if found else 0,
        "train_runtime": train_seconds,
        "checkpoints_saved": progress.checkpoints_saved,
        "checkpoint_seconds": progress.checkpoint_seconds,
        **metrics(rows, advantages, sums, counts, found, accelerator.num_processes),
        **sampled,
        "rows_skipped_zero_advantage": skipped,
        "trajectories_dropped_uniform_outcome": len(sampled_trajectories) - len(trajectories),
    }


def metrics(rows: Rows, advantages, sums: Sums, counts, found: list[dict], processes: int) -> dict:
    """Training statistics (means over the loss tokens trained) and the data's."""
    mask = rows.mask
    recorded = mask & ~rows.recorded_logp.isnan()
    gap = 0.0
    if recorded.any() and rows.start_logp is not None:
        gap = float((rows.recorded_logp - rows.start_logp).abs()[recorded].mean())
    tokens = max(sums.tokens, 1)
    return {
        "loss": sums.loss / max(sums.steps, 1),
        "kl": sums.kl / tokens,
        "clip_fraction": sums.clipped / tokens,
        "mean_advantage": float(advantages[mask].mean()) if mask.any() else 0.0,
        "loss_tokens_trained": sums.tokens,
        "optimizer_steps": sums.steps,
        "processes": processes,
        # How far the sampler's log-probabilities are from the trainer's for the same model.
        "sampler_logprob_gap": gap,
        **counts.as_metrics(),
        **token_counts(found),
    }


def main(argv: list[str] | None = None) -> None:
    report_metrics(train(parse_job(__doc__.splitlines()[0], RLSettings, argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
