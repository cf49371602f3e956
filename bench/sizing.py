"""Sizing on paper: memory and wall time per stage from FLOP counts and hardware bounds.

The formulas (docs/sizing.md shows them with the table this prints):

- parameters of a Llama/Qwen2-style decoder, from its config: per layer q and o (h x nh*d each),
  k and v (h x nkv*d each), the MLP (3 x h x i) and two norms; the LM head (V x h; tied or not,
  it is a matmul every token);
- FLOPs: a forward token costs 2 x (non-embedding + LM head) parameters; training a token costs
  2 x forward + 4 x trainable layer parameters (backward: gradients to activations and weights),
  the LM head 4 x on each position it projects ("6 N per token" for full fine-tuning); LoRA
  keeps the backward to activations (2 x) and drops the weight gradients of frozen matrices;
  attention over a context of c tokens adds 4 x layers x nh*d x c per token;
- decode bound (tokens/s): on a CPU, compute: FLOP/s / FLOPs a token (what the rollout bench
  reports); on a GPU, the roofline: batch / max(weights' bytes + KV bytes read, FLOPs) per step,
  i.e. min(FLOP/s / FLOPs a token, batch x bandwidth / (weight bytes + batch x context x KV bytes
  a token));
- memory per GPU: bf16 weights 2 B/param; full fine-tuning adds bf16 gradients 2 B and AdamW in
  fp32 (master weights, m, v) 12 B per trainable parameter; ZeRO-2 shards gradients and optimizer
  over G GPUs, ZeRO-3 shards the weights too; activations with gradient checkpointing hold each
  layer's input (2 B x h per token per layer) plus one layer recomputed (34 B x h per token,
  Korthikanti et al. with flash attention), plus fp32 logits and their gradient on the positions
  with a loss (8 B x V each); KV cache 2 x layers x nkv x d x 2 B per token.

    python -m bench.sizing            # the table of docs/sizing.md
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

BF16 = 2  # bytes


@dataclass(frozen=True)
class Shape:
    """A decoder's dimensions, as its config.json names them."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True

    @property
    def layer_parameters(self) -> int:
        attention = 2 * self.hidden * self.heads * self.head_dim
        attention += 2 * self.hidden * self.kv_heads * self.head_dim
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def non_embedding(self) -> int:
        return self.layers * self.layer_parameters + self.hidden  # + the final norm

    @property
    def lm_head(self) -> int:
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        return self.non_embedding + self.lm_head * (1 if self.tied else 2)

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs of one forward token: 2 x (non-embedding + LM head parameters)."""
        return 2 * (self.non_embedding + self.lm_head)

    def attention_flops_per_token(self, context: int) -> int:
        """QK^T and AV over `context` earlier tokens, every layer."""
        return 4 * self.layers * self.heads * self.head_dim * context

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16

    def lora_parameters(self, rank: int) -> int:
        """LoRA on every linear layer (q, k, v, o, gate, up, down): rank x (in + out) each."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        pairs = [(self.hidden, q_out), (self.hidden, kv_out), (self.hidden, kv_out)]
        pairs += [(q_out, self.hidden), (self.hidden, self.intermediate)] * 1
        pairs += [(self.hidden, self.intermediate), (self.intermediate, self.hidden)]
        return self.layers * rank * sum(a + b for a, b in pairs)


# From the models' config.json (Hugging Face Hub).
SHAPES = {
    "smollm2-135m": Shape("SmolLM2-135M", 576, 1536, 30, 9, 3, 64, 49152),
    "0.5b": Shape("Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 64, 151936),
    "1.5b": Shape("Qwen2.5-1.5B", 1536, 8960, 28, 12, 2, 128, 151936),
    "7b": Shape("Qwen2.5-7B", 3584, 18944, 28, 28, 4, 128, 152064, tied=False),
}


@dataclass(frozen=True)
class Hardware:
    name: str
    flops: float  # dense bf16 (GPU) or float32 (CPU) matmul FLOP/s
    bandwidth: float  # memory bytes/s (None-like 0: not the bound, as on the CPU benches)
    memory: float  # bytes per device


H100 = Hardware("H100 SXM", 989e12, 3.35e12, 80e9)  # NVIDIA's datasheet, dense bf16, HBM3
# Planning efficiencies until the GPU checklist measures them: training at 40% of the matmul
# bound (the CPU benches reached 50% SFT, 90% DPO), decoding and prefill at 50% of theirs.
TRAIN_EFFICIENCY = 0.40
DECODE_EFFICIENCY = 0.50
PREFILL_EFFICIENCY = 0.50
LORA_RANK = 16


# --- throughput ------------------------------------------------------------------------------


def compute_decode_bound(shape: Shape, flops: float) -> float:
    """Tokens/s when every token's matmuls run at `flops` (the CPU rollout bench's bound)."""
    return flops / shape.flops_per_token


def decode_bound(shape: Shape, hardware: Hardware, batch: int, context: int) -> float:
    """Generated tokens/s of `batch` sequences at `context` tokens each: the roofline's lower of
    compute and memory (weights and every sequence's KV cache read once per step)."""
    step_bytes = shape.parameters * BF16 + batch * context * shape.kv_bytes_per_token
    step_flops = batch * (shape.flops_per_token + shape.attention_flops_per_token(context))
    return batch / max(step_bytes / hardware.bandwidth, step_flops / hardware.flops)


def trainable_layer_parameters(shape: Shape, frozen_layers: int) -> int:
    per_layer = shape.non_embedding // shape.layers
    return per_layer * max(0, shape.layers - frozen_layers)


def training_flops(
    shape: Shape, tokens: int, projected: int, frozen_layers: int = 0, lora: bool = False
) -> float:
    """Forward and backward FLOPs of `tokens` tokens, `projected` through the LM head (as
    bench/train_throughput.py counts them). LoRA: no weight gradients (2 x instead of 4 x)."""
    backward = (
        2 * shape.non_embedding if lora else 4 * trainable_layer_parameters(shape, frozen_layers)
    )
    return float((2 * shape.non_embedding + backward) * tokens + 4 * shape.lm_head * projected)


def train_seconds(
    flops: float, hardware_flops: float, efficiency: float, devices: int = 1
) -> float:
    return flops / (hardware_flops * efficiency * devices)


# --- memory ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    weights: float
    optimizer: float  # gradients + AdamW state
    activations: float
    kv_cache: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.optimizer + self.activations + self.kv_cache


def training_memory(
    shape: Shape, gpus: int, zero: int, lora: bool, micro_tokens: int, loss_tokens: int
) -> Memory:
    """Bytes per GPU of a training step on `micro_tokens` tokens (bf16, gradient checkpointing)."""
    trainable = shape.lora_parameters(LORA_RANK) if lora else shape.parameters
    weights = shape.parameters * BF16 / (gpus if zero >= 3 else 1)
    state = (4 + 12) * trainable if lora else (2 + 12) * trainable  # LoRA keeps fp32 adapters
    optimizer = state / (gpus if zero >= 2 else 1)
    activations = micro_tokens * (2 * shape.hidden * shape.layers + 34 * shape.hidden)
    activations += loss_tokens * shape.vocab * 8  # fp32 logits and their gradient
    return Memory(weights, optimizer, activations)


def rollout_sequences(shape: Shape, hardware: Hardware, context: int, share: float = 0.9) -> int:
    """How many sequences of `context` tokens fit in the KV cache beside the weights."""
    free = hardware.memory * share - shape.parameters * BF16
    return max(0, int(free // (context * shape.kv_bytes_per_token)))


# --- workloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One round's token budget (assumptions marked in docs/sizing.md)."""

    name: str
    sft_tokens: float  # trajectories x tokens each x epochs (0: no SFT in the round)
    sft_loss_share: float  # fraction of tokens with a loss (the LM head projects only those)
    episodes: int  # explored / rolled-out episodes
    turns: float  # mean agent turns an episode
    generated_per_turn: float
    new_prompt_per_turn: float  # observation tokens prefilled each turn (prefix cached)
    context: int  # mean context length while decoding
    dpo_tokens: float = 0.0  # pairs x 2 sides x tokens x epochs
    rl_tokens: float = 0.0  # trajectory tokens updated on (3 passes: old, ref, update)


WEBSHOP_TOKENS, SCIWORLD_TOKENS = 1200, 2500  # assumed mean tokens of an expert trajectory
WORKLOADS = {
    "eto-webshop": Workload(
        "ETO round, WebShop", sft_tokens=1938 * WEBSHOP_TOKENS * 3, sft_loss_share=0.2,
        episodes=1938, turns=5, generated_per_turn=40, new_prompt_per_turn=200, context=1200,
        dpo_tokens=1938 * 2 * WEBSHOP_TOKENS * 1,
    ),
    "eto-sciworld": Workload(
        "ETO round, ScienceWorld", sft_tokens=1483 * SCIWORLD_TOKENS * 3, sft_loss_share=0.2,
        episodes=1483, turns=15, generated_per_turn=30, new_prompt_per_turn=120, context=2500,
        dpo_tokens=1483 * 2 * SCIWORLD_TOKENS * 1,
    ),
    # Agent-R1 legacy run_grpo_hotpotqa.sh: 128 questions x 5 rollouts, <= 5 turns (one step).
    "agent-r1-step": Workload(
        "Agent-R1 step (128 questions x 5)", sft_tokens=0, sft_loss_share=0.0,
        episodes=128 * 5, turns=3, generated_per_turn=150, new_prompt_per_turn=500, context=2000,
        rl_tokens=128 * 5 * 2000,
    ),
}  # fmt: skip


def stage_seconds(shape: Shape, work: Workload, hardware: Hardware, gpus: int, lora: bool) -> dict:
    """Wall seconds of each stage of one round on `gpus` GPUs (data parallel, planning
    efficiencies); rollouts run one vLLM replica per GPU at the batch the KV cache holds."""
    flops = hardware.flops * gpus
    times = {}
    if work.sft_tokens:
        loss = work.sft_tokens * work.sft_loss_share
        f = training_flops(shape, int(work.sft_tokens), int(loss), lora=lora)
        times["sft"] = train_seconds(f, flops, TRAIN_EFFICIENCY)
    per_gpu = max(1, work.episodes // gpus)
    batch = max(1, min(per_gpu, rollout_sequences(shape, hardware, work.context)))
    generated = work.episodes * work.turns * work.generated_per_turn
    decode = decode_bound(shape, hardware, batch, work.context) * DECODE_EFFICIENCY * gpus
    prefill = work.episodes * work.turns * work.new_prompt_per_turn * shape.flops_per_token
    times["explore"] = generated / decode + prefill / (flops * PREFILL_EFFICIENCY)
    if work.dpo_tokens:  # the reference's log-probs once (a forward), then training
        f = training_flops(shape, int(work.dpo_tokens), int(work.dpo_tokens * 0.2), lora=lora)
        f += shape.flops_per_token * work.dpo_tokens
        times["dpo"] = train_seconds(f, flops, TRAIN_EFFICIENCY)
    if work.rl_tokens:  # old policy and reference log-probs (two forwards), then the update
        f = training_flops(shape, int(work.rl_tokens), int(work.rl_tokens * 0.25), lora=lora)
        f += 2 * shape.flops_per_token * work.rl_tokens
        times["rl update"] = train_seconds(f, flops, TRAIN_EFFICIENCY)
    return times


# --- the table -------------------------------------------------------------------------------


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f}"


def _time(seconds: float) -> str:
    return f"{seconds / 60:,.1f} min" if seconds < 3600 else f"{seconds / 3600:,.1f} h"


def memory_table(micro_tokens: int = 4096, loss_share: float = 0.25) -> list[str]:
    lines = [
        f"| model | params | setup | weights GB | grads+optimizer GB | activations GB "
        f"({micro_tokens} tokens) | total GB/GPU | fits 80 GB |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    setups = [("full, 1 GPU", 1, 0, False), ("full, 8 GPUs ZeRO-2", 8, 2, False),
              ("full, 8 GPUs ZeRO-3", 8, 3, False), (f"LoRA r={LORA_RANK}, 1 GPU", 1, 0, True)]  # fmt: skip
    for key in ("0.5b", "1.5b", "7b"):
        shape = SHAPES[key]
        for label, gpus, zero, lora in setups:
            m = training_memory(
                shape, gpus, zero, lora, micro_tokens, int(micro_tokens * loss_share)
            )
            lines.append(
                f"| {shape.name} | {shape.parameters / 1e9:.2f}B | {label} | {_gb(m.weights)} "
                f"| {_gb(m.optimizer)} | {_gb(m.activations)} | {_gb(m.total)} "
                f"| {'yes' if m.total < H100.memory else 'no'} |"
            )
    return lines


def rollout_table() -> list[str]:
    lines = [
        "| model | weights GB | KV KB/token | sequences of 2,000 tokens in 90% of 80 GB "
        "| decode bound, batch 1 (tok/s) | decode bound at that batch (tok/s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key in ("0.5b", "1.5b", "7b"):
        shape = SHAPES[key]
        n = rollout_sequences(shape, H100, 2000)
        lines.append(
            f"| {shape.name} | {_gb(shape.parameters * BF16)} | {shape.kv_bytes_per_token / 1024:.0f} "
            f"| {n:,} | {decode_bound(shape, H100, 1, 2000):,.0f} "
            f"| {decode_bound(shape, H100, n, 2000):,.0f} |"
        )
    return lines


def time_table() -> list[str]:
    lines = [
        "| model | round | method | GPUs | " + " | ".join(("sft", "explore", "dpo", "rl update"))
        + " | round |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for key in ("0.5b", "1.5b", "7b"):
        shape = SHAPES[key]
        for work in WORKLOADS.values():
            for lora in (False, True):
                for gpus in (1, 8):
                    t = stage_seconds(shape, work, H100, gpus, lora)
                    m = training_memory(shape, gpus, 3 if gpus > 1 else 0, lora, 4096, 1024)
                    mark = "" if m.total < H100.memory else " (no fit)"
                    cells = [
                        (_time(t[s]) + (mark if s != "explore" else "")) if s in t else "-"
                        for s in ("sft", "explore", "dpo", "rl update")
                    ]
                    method = f"LoRA r={LORA_RANK}" if lora else "full"
                    lines.append(
                        f"| {shape.name} | {work.name} | {method} | {gpus} | "
                        + " | ".join(cells) + f" | {_time(sum(t.values()))} |"
                    )  # fmt: skip
    return lines


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(f"Hardware: {H100.name}, {H100.flops / 1e12:.0f} TFLOP/s bf16, "
          f"{H100.bandwidth / 1e12:.2f} TB/s, {H100.memory / 1e9:.0f} GB; efficiencies: training "
          f"{TRAIN_EFFICIENCY:.0%}, decode {DECODE_EFFICIENCY:.0%}, prefill {PREFILL_EFFICIENCY:.0%}\n")  # fmt: skip
    print("\n".join(memory_table()) + "\n")
    print("\n".join(rollout_table()) + "\n")
    print("\n".join(time_table()))


if __name__ == "__main__":
    main()
