"""Agent-R's data rules: path pairing thresholds, verifier parsing, first error, the splice."""

from __future__ import annotations

import random

import pytest
from tree_nodes import crafting_tree, step

from agents.mcts import Critique, PathPair, SearchTree, TreeNode, divergence
from envs import make_env
from flows.agent_r import AgentRConfig
from flywheel.config_files import load_config
from flywheel.inference import Generation
from flywheel.records import Message
from tasks.critique import (
    ELIDED,
    VERIFIER_SYSTEM,
    CritiqueSettings,
    critique_metrics,
    critique_pairs,
    first_error,
    parse_judgement,
    shorten_middle,
)
from tasks.select_paths import select_good, select_pairs
from tasks.splice import (
    REVISION_THOUGHTS,
    bad_prefix_end,
    build_training_data,
    revision_reply,
    splice_revision,
)
from training.datasets import sft_rows

# These tests cover the written critique: the model's reply and the verdict parsed from it.
WRITTEN = CritiqueSettings(method="generate")


@pytest.fixture
def tree() -> SearchTree:
    """root -> 1 -> {2 -> 4 (solved), 3 -> 5 (failed)}; root -> 6 (failed); root -> 7 (0.75)."""
    return crafting_tree(
        step(5, 3, 3, "inventory", "Inventory: a z", finish="max_depth", score=0.0),
        step(6, 0, 1, "look", "Could not execute look", finish="max_depth", score=0.0),
        step(7, 0, 1, "get 1 c", "Got 1 c", finish="max_depth", score=0.75),
    )


def test_pairs_need_a_good_leaf_of_at_least_alpha_and_a_gap_above_beta(tree):
    pairs = select_pairs(tree, alpha=0.5, beta=0.2, cap=10)
    found = {(p.good_leaf, p.bad_leaf) for p in pairs}
    # 1.0 beats 0.0 (twice) and 0.75 (gap 0.25); 0.75 beats 0.0; nothing beats 1.0.
    assert found == {(4, 5), (4, 6), (4, 7), (7, 5), (7, 6)}
    assert {(p.good_leaf, p.bad_leaf) for p in select_pairs(tree, 0.8, 0.2, 10)} == {
        (4, 5), (4, 6), (4, 7)
    }  # fmt: skip
    assert {(p.good_leaf, p.bad_leaf) for p in select_pairs(tree, 0.5, 0.25, 10)} == {
        (4, 5), (4, 6), (7, 5), (7, 6)
    }  # a gap of exactly beta is not enough  # fmt: skip
    assert {(p.good_leaf, p.bad_leaf) for p in select_pairs(tree, 1.0, 0.2, 10)} == {
        (4, 5), (4, 6), (4, 7)
    }  # alpha 1.0 admits a solved task  # fmt: skip
    assert select_pairs(tree, 0.5, 0.9, 10) and not select_pairs(tree, 0.5, 1.0, 10)


def test_thresholds_from_a_config_are_numbers_and_pairs_are_capped_over_distinct_bad_leaves(
    tree, tmp_path
):
    config = tmp_path / "agent_r.yaml"
    config.write_text("paths:\n  alpha: ['0.5', '0.7', '1.0']\n")
    cfg = load_config(AgentRConfig, str(config), ["paths.beta='0.2'"])
    assert cfg.paths.beta == 0.2 and cfg.paths.alpha_for(1) == 0.5 and cfg.paths.alpha_for(9) == 1.0
    pairs = select_pairs(tree, cfg.paths.alpha_for(1), cfg.paths.beta, cap=3)
    assert len(pairs) == 3 and len({p.bad_leaf for p in pairs}) == 3
    assert pairs == select_pairs(tree, 0.5, 0.2, cap=3)  # seeded


def test_divergence_counts_shared_agent_turns(tree):
    assert divergence(tree, 4, 5) == 1 and divergence(tree, 4, 6) == 0
    pair = next(p for p in select_pairs(tree, 0.5, 0.2, 10) if (p.good_leaf, p.bad_leaf) == (4, 5))
    assert pair.divergence == 1


def test_good_paths_are_the_best_leaves_above_alpha(tree):
    assert select_good(tree, 0.5, 5) == [4, 7]
    assert select_good(tree, 0.8, 5) == [4] and select_good(tree, 0.5, 1) == [4]


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("The step fetched a needed item.\nJudgement: Good", "good"),
        ("Judgment: bad", "bad"),
        ("**Judgement:** Uncertain.", "uncertain"),
        ("judgement - BAD", "bad"),
        ("Judgement: Good\nOn reflection... Judgement: Bad", "bad"),
        ("This step is not good at all.", None),
        ("", None),
        ("Judgement: maybe", None),
    ],
)
def test_verdicts_are_parsed_from_either_spelling_and_missing_ones_are_none(text, verdict):
    assert parse_judgement(text) == verdict


def test_first_error_is_the_first_bad_verdict():
    assert first_error(["good", None, "uncertain", "bad", "bad"], offset=2) == 5
    assert first_error(["good", None]) is None


def test_splice_keeps_the_bad_prefix_without_loss_and_trains_on_revision_and_good_path(tree, chat):
    prefix = [Message(role="system", content="S")]
    pair = PathPair(
        task_id="acacia_boat", good_leaf=4, bad_leaf=5, good_score=1, bad_score=0, divergence=1
    )
    revised = splice_revision(tree, pair, 1, prefix, "Thought: oops\nAction: inventory", "Inv")
    roles = [(m.role, m.loss) for m in revised.continuation]
    assert roles == [
        ("assistant", False), ("user", False),  # shared step 1 (get a)
        ("assistant", False), ("user", False),  # first error: get z, and what it showed
        ("assistant", True), ("user", False),  # revision turn and the no-op's observation
        ("assistant", True), ("user", False), ("assistant", True),  # good path from step 2
    ]  # fmt: skip
    texts = [m.content for m in revised.continuation]
    assert "get 1 z" in texts[2] and texts[4].startswith("Thought: oops")
    assert "get 1 b" in texts[6] and "craft 1 x" in texts[8]
    assert revised.source == "revision" and revised.success and revised.reward == 1.0
    # An error judged before the divergence still cuts at the first step off the good path.
    early = splice_revision(tree, pair, 0, prefix, "Thought: oops\nAction: inventory", "Inv")
    assert early.continuation == revised.continuation
    # No error found (and Direct-Revision): the whole bad path stays.
    whole = splice_revision(tree, pair, None, prefix, "Thought: oops\nAction: inventory", "Inv")
    assert [m.content for m in whole.continuation][:6] == [
        m.content for m in tree.trajectory(5, prefix).continuation
    ] + ["Observation: Inventory: a z"]
    # The loss flags survive into the SFT rows: only revision and good turns are learned.
    ids, mask = chat.encode(revised.training_messages)
    (row,), _ = sft_rows([revised], chat, max_length=4096)
    assert row["input_ids"] == ids and row["assistant_masks"] == mask
    learned = chat.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert "oops" in learned and "get 1 b" in learned and "craft 1 x" in learned
    assert "get 1 z" not in learned and "get 1 a" not in learned


class VerdictBackend:
    """Judges a step Bad when its action contains `bad_word`, else Good; no verdict on 'look'."""

    def __init__(self, chat, bad_word: str):
        self.chat, self.bad_word, self.calls = chat, bad_word, []

    def generate(self, prompts, sampling):
        self.calls.append(len(prompts))
        out = []
        for prompt in prompts:
            text = self.chat.tokenizer.decode(prompt)
            judged = text.split("Step to judge:\nAction: ")[-1].split("\n")[0]
            reply = "I cannot tell." if judged == "look" else (
                "Judgement: Bad" if self.bad_word in judged else "Judgement: Good"
            )  # fmt: skip
            out.append(Generation(reply, [1], "stop"))
        return out


def test_critique_judges_from_the_divergence_in_lockstep_and_stops_at_the_first_bad(tree, chat):
    pairs = select_pairs(tree, 0.5, 0.2, 10)
    env = make_env("textcraft")
    backend = VerdictBackend(chat, bad_word="z")
    critiques = critique_pairs(
        pairs, {"acacia_boat": tree}, backend, chat, WRITTEN, 4096, progress=False
    )
    by_pair = {(pairs[c.pair].good_leaf, pairs[c.pair].bad_leaf): c for c in critiques}
    to_5 = by_pair[(4, 5)]  # judged from step 1: "get 1 z" is bad at once
    assert to_5.judged_from == 1 and to_5.verdicts == ["bad"] and to_5.first_error == 1
    to_6 = by_pair[(4, 6)]  # "look": no verdict, no error found
    assert to_6.verdicts == [None] and to_6.first_error is None
    to_7 = by_pair[(7, 5)]  # from the root: "get 1 a" good, then "get 1 z" bad
    assert to_7.judged_from == 0 and to_7.verdicts == ["good", "bad"] and to_7.first_error == 1
    # One call per step position for every pair still undecided: all five, then (7, 5) alone.
    assert backend.calls == [len(pairs), 1]
    data, counts = build_training_data(
        env, [tree], pairs, [{"task_id": "acacia_boat", "leaf": 4}], critiques,
        [Message(role="system", content="S")], "revision", include_good=True,
    )  # fmt: skip
    assert counts == {"revisions": len(pairs), "good_paths": 1}
    assert [t.source for t in data].count("revision") == len(pairs)


def test_textcraft_oracle_flags_wasted_steps():
    env = make_env("textcraft")
    plan = [action for _, action in env.expert_plan("acacia_boat")]
    assert env.mistakes("acacia_boat", plan) == [False] * len(plan)
    flags = env.mistakes("acacia_boat", ["inventory", None, "get 2 cobblestone", plan[0]])
    assert flags == [True, True, True, False]
    with pytest.raises(KeyError, match="unknown textcraft task id 'no_such_item'"):
        env.mistakes("no_such_item", plan)


def test_the_oracles_first_error_is_searched_from_the_divergence(tree, chat):
    (pair,) = [p for p in select_pairs(tree, 0.5, 0.2, 10) if (p.good_leaf, p.bad_leaf) == (4, 5)]
    asked = []

    def oracle(task_id, actions):
        asked.append((task_id, actions))
        return [True, False, True]  # step 0 is on the shared (good) prefix: not this pair's error

    backend = VerdictBackend(chat, bad_word="z")
    (critique,) = critique_pairs(
        [pair], {"acacia_boat": tree}, backend, chat, WRITTEN, 4096, oracle, False
    )
    assert asked == [("acacia_boat", ["get 1 a", "get 1 z", "inventory"])]
    assert critique.oracle and critique.oracle_first_error == 2
    (none_found,) = critique_pairs(
        [pair], {"acacia_boat": tree}, backend, chat, WRITTEN, 4096,
        lambda task_id, actions: [True, False, False], False,
    )  # fmt: skip
    assert none_found.oracle and none_found.oracle_first_error is None
    # An environment without an oracle answers None: the critique says so.
    (no_oracle,) = critique_pairs(
        [pair], {"acacia_boat": tree}, backend, chat, WRITTEN, 4096,
        lambda task_id, actions: None, False,
    )  # fmt: skip
    assert not no_oracle.oracle and no_oracle.oracle_first_error is None


def test_critique_metrics_on_hand_made_critiques():
    def critique(verdicts, first, oracle_first=None, oracle=True):
        return Critique(
            task_id="t", pair=0, judged_from=0, verdicts=verdicts, responses=[""] * len(verdicts),
            first_error=first, oracle_first_error=oracle_first, oracle=oracle,
        )  # fmt: skip

    critiques = [
        critique(["good", "bad"], 1, oracle_first=1),  # agrees with the oracle
        critique([None, "good"], None, oracle_first=0),  # misses the oracle's error
        critique(["bad"], 0, oracle=False),  # no oracle
        critique([], None, oracle_first=None),  # nothing judged: left out of the rates
        critique(["good"], None, oracle_first=None),  # agrees: neither found an error
        critique(["good", "bad"], 1, oracle=False),
    ]
    metrics = critique_metrics(critiques)
    # 8 verdicts: 4 good, 3 bad, 1 missing; 5 critiques judged something, 3 found an error; of
    # the 3 judged with an oracle, 2 agree with it, 2 have an oracle error, 1 at the divergence.
    assert metrics == {
        "steps_judged": 8.0,
        "verdicts_good": 4.0,
        "verdicts_bad": 3.0,
        "verdicts_uncertain": 0.0,
        "verdicts_none": 1.0,
        "verdict_missing_rate": 1 / 8,
        "verdict_bad_rate": 3 / 8,
        "first_error_found_rate": 3 / 5,
        "first_error_oracle_agreement": 2 / 3,
        # both found an error, at most a step apart: the first only (neither finding one agrees
        # above, but gives no position to be near)
        "first_error_oracle_within_1": 1 / 3,
        "oracle_error_found_rate": 2 / 3,
        "oracle_error_at_divergence_rate": 1 / 3,
    }
    near = critique_metrics([critique(["good", "good", "bad"], 2, oracle_first=1)])
    far = critique_metrics([critique(["good", "good", "good", "bad"], 3, oracle_first=1)])
    assert near["first_error_oracle_within_1"] == 1.0 and far["first_error_oracle_within_1"] == 0
    without_oracle = critique_metrics([c for c in critiques if not c.oracle])
    assert "first_error_oracle_agreement" not in without_oracle
    assert critique_metrics([]) == {
        "steps_judged": 0.0, "verdicts_good": 0.0, "verdicts_bad": 0.0,
        "verdicts_uncertain": 0.0, "verdicts_none": 0.0, "verdict_missing_rate": 0.0,
        "verdict_bad_rate": 0.0, "first_error_found_rate": 0.0,
    }  # fmt: skip


class PromptRecorder:
    def __init__(self):
        self.prompts = []

    def generate(self, prompts, sampling):
        self.prompts += prompts
        return [Generation("Judgement: Good", [1], "stop") for _ in prompts]


def test_a_critique_prompt_too_long_keeps_the_instruction_and_the_question(tree, chat):
    recipes = "\n".join(f"craft 1 thing{i} using 1 stuff{i}" for i in range(400))
    long_tree = tree.model_copy(deep=True)
    long_tree.nodes[0].observation = f"Crafting commands:\n{recipes}\n\nGoal: craft x."
    long_tree.nodes[3].observation = "Got 1 z. " + "Nothing happens. " * 300
    pair = PathPair(task_id="acacia_boat", good_leaf=4, bad_leaf=5, good_score=1, bad_score=0,
                    divergence=1)  # fmt: skip
    backend = PromptRecorder()
    settings = WRITTEN.model_copy(update={"max_tokens": 16, "history_steps": 6})
    critique_pairs([pair], {"acacia_boat": long_tree}, backend, CountingChat(chat), settings, 512,
                   progress=False)  # fmt: skip
    assert len(backend.prompts) == 2  # steps 1 and 2 of the bad path, both judged Good
    for prompt in backend.prompts:
        assert len(prompt) <= 512 - 16
        text = chat.tokenizer.decode(prompt)
        assert text.startswith(f"<|im_start|>system\n{VERIFIER_SYSTEM}<|im_end|>")
        assert "Task:\nCrafting commands:\ncraft 1 thing0 using 1 stuff0" in text
        assert "Goal: craft x.\n\n" in text  # the task's end survives the cut in its middle
        assert text.endswith("'Judgement: Uncertain'.<|im_end|>\n<|im_start|>assistant\n")
    first, second = (chat.tokenizer.decode(p) for p in backend.prompts)
    assert "Step to judge:\nAction: get 1 z\nObservation: Got 1 z. Nothing" in first
    assert "Step to judge:\nAction: inventory\nObservation: Inventory: a z" in second


def test_a_critique_prompt_that_cannot_fit_is_refused_with_the_setting_to_change(tree, chat):
    pair = PathPair(task_id="acacia_boat", good_leaf=4, bad_leaf=5, good_score=1, bad_score=0,
                    divergence=1)  # fmt: skip
    with pytest.raises(ValueError, match="max_model_len"):
        critique_pairs([pair], {"acacia_boat": tree}, PromptRecorder(), chat,
                       WRITTEN.model_copy(update={"max_tokens": 16}), 96,
                       progress=False)  # fmt: skip


def test_shorten_middle_keeps_both_ends():
    assert shorten_middle("abcdefghij", 4) == "ab" + ELIDED + "ij"
    assert shorten_middle("abcdefghij", 5) == "ab" + ELIDED + "hij"
    assert shorten_middle("abc", 3) == "abc"


def test_the_revision_turn_sees_the_noop_answered_after_the_error_step(chat):
    """root -> 1 get 1 acacia logs -> {2 get 2 cobblestone (the error) -> 3 inventory (fails),
    4 get 1 acacia logs (solves)}. The no-op after the bad prefix must show what the error
    step did (2 cobblestone), or the revision turn is taught against the wrong state."""
    env = make_env("textcraft")
    nodes = [
        TreeNode(id=0, observation=env.start("acacia_boat").instruction),
        step(1, 0, 1, "get 1 acacia logs", "Got 1 acacia logs"),
        step(2, 1, 2, "get 2 cobblestone", "Got 2 cobblestone"),
        step(3, 2, 3, "inventory", "Inventory: ...", finish="max_depth", score=0.0),
        step(4, 1, 2, "get 1 acacia logs", "Got 1 acacia logs", finish="done", score=1.0),
    ]
    for n in nodes[1:]:
        nodes[n.parent].children.append(n.id)
    tree = SearchTree(task_id="acacia_boat", env="textcraft", nodes=nodes)
    pair = PathPair(task_id="acacia_boat", good_leaf=4, bad_leaf=3, good_score=1, bad_score=0,
                    divergence=1)  # fmt: skip
    judged = Critique(task_id="acacia_boat", pair=0, judged_from=1, verdicts=["bad"],
                      responses=[""], first_error=1)  # fmt: skip
    prefix = [Message(role="system", content="S")]
    (revision,), counts = build_training_data(
        env, [tree], [pair], [], [judged], prefix, "revision", include_good=False
    )
    assert counts == {"revisions": 1, "good_paths": 0}
    contents = [m.content for m in revision.continuation]
    assert "get 2 cobblestone" in contents[2] and contents[4].endswith("Action: inventory")
    assert contents[5] == "Observation: Inventory: [acacia logs] (1) [cobblestone] (2)"
    # Direct-Revision keeps the whole bad path: the no-op comes after step 3 as well.
    (direct,), _ = build_training_data(
        env, [tree], [pair], [], [judged], prefix, "direct", include_good=False
    )
    assert [m.content for m in direct.continuation][7] == (
        "Observation: Inventory: [acacia logs] (1) [cobblestone] (2)"
    )


class SamplingRecorder(PromptRecorder):
    def __init__(self):
        super().__init__()
        self.samplings = []

    def generate(self, prompts, sampling):
        self.samplings.append(sampling)
        return super().generate(prompts, sampling)


def test_a_critique_prompt_uses_all_the_room_a_reply_leaves_and_greedy_sampling(tree, chat, capsys):
    from flywheel.inference import SamplingSettings
    from tasks.critique import CritiqueSettings

    pair = PathPair(
        task_id="acacia_boat", good_leaf=4, bad_leaf=5, good_score=1, bad_score=0, divergence=2
    )  # fmt: skip  (one step judged: 5 "inventory")
    settings = CritiqueSettings(method="generate", max_tokens=16, history_steps=6)

    def prompts(max_model_len, progress=False):
        backend = SamplingRecorder()
        critique_pairs([pair], {"acacia_boat": tree}, backend, chat, settings, max_model_len,
                       progress=progress)  # fmt: skip
        assert backend.samplings == [SamplingSettings(temperature=0.0, top_p=1.0, max_tokens=16,
                                                      seed=0)]  # fmt: skip
        return backend.prompts

    (whole,) = prompts(4096)
    text = chat.tokenizer.decode(whole)
    assert "Earlier steps:\nAction: get 1 a\nObservation: Got 1 a\nAction: get 1 z" in text
    # Exactly room for the prompt, its reply header and max_tokens: nothing is cut.
    exact = len(whole) + 16
    assert prompts(exact) == [whole]
    (cut,) = prompts(exact - 1)  # one token short: the oldest history step goes
    assert len(cut) < len(whole)
    assert "Earlier steps:\nAction: get 1 z" in chat.tokenizer.decode(cut)
    capsys.readouterr()
    prompts(4096, progress=True)
    assert "critique: 100%" in capsys.readouterr().err


def test_pairs_are_drawn_with_seed_zero_unless_told_and_alpha_itself_is_good_enough(tree):
    by_default = select_pairs(tree, 0.5, 0.2, cap=3)
    assert by_default == select_pairs(tree, 0.5, 0.2, cap=3, seed=0)
    assert by_default != select_pairs(tree, 0.5, 0.2, cap=3, seed=1)  # the seed chooses
    assert select_good(tree, 0.75, 5) == [4, 7]  # leaf 7 scores exactly 0.75


def test_the_verifier_prompt_word_for_word():
    from tasks.critique import verifier_messages, verifier_question

    history = [step(1, 0, 1, "get 1 a", "Got 1 a"), step(2, 1, 2, None, "Invalid reply.")]
    judged = step(3, 2, 3, "craft 1 x using 1 a", "Crafted 1 x")
    system, user = verifier_messages("Goal: craft x.", history, judged, verifier_question(WRITTEN))
    assert (system.role, system.content) == (
        "system",
        "You review an agent's work one step at a time and say whether a step was right.",
    )
    assert user.role == "user" and user.content == (
        "Task:\nGoal: craft x.\n\n"
        "Earlier steps:\nAction: get 1 a\nObservation: Got 1 a\n"
        "Action: None\nObservation: Invalid reply.\n\n"
        "Step to judge:\nAction: craft 1 x using 1 a\nObservation: Crafted 1 x\n\n"
        "Was this step good (it brings the goal closer), bad (it fails, wastes the turn or leads "
        "away from the goal) or uncertain? Reason in one sentence, then end with one line: "
        "'Judgement: Good', 'Judgement: Bad' or 'Judgement: Uncertain'."
    )
    no_action = judged.model_copy(update={"action": None, "reply": "I think I should craft."})
    (_, first) = verifier_messages("Goal: craft x.", [], no_action, verifier_question(WRITTEN))
    assert first.content.startswith(
        "Task:\nGoal: craft x.\n\nEarlier steps:\n(none)\n\n"
        "Step to judge:\nAction: I think I should craft.\nObservation: Crafted 1 x\n\nWas this"
    )
    assert (system.loss, user.loss) == (False, False)


def test_a_backend_answering_fewer_prompts_than_asked_is_an_error(tree, chat, capsys):
    class OneAnswer:
        def generate(self, prompts, sampling):
            return [Generation("Judgement: Good", [1], "stop")]

    pairs = select_pairs(tree, 0.5, 0.2, 10)[:2]
    with pytest.raises(ValueError, match="zip"):
        critique_pairs(pairs, {"acacia_boat": tree}, OneAnswer(), chat, WRITTEN, 4096,
                       progress=False)  # fmt: skip
    critique_pairs(pairs[:1], {"acacia_boat": tree}, PromptRecorder(), chat, WRITTEN,
                   4096, progress=True)  # fmt: skip
    err = capsys.readouterr().err
    assert "critique: 100%" in err and "pair/s]" in err
    critique_pairs(pairs[:1], {"acacia_boat": tree}, PromptRecorder(), chat, WRITTEN,
                   4096, progress=False)  # fmt: skip
    assert "critique" not in capsys.readouterr().err


class CountingChat:
    """The chat tokenizer, refusing to render more than `limit` prompts (a shortening loop that
    makes no progress fails at once instead of running forever)."""

    def __init__(self, chat, limit: int = 200):
        self._chat, self.calls, self.limit = chat, 0, limit

    def __getattr__(self, name):
        return getattr(self._chat, name)

    def encode(self, messages):
        self.calls += 1
        if self.calls > self.limit:
            raise RuntimeError(f"{self.calls} prompts rendered: the loop makes no progress")
        return self._chat.encode(messages)


class AlwaysGood(PromptRecorder):
    def generate(self, prompts, sampling):
        assert len(self.prompts) < 10, "judged the same steps again and again"
        return super().generate(prompts, sampling)


def test_each_step_of_the_bad_path_is_judged_once_in_order(tree, chat):
    from tasks.critique import CritiqueSettings

    (pair,) = [p for p in select_pairs(tree, 0.5, 0.2, 10) if (p.good_leaf, p.bad_leaf) == (7, 5)]
    backend = AlwaysGood()
    (critique,) = critique_pairs([pair], {"acacia_boat": tree}, backend, chat, CritiqueSettings(method="generate"),
                                 4096, progress=False)  # fmt: skip
    judged = [chat.tokenizer.decode(p).split("Step to judge:\nAction: ")[1].split("\n")[0]
              for p in backend.prompts]  # fmt: skip
    assert judged == ["get 1 a", "get 1 z", "inventory"]
    assert critique.verdicts == ["good"] * 3 and critique.first_error is None


def test_a_long_reply_without_an_action_is_cut_in_its_middle(tree, chat):
    from tasks.critique import CritiqueSettings

    rambling = tree.model_copy(deep=True)
    reply = "I wonder what to do. " + "Maybe this, maybe that. " * 200 + "I give up."
    rambling.nodes[5].action, rambling.nodes[5].reply = None, reply
    pair = PathPair(task_id="acacia_boat", good_leaf=4, bad_leaf=5, good_score=1, bad_score=0,
                    divergence=2)  # fmt: skip
    backend, counting = PromptRecorder(), CountingChat(chat)
    critique_pairs([pair], {"acacia_boat": rambling}, backend, counting,
                   CritiqueSettings(method="generate", max_tokens=16, history_steps=0), 400, progress=False)  # fmt: skip
    (prompt,) = backend.prompts
    text = chat.tokenizer.decode(prompt)
    assert len(prompt) <= 400 - 16
    assert "Step to judge:\nAction: I wonder what to do. Maybe" in text
    assert ELIDED in text and "I give up.\nObservation: Inventory: a z" in text
    assert "Task:\nCrafting commands: ...\n\nGoal: craft x.\n\n" in text  # short: kept whole


def test_texts_of_at_most_32_characters_are_never_cut(tree, chat):
    from tasks.critique import CritiqueSettings, verifier_messages, verifier_question

    short = tree.model_copy(deep=True)
    short.nodes[0].observation = "Goal: craft one x. " + "y" * 13  # exactly 32 characters
    assert len(short.nodes[0].observation) == 32
    pair = PathPair(task_id="acacia_boat", good_leaf=4, bad_leaf=5, good_score=1, bad_score=0,
                    divergence=2)  # fmt: skip
    judged = short.nodes[5]
    whole = len(
        chat.encode(
            verifier_messages(short.nodes[0].observation, [], judged, verifier_question(WRITTEN))
        )[0]
    )
    cut = len(chat.encode(verifier_messages(shorten_middle(short.nodes[0].observation, 16), [],
                                            judged, verifier_question(WRITTEN)))[0])  # fmt: skip
    assert cut < whole
    # Room for the prompt with the task cut to 16 characters, not for the whole task.
    max_model_len = cut + len(chat.header_ids) + 16
    with pytest.raises(ValueError, match="raise inference.max_model_len or lower critique.max_"):
        critique_pairs([pair], {"acacia_boat": short}, PromptRecorder(), CountingChat(chat),
                       CritiqueSettings(method="generate", max_tokens=16, history_steps=0), max_model_len,
                       progress=False)  # fmt: skip


def test_the_bad_prefix_ends_at_the_error_within_the_path_and_the_step_count_follows(tree):
    """Bad path 5: get 1 a, get 1 z, inventory; good path 4: get 1 a, get 1 b, craft 1 x;
    divergence 1. The prefix ends at the error, at least at the divergence, at most at the
    last step; the spliced episode counts prefix + revision + the good path after divergence."""
    pair = PathPair(
        task_id="acacia_boat", good_leaf=4, bad_leaf=5, good_score=1, bad_score=0, divergence=1
    )
    assert [bad_prefix_end(pair, e, 3) for e in (None, 0, 1, 2, 7)] == [2, 1, 1, 2, 2]
    prefix, reply = [Message(role="system", content="S")], "Thought: oops\nAction: inventory"
    # error at step 1: 2 prefix steps + the revision + 2 good steps (get 1 b, craft 1 x)
    assert splice_revision(tree, pair, 1, prefix, reply, "Inv").n_steps == 5
    assert splice_revision(tree, pair, None, prefix, reply, "Inv").n_steps == 6


def test_each_mode_builds_its_own_data(tree):
    env = make_env("textcraft")
    pair = PathPair(
        task_id="acacia_boat", good_leaf=4, bad_leaf=5, good_score=1, bad_score=0, divergence=1
    )
    good = [{"task_id": "acacia_boat", "leaf": 4}]
    judged = Critique(task_id="acacia_boat", pair=0, judged_from=1, verdicts=["bad"],
                      responses=[""], first_error=1)  # fmt: skip
    prefix = [Message(role="system", content="S")]

    def counts(mode, include_good):
        args = (env, [tree], [pair], good, [judged], prefix, mode, include_good)
        return build_training_data(*args)[1]

    assert counts("good", False) == {"revisions": 0, "good_paths": 1}
    assert counts("revision", False) == {"revisions": 1, "good_paths": 0}
    assert counts("revision", True) == {"revisions": 1, "good_paths": 1}
    assert counts("direct", False) == {"revisions": 1, "good_paths": 0}


def acacia_tree(after_error: str) -> SearchTree:
    """root -> 1 get 1 acacia logs -> {2 get 2 cobblestone (the error) -> 3 `after_error`
    (fails), 4 get 1 acacia logs (solves)}, on the real TextCraft task."""
    nodes = [
        TreeNode(id=0, observation=make_env("textcraft").start("acacia_boat").instruction),
        step(1, 0, 1, "get 1 acacia logs", "Got 1 acacia logs"),
        step(2, 1, 2, "get 2 cobblestone", "Got 2 cobblestone"),
        step(3, 2, 3, after_error, "...", finish="max_depth", score=0.0),
        step(4, 1, 2, "get 1 acacia logs", "Got 1 acacia logs", finish="done", score=1.0),
    ]
    for n in nodes[1:]:
        nodes[n.parent].children.append(n.id)
    return SearchTree(task_id="acacia_boat", env="textcraft", nodes=nodes)


ACACIA_PAIR = PathPair(task_id="acacia_boat", good_leaf=4, bad_leaf=3, good_score=1,
                       bad_score=0, divergence=1)  # fmt: skip


def test_the_noop_is_answered_after_the_error_step_not_after_the_steps_past_it():
    """The step after the error changes the inventory: the revision turn's no-op must not see it
    (it is cut away), while Direct-Revision, which keeps the whole bad path, does."""
    env, tree = make_env("textcraft"), acacia_tree("get 1 acacia logs")
    judged = Critique(task_id="acacia_boat", pair=0, judged_from=1, verdicts=["bad"],
                      responses=[""], first_error=1)  # fmt: skip
    prefix = [Message(role="system", content="S")]
    args = (env, [tree], [ACACIA_PAIR], [], [judged], prefix)
    (revision,), _ = build_training_data(*args, "revision", include_good=False)
    assert [m.content for m in revision.continuation][5] == (
        "Observation: Inventory: [acacia logs] (1) [cobblestone] (2)"
    )
    (direct,), _ = build_training_data(*args, "direct", include_good=False)
    assert [m.content for m in direct.continuation][7] == (
        "Observation: Inventory: [acacia logs] (2) [cobblestone] (2)"
    )


def test_the_revision_thought_is_one_of_the_listed_ones_drawn_with_seed_zero_unless_told():
    assert revision_reply("inventory", random.Random(3)) == (
        f"Thought: {random.Random(3).choice(REVISION_THOUGHTS)}\nAction: inventory"
    )
    env, tree = make_env("textcraft"), acacia_tree("inventory")
    prefix = [Message(role="system", content="S")]
    pairs = [ACACIA_PAIR] * 6

    def thoughts(*seed):
        data, _ = build_training_data(env, [tree], pairs, [], [], prefix, "revision", False, *seed)
        return [t.continuation[6].content.split("\n")[0] for t in data]

    drawn = random.Random(0)
    assert thoughts() == [f"Thought: {drawn.choice(REVISION_THOUGHTS)}" for _ in pairs]
    assert thoughts() == thoughts(0) != thoughts(1)


def test_a_step_without_an_action_is_wasted_even_after_the_goal_is_crafted():
    env = make_env("textcraft")
    plan = [action for _, action in env.expert_plan("acacia_boat")]
    assert env.mistakes("acacia_boat", [*plan, None]) == [False] * len(plan) + [True]
