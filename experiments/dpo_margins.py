"""Why did a DPO round not help? Log-probabilities of its pairs and of held-out expert actions,
under the policy it started from (the reference) and the policy it made.

For each DPO model given, on three sets of sequences:

- the round's own train pairs (what DPO optimised),
- held-out pairs built by ETO's rule from the start policy's greedy episodes on the validation
  split (the expert's trajectory against each failed episode, on tasks never trained on),
- the expert's trajectories on every validation task (chosen side only).

it reports the change in summed log-probability of the chosen and the rejected side, DPO's
implicit reward margin beta * (chosen change - rejected change) and how many pairs it ranks
right; and on the expert's actions, the mean log-probability per token, the share of tokens the
model ranks first (teacher-forced), and the share of whole agent turns it would reproduce token
for token under greedy decoding (every token ranked first): the last is what a greedy episode
needs. A DPO round that widens the margin on held-out pairs while its turn match falls is pushing
both sides down (likelihood displacement) rather than raising the right actions.

    python -m experiments.dpo_margins runs/efficacy-eto-seed0 --policy lr1e-5=DIR [--policy NAME=DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.run_files import read_records
from flywheel.records import Pair, Trajectory


@dataclass
class Scored:
    """One sequence's loss-masked tokens under one model."""

    logp: float  # summed over the masked tokens
    tokens: int
    top1: int  # masked tokens the model ranks first
    turns: int  # runs of masked tokens (agent turns)
    turns_exact: int  # turns whose every token the model ranks first
    actions: int = 0  # the turns' commands (what follows "Action:"), where marked
    actions_exact: int = 0  # commands whose every token the model ranks first, given the thought


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of every run of 1s in `mask`."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def action_spans(tokenizer, ids: list[int], mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each agent turn's command: the tokens after the one that completes
    "Action:" (a turn without it has none)."""
    spans = []
    for start, end in mask_runs(mask):
        for k in range(start, end):
            if "Action:" in tokenizer.decode(ids[start : k + 1]):
                if k + 1 < end:
                    spans.append((k + 1, end))
                break
    return spans


def score(model, ids: list[int], mask: list[int], actions=()) -> Scored:
    """Each masked token's log-probability given the tokens before it (position 0 is never
    masked: a prompt comes first); `actions` ([start, end) of token ids) are checked whole."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(ids[1:])
    token_logp = logprobs.gather(1, targets[:, None])[:, 0]
    ranked_first = logits.argmax(dim=-1) == targets
    shifted = mask[1:]
    picked = torch.tensor(shifted, dtype=torch.bool)
    runs = mask_runs(shifted)
    return Scored(
        logp=float(token_logp[picked].sum()),
        tokens=int(picked.sum()),
        top1=int(ranked_first[picked].sum()),
        turns=len(runs),
        turns_exact=sum(bool(ranked_first[a:b].all()) for a, b in runs),
        actions=len(actions),
        actions_exact=sum(bool(ranked_first[a - 1 : b - 1].all()) for a, b in actions),
    )


def pair_sequences(pairs: list[Pair], chat, max_length: int) -> list[dict]:
    from training.datasets import dpo_rows

    rows, _ = dpo_rows(pairs, chat, max_length)
    return [
        {
            side: (row["prompt_ids"] + row[f"{side}_ids"],
                   [0] * len(row["prompt_ids"]) + row[f"{side}_mask"])
            for side in ("chosen", "rejected")
        }
        for row in rows
    ]  # fmt: skip


def expert_sequences(trajectories: list[Trajectory], chat, max_length: int) -> list[tuple]:
    from training.datasets import sft_rows

    rows, _ = sft_rows(trajectories, chat, max_length)
    return [
        (ids, mask, action_spans(chat.tokenizer, ids, mask))
        for ids, mask in ((row["input_ids"], row["assistant_masks"]) for row in rows)
    ]


def held_out_sets(run: Path, split: str) -> tuple[list[Pair], list[Trajectory]]:
    """ETO's pairs on the start policy's greedy episodes of `split`, and the expert's
    trajectories on the same tasks (played in the environment, with the episodes' prefix)."""
    from envs import make_env
    from flywheel.settings import EvaluateSettings
    from tasks.build_pairs import build_pairs
    from tasks.expert_data import expert_trajectory

    folder = EvaluateSettings(split=split).folder
    start = read_records(run / folder / "sft" / "trajectories.jsonl", Trajectory)
    env = make_env(start[0].env)
    experts = []
    for episode in start:
        expert = expert_trajectory(env, episode.task_id, episode.messages[: episode.episode_start])
        if expert is not None:
            experts.append(expert)
    pairs, _ = build_pairs(start, experts)
    return pairs, experts


def pair_summary(reference: list[dict], policy: list[dict], beta: float) -> dict:
    chosen = [p["chosen"].logp - r["chosen"].logp for p, r in zip(policy, reference, strict=True)]
    rejected = [
        p["rejected"].logp - r["rejected"].logp for p, r in zip(policy, reference, strict=True)
    ]
    margins = [beta * (c - r) for c, r in zip(chosen, rejected, strict=True)]
    return {
        "pairs": len(margins),
        "chosen change": statistics.mean(chosen),
        "rejected change": statistics.mean(rejected),
        "margin": statistics.mean(margins),
        "ranked right": sum(m > 0 for m in margins),
    }


def expert_summary(scored: list[Scored]) -> dict:
    tokens = sum(s.tokens for s in scored)
    return {
        "logp per token": sum(s.logp for s in scored) / tokens,
        "top-1 tokens": sum(s.top1 for s in scored) / tokens,
        "turns exact": sum(s.turns_exact for s in scored) / sum(s.turns for s in scored),
        "actions exact": sum(s.actions_exact for s in scored)
        / max(sum(s.actions for s in scored), 1),
    }


def measure(run: Path, reference: Path, policies: dict[str, Path], pairs_file: Path | None,
            split: str, beta: float, max_length: int) -> str:  # fmt: skip
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flywheel.chat import ChatTokenizer

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(reference))
    train_pairs = read_records(pairs_file or run / "round-1" / "pairs" / "pairs.jsonl", Pair)
    held_pairs, experts = held_out_sets(run, split)
    sets = {
        "train pairs": pair_sequences(train_pairs, chat, max_length),
        f"{split} pairs": pair_sequences(held_pairs, chat, max_length),
    }
    expert_rows = expert_sequences(experts, chat, max_length)
    scored = {}
    for name, folder in {"start": reference, **policies}.items():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
        scored[name] = {
            key: [{side: score(model, *seq) for side, seq in row.items()} for row in rows]
            for key, rows in sets.items()
        } | {"experts": [score(model, *row) for row in expert_rows]}
        print(f"scored {name}", file=sys.stderr, flush=True)
    return report(scored, sets, len(experts), split, beta)


def report(scored: dict, sets: dict, experts: int, split: str, beta: float) -> str:
    lines = [
        f"| policy | set | pairs | chosen logp change | rejected logp change | margin (beta {beta})"
        " | ranked right |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in [n for n in scored if n != "start"]:
        for key in sets:
            s = pair_summary(scored["start"][key], scored[name][key], beta)
            lines.append(
                f"| {name} | {key} | {s['pairs']} | {s['chosen change']:+.2f} | "
                f"{s['rejected change']:+.2f} | {s['margin']:+.3f} | {s['ranked right']} |"
            )
    lines += [
        "",
        f"Expert trajectories on the {experts} {split} tasks (agent turns, teacher-forced):",
        "",
        "| policy | logp per token | tokens ranked first | turns reproduced greedily |"
        " commands reproduced, given the thought |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in scored:
        e = expert_summary(scored[name]["experts"])
        lines.append(
            f"| {name} | {e['logp per token']:.3f} | {100 * e['top-1 tokens']:.1f}% | "
            f"{100 * e['turns exact']:.1f}% | {100 * e['actions exact']:.1f}% |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run's folder (an efficacy run: ...-seed0)")
    parser.add_argument("--reference", type=Path, help="the start policy (default: RUN/sft/model)")
    parser.add_argument(
        "--policy", action="append", required=True, metavar="NAME=DIR", help="a DPO model folder"
    )
    parser.add_argument("--pairs", type=Path, help="train pairs (default: RUN/round-1/pairs)")
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--beta", type=float, default=0.1, help="DPO's beta, for the margin")
    parser.add_argument("--max-length", type=int, default=2048, help="as dpo.max_length")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    policies = dict(item.split("=", 1) for item in args.policy)
    text = measure(args.run, args.reference or args.run / "sft" / "model",
                   {k: Path(v) for k, v in policies.items()}, args.pairs, args.split,
                   args.beta, args.max_length)  # fmt: skip
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
