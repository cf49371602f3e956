"""How often the Agent-R critique's first error is the environment oracle's, old way and new.

Loads a finished Agent-R run's round (its MCTS trees, path pairs and the policy that searched
them, found through the stages' `_MANIFEST.json`), and runs `tasks.critique.critique_pairs` on
the pairs' bad paths with several critique settings: the likelihood critique as the demo ran it,
with contextual calibration (`calibration: content_free`), and with `locate: most_bad`. The model
runs on CPU with transformers; every (prompt, reply) is scored once and shared by all settings.

    .venv/bin/python -m experiments.critique_agreement --run /work/main/runs/agent-r-textcraft \\
        --pairs all --out experiments/results-critique.md

`--pairs selected` judges the pairs the run's select-paths stage chose; `all` pairs every failed
leaf of a tree that has a good leaf with one (the select-paths rule without its cap), for more n.
The table: verdicts given, first errors found, exact and within-one-step agreement with the
oracle's first error (TextCraft: the first wasted step from the divergence on), the agreement of
a critic that always names the first judged step (the divergence), and per judged step the AUC of
P(Bad) against the oracle's wasted-step flag (0.5: no better than chance).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from agents.mcts import Critique, PathPair, SearchTree
from bench.run_files import read_records
from tasks.critique import CritiqueSettings, critique_metrics, critique_pairs
from tasks.select_paths import select_pairs


def _path(url: str) -> Path:
    return Path(urlparse(url).path) if url.startswith("file://") else Path(url)


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "_MANIFEST.json").read_text())


class TransformersScorer:
    """`InferenceBackend.score` with a transformers model on CPU: one forward pass per distinct
    prompt, its cache shared by the replies scored after it; every result is remembered."""

    def __init__(self, model_dir: str, threads: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.memo: dict[tuple, float] = {}
        self.forwards = self.tokens = 0

    def generate(self, prompts, sampling):
        raise NotImplementedError("the bench scores only")

    def score(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[float]:
        wanted: dict[tuple, list[tuple]] = {}
        for p, c in zip(prompts, continuations, strict=True):
            if (tuple(p), tuple(c)) not in self.memo:
                wanted.setdefault(tuple(p), []).append(tuple(c))
        # Sorted, neighbours share the longest prefixes (the task, the history, the step's
        # "Action: "): each prompt's forward pass starts from its predecessor's cache.
        previous, previous_cache = (), None
        for prompt in sorted(wanted):
            replies = list(dict.fromkeys(wanted[prompt]))
            shared = 0
            while (
                shared < min(len(previous), len(prompt) - 1) and previous[shared] == prompt[shared]
            ):
                shared += 1
            first, cache = self._prompt(prompt, previous_cache if shared >= 16 else None, shared)
            previous, previous_cache = prompt, copy.deepcopy(cache)
            for reply, score in zip(
                replies, self._replies(first, cache, prompt, replies), strict=True
            ):
                self.memo[(prompt, reply)] = score
        return [
            self.memo[(tuple(p), tuple(c))] for p, c in zip(prompts, continuations, strict=True)
        ]

    def _prompt(self, prompt: tuple, cache, shared: int):
        torch = self.torch
        with torch.inference_mode():
            if cache is None:
                shared = 0
            else:
                cache.crop(shared)
            out = self.model(torch.tensor([prompt[shared:]]), past_key_values=cache, use_cache=True)
        self.forwards += 1
        self.tokens += len(prompt) - shared
        return torch.log_softmax(out.logits[0, -1].float(), -1), out.past_key_values

    def _replies(self, first, cache, prompt: tuple, replies: list[tuple]) -> list[float]:
        """Each reply's log-probability: `first` predicts its first token, then one batched
        pass over the replies after the prompt's cache."""
        torch = self.torch
        with torch.inference_mode():
            cache.batch_repeat_interleave(len(replies))
            width = max(map(len, replies))
            ids = torch.tensor([list(r) + [0] * (width - len(r)) for r in replies])
            mask = torch.ones(len(replies), len(prompt) + width, dtype=torch.long)
            logits = self.model(ids, past_key_values=cache, attention_mask=mask).logits
            logp = torch.log_softmax(logits.float(), -1)
        scores = []
        for row, reply in enumerate(replies):
            total = float(first[reply[0]])
            total += sum(float(logp[row, j - 1, reply[j]]) for j in range(1, len(reply)))
            scores.append(total)
        return scores

    def close(self) -> None:
        pass


def all_pairs(trees: list[SearchTree], alpha: float, beta: float) -> list[PathPair]:
    """Every failed leaf once, paired with a good leaf of its tree (select-paths' rule)."""
    pairs = []
    for tree in trees:
        bad = {leaf.id for leaf in tree.leaves()}
        pairs.extend(select_pairs(tree, alpha, beta, cap=len(bad), seed=0))
    return pairs


def auc(scored: list[tuple[float, bool]]) -> float | None:
    """P(a flagged step scores above an unflagged one), ties half: the Mann-Whitney AUC."""
    pos = [s for s, flag in scored if flag]
    neg = [s for s, flag in scored if not flag]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def step_auc(critiques: list[Critique], p_bad: dict[int, list[float | None]], flags) -> tuple:
    scored = []
    for c in critiques:
        for k, p in enumerate(p_bad[c.pair]):
            if p is not None:
                scored.append((p, flags[c.pair][c.judged_from + k]))
    return auc(scored), len(scored), sum(f for _, f in scored)


def p_bad_of(response: str) -> float | None:
    marker = "P(bad) "
    return float(response.split(marker)[-1].rstrip(")")) if marker in response else None


VARIANTS = {
    "likelihood, as the demo ran (old)": {},
    "calibrated, first Bad verdict": {"calibration": "content_free"},
    "uncalibrated, highest P(Bad)": {"locate": "most_bad"},
    "calibrated, highest P(Bad)": {"calibration": "content_free", "locate": "most_bad"},
}


def recorded(run: Path, round_no: int) -> None:
    """The run's critique stage's own (vLLM) scores, from its responses: the verdicts it gave
    against the highest uncalibrated P(Bad) of each bad path, and the divergence baseline."""
    import re

    from envs.textcraft import wasted_steps

    round_dir = run / f"round-{round_no}"
    trees = read_records(_path(_manifest(round_dir / "mcts")["files"]["trees"]), SearchTree)
    by_task = {t.task_id: t for t in trees}
    pairs = read_records(_path(_manifest(round_dir / "paths")["files"]["pairs"]), PathPair)
    critiques = read_records(
        _path(_manifest(round_dir / "critique")["files"]["critiques"]), Critique
    )
    rows, steps = {"as recorded": [], "highest P(Bad)": [], "divergence": []}, []
    for c in critiques:
        pair = pairs[c.pair]
        flags = wasted_steps(
            pair.task_id, [n.action for n in by_task[pair.task_id].path(pair.bad_leaf)[1:]]
        )
        p_bad = []
        for k, response in enumerate(c.responses):
            scores = {
                v: float(x) for v, x in re.findall(r"(good|bad|uncertain) (-?[\d.]+)", response)
            }
            top = max(scores.values())
            p_bad.append(
                math.exp(scores["bad"] - top) / sum(math.exp(x - top) for x in scores.values())
            )
            steps.append((p_bad[-1], flags[c.judged_from + k]))
        best = c.judged_from + max(range(len(p_bad)), key=lambda i: (p_bad[i], -i))
        for name, guess in (
            ("as recorded", c.first_error),
            ("highest P(Bad)", best),
            ("divergence", c.judged_from),
        ):
            rows[name].append((guess, c.oracle_first_error))
    n = len(critiques)
    print(f"| recorded scores, {n} pairs | found | exact | within 1 |\n|---|---|---|---|")
    for name, got in rows.items():
        found = sum(g is not None for g, _ in got)
        exact = sum(g == o for g, o in got)
        near = sum(g is not None and o is not None and abs(g - o) <= 1 for g, o in got)
        print(f"| {name} | {found}/{n} | {exact}/{n} | {near}/{n} |")
    print(
        f"step AUC of uncalibrated P(Bad): {auc(steps):.2f} (n={len(steps)}, {sum(f for _, f in steps)} wasted)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="/work/main/runs/agent-r-textcraft")
    parser.add_argument("--round", type=int, default=1)
    parser.add_argument("--pairs", choices=["selected", "all"], default="selected")
    parser.add_argument("--history-steps", type=int, default=4)  # the demo config's
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--two-verdicts", action="store_true", help="also good/bad only")
    parser.add_argument("--out", default=None, help="write the table (markdown) here too")
    parser.add_argument(
        "--recorded", action="store_true",
        help="no model: re-rank the run's own critique scores (uncalibrated) by P(Bad)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.recorded:
        recorded(Path(args.run), args.round)
        return

    from transformers import AutoTokenizer

    from envs.textcraft import wasted_steps
    from flywheel.chat import ChatTokenizer

    run = Path(args.run)
    round_dir = run / f"round-{args.round}"
    trees = read_records(_path(_manifest(round_dir / "mcts")["files"]["trees"]), SearchTree)
    paths = _manifest(round_dir / "paths")
    model_url = next(u for u in _manifest(round_dir / "critique")["upstream"] if "model" in u)
    model_dir = str(_path(model_url))
    if args.pairs == "selected":
        pairs = read_records(_path(paths["files"]["pairs"]), PathPair)
    else:
        pairs = all_pairs(trees, paths["metrics"]["alpha"], paths["metrics"]["beta"])
    by_task = {t.task_id: t for t in trees}
    flags = [
        wasted_steps(p.task_id, [n.action for n in by_task[p.task_id].path(p.bad_leaf)[1:]])
        for p in pairs
    ]

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    backend = TransformersScorer(model_dir, args.threads)
    variants = dict(VARIANTS)
    if args.two_verdicts:
        variants["calibrated, good/bad only, first Bad"] = {
            "calibration": "content_free", "verdicts": ["good", "bad"],
        }  # fmt: skip
    # The calibrated most_bad run scores every prompt the others need: run it first.
    order = [
        "calibrated, highest P(Bad)",
        *[v for v in variants if v != "calibrated, highest P(Bad)"],
    ]

    def oracle(task_id, actions):
        return wasted_steps(task_id, actions)

    results, started = {}, time.perf_counter()
    for name in order:
        settings = CritiqueSettings(history_steps=args.history_steps, **variants[name])
        t0 = time.perf_counter()
        critiques = critique_pairs(
            pairs, by_task, backend, chat, settings, args.max_model_len, oracle, progress=False
        )
        results[name] = (critiques, time.perf_counter() - t0)
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    # Thresholds on the calibrated P(Bad), read off the most_bad run's per-step values.
    base, _ = results["calibrated, highest P(Bad)"]
    p_bad = {c.pair: [p_bad_of(r) for r in c.responses] for c in base}
    raw_p_bad = {
        c.pair: [p_bad_of(r) for r in c.responses]
        for c in results["uncalibrated, highest P(Bad)"][0]
    }

    lines = [
        f"# Critique agreement with the oracle's first error ({args.pairs} pairs)",
        "",
        f"Command: `.venv/bin/python -m experiments.critique_agreement --run {args.run} "
        f"--round {args.round} --pairs {args.pairs} --history-steps {args.history_steps}"
        f"{' --two-verdicts' if args.two_verdicts else ''}`",
        f"Machine: {platform.processor() or platform.machine()}, {args.threads} threads, "
        f"transformers on CPU; {datetime.date.today().isoformat()}; "
        f"{backend.forwards} prompts scored ({backend.tokens} tokens after shared prefixes), {time.perf_counter() - started:.0f} s.",
        f"Model: `{model_dir}`; trees: {len(trees)}; pairs: {len(pairs)} over "
        f"{len({p.task_id for p in pairs})} tasks.",
        "",
        "| critique | steps judged | verdicts (good/bad/uncertain) | first errors found | "
        "exact agreement | within 1 step | step AUC of P(Bad) |",
        "|---|---|---|---|---|---|---|",
    ]
    n = len(pairs)

    def row(name, critiques, auc_text):
        m = critique_metrics(critiques)
        steps = int(m["steps_judged"])
        found = sum(c.first_error is not None for c in critiques)
        exact = sum(c.first_error == c.oracle_first_error for c in critiques)
        near = sum(
            c.first_error is not None
            and c.oracle_first_error is not None
            and abs(c.first_error - c.oracle_first_error) <= 1
            for c in critiques
        )
        kinds = "/".join(str(int(m[f"verdicts_{k}"])) for k in ("good", "bad", "uncertain"))
        lines.append(
            f"| {name} | {steps} | {kinds} | {found}/{n} | {exact}/{n} ({exact / n:.0%}) | "
            f"{near}/{n} ({near / n:.0%}) | {auc_text} |"
        )

    def auc_text(values):
        value, steps, flagged = step_auc(base, values, flags)
        return "n/a" if value is None else f"{value:.2f} (n={steps}, {flagged} wasted)"

    for name in variants:
        critiques = results[name][0]
        shown = "–"
        if name == "calibrated, highest P(Bad)":
            shown = auc_text(p_bad)
        elif name == "uncalibrated, highest P(Bad)":
            shown = auc_text(raw_p_bad)
        row(name, critiques, shown)
    for threshold in (0.3, 0.4, 0.5, 0.6):
        thresholded = []
        for c in base:
            hit = next((k for k, p in enumerate(p_bad[c.pair]) if p > threshold), None)
            first = None if hit is None else c.judged_from + hit
            verdicts = ["bad" if p > threshold else "good" for p in p_bad[c.pair]]
            thresholded.append(c.model_copy(update={"first_error": first, "verdicts": verdicts}))
        row(f"calibrated, first P(Bad) > {threshold} (offline)", thresholded, "–")
    at_divergence = [c.model_copy(update={"first_error": c.judged_from}) for c in base]
    row("baseline: the first judged step (divergence)", at_divergence, "–")
    found = sum(c.oracle_first_error is not None for c in base)
    lines += [
        "",
        f"The oracle finds an error in {found}/{n} bad paths. Step AUC: over every judged step "
        "of the bad paths, the chance that a wasted step (oracle) has a higher P(Bad) than a "
        "useful one; 0.5 is chance. Threshold rows are computed from the calibrated run's "
        "per-step P(Bad) (verdict Bad above the threshold), not a setting.",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
