"""Stage: the actor model finds the first error of each pair's bad path (Agent-R's critique).

The model judges the bad path one step at a time with a verifier prompt and answers Good, Bad or
Uncertain; the first Bad step ends the bad prefix. Judging starts where the bad path leaves the
good one: the steps before are on a path that reached a good leaf. Pairs are judged in lockstep,
one generate call per step position for all pairs still undecided.

Where the environment has an oracle (TextCraft: a step is a mistake when it is wasted), the
stage reports how often the model's first error is the oracle's.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from pydantic import BaseModel
from tqdm import tqdm

from agents.mcts import Critique, PathPair, SearchTree, TreeNode
from flywheel.chat import ChatTokenizer
from flywheel.inference import InferenceBackend, SamplingSettings
from flywheel.records import Message
from flywheel.settings import CritiqueSettings, EnvSettings, InferenceSettings
from flywheel.stage import StageResult, StageRun, stage

VERIFIER_SYSTEM = "You review an agent's work one step at a time and say whether a step was right."
ELIDED = " [...] "  # marks the middle cut out of a text too long for the prompt
MIN_SHORTENED_CHARS = 32  # a text is not cut below this; the prompt is refused instead

# Both spellings, any case, optional markdown around the verdict: "**Judgment:** bad".
_VERDICT = re.compile(
    r"judg(?:e)?ment\s*[*_]*\s*[:\-]\s*[*_`\"']*\s*(good|bad|uncertain)\b", re.IGNORECASE
)


def parse_judgement(text: str) -> str | None:
    """The last labelled verdict in `text` ("good", "bad", "uncertain"), or None without one.

    Only a labelled verdict counts: "not good" or a bare "bad idea" in the reasoning says nothing
    about the verdict. A missing verdict is treated like "uncertain" (the path goes on), as in
    Agent-R, and counted apart so a model that never answers shows up in the metrics.
    """
    matches = _VERDICT.findall(text)
    return matches[-1].lower() if matches else None


def first_error(verdicts: list[str | None], offset: int = 0) -> int | None:
    """Step index (plus `offset`) of the first "bad" verdict, or None."""
    for i, verdict in enumerate(verdicts):
        if verdict == "bad":
            return offset + i
    return None


def verifier_messages(instruction: str, history: list[TreeNode], step: TreeNode) -> list[Message]:
    earlier = "\n".join(f"Action: {n.action}\nObservation: {n.observation}" for n in history)
    prompt = (
        f"Task:\n{instruction}\n\n"
        f"Earlier steps:\n{earlier or '(none)'}\n\n"
        f"Step to judge:\nAction: {step.action if step.action is not None else step.reply}\n"
        f"Observation: {step.observation}\n\n"
        "Was this step good (it brings the goal closer), bad (it fails, wastes the turn or leads "
        "away from the goal) or uncertain? Reason in one sentence, then end with one line: "
        "'Judgement: Good', 'Judgement: Bad' or 'Judgement: Uncertain'."
    )
    return [
        Message(role="system", content=VERIFIER_SYSTEM),
        Message(role="user", content=prompt),
    ]


@dataclass
class _Review:
    index: int
    pair: PathPair
    tree: SearchTree
    steps: list[TreeNode]  # the bad path's agent turns
    at: int  # the step judged next
    verdicts: list[str | None]
    responses: list[str]
    decided: bool = False


def critique_pairs(
    pairs: list[PathPair],
    trees: dict[str, SearchTree],
    backend: InferenceBackend,
    chat: ChatTokenizer,
    settings: CritiqueSettings,
    max_model_len: int,
    oracle=None,
    progress: bool = True,
) -> list[Critique]:
    """Judge every pair's bad path; `oracle(task_id, actions)` gives per-step mistake flags."""
    reviews = []
    for i, pair in enumerate(pairs):
        tree = trees[pair.task_id]
        steps = tree.path(pair.bad_leaf)[1:]
        reviews.append(_Review(i, pair, tree, steps, pair.divergence, [], []))
    sampling = SamplingSettings(temperature=0.0, max_tokens=settings.max_tokens)
    room = max_model_len - len(chat.header_ids) - settings.max_tokens
    active = [r for r in reviews if r.at < len(r.steps)]
    bar = tqdm(total=len(reviews), desc="critique", unit="pair", disable=not progress)
    bar.update(len(reviews) - len(active))
    while active:
        prompts = [_prompt_ids(r, chat, settings.history_steps, room) for r in active]
        for review, generation in zip(active, backend.generate(prompts, sampling), strict=True):
            verdict = parse_judgement(generation.text)
            review.verdicts.append(verdict)
            review.responses.append(generation.text)
            review.at += 1
            review.decided = verdict == "bad" or review.at >= len(review.steps)
            bar.update(int(review.decided))
        active = [r for r in active if not r.decided]
    bar.close()
    return [_critique(r, oracle) for r in reviews]


def _prompt_ids(review: _Review, chat: ChatTokenizer, history_steps: int, room: int) -> list[int]:
    """The verifier prompt within `room` tokens. The oldest history goes first; then the longest
    of the task, the judged step's observation and its reply (when it had no action) is cut in
    its middle, so the system message, the task's start and end and the question are kept."""
    history = review.steps[max(0, review.at - history_steps) : review.at]
    instruction = review.tree.nodes[0].observation
    step = review.steps[review.at]
    while True:
        ids, _ = chat.encode(verifier_messages(instruction, history, step))
        if len(ids) <= room:
            return ids + chat.header_ids
        if history:
            history = history[1:]
            continue
        texts = {"instruction": instruction, "observation": step.observation}
        if step.action is None:  # the prompt shows the whole reply
            texts["reply"] = step.reply
        longest = max(texts, key=lambda name: len(texts[name]))
        if len(texts[longest]) <= MIN_SHORTENED_CHARS:
            raise ValueError(
                f"the critique prompt does not fit in max_model_len (room for {room} tokens "
                "before the reply): raise inference.max_model_len or lower critique.max_tokens"
            )
        shorter = shorten_middle(texts[longest], len(texts[longest]) // 2)
        if longest == "instruction":
            instruction = shorter
        else:
            step = step.model_copy(update={longest: shorter})


def shorten_middle(text: str, chars: int) -> str:
    """`text` cut to about `chars` characters: its start and its end, with a mark between."""
    if len(text) <= chars:
        return text
    head = chars // 2
    return text[:head] + ELIDED + text[len(text) - (chars - head) :]


def _critique(review: _Review, oracle) -> Critique:
    start = review.pair.divergence
    oracle_first, has_oracle = None, False
    if oracle is not None:
        flags = oracle(review.pair.task_id, [step.action for step in review.steps])
        if flags is not None:
            has_oracle = True
            oracle_first = next((i for i in range(start, len(flags)) if flags[i]), None)
    return Critique(
        task_id=review.pair.task_id,
        pair=review.index,
        judged_from=start,
        verdicts=review.verdicts,
        responses=review.responses,
        first_error=first_error(review.verdicts, start),
        oracle_first_error=oracle_first,
        oracle=has_oracle,
    )


def critique_metrics(critiques: list[Critique]) -> dict[str, float]:
    verdicts = [v for c in critiques for v in c.verdicts]
    judged = [c for c in critiques if c.verdicts]
    with_oracle = [c for c in judged if c.oracle]
    metrics = {
        "steps_judged": float(len(verdicts)),
        "verdict_missing_rate": _share(verdicts, lambda v: v is None),
        "verdict_bad_rate": _share(verdicts, lambda v: v == "bad"),
        "first_error_found_rate": _share(judged, lambda c: c.first_error is not None),
    }
    if with_oracle:
        metrics["first_error_oracle_agreement"] = _share(
            with_oracle, lambda c: c.first_error == c.oracle_first_error
        )
        metrics["oracle_error_found_rate"] = _share(
            with_oracle, lambda c: c.oracle_first_error is not None
        )
    return metrics


def _share(items: list, predicate) -> float:
    return sum(1 for item in items if predicate(item)) / len(items) if items else 0.0


class CritiqueInputs(BaseModel):
    """The actor model judges the bad path of each pair (select-paths) in its tree (mcts)."""

    model_url: str  # the judge: the policy that searched the trees
    env: EnvSettings  # its oracle, where it has one, scores the judge
    trees_url: str
    pairs_url: str
    inference: InferenceSettings
    settings: CritiqueSettings


@stage("critique")
def critique_stage(inputs: CritiqueInputs, run: StageRun) -> StageResult:
    from transformers import AutoTokenizer

    from agents.rollout import open_backend
    from envs import make_env

    store, inference = run.store, inputs.inference
    pairs = store.read_records(inputs.pairs_url, PathPair)
    trees = {t.task_id: t for t in store.read_records(inputs.trees_url, SearchTree)}
    started = time.perf_counter()
    critiques = []
    if pairs:  # no model is loaded for nothing
        model_dir = str(store.local_dir(inputs.model_url))
        chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
        backend = open_backend(inference, model_dir, chat.tokenizer)
        oracle = make_env(inputs.env).mistakes
        critiques = critique_pairs(
            pairs, trees, backend, chat, inputs.settings, inference.max_model_len, oracle
        )
    metrics = critique_metrics(critiques)
    metrics["seconds"] = time.perf_counter() - started
    return StageResult(
        files={"critiques": store.write_records(run.file("critiques.jsonl"), critiques)},
        counts={
            "pairs": len(critiques),
            "first_errors_found": sum(c.first_error is not None for c in critiques),
        },
        metrics=metrics,
    )
