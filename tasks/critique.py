"""Stage: the actor model finds the first error of each pair's bad path (Agent-R's critique).

A step verifier: each step gets a verdict of its own, in turn. (ET-Agent's judge,
`agents/trajectory_judge.py`, reads a whole trajectory at once and names one step by number.)

The model judges the bad path one step at a time with a verifier prompt: Good, Bad or Uncertain;
the first Bad step ends the bad prefix. Judging starts where the bad path leaves the good one:
the steps before are on a path that reached a good leaf. Pairs are judged in lockstep, one
backend call per step position for all pairs still undecided.

By default (`critique.method: likelihood`) the verdict is the reply the model itself finds most
likely among "Judgement: Good", "Judgement: Bad" and "Judgement: Uncertain", each scored with its
log-probability after the prompt: every step gets a verdict, where a 135M model asked to write
one almost never writes a parsable answer. `generate` keeps the written reply and its parse.

Contextual calibration (`critique.calibration: content_free`, Zhao et al. 2021, "Calibrate before
use"): a small model prefers one verdict whatever the step (SmolLM2-135M after SFT says Good to
every step of the Agent-R demo's bad paths). Each verdict's log-probability is then taken relative
to the one the model gives to the same prompt with the judged step replaced by "N/A", its prior for
that task and history; the verdict is chosen from these calibrated scores. `critique.locate:
most_bad` judges every step of the bad path and takes the step with the highest P(Bad) (the
softmax of the verdicts' scores) as its first error: the bad path failed, so it has one.

Steps are shown as the agent's turn format writes them (the tree's, `agents.turns`): ReAct's
``Action: ...`` and ``Observation: ...``, or a tool format's call (``<search>...</search>``) and its
wrapped result; a reply no move could be read from is shown whole when it is the judged step.

Where the environment has an oracle (TextCraft: a step is a mistake when it is wasted), the
stage reports how often the model's first error is the oracle's.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from tqdm import tqdm

from agents.mcts import Critique, PathPair, SearchTree, TreeNode
from agents.turns import ReActTurns, Turns
from flywheel.chat import ChatTokenizer
from flywheel.inference import InferenceBackend, SamplingSettings
from flywheel.records import Message
from flywheel.settings import EnvSettings, InferenceSettings, Strict
from flywheel.stage import StageResult, StageRun, stage


class CritiqueSettings(Strict):
    """The actor model judging a bad path step by step to find its first error.

    `likelihood` scores each candidate reply ("Judgement: Good", "Judgement: Bad", ...) with the
    model's own log-probability and takes the most likely, so every step gets a verdict;
    `generate` lets the model write a reply and parses a verdict from it, which a small model
    often leaves out (the step then has none).
    """

    method: Literal["likelihood", "generate"] = "likelihood"
    """Likelihood or generate (see the class docstring)."""
    max_tokens: int = Field(default=64, ge=1)
    """per generated judgement (method generate)"""
    history_steps: int = Field(default=6, ge=0)
    """earlier steps shown before the judged one"""
    verdicts: list[Literal["good", "bad", "uncertain"]] = ["good", "bad", "uncertain"]
    """likelihood: the verdicts scored. Without "uncertain" the model must pick good or bad."""
    margin: float = Field(default=0.0, ge=0.0)
    """likelihood: a winner at most this many nats (log-probability) ahead of the runner-up is a
    close call and becomes "uncertain" (the path goes on); 0 maps only exact ties.
    """

    @field_validator("verdicts")
    @classmethod
    def _two_distinct_verdicts(cls, verdicts: list[str]) -> list[str]:
        if len(set(verdicts)) != len(verdicts) or len(verdicts) < 2:
            raise ValueError(
                "critique.verdicts needs at least two distinct verdicts of good, bad, uncertain"
            )
        if "bad" not in verdicts:
            raise ValueError("critique.verdicts must include bad, or no first error is found")
        return verdicts

    calibration: Literal["none", "content_free"] = "none"
    """likelihood: contextual calibration (Zhao et al. 2021). "content_free" subtracts from each
    verdict's log-probability the one the model gives to the same prompt with the judged step
    replaced by "N/A" (its prior for that context), then picks the verdict; "none" does not.
    """
    locate: Literal["first_bad", "most_bad"] = "first_bad"
    """Which judged step is the first error: "first_bad", the first step whose verdict is Bad
    (Agent-R; judging stops there); "most_bad" (likelihood), every step is judged and the one
    with the highest P(Bad) (after calibration, normalised over the verdicts) is the error.
    """

    @model_validator(mode="after")
    def _most_bad_needs_scores(self) -> CritiqueSettings:
        if self.locate == "most_bad" and self.method != "likelihood":
            raise ValueError("critique.locate most_bad needs critique.method likelihood")
        return self


VERIFIER_SYSTEM = "You review an agent's work one step at a time and say whether a step was right."
VERDICTS = ("good", "bad", "uncertain")  # the order the question lists them in
VERDICT_MEANINGS = {
    "good": "good (it brings the goal closer)",
    "bad": "bad (it fails, wastes the turn or leads away from the goal)",
    "uncertain": "uncertain",
}
CONTENT_FREE = "N/A"  # the judged step's action and observation in the calibration prompt
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


def verdict_reply(verdict: str) -> str:
    """The one-line reply that states `verdict`: "Judgement: Good"."""
    return f"Judgement: {verdict.capitalize()}"


def choose_verdict(scores: dict[str, float], margin: float = 0.0) -> str:
    """The verdict whose reply has the highest log-probability in `scores`.

    A winner no more than `margin` nats ahead of the runner-up is a close call: "uncertain", so
    the path goes on as it does after an Uncertain verdict. With margin 0 only an exact tie is.
    """
    if len(scores) < 2:
        raise ValueError("choosing a verdict needs the scores of at least two verdicts")
    best, runner_up = sorted(scores.values(), reverse=True)[:2]
    if best - runner_up <= margin:
        return "uncertain"
    return max(scores, key=scores.__getitem__)


def calibrate(scores: dict[str, float], prior: dict[str, float]) -> dict[str, float]:
    """Each verdict's log-probability minus the model's log-probability of that verdict for the
    content-free prompt: log(p(v | step) / p(v | N/A)). A verdict the model gives whatever the
    step loses its head start; one it gives only to this step gains."""
    if scores.keys() != prior.keys():
        raise ValueError("calibration needs the prior of every verdict scored")
    return {v: scores[v] - prior[v] for v in scores}


def bad_probability(scores: dict[str, float]) -> float:
    """P(Bad) among the verdicts scored: the softmax of their log-probabilities."""
    top = max(scores.values())
    return math.exp(scores["bad"] - top) / sum(math.exp(s - top) for s in scores.values())


def most_likely_error(p_bad: list[float | None], offset: int = 0) -> int | None:
    """Step index (plus `offset`) of the highest P(Bad), the earliest among equals; None when no
    step has one."""
    scored = [(p, i) for i, p in enumerate(p_bad) if p is not None]
    if not scored:
        return None
    best = max(p for p, _ in scored)
    return offset + min(i for p, i in scored if p == best)


def first_error(verdicts: list[str | None], offset: int = 0) -> int | None:
    """Step index (plus `offset`) of the first "bad" verdict, or None."""
    for i, verdict in enumerate(verdicts):
        if verdict == "bad":
            return offset + i
    return None


def verifier_question(settings: CritiqueSettings) -> str:
    """What the verifier is asked about the judged step: the verdicts it may give, and for
    `generate` a sentence of reasoning before the verdict line."""
    verdicts = [v for v in VERDICTS if settings.method == "generate" or v in settings.verdicts]
    listed = [VERDICT_MEANINGS[v] for v in verdicts]
    replies = [f"'{verdict_reply(v)}'" for v in verdicts]
    asked = f"Was this step {', '.join(listed[:-1])} or {listed[-1]}?"
    if settings.method == "generate":
        return (
            f"{asked} Reason in one sentence, then end with one line: "
            f"{', '.join(replies[:-1])} or {replies[-1]}."
        )
    return f"{asked} Answer with one line: {', '.join(replies[:-1])} or {replies[-1]}."


def content_free_step(step: TreeNode) -> TreeNode:
    """The judged step with no content: its action, reply and observation all "N/A"."""
    return step.model_copy(
        update={"action": CONTENT_FREE, "reply": CONTENT_FREE, "observation": CONTENT_FREE}
    )


def unread(step: TreeNode) -> bool:
    """No move was read from the step's reply: no action (ReAct), or a malformed one."""
    return step.action is None or step.malformed


def shown_step(step: TreeNode, turns: Turns, judged: bool) -> str:
    """The step's move and what answered it, as the agent's turn format writes them. A judged
    reply no move was read from is shown whole: it is what is judged."""
    move = step.action if not step.malformed else None
    shown = turns.shown_move(move, step.reply if judged else None)
    return f"{shown}\n{turns.observation(step.observation, step.malformed).content}"


def verifier_messages(
    instruction: str,
    history: list[TreeNode],
    step: TreeNode,
    question: str,
    turns: Turns | None = None,
) -> list[Message]:
    """The verifier's prompt; steps written in `turns`' format (ReAct when not given)."""
    turns = turns or ReActTurns()
    earlier = "\n".join(shown_step(n, turns, judged=False) for n in history)
    prompt = (
        f"Task:\n{instruction}\n\n"
        f"Earlier steps:\n{earlier or '(none)'}\n\n"
        f"Step to judge:\n{shown_step(step, turns, judged=True)}\n\n"
        f"{question}"
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
    p_bad: list[float | None]  # per judged step (likelihood), after calibration when on
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
        reviews.append(_Review(i, pair, tree, steps, pair.divergence, [], [], []))
    if settings.method == "likelihood":
        judge = _LikelihoodVerifier(backend, chat, settings)
    else:
        judge = _GenerateVerifier(backend, settings)
    question = verifier_question(settings)
    room = max_model_len - len(chat.header_ids) - judge.reply_room
    active = [r for r in reviews if r.at < len(r.steps)]
    bar = tqdm(total=len(reviews), desc="critique", unit="pair", disable=not progress)
    bar.update(len(reviews) - len(active))
    calibrated = settings.method == "likelihood" and settings.calibration == "content_free"
    every_step = settings.locate == "most_bad"
    while active:
        prompts = [_prompt_ids(r, chat, settings, question, room) for r in active]
        blanks = None
        if calibrated:
            blanks = [_prompt_ids(r, chat, settings, question, room, blank=True) for r in active]
        judged = judge(prompts, blanks) if calibrated else judge(prompts)
        for review, (verdict, response, p_bad) in zip(active, judged, strict=True):
            review.verdicts.append(verdict)
            review.responses.append(response)
            review.p_bad.append(p_bad)
            review.at += 1
            review.decided = (verdict == "bad" and not every_step) or review.at >= len(review.steps)
            bar.update(int(review.decided))
        active = [r for r in active if not r.decided]
    bar.close()
    return [_critique(r, oracle, every_step) for r in reviews]


class _GenerateVerifier:
    """The model writes its judgement; the verdict is parsed from it (None without one)."""

    def __init__(self, backend: InferenceBackend, settings: CritiqueSettings):
        self.backend = backend
        self.sampling = SamplingSettings(temperature=0.0, max_tokens=settings.max_tokens)
        self.reply_room = settings.max_tokens

    def __call__(self, prompts: list[list[int]]) -> list[tuple[str | None, str, None]]:
        generations = self.backend.generate(prompts, self.sampling)
        return [(parse_judgement(g.text), g.text, None) for g in generations]


class _LikelihoodVerifier:
    """Each verdict's reply, ended as a finished turn, is scored after the prompt; one score
    call covers every prompt and verdict (and, calibrated, every content-free prompt). The
    response records the scores."""

    def __init__(self, backend: InferenceBackend, chat: ChatTokenizer, settings: CritiqueSettings):
        self.backend = backend
        self.margin = settings.margin
        self.verdicts = list(settings.verdicts)
        # The turn's end is scored too: the reply is the verdict line and nothing after it, so a
        # verdict word that would go on ("Bad" -> "Badly") is not credited as a verdict.
        end = chat.turn_end.strip()
        self.replies = {
            v: chat.tokenizer(verdict_reply(v) + end, add_special_tokens=False)["input_ids"]
            for v in self.verdicts
        }
        self.reply_room = max(map(len, self.replies.values())) + 1  # vLLM generates one token

    def __call__(
        self, prompts: list[list[int]], blanks: list[list[int]] | None = None
    ) -> list[tuple[str, str, float]]:
        """`blanks`: each prompt's content-free version; given, the verdicts are calibrated."""
        everything = prompts + (blanks or [])
        asked = [(p, self.replies[v]) for p in everything for v in self.verdicts]
        flat = self.backend.score([p for p, _ in asked], [c for _, c in asked])
        n = len(self.verdicts)

        def scores_of(i: int) -> dict[str, float]:
            return dict(zip(self.verdicts, flat[i * n : (i + 1) * n], strict=True))

        judged = []
        for i in range(len(prompts)):
            scores = raw = scores_of(i)
            shown = f"log-probabilities: {_shown(raw)}"
            if blanks is not None:
                prior = scores_of(len(prompts) + i)
                scores = calibrate(raw, prior)
                shown += f"; content-free: {_shown(prior)}; calibrated: {_shown(scores)}"
            verdict = choose_verdict(scores, self.margin)
            p_bad = bad_probability(scores)
            judged.append(
                (verdict, f"{verdict_reply(verdict)} ({shown}; P(bad) {p_bad:.3f})", p_bad)
            )
        return judged


def _shown(scores: dict[str, float]) -> str:
    return ", ".join(f"{v} {score:.3f}" for v, score in scores.items())


def _prompt_ids(
    review: _Review,
    chat: ChatTokenizer,
    settings: CritiqueSettings,
    question: str,
    room: int,
    blank: bool = False,
) -> list[int]:
    """The verifier prompt within `room` tokens. The oldest history goes first; then the longest
    of the task, the judged step's observation and its reply (when it had no action) is cut in
    its middle, so the system message, the task's start and end and the question are kept.
    `blank`: its content-free version, the same task and history with the step "N/A"."""
    history = review.steps[max(0, review.at - settings.history_steps) : review.at]
    instruction = review.tree.nodes[0].observation
    step = review.steps[review.at]
    turns = review.tree.turns()
    while True:
        ids, _ = chat.encode(verifier_messages(instruction, history, step, question, turns))
        if len(ids) <= room:
            if blank:  # shorter than the prompt that fits: the step's text is "N/A"
                blank_step = content_free_step(step)
                messages = verifier_messages(instruction, history, blank_step, question, turns)
                ids, _ = chat.encode(messages)
            return ids + chat.header_ids
        if history:
            history = history[1:]
            continue
        texts = {"instruction": instruction, "observation": step.observation}
        if unread(step):  # the prompt shows the whole reply
            texts["reply"] = step.reply
        longest = max(texts, key=lambda name: len(texts[name]))
        if len(texts[longest]) <= MIN_SHORTENED_CHARS:
            fix = "lower critique.max_tokens" if settings.method == "generate" else ""
            raise ValueError(
                f"the critique prompt does not fit in max_model_len (room for {room} tokens "
                f"before the reply): raise inference.max_model_len{' or ' + fix if fix else ''}"
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


def _critique(review: _Review, oracle, most_bad: bool = False) -> Critique:
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
        first_error=(
            most_likely_error(review.p_bad, start)
            if most_bad
            else first_error(review.verdicts, start)
        ),
        oracle_first_error=oracle_first,
        oracle=has_oracle,
    )


def critique_metrics(critiques: list[Critique]) -> dict[str, float]:
    verdicts = [v for c in critiques for v in c.verdicts]
    judged = [c for c in critiques if c.verdicts]
    with_oracle = [c for c in judged if c.oracle]
    metrics = {
        "steps_judged": float(len(verdicts)),
        # Counts by kind; "none" (no verdict) stays 0 with the likelihood critique.
        **{f"verdicts_{kind}": float(verdicts.count(kind)) for kind in VERDICTS},
        "verdicts_none": float(verdicts.count(None)),
        "verdict_missing_rate": _share(verdicts, lambda v: v is None),
        "verdict_bad_rate": _share(verdicts, lambda v: v == "bad"),
        "first_error_found_rate": _share(judged, lambda c: c.first_error is not None),
    }
    if with_oracle:
        metrics["first_error_oracle_agreement"] = _share(
            with_oracle, lambda c: c.first_error == c.oracle_first_error
        )
        metrics["first_error_oracle_within_1"] = _share(
            with_oracle,
            lambda c: (
                c.first_error is not None
                and c.oracle_first_error is not None
                and abs(c.first_error - c.oracle_first_error) <= 1
            ),
        )
        metrics["oracle_error_found_rate"] = _share(
            with_oracle, lambda c: c.oracle_first_error is not None
        )
        # The agreement of a critic that calls every first judged step bad: the bar to beat.
        metrics["oracle_error_at_divergence_rate"] = _share(
            with_oracle, lambda c: c.oracle_first_error == c.judged_from
        )
    return metrics


def _share(items: list, predicate) -> float:
    return sum(1 for item in items if predicate(item)) / len(items) if items else 0.0


class CritiqueInputs(BaseModel):
    """The actor model judges the bad path of each pair (select-paths) in its tree (mcts)."""

    model_url: str
    """the judge: the policy that searched the trees"""
    env: EnvSettings
    """its oracle, where it has one, scores the judge"""
    trees_url: str
    pairs_url: str
    inference: InferenceSettings
    settings: CritiqueSettings


@stage("critique")
def critique_stage(inputs: CritiqueInputs, run: StageRun) -> StageResult:
    from transformers import AutoTokenizer

    from envs import make_env
    from flywheel.inference import open_backend

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
