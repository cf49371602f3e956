"""The likelihood critique: verdicts chosen from log-probabilities, judged in lockstep, and (slow)
scored by vLLM exactly as a transformers forward pass of the same tokens scores them."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError
from tree_nodes import crafting_tree, step

from agents.mcts import PathPair, SearchTree
from flows.agent_r import AgentRConfig
from flywheel.config_files import load_config
from tasks.critique import (
    ELIDED,
    VERDICTS,
    CritiqueSettings,
    bad_probability,
    calibrate,
    choose_verdict,
    critique_metrics,
    critique_pairs,
    first_error,
    most_likely_error,
    verdict_reply,
    verifier_question,
)


@pytest.fixture
def tree() -> SearchTree:
    """root -> 1 get a -> {2 get b -> 4 craft x (solved), 3 get z -> 5 look (failed)}."""
    return crafting_tree(
        step(5, 3, 3, "look", "Could not execute look", finish="max_depth", score=0.0),
    )


def pair(good_leaf: int, bad_leaf: int, divergence: int) -> PathPair:
    return PathPair(
        task_id="acacia_boat", good_leaf=good_leaf, bad_leaf=bad_leaf, good_score=1.0,
        bad_score=0.0, divergence=divergence,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("scores", "margin", "verdict"),
    [
        ({"good": -2.0, "bad": -1.0, "uncertain": -3.0}, 0.0, "bad"),
        ({"good": -2.0, "bad": -1.0, "uncertain": -3.0}, 0.5, "bad"),  # leads by 1.0 > 0.5
        ({"good": -2.0, "bad": -1.0, "uncertain": -3.0}, 1.0, "uncertain"),  # by exactly 1.0
        ({"good": -2.0, "bad": -1.0, "uncertain": -1.5}, 0.75, "uncertain"),  # runner-up: 0.5
        ({"good": -0.5, "bad": -4.0}, 3.0, "good"),  # leads by 3.5
        ({"good": -0.5, "bad": -4.0}, 3.5, "uncertain"),
        ({"good": -1.25, "bad": -1.25}, 0.0, "uncertain"),  # a tie is a close call
        ({"good": -1.25, "bad": -1.25, "uncertain": -9.0}, 0.0, "uncertain"),
        ({"good": -3.0, "bad": -2.0, "uncertain": -0.1}, 0.0, "uncertain"),  # most likely
        ({"good": -7.0, "bad": -7.5}, 0.0, "good"),
    ],
)
def test_the_verdict_is_the_most_likely_reply_unless_within_the_margin(scores, margin, verdict):
    assert choose_verdict(scores, margin) == verdict


def test_a_verdict_needs_two_scores():
    with pytest.raises(ValueError, match="at least two"):
        choose_verdict({"bad": -1.0})


def test_the_first_error_is_the_first_step_scored_bad():
    verdicts = [
        choose_verdict({"good": -1.0, "bad": -2.0}),  # good
        choose_verdict({"good": -1.0, "bad": -1.0}),  # tie: uncertain, the path goes on
        choose_verdict({"good": -3.0, "bad": -2.0}),  # bad: the first error
    ]
    assert verdicts == ["good", "uncertain", "bad"]
    assert first_error(verdicts, offset=2) == 4
    assert first_error(verdicts[:2]) is None


def test_critique_settings_default_to_likelihood_and_old_configs_still_load(tmp_path):
    settings = CritiqueSettings()
    assert settings.method == "likelihood" and settings.verdicts == ["good", "bad", "uncertain"]
    assert settings.margin == 0.0
    config = tmp_path / "agent_r.yaml"
    config.write_text("critique:\n  max_tokens: 48\n  history_steps: 4\n")  # a config of before
    loaded = load_config(AgentRConfig, str(config), ["critique.margin=0.5"])
    assert loaded.critique.method == "likelihood" and loaded.critique.margin == 0.5
    assert loaded.critique.history_steps == 4
    for verdicts in (["good"], ["good", "good"], ["good", "uncertain"]):
        with pytest.raises(ValidationError, match="critique.verdicts"):
            CritiqueSettings(verdicts=verdicts)
    with pytest.raises(ValidationError):
        CritiqueSettings(margin=-0.1)


def test_the_question_lists_the_verdicts_scored():
    assert verifier_question(CritiqueSettings(verdicts=["good", "bad"])) == (
        "Was this step good (it brings the goal closer) or bad (it fails, wastes the turn or "
        "leads away from the goal)? Answer with one line: 'Judgement: Good' or 'Judgement: Bad'."
    )
    three = verifier_question(CritiqueSettings())
    assert three.endswith("'Judgement: Good', 'Judgement: Bad' or 'Judgement: Uncertain'.")
    assert "Reason in one sentence" in verifier_question(CritiqueSettings(method="generate"))
    # a generating judge may write any verdict, so it is offered all three whatever is scored
    generating = verifier_question(CritiqueSettings(method="generate", verdicts=["good", "bad"]))
    assert "'Judgement: Bad' or 'Judgement: Uncertain'." in generating


class ScriptedScorer:
    """Scores the verdict replies as if the model judged a step Bad when its action has a "z",
    Good otherwise, and could not tell Good from Bad on "look". Records every call."""

    SCORES = {
        "bad-step": {"Good": -4.0, "Bad": -0.5, "Uncertain": -6.0},
        "good-step": {"Good": -0.7, "Bad": -3.0, "Uncertain": -6.0},
        "look": {"Good": -2.0, "Bad": -2.0, "Uncertain": -6.0},
    }

    def __init__(self, chat):
        self.chat, self.calls = chat, []

    def generate(self, prompts, sampling):
        raise AssertionError("the likelihood critique generates nothing")

    LOOK_ALIKE = ("look",)  # actions scored as "look": the judge cannot tell
    BIAS = {"Good": 0.0, "Bad": 0.0, "Uncertain": 0.0}  # added to every score

    def score(self, prompts, continuations):
        self.calls.append(list(zip(prompts, continuations, strict=True)))
        scores = []
        for prompt, continuation in zip(prompts, continuations, strict=True):
            judged = self.chat.tokenizer.decode(prompt).split("Step to judge:\nAction: ")[-1]
            action = judged.split("\n")[0]
            kind = (
                "look"
                if action in self.LOOK_ALIKE
                else "bad-step"
                if "z" in action
                else "good-step"
            )
            reply = self.chat.tokenizer.decode(continuation)
            word = reply.removeprefix("Judgement: ").removesuffix("<|im_end|>")
            scores.append(self.SCORES[kind][word] + self.BIAS[word])
        return scores


def test_likelihood_critique_gives_every_step_a_verdict_in_lockstep(tree, chat):
    pairs = [pair(4, 5, 1), pair(4, 5, 0)]  # the second judges "get 1 a" first
    backend = ScriptedScorer(chat)
    oracle_flags = {"acacia_boat": [False, True, True]}
    critiques = critique_pairs(
        pairs, {"acacia_boat": tree}, backend, chat, CritiqueSettings(), 4096,
        lambda task_id, actions: oracle_flags[task_id], progress=False,
    )  # fmt: skip
    from_1, from_0 = critiques
    assert from_1.verdicts == ["bad"] and from_1.first_error == 1
    assert from_0.verdicts == ["good", "bad"] and from_0.first_error == 1
    assert from_1.responses == [
        "Judgement: Bad (log-probabilities: good -4.000, bad -0.500, uncertain -6.000; "
        "P(bad) 0.967)"
    ]
    # One score call per step position, three replies for each pair still undecided.
    assert [len(call) for call in backend.calls] == [6, 3]
    replies = {
        v: chat.tokenizer(verdict_reply(v) + "<|im_end|>", add_special_tokens=False)["input_ids"]
        for v in ("good", "bad", "uncertain")
    }
    assert [c for _, c in backend.calls[0][:3]] == list(replies.values())
    prompt = chat.tokenizer.decode(backend.calls[0][0][0])
    assert prompt.endswith("'Judgement: Uncertain'.<|im_end|>\n<|im_start|>assistant\n")
    assert "Reason in one sentence" not in prompt
    metrics = critique_metrics(critiques)
    assert metrics["verdicts_none"] == 0 and metrics["verdicts_bad"] == 2
    assert metrics["verdicts_good"] == 1 and metrics["verdicts_uncertain"] == 0
    assert metrics["first_error_oracle_agreement"] == 1.0
    # The oracle's first error is step 1: at the divergence for the first pair only.
    assert metrics["oracle_error_at_divergence_rate"] == 0.5


def test_a_close_call_is_uncertain_and_the_path_goes_on(tree, chat):
    """On "look" Good and Bad tie: uncertain, not bad, so no first error is found on it."""
    backend = ScriptedScorer(chat)
    settings = CritiqueSettings(verdicts=["good", "bad"])
    (critique,) = critique_pairs(
        [pair(4, 5, 2)], {"acacia_boat": tree}, backend, chat, settings, 4096, progress=False
    )
    assert critique.verdicts == ["uncertain"] and critique.first_error is None
    assert [len(call) for call in backend.calls] == [2]
    # With a margin wider than Bad's lead on "get 1 z" (3.5 nats), that step is uncertain too.
    wide = CritiqueSettings(verdicts=["good", "bad"], margin=3.5)
    (critique,) = critique_pairs(
        [pair(4, 5, 1)], {"acacia_boat": tree}, backend, chat, wide, 4096, progress=False
    )
    assert critique.verdicts == ["uncertain", "uncertain"] and critique.first_error is None
    assert critique_metrics([critique])["verdicts_uncertain"] == 2


def test_a_likelihood_prompt_leaves_room_for_the_longest_reply_and_one_token(tree, chat):
    long_tree = tree.model_copy(deep=True)
    long_tree.nodes[3].observation = "Got 1 z. " + "Nothing happens. " * 300
    backend = ScriptedScorer(chat)
    critique_pairs(
        [pair(4, 5, 1)], {"acacia_boat": long_tree}, backend, chat, CritiqueSettings(), 400,
        progress=False,
    )  # fmt: skip
    longest = max(len(prompt) + len(reply) for call in backend.calls for prompt, reply in call)
    assert longest <= 400 - 1  # vLLM generates one token after the scored reply
    assert any(ELIDED in chat.tokenizer.decode(p) for call in backend.calls for p, _ in call)


@pytest.mark.extended
@pytest.mark.slow
def test_vllm_scores_are_the_models_log_probabilities_and_every_step_gets_a_verdict(
    tree, chat, base_model_dir
):
    """The real SmolLM2-135M through vLLM: every judged step has a verdict, and each score is
    the sum of the reply tokens' log-probabilities from a transformers forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    from flywheel.inference import release_vllm, shared_vllm

    class Recorder:
        def __init__(self, backend):
            self.backend, self.calls = backend, []

        def score(self, prompts, continuations):
            scores = self.backend.score(prompts, continuations)
            self.calls += list(zip(prompts, continuations, scores, strict=True))
            return scores

    backend = Recorder(shared_vllm(str(base_model_dir), 2048, 1))
    try:
        pairs = [pair(4, 5, 0), pair(4, 5, 1), pair(4, 5, 2)]
        critiques = critique_pairs(
            pairs, {"acacia_boat": tree}, backend, chat, CritiqueSettings(), 2048, progress=False
        )
        # A direct call: several prompts of different lengths in one batch.
        prompts = [[1, 2, 3], list(range(10, 60)), [7]]
        continuations = [[4], [60, 61, 62], [8, 9]]
        backend.score(prompts, continuations)
    finally:
        release_vllm()
    for critique in critiques:
        assert len(critique.verdicts) >= 1
        assert all(v in ("good", "bad", "uncertain") for v in critique.verdicts)
        assert critique.first_error is not None or len(critique.verdicts) == 3 - critique.pair
    assert critique_metrics(critiques)["verdicts_none"] == 0

    model = AutoModelForCausalLM.from_pretrained(base_model_dir, torch_dtype=torch.float32)
    model.eval()
    for prompt, continuation, score in backend.calls:
        ids = torch.tensor([prompt + continuation])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
        expected = sum(
            logprobs[len(prompt) + i - 1, token].item() for i, token in enumerate(continuation)
        )
        assert math.isclose(score, expected, abs_tol=1e-3), (score, expected)
    # The verdicts follow from those scores: one triple of replies per judged step.
    judged = backend.calls[: -len(prompts)]
    triples = [judged[i : i + 3] for i in range(0, len(judged), 3)]
    chosen = [
        choose_verdict({v: s for v, (_, _, s) in zip(VERDICTS, t, strict=True)}) for t in triples
    ]
    assert sorted(chosen) == sorted(v for c in critiques for v in c.verdicts)


def test_calibration_subtracts_the_content_free_prior():
    """A model that says Good to everything: Good -1, Bad -5 on the step, Good -0.5, Bad -6.5
    with the step blanked. Raw, Good wins; calibrated, Bad has gained 1.5 nats on its prior and
    Good lost 0.5: Bad. Adding the prior (the wrong sign) or ignoring it keeps Good."""
    scores, prior = {"good": -1.0, "bad": -5.0}, {"good": -0.5, "bad": -6.5}
    calibrated = calibrate(scores, prior)
    assert calibrated == {"good": -0.5, "bad": 1.5}
    assert choose_verdict(scores) == "good"
    assert choose_verdict(calibrated) == "bad"
    assert choose_verdict({v: scores[v] + prior[v] for v in scores}) == "good"  # wrong sign
    assert bad_probability(calibrated) == pytest.approx(1 / (1 + math.exp(-2.0)))
    # A verdict the model gives whatever the step is neutral after calibration: the same scores
    # as the prior give a tie, a close call.
    assert choose_verdict(calibrate(prior, prior)) == "uncertain"
    with pytest.raises(ValueError, match="prior of every verdict"):
        calibrate(scores, {"good": -0.5})


def test_the_most_likely_error_is_the_step_with_the_highest_p_bad():
    assert most_likely_error([0.1, 0.7, 0.7, 0.2], offset=3) == 4  # the earliest of equals
    assert most_likely_error([None, 0.2]) == 1
    assert most_likely_error([]) is None and most_likely_error([None]) is None


class BiasedScorer(ScriptedScorer):
    """A judge biased to Good: every step, blank or not, scores Good 4 nats above the scripted
    scores; the blank step ("N/A") has the scripted "look" scores (Good and Bad equal) plus the
    bias. Calibrated, the bias cancels and the scripted verdicts come back."""

    BIAS = {"Good": 4.0, "Bad": 0.0, "Uncertain": 0.0}
    LOOK_ALIKE = ("look", "N/A")


def test_a_calibrated_critique_finds_the_error_a_biased_judge_calls_good(tree, chat):
    oracle = {"acacia_boat": [False, True, True]}
    kwargs = dict(oracle=lambda task_id, actions: oracle[task_id], progress=False)
    raw_settings = CritiqueSettings(verdicts=["good", "bad"])
    (raw,) = critique_pairs(
        [pair(4, 5, 0)], {"acacia_boat": tree}, BiasedScorer(chat), chat, raw_settings, 4096,
        **kwargs,
    )  # fmt: skip
    # Bad leads "get 1 z" by 3.5 nats; the bias gives Good 4: the raw judge calls all Good.
    assert raw.verdicts == ["good", "good", "good"] and raw.first_error is None
    backend = BiasedScorer(chat)
    settings = CritiqueSettings(verdicts=["good", "bad"], calibration="content_free")
    (calibrated,) = critique_pairs(
        [pair(4, 5, 0)], {"acacia_boat": tree}, backend, chat, settings, 4096, **kwargs
    )
    assert calibrated.verdicts == ["good", "bad"] and calibrated.first_error == 1
    # Each call scores the prompts, then their content-free versions: the step is "N/A".
    first_call = backend.calls[0]
    assert len(first_call) == 4
    blank = chat.tokenizer.decode(first_call[2][0])
    assert "Step to judge:\nAction: N/A\nObservation: N/A" in blank
    assert (
        blank.split("Step to judge:")[0]
        == chat.tokenizer.decode(first_call[0][0]).split("Step to judge:")[0]
    )  # the same task and history
    assert "content-free: good" in calibrated.responses[1]

    # Adding the prior instead of subtracting it, "get 1 z" would be Good by 4 nats: the test
    # above fails. Judging every step, the error is the step with the highest calibrated P(Bad)
    # ("look" ties with its prior: 0.5; "get 1 z": 0.97).
    every = settings.model_copy(update={"locate": "most_bad"})
    (most_bad,) = critique_pairs(
        [pair(4, 5, 0)], {"acacia_boat": tree}, BiasedScorer(chat), chat, every, 4096, **kwargs
    )
    assert most_bad.verdicts == ["good", "bad", "uncertain"] and most_bad.first_error == 1
    assert critique_metrics([most_bad])["first_error_oracle_within_1"] == 1.0


def test_most_bad_locates_the_highest_p_bad_even_when_no_step_is_called_bad(tree, chat):
    """With a margin of 3.5 nats every step is a close call (uncertain), so the first "bad" is
    None; locate=most_bad still names "get 1 z" (P(bad) 0.97 against "look"'s 0.5), counted from
    the divergence (step 1)."""
    settings = CritiqueSettings(verdicts=["good", "bad"], margin=3.5, locate="most_bad")
    (critique,) = critique_pairs(
        [pair(4, 5, 1)], {"acacia_boat": tree}, ScriptedScorer(chat), chat, settings, 4096,
        progress=False,
    )  # fmt: skip
    assert critique.verdicts == ["uncertain", "uncertain"]
    assert critique.first_error == 1
    first_bad = settings.model_copy(update={"locate": "first_bad"})
    (plain,) = critique_pairs(
        [pair(4, 5, 1)], {"acacia_boat": tree}, ScriptedScorer(chat), chat, first_bad, 4096,
        progress=False,
    )  # fmt: skip
    assert plain.first_error is None


def test_a_calibrated_batch_subtracts_each_prompts_own_prior(tree, chat):
    """Two pairs judged in one call: each step's scores are calibrated with its own blank
    prompt's, and the reply shows the raw, content-free and calibrated scores."""
    backend = BiasedScorer(chat)
    settings = CritiqueSettings(verdicts=["good", "bad"], calibration="content_free")
    from_0, from_1 = critique_pairs(
        [pair(4, 5, 0), pair(4, 5, 1)], {"acacia_boat": tree}, backend, chat, settings, 4096,
        progress=False,
    )  # fmt: skip
    assert from_0.verdicts == ["good", "bad"] and from_1.verdicts == ["bad"]
    assert from_1.responses[0].startswith("Judgement: Bad (log-probabilities: good ")
    assert "; content-free: good " in from_1.responses[0]
    first_call = backend.calls[0]  # 2 prompts x 2 replies, then their blanks
    blank = chat.tokenizer.decode(first_call[4][0])
    assert "Action: N/A" in blank and blank.endswith(
        "'Judgement: Good' or 'Judgement: Bad'.<|im_end|>\n<|im_start|>assistant\n"
    )
