"""Rewards for question answering: answer match as the SQuAD/HotpotQA evaluation scores it, a
format term, and an optional process reward per successful tool call.

They live in the environments layer because the QA environment gives the reward when an episode
answers (`StepResult.reward`); trainers read rewards from the trajectories, so they never need
these functions (and `training/` may not import `envs/`).

`qa_reward` combines the parts (`RewardWeights`):

    total = format_weight                      if the reply follows the format, else 0
          + answer_weight * (F1 or EM)         only if the reply follows the format
          + tool_call_weight * min(successful tool calls, max_rewarded_tool_calls)

An answer in a malformed reply earns nothing: rewarding it would teach the malformed format. The
process reward is capped so that calling tools in a loop pays no more than a few useful calls,
and it is off by default (the outcome alone is what Agent-R1 trains on; the process reward helps
a cold policy find the tools).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Literal

from pydantic import BaseModel

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
# HotpotQA's F1: a yes/no/noanswer prediction or gold scores 0 unless both are the same word.
_SPECIAL_ANSWERS = {"yes", "no", "noanswer"}


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, answers: list[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer."""
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(answer) for answer in answers))


def token_f1(prediction: str, answer: str) -> float:
    """F1 of the normalised tokens shared by the prediction and one gold answer."""
    predicted, gold = normalize_answer(prediction), normalize_answer(answer)
    if (predicted in _SPECIAL_ANSWERS or gold in _SPECIAL_ANSWERS) and predicted != gold:
        return 0.0
    predicted_tokens, gold_tokens = predicted.split(), gold.split()
    if not predicted_tokens or not gold_tokens:  # SQuAD v2: both empty is a match
        return float(predicted_tokens == gold_tokens)
    shared = sum((Counter(predicted_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted_tokens), shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def best_f1(prediction: str, answers: list[str]) -> float:
    return max((token_f1(prediction, answer) for answer in answers), default=0.0)


class RewardWeights(BaseModel):
    answer_metric: Literal["f1", "em"] = "f1"
    answer_weight: float = 1.0
    format_weight: float = 0.1
    tool_call_weight: float = 0.0  # process reward per successful tool call; 0 = off
    max_rewarded_tool_calls: int = 3


class QAReward(BaseModel):
    """The parts of one episode's reward, kept for the metrics (exact match, format validity)."""

    exact_match: float
    f1: float
    format: float
    process: float
    total: float


def qa_reward(
    prediction: str | None,
    answers: list[str],
    format_valid: bool,
    successful_tool_calls: int = 0,
    weights: RewardWeights | None = None,
) -> QAReward:
    """The reward of an episode that answered `prediction` (None: it never answered)."""
    weights = weights or RewardWeights()
    em = exact_match(prediction, answers) if prediction is not None else 0.0
    f1 = best_f1(prediction, answers) if prediction is not None else 0.0
    answer = f1 if weights.answer_metric == "f1" else em
    format_term = weights.format_weight if format_valid else 0.0
    answer_term = weights.answer_weight * answer if format_valid else 0.0
    calls = min(successful_tool_calls, weights.max_rewarded_tool_calls)
    process = weights.tool_call_weight * calls
    return QAReward(
        exact_match=em,
        f1=f1,
        format=float(format_valid),
        process=process,
        total=format_term + answer_term + process,
    )
