"""Agent-R's round on each in-process environment, in its own turn format: the tree search takes
environment steps, leaves record their score and whether they solved the task, a pair forms, and
the critique and the splice write their prompts and rows as the environment's agent writes turns.

TextCraft's agent writes ReAct; QA's writes tool calls in tags (``<search>...</search>``) and
reads results in ``<result>`` (a reply no call can be read from is stepped as a malformed action,
as the rollout steps it). The policy is scripted (`PlanWithDetours`): the expert's plan, and at
each expansion detours beside it. ScienceWorld is left out: its episodes take seconds to start
and cannot snapshot, so every child replays its path (minutes for one tree).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agents.mcts import SearchLimits, SearchTree, search
from agents.rollout import agent_prefix
from agents.turns import turns_for
from envs import make_env
from flywheel.inference import Generation
from flywheel.settings import EnvSettings
from tasks.critique import CritiqueSettings, critique_pairs
from tasks.mcts import MCTSSettings
from tasks.select_paths import select_good, select_pairs
from tasks.splice import REVISION_THOUGHTS, build_training_data
from training.datasets import sft_rows

JUDGE = CritiqueSettings(method="generate", max_tokens=16)


class PlanWithDetours:
    """Of each expansion's samples, the first is the plan's next turn and the others its
    detours there (`detours(turns taken on the plan)`). How far along the plan an episode is:
    the plan's turns found in order in its text after the instruction."""

    def __init__(self, chat, instruction: str, plan: list[str], detours):
        self.chat, self.instruction, self.plan, self.detours = chat, instruction, plan, detours

    def generate(self, prompts, sampling):
        out = []
        for i, prompt in enumerate(prompts):
            done = self.progress(self.chat.tokenizer.decode(prompt))
            choices = [self.plan[done], *self.detours(done)]
            text = choices[i % len(choices)]
            ids = self.chat.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(text, ids + [self.chat.tokenizer.eos_token_id], "stop"))
        return out

    def progress(self, prompt: str) -> int:
        episode, done, at = prompt.split(self.instruction, 1)[1], 0, 0
        while done < len(self.plan) - 1 and (found := episode.find(self.plan[done], at)) >= 0:
            done, at = done + 1, found + len(self.plan[done])
        return done


class StepJudge:
    """Writes "Judgement: Good" for a judged step that makes one of `good_moves`, else "Bad";
    records the prompts."""

    def __init__(self, chat, good_moves: list[str]):
        self.chat, self.good_moves, self.prompts = chat, good_moves, []

    def generate(self, prompts, sampling):
        texts = [self.chat.tokenizer.decode(p) for p in prompts]
        self.prompts += texts
        judged = [t.split("Step to judge:\n")[1].split("\n")[0] for t in texts]
        verdicts = ["Good" if j in self.good_moves else "Bad" for j in judged]
        return [Generation(f"Judgement: {v}", [1], "stop") for v in verdicts]


@dataclass
class World:
    """An environment, a task, the scripted policy's detours, and what its turns look like."""

    env: object
    task: str
    detours: object  # turns taken on the plan -> the detour replies there
    observation_start: str  # how the format writes an observation
    max_depth: int


def qa_world() -> World:
    env = make_env(EnvSettings(name="qa", qa={"tools": ["search"]}))
    task = "founder_birth_town/company-016"  # search, search, answer "Wastdale"
    turns, answer = turns_for(env), env.questions("train")[task].answer
    plan_steps = len(env.expert_plan(task))

    def detours(done: int) -> list[str]:
        if done == plan_steps - 1:  # the answer: a wrong one, and one half right (F1 above alpha)
            return ["<answer>Nobody</answer>", f"<answer>{answer} town</answer>"]
        return ["Let me look around.\n<search>weather report</search>", "I am not sure."]

    assert turns.read("I am not sure.").malformed
    return World(env, task, detours, "<result>\n", max_depth=4)


def textcraft_world() -> World:
    env = make_env("textcraft")
    task = next(t for t in env.task_ids("train") if len(env.expert_plan(t)) == 3)

    def detours(done: int) -> list[str]:
        return ["Thought: Let me look.\nAction: inventory", "Thought: I am not sure."]

    return World(env, task, detours, "Observation: ", max_depth=4)


WORLDS = {"qa": qa_world, "textcraft": textcraft_world}


@pytest.fixture(scope="module", params=sorted(WORLDS))
def world(request) -> World:
    return WORLDS[request.param]()


@pytest.fixture(scope="module")
def grown(world, chat):
    """The world's tree, grown by the scripted policy."""
    env, turns = world.env, turns_for(world.env)
    plan = [turns.written_turn(t, a).content for t, a in env.expert_plan(world.task)]
    instruction = env.start(world.task).instruction
    backend = PlanWithDetours(chat, instruction, plan, world.detours)
    limits = SearchLimits(iterations=12, max_depth=world.max_depth, samples_per_node=3)
    prefix = agent_prefix(env, [])
    (tree,) = search(env, [world.task], backend, chat, prefix, limits, seed=1, progress=False)
    return tree, prefix


def test_the_tree_steps_the_environment_in_its_turn_format(world, grown):
    tree, _ = grown
    turns = turns_for(world.env)
    assert tree.agent_format == world.env.agent_format and tree.env_steps > 0
    children = tree.nodes[1:]
    assert children and all(n.observation for n in children)
    for node in children:
        read = turns.read(node.reply)
        assert (node.action, node.malformed) == (read.action, read.malformed)
    stepped = [n for n in children if n.action is not None and not n.malformed]
    assert stepped, "no reply was read as an environment action"
    # The scripted replies that are not moves: QA steps them (the format's error answers),
    # ReAct takes no step and tells the format.
    unread = [n for n in children if n.action is None or n.malformed]
    assert unread
    if world.env.agent_format == "react":
        assert all(n.action is None for n in unread)
    else:
        assert all(
            n.malformed and n.observation.startswith("No call in this reply") for n in unread
        )
    # A path becomes a trajectory written as the rollout writes one.
    leaf = max(tree.leaves(), key=lambda n: n.depth)
    seen = [m for m in tree.trajectory(leaf.id, []).continuation if m.role == "user"]
    for message, node in zip(seen, tree.path(leaf.id)[1:], strict=False):
        assert message == turns.observation(node.observation, node.malformed)
        assert node.malformed or message.content.startswith(world.observation_start)


def test_leaves_record_their_score_and_whether_the_episode_solved_its_task(world, grown):
    tree, _ = grown
    leaves = tree.leaves()
    assert leaves and all(leaf.score is not None for leaf in leaves)
    assert any(leaf.solved and leaf.score == 1.0 for leaf in leaves)
    if world.env.name == "qa":  # QA decides success itself: its exact match
        assert all(leaf.success is not None for leaf in leaves)
        half = [leaf for leaf in leaves if leaf.reply.endswith(" town</answer>")]
        # A half-right answer scores above alpha 0.5 (answer F1 plus the format term) unsolved.
        assert any(0.5 <= leaf.score < 1.0 for leaf in half)
        assert not any(leaf.solved for leaf in half)
        # The right answer after a reply that broke the format: solved, without reward.
        assert any(leaf.solved and leaf.score == 0.0 for leaf in leaves)
    else:  # TextCraft leaves it to the score
        assert all(leaf.success is None for leaf in leaves)
    restored = SearchTree.model_validate_json(tree.model_dump_json())
    assert restored == tree and restored.turns().__class__ is turns_for(world.env).__class__


def test_good_leaves_are_solved_where_the_environment_says_so(world, grown):
    tree, _ = grown
    pairs = select_pairs(tree, alpha=0.5, beta=0.2, cap=20)
    assert pairs, "no pair formed"
    good = [tree.nodes[p.good_leaf] for p in pairs] + [
        tree.nodes[leaf] for leaf in select_good(tree, 0.5, 10)
    ]
    assert all(leaf.solved and leaf.score >= 0.5 for leaf in good)


def test_the_critique_and_the_splice_write_the_environments_turns(world, grown, chat):
    tree, prefix = grown
    env, turns = world.env, turns_for(world.env)
    pairs = select_pairs(tree, alpha=0.5, beta=0.2, cap=20)
    good_moves = [turns.shown_move(a) for _, a in env.expert_plan(world.task)]
    judge = StepJudge(chat, good_moves)
    critiques = critique_pairs(pairs, {tree.task_id: tree}, judge, chat, JUDGE, 4096, None, False)
    assert judge.prompts and any(c.first_error is not None for c in critiques)
    judged = [prompt.split("Step to judge:\n")[1] for prompt in judge.prompts]
    moves = {turns.shown_move(None if n.malformed else n.action, n.reply) for n in tree.nodes[1:]}
    assert {step.split("\n")[0] for step in judged} <= moves  # as the agent writes them
    for step in judged:
        answer = step.split("\n", 1)[1]  # what answered the judged move
        assert answer.startswith(world.observation_start) or answer.startswith("No call")
        assert ("Action: " in step) == (env.agent_format == "react")

    good = [{"task_id": tree.task_id, "leaf": leaf} for leaf in select_good(tree, 0.5, 2)]
    data, counts = build_training_data(
        env, [tree], pairs, good, critiques, prefix, "revision", include_good=True
    )
    revisions = [t for t in data if t.source == "revision"]
    assert revisions and counts["revisions"] == len(revisions)
    assert counts["revisions"] + counts.get("unrevisable_pairs", 0) == len(pairs)
    written = {turns.written_turn(t, env.noop_action).content for t in REVISION_THOUGHTS}
    replies = {node.reply for node in tree.nodes[1:]}
    for trajectory in revisions:
        episode = trajectory.continuation
        at = next(i for i, m in enumerate(episode) if m.content in written)
        assert episode[at].loss and episode[at].token_ids is None
        noop = episode[at + 1].content  # the no-op's answer, as the format wraps a result
        assert noop.startswith(world.observation_start) and "episode is over" not in noop
        assert trajectory.success and all(m.role == "user" for m in episode[1::2])
        assert {m.content for m in episode[::2]} <= replies | written
    assert all(row["input_ids"] for row in sft_rows(data, chat, max_length=4096)[0])


def test_the_revision_turn_never_follows_the_step_that_ended_the_episode(world, grown):
    """A QA answer ends its episode: a pair whose bad path leaves the good one only at its answer
    has nothing to revise (no revision turn comes after an answer). TextCraft's bad paths never
    end that way: its episodes end only when solved."""
    tree, prefix = grown
    pairs = select_pairs(tree, 0.5, 0.2, 20)
    late = [p for p in pairs if p.divergence == tree.nodes[p.bad_leaf].depth - 1
            and tree.nodes[p.bad_leaf].finish == "done"]  # fmt: skip
    assert bool(late) == (world.env.name == "qa")
    data, counts = build_training_data(world.env, [tree], late, [], [], prefix, "direct", False)
    assert data == [] and counts.get("unrevisable_pairs", 0) == len(late)


def test_a_round_of_mcts_takes_a_seeded_mix_of_the_train_tasks():
    """QA lists its train questions by family: a round's slice is taken from a seeded order, the
    same every round, so rounds still cover every question."""
    questions = make_env(EnvSettings(name="qa")).task_ids("train")
    settings = MCTSSettings(tasks_per_round=32)
    rounds = [settings.tasks_for_round(questions, n) for n in range(1, 12)]
    assert len({q.split("/")[0] for q in rounds[0]}) > 2  # the listed order: one family
    assert len({q.split("/")[0] for q in questions[:32]}) == 1
    assert all(len(r) == 32 for r in rounds) and set().union(*rounds) == set(questions)
    assert rounds[0] == settings.tasks_for_round(questions, 1)  # seeded
    assert rounds[0] == [q for q in questions if q in set(rounds[0])]  # in the listed order
    other = MCTSSettings(tasks_per_round=32, task_order_seed=1).tasks_for_round(questions, 1)
    assert other != rounds[0]
    assert MCTSSettings().tasks_for_round(questions, 2) == questions  # all of them: as listed
    listed = MCTSSettings(tasks_per_round=2, task_order_seed=None)  # the listed order's slices
    assert listed.tasks_for_round(["a", "b", "c"], 2) == ["c", "a"]


def test_the_verifier_prompt_in_the_tag_format_word_for_word():
    from agents.mcts import TreeNode
    from agents.turns import format_turns
    from envs.tools import call_action, malformed_action
    from tasks.critique import verifier_messages, verifier_question

    turns = format_turns("tags", {"search": "query"})
    unclear = "I am not sure."
    history = [
        TreeNode(id=1, action=call_action("search", {"query": "Acme"}), observation="Acme: 1990."),
        TreeNode(id=2, reply=unclear, action=malformed_action("No call."), malformed=True,
                 observation="No call."),
    ]  # fmt: skip
    judged = TreeNode(id=3, action=call_action("answer", {"text": "1990"}), observation="Done.")
    question = verifier_question(JUDGE)
    _, user = verifier_messages("Question: When?", history, judged, question, turns)
    assert user.content == (
        "Task:\nQuestion: When?\n\n"
        "Earlier steps:\n<search>Acme</search>\n<result>\nAcme: 1990.\n</result>\n"
        "(a reply no call could be read from)\nNo call.\n\n"
        "Step to judge:\n<answer>1990</answer>\n<result>\nDone.\n</result>\n\n" + question
    )
    _, unread = verifier_messages("Question: When?", [], history[1], question, turns)
    assert "Step to judge:\nI am not sure.\nNo call.\n\n" in unread.content  # the reply, whole
