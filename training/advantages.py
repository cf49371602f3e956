"""Advantage estimators and the PPO-style losses, one small function each, on plain torch tensors.

Shapes: B sequences of T token positions (padded). `loss_mask` (B, T) is true where the model
generated the token. Every other position (prompt, tool results, observations, template tokens
it did not sample, padding) gets zero advantage and zero loss, and its value (log-probability,
value estimate, anything, even inf or nan) never enters a statistic: masks are applied with
`torch.where`, not by multiplying, so a masked inf cannot turn into nan.

Sequence rewards are (B,); `group_ids` (B,) integers say which sequences answer the same prompt
(`group_index` turns trajectories' group ids into them).

Estimators:
- `grpo_advantages`: (r - group mean) / (group std + eps), the std unbiased as trl computes it;
  `scale_by_std=False` is Dr. GRPO's r - group mean.
- `rloo_advantages`: r_i - mean of the other rewards of its group.
- `reinforce_pp_advantages` (REINFORCE++): per-token reward -beta * (logp - ref_logp), the outcome
  reward added at the last generated token, discounted return-to-go, whitened over all loss
  tokens of the batch.
- `gae_advantages` (PPO): generalised advantage estimation from a value model's per-token values.
- `gigpo_advantages` (GiGPO, Feng et al. 2025): GRPO's episode advantage plus `step_weight` x a
  step advantage, computed within "anchor states": the turns of a group's episodes that act from
  the same environment state, compared by their discounted returns.

Multi-turn sequences: a return-to-go or GAE recursion steps over generated tokens only. The tokens
between two turns (a tool's output) are the environment's doing, not actions, so they neither
take a discount step nor carry a value: the state after the last token of a turn is valued at
the first token of the next.

A group of one, or all of whose rewards are equal, has zero GRPO and RLOO advantage: there is
nothing to compare.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token-mean", "sequence-mean"]


def group_index(group_ids: list[str | None]) -> Tensor:
    """Integer group ids for `grpo_advantages` and `rloo_advantages`, from trajectories' own
    (`Trajectory.group_id`); a sequence without one is a group of its own."""
    numbers: dict[str, int] = {}
    index = []
    for position, group in enumerate(group_ids):
        key = group if group is not None else f"\0alone-{position}"
        index.append(numbers.setdefault(key, len(numbers)))
    return torch.tensor(index, dtype=torch.long)


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each sequence's group mean, unbiased group std (0 for a group of one) and group size.

    A group whose rewards are all equal gets exactly its reward as mean and 0 as std: summed in
    floating point, eight rewards of 0.1 have a mean a few ulps off, which GRPO's division by a
    near-zero std turns into a small advantage of one sign on every token of the group (and
    the trainer no longer skips the group as one without signal)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    zeros = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device)
    size = zeros.index_add(0, inverse, torch.ones_like(rewards))
    mean = zeros.index_add(0, inverse, rewards) / size
    low = zeros.scatter_reduce(0, inverse, rewards, "amin", include_self=False)
    high = zeros.scatter_reduce(0, inverse, rewards, "amax", include_self=False)
    mean = torch.where(low == high, low, mean)
    squares = zeros.index_add(0, inverse, (rewards - mean[inverse]) ** 2)
    std = torch.where(size > 1, (squares / (size - 1).clamp(min=1)).sqrt(), 0.0)
    return mean[inverse], std[inverse], size[inverse]


def per_token(sequence_values: Tensor, loss_mask: Tensor) -> Tensor:
    """A value per sequence (B,) on each of its loss tokens (B, T); zero elsewhere."""
    values = sequence_values[:, None].expand(loss_mask.shape)
    return torch.where(loss_mask.bool(), values, 0.0)


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    mean, std, _ = _group_stats(rewards, group_ids)
    advantages = rewards - mean
    if scale_by_std:
        advantages = advantages / (std + eps)
    return per_token(advantages, loss_mask)


def rloo_advantages(rewards: Tensor, group_ids: Tensor, loss_mask: Tensor) -> Tensor:
    # mean of the others = (n * mean - r_i) / (n - 1)
    mean, std, size = _group_stats(rewards, group_ids)
    others = (size * mean - rewards) / (size - 1).clamp(min=1)
    # std is exactly 0 for a group of equal rewards, where `others` may be a few ulps off
    return per_token(torch.where((size > 1) & (std > 0), rewards - others, 0.0), loss_mask)


def gigpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    turn_of_token: Tensor,
    turn_anchors: Tensor,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GiGPO: A = A_episode + step_weight x A_step on each turn's loss tokens.

    `turn_of_token` (B, T): the index k of the turn a generated token belongs to (-1 elsewhere).
    `turn_anchors` (B, K): an integer naming the environment state turn k acted from (-1 past the
    episode's last turn); equal integers in one group are one anchor state. The sparse outcome
    reward gives turn k of an episode of K turns the discounted return gamma^(K-1-k) x reward.
    Within each (group, anchor state), a turn's step advantage is its return less the anchor
    group's mean, over its std with `scale_by_std`; an anchor state met once has none."""
    episode = grpo_advantages(rewards, group_ids, loss_mask, scale_by_std, eps)
    valid = turn_anchors >= 0
    turns = valid.sum(dim=1, keepdim=True)
    k = torch.arange(turn_anchors.shape[1], device=rewards.device)[None, :]
    returns = rewards[:, None] * gamma ** (turns - 1 - k).clamp(min=0).to(rewards.dtype)
    rows, columns = valid.nonzero(as_tuple=True)
    pairs = torch.stack([group_ids[rows], turn_anchors[rows, columns]], dim=1)
    _, step_groups = torch.unique(pairs, dim=0, return_inverse=True)
    mean, std, _ = _group_stats(returns[rows, columns], step_groups)
    step = returns[rows, columns] - mean
    if scale_by_std:
        step = step / (std + eps)
    per_turn = torch.zeros_like(returns)
    per_turn[rows, columns] = step
    index = turn_of_token.clamp(min=0)
    per_token_step = torch.gather(per_turn, 1, index.clamp(max=per_turn.shape[1] - 1))
    on_turn = loss_mask.bool() & (turn_of_token >= 0)
    return episode + step_weight * torch.where(on_turn, per_token_step, 0.0)


# ---- token-level rewards and returns ------------------------------------------------------------


def outcome_token_rewards(rewards: Tensor, loss_mask: Tensor) -> Tensor:
    """(B, T): each sequence's reward on its last generated token, zero elsewhere (a sequence
    with no generated token has nowhere to put it)."""
    mask = loss_mask.bool()
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    last = (mask * positions).argmax(dim=1)  # the highest position with mask 1
    placed = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    placed[torch.arange(mask.shape[0]), last] = rewards
    return torch.where(mask, placed, 0.0)


def kl_token_rewards(logp: Tensor, ref_logp: Tensor, loss_mask: Tensor, beta: float) -> Tensor:
    """-beta * (logp - ref_logp) on loss tokens: the k1 estimate of KL(policy || reference) as a
    penalty on each generated token."""
    return torch.where(loss_mask.bool(), -beta * (logp - ref_logp), 0.0)


def discounted_returns(token_rewards: Tensor, loss_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Return-to-go G_t = r_t + gamma * G_next over the generated tokens; G_next is the return at
    the next generated token (masked tokens in between take no discount step)."""
    mask = loss_mask.bool()
    returns = torch.zeros_like(token_rewards)
    following = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(mask.shape[1])):
        following = torch.where(mask[:, t], token_rewards[:, t] + gamma * following, following)
        returns[:, t] = torch.where(mask[:, t], following, 0.0)
    return returns


def whiten(values: Tensor, loss_mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps), the mean and (population) variance over the loss tokens of
    the whole batch; zero off the mask."""
    mask = loss_mask.bool()
    count = mask.sum().clamp(min=1)
    mean = torch.where(mask, values, 0.0).sum() / count
    variance = torch.where(mask, (values - mean) ** 2, 0.0).sum() / count
    return torch.where(mask, (values - mean) * torch.rsqrt(variance + eps), 0.0)


def reinforce_pp_advantages(
    rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    loss_mask: Tensor,
    beta: float = 0.01,
    gamma: float = 1.0,
) -> Tensor:
    """REINFORCE++: KL-penalised token rewards plus the outcome, returns-to-go, whitened."""
    token_rewards = outcome_token_rewards(rewards, loss_mask)
    token_rewards = token_rewards + kl_token_rewards(logp.detach(), ref_logp, loss_mask, beta)
    return whiten(discounted_returns(token_rewards, loss_mask, gamma), loss_mask)


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """PPO's GAE: delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam * A_next,
    next = the next generated token (0 after the last); returns = A + V. (advantages, returns),
    both zero off the mask."""
    mask, values = loss_mask.bool(), values.detach()
    advantages = torch.zeros_like(token_rewards)
    next_value = next_advantage = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(mask.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(mask[:, t], advantage, 0.0)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        next_advantage = torch.where(mask[:, t], advantage, next_advantage)
    return advantages, torch.where(mask, advantages + values, 0.0)


# ---- losses -------------------------------------------------------------------------------------


def aggregate(per_token_loss: Tensor, loss_mask: Tensor, aggregation: Aggregation) -> Tensor:
    """token-mean: the mean over all loss tokens of the batch (long replies weigh more);
    sequence-mean: each sequence's mean over its loss tokens, then the mean over sequences that
    have any (every reply weighs the same)."""
    mask = loss_mask.bool()
    losses = torch.where(mask, per_token_loss, 0.0)
    if aggregation == "token-mean":
        return losses.sum() / mask.sum().clamp(min=1)
    if aggregation == "sequence-mean":
        counts = mask.sum(dim=1)
        means = losses.sum(dim=1) / counts.clamp(min=1)
        return means[counts > 0].sum() / (counts > 0).sum().clamp(min=1)
    raise ValueError(f"unknown aggregation {aggregation!r}")


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
) -> Tensor:
    """PPO's clipped surrogate: -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A),
    ratio = exp(logp - old_logp). `clip_high` above `clip_low` is DAPO's clip-higher."""
    mask = loss_mask.bool()
    ratio = torch.exp(torch.where(mask, logp - old_logp, 0.0))
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token_loss = -torch.minimum(ratio * advantages, clipped * advantages)
    return aggregate(per_token_loss, mask, aggregation)


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    clip: float = 0.2,
    aggregation: Aggregation = "token-mean",
) -> Tensor:
    """0.5 * max((V - R)^2, (V_clipped - R)^2), V_clipped = V_old + clip(V - V_old, -clip, clip):
    the value model is not rewarded for moving further than `clip` from where it was."""
    mask = loss_mask.bool()  # off the mask every input is 0, so no gradient there is nan
    values, old_values, returns = (torch.where(mask, x, 0.0) for x in (values, old_values, returns))
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    per_token_loss = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return aggregate(per_token_loss, mask, aggregation)


def kl_k3(logp: Tensor, ref_logp: Tensor, loss_mask: Tensor) -> Tensor:
    """Per-token KL(policy || reference), the k3 estimate GRPO adds to its loss:
    exp(ref - logp) - (ref - logp) - 1, never negative; zero off the mask."""
    mask = loss_mask.bool()
    difference = torch.where(mask, ref_logp - logp, 0.0)
    return torch.where(mask, torch.exp(difference) - difference - 1, 0.0)
