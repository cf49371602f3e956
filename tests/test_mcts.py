"""Tree search: UCT choice, back-propagation, de-duplication, terminal cases, restore vs replay.

The search runs on real TextCraft; replies come from `NoisyExpertBackend` (the expert's plan with
seeded mistakes), so the rules can be checked exactly. Real vLLM runs in test_agent_r_flow.
"""

from __future__ import annotations

import random

import pytest
from scripted_policy import NoisyExpertBackend
from scripted_worlds import Dial, ScriptedCalls

from agents.mcts import (
    SearchLimits,
    SearchTree,
    TreeNode,
    backpropagate,
    divergence,
    render,
    search,
    uct_choice,
    unique_replies,
)
from agents.rollout import agent_prefix
from envs import make_env
from envs.base import Environment, Episode, StepResult
from flywheel.chat import FORMAT_HINT, format_reply
from flywheel.inference import Generation
from flywheel.records import Message


def node(id, parent=None, visits=0, value=0.0, closed=False, finish="", score=None):
    return TreeNode(
        id=id, parent=parent, visits=visits, value=value, closed=closed, finish=finish, score=score
    )


def test_uct_prefers_unvisited_then_the_best_score():
    parent = node(0, visits=10)
    visited = node(1, 0, visits=5, value=5.0)
    fresh = node(2, 0)
    assert uct_choice(parent, [visited, fresh], 0.25, random.Random(0)) is fresh
    low, high = node(1, 0, visits=5, value=1.0), node(2, 0, visits=5, value=4.0)
    assert uct_choice(parent, [low, high], 0.25, random.Random(0)) is high
    # Exploration: a rarely visited child with a lower mean wins when c is large.
    often, rare = node(1, 0, visits=9, value=5.4), node(2, 0, visits=1, value=0.3)
    assert uct_choice(parent, [often, rare], 0.25, random.Random(0)) is often
    assert uct_choice(parent, [often, rare], 2.0, random.Random(0)) is rare


def test_uct_breaks_ties_by_the_seeded_coin_and_skips_closed_children():
    parent = node(0, visits=4)
    a, b = node(1, 0, visits=2, value=1.0), node(2, 0, visits=2, value=1.0)
    picks = [uct_choice(parent, [a, b], 0.25, random.Random(seed)).id for seed in range(20)]
    assert set(picks) == {1, 2}
    # The coin is the given rng (not the global one): each pick is that seed's own choice.
    assert picks == [random.Random(seed).choice([1, 2]) for seed in range(20)]
    closed = node(3, 0, closed=True)
    assert uct_choice(parent, [closed, a], 0.25, random.Random(0)) is a
    assert uct_choice(parent, [closed], 0.25, random.Random(0)) is None


def test_backpropagation_adds_the_score_to_every_ancestor_and_closes_exhausted_nodes():
    root, middle = node(0), node(1, 0)
    done = node(2, 1, finish="done", score=1.0, closed=True)
    still_open = node(3, 0)
    root.children, middle.children = [1, 3], [2]
    tree = SearchTree(task_id="t", env="e", nodes=[root, middle, done, still_open])
    backpropagate(tree, 2, 1.0)
    assert [(n.visits, n.value) for n in tree.nodes[:3]] == [(1, 1.0), (1, 1.0), (1, 1.0)]
    assert middle.closed  # its only child is terminal
    assert not root.closed  # child 3 is still open
    assert tree.nodes[3].visits == 0


def test_backpropagation_sums_different_scores_and_counts_every_visit():
    """root -> 1 -> {2, 3}; root -> 4. Leaves 2 and 3 score 0.25 and 0.5; 4 ends later with 0."""
    root, middle, still_open = node(0), node(1, 0), node(4, 0)
    low = node(2, 1, finish="max_depth", score=0.25, closed=True)
    high = node(3, 1, finish="done", score=0.5, closed=True)
    root.children, middle.children = [1, 4], [2, 3]
    tree = SearchTree(task_id="t", env="e", nodes=[root, middle, low, high, still_open])
    backpropagate(tree, 2, 0.25)
    backpropagate(tree, 3, 0.5)
    # Sums, not the last score, and one visit per back-propagation through the node.
    assert (middle.visits, middle.value) == (2, 0.75)
    assert (root.visits, root.value) == (2, 0.75)
    assert (low.visits, low.value, high.visits, high.value) == (1, 0.25, 1, 0.5)
    assert middle.closed and not root.closed
    still_open.finish, still_open.score, still_open.closed = "max_depth", 0.0, True
    backpropagate(tree, 4, 0.0)
    assert (root.visits, root.value) == (3, 0.75) and root.closed
    assert (middle.visits, middle.value) == (2, 0.75)  # not on the path from 4


def test_identical_replies_are_kept_once():
    replies = [Generation(t, [1], "stop") for t in ["a", "b ", "b", "a", "c"]]
    kept, dropped = unique_replies(replies)
    assert [g.text for g in kept] == ["a", "b ", "c"] and dropped == 2


@pytest.fixture(scope="module")
def env():
    return make_env("textcraft")


@pytest.fixture(scope="module")
def deep_tasks(env):
    return [t for t in env.task_ids("train") if len(env.expert_plan(t)) >= 6][:3]


def test_a_perfect_policy_reaches_done_with_score_one(env, chat):
    task = "acacia_boat"
    backend = NoisyExpertBackend(env, chat.tokenizer, mistake_rate=0.0)
    limits = SearchLimits(iterations=3, max_depth=10, samples_per_node=3)
    (tree,) = search(env, [task], backend, chat, agent_prefix(env, []), limits, progress=False)
    # Every sample is the same reply: one child per expansion, one path, closed after iteration 1.
    assert tree.duplicates == 2 * tree.expansions
    leaf = tree.leaves()[0]
    assert len(tree.leaves()) == 1 and leaf.finish == "done" and leaf.score == 1.0
    assert leaf.depth == len(env.expert_plan(task))
    assert tree.nodes[0].closed and tree.iterations == 1  # the root closed: no more descents
    assert tree.nodes[0].visits == 1 and tree.nodes[0].value == 1.0
    trajectory = tree.trajectory(leaf.id, agent_prefix(env, []))
    assert trajectory.success and trajectory.messages[-1].role == "assistant"


def test_max_depth_and_full_context_end_a_branch(env, chat, deep_tasks):
    backend = NoisyExpertBackend(env, chat.tokenizer, mistake_rate=1.0)
    limits = SearchLimits(iterations=4, max_depth=2, samples_per_node=3)
    trees = search(env, deep_tasks, backend, chat, agent_prefix(env, []), limits, progress=False)
    for tree in trees:
        assert tree.leaves() and {leaf.finish for leaf in tree.leaves()} == {"max_depth"}
        assert all(leaf.depth == 2 and leaf.score == 0.0 for leaf in tree.leaves())
    prompt_len = len(chat.encode(agent_prefix(env, []))[0]) + 400
    tight = SearchLimits(iterations=1, max_depth=50, samples_per_node=2, max_model_len=prompt_len)
    (tree,) = search(
        env, deep_tasks[:1], backend, chat, agent_prefix(env, []), tight, progress=False
    )
    assert tree.leaves() and all(leaf.finish == "context" for leaf in tree.leaves())


def test_trees_expand_together_and_restore_builds_the_same_trees_with_fewer_steps(
    env, chat, deep_tasks
):
    prefix = agent_prefix(env, [])
    trees = {}
    for restore in (True, False):
        backend = NoisyExpertBackend(env, chat.tokenizer, mistake_rate=0.4)
        limits = SearchLimits(iterations=3, max_depth=8, samples_per_node=3, restore_state=restore)
        trees[restore] = search(
            env, deep_tasks, backend, chat, prefix, limits, seed=5, progress=False
        )
        assert backend.calls[0] == 3 * len(deep_tasks)  # every tree's N samples in one call
    for restored, replayed in zip(trees[True], trees[False], strict=True):
        assert [n.model_dump() for n in restored.nodes] == [n.model_dump() for n in replayed.nodes]
        deep = [n for n in restored.nodes if n.depth >= 6]
        assert deep, "the search should reach depth 6"
        assert restored.env_steps * 3 <= replayed.env_steps
        assert restored.iterations == 3
        # Trees are stored and read back whole, and render for inspection.
        assert SearchTree.model_validate_json(restored.model_dump_json()) == restored
        assert restored.task_id in render(restored)


def test_children_of_a_parent_have_distinct_replies(env, chat, deep_tasks):
    backend = NoisyExpertBackend(env, chat.tokenizer, mistake_rate=0.5)
    limits = SearchLimits(iterations=3, max_depth=6, samples_per_node=4)
    (tree,) = search(
        env, deep_tasks[:1], backend, chat, agent_prefix(env, []), limits, progress=False
    )
    for parent in tree.nodes:
        replies = [tree.nodes[c].reply.strip() for c in parent.children]
        assert len(replies) == len(set(replies))
    assert tree.samples == 4 * tree.expansions
    assert tree.samples - tree.duplicates == len(tree.nodes) - 1


class Corridor(Environment):
    """One task: 'win' ends it with reward 1; any other action walks one step further."""

    name = "corridor"

    def task_ids(self, split):
        return ["t"]

    def start(self, task_id):
        return CorridorEpisode()


class CorridorEpisode(Episode):
    task_id, instruction = "t", "Goal: reach the end."

    def step(self, action):
        won = action == "win"
        return StepResult("You won." if won else "You walked.", float(won), won)


class WinOrWalkBackend:
    """Every expansion samples two replies: 'win' first, then 'walk'."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, sampling):
        out = []
        for i in range(len(prompts)):
            text = format_reply("go", "win" if i % 2 == 0 else "walk")
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(text, ids + [self.tokenizer.eos_token_id], "stop"))
        return out


def test_a_terminal_first_child_leaves_its_siblings_open_to_search(chat):
    env = Corridor()
    limits = SearchLimits(iterations=5, max_depth=3, samples_per_node=2)
    prefix = [Message(role="system", content="S")]
    (tree,) = search(env, ["t"], WinOrWalkBackend(chat.tokenizer), chat, prefix, limits,
                     progress=False)  # fmt: skip
    # root -> 1 win (done), 2 walk -> 3 win (done), 4 walk -> 5 win (done), 6 walk (max_depth).
    assert [(n.id, n.parent, n.action) for n in tree.nodes[1:]] == [
        (1, 0, "win"), (2, 0, "walk"), (3, 2, "win"), (4, 2, "walk"), (5, 4, "win"),
        (6, 4, "walk"),
    ]  # fmt: skip
    assert [(leaf.id, leaf.finish, leaf.score) for leaf in tree.leaves()] == [
        (1, "done", 1.0), (3, "done", 1.0), (5, "done", 1.0), (6, "max_depth", 0.0),
    ]  # fmt: skip
    # Four leaves back-propagated through the root: three wins and one loss.
    assert (tree.nodes[0].visits, tree.nodes[0].value) == (4, 3.0)
    assert (tree.nodes[2].visits, tree.nodes[2].value) == (3, 2.0)
    assert (tree.nodes[4].visits, tree.nodes[4].value) == (2, 1.0)
    assert tree.nodes[0].closed and tree.expansions == 3


class WinOrMumbleBackend:
    """Each expansion samples 'win', then a reply with no action, whose ids are one token per
    character: the same text as the tokenizer's ids for it, other ids. Records every prompt."""

    MUMBLE = "Thought: hmm, maybe"

    def __init__(self, tokenizer):
        self.tokenizer, self.prompts = tokenizer, []

    def mumble_ids(self) -> list[int]:
        return [
            i for c in self.MUMBLE for i in self.tokenizer(c, add_special_tokens=False)["input_ids"]
        ]

    def generate(self, prompts, sampling):
        self.prompts += prompts
        win = format_reply("go", "win")
        replies = [(win, self.tokenizer(win, add_special_tokens=False)["input_ids"]),
                   (self.MUMBLE, self.mumble_ids())]  # fmt: skip
        eos = [self.tokenizer.eos_token_id]
        return [
            Generation(*replies[i % 2][:1], replies[i % 2][1] + eos, "stop")
            for i in range(len(prompts))
        ]


def test_a_reply_without_an_action_is_told_the_format_and_kept_as_generated(chat):
    backend = WinOrMumbleBackend(chat.tokenizer)
    assert (
        backend.mumble_ids()
        != chat.tokenizer(backend.MUMBLE, add_special_tokens=False)["input_ids"]
    )
    limits = SearchLimits(iterations=2, max_depth=3, samples_per_node=2)
    prefix = [Message(role="system", content="S")]
    (tree,) = search(Corridor(), ["t"], backend, chat, prefix, limits, progress=False)
    mumble = tree.nodes[2]
    assert (mumble.parent, mumble.action, mumble.observation) == (0, None, FORMAT_HINT)
    # no reward, not done: the search goes on below it, to max_depth
    assert (mumble.reward, mumble.finish, mumble.score) == (0.0, "", None)
    assert [(n.parent, n.finish) for n in tree.nodes[1:]] == [
        (0, "done"), (0, ""), (2, "done"), (2, ""), (4, "done"), (4, "max_depth"),
    ]  # fmt: skip
    # its prompt holds the reply's ids as generated, not the tokenizer's ids for its text
    prompt, ids = backend.prompts[2], backend.mumble_ids()  # 2 samples of the root first
    assert any(prompt[i : i + len(ids)] == ids for i in range(len(prompt)))


def test_a_leaf_becomes_a_trajectory_with_the_generated_ids_and_the_leafs_outcome():
    """root -> 1 -> 2 -> 3 (done, reward 1) and 2 -> 4: the path to 3 as an episode."""
    nodes = [TreeNode(id=0, observation="Goal: craft x.")]
    for id, parent, action in [(1, 0, "get 1 a"), (2, 1, "get 1 b"), (3, 2, "craft 1 x"),
                               (4, 2, "inventory")]:  # fmt: skip
        nodes.append(TreeNode(
            id=id, parent=parent, depth=nodes[parent].depth + 1, reply=f"Action: {action}",
            token_ids=[100 + id, 200 + id], end_generated=id != 2, action=action,
            observation=f"seen {id}",
        ))  # fmt: skip
        nodes[parent].children.append(id)
    nodes[3].finish, nodes[3].score, nodes[3].reward = "done", 1.0, 1.0
    nodes[4].finish, nodes[4].score = "max_depth", 0.0
    tree = SearchTree(task_id="x", env="e", nodes=nodes)
    prefix = [Message(role="system", content="S"), Message(role="user", content="example")]
    trajectory = tree.trajectory(3, prefix)
    assert trajectory.messages[:2] == prefix and trajectory.episode_start == 2
    assert [(m.role, m.content, m.loss, m.token_ids, m.end_generated)
            for m in trajectory.messages[2:]] == [
        ("user", "Goal: craft x.", False, None, True),
        ("assistant", "Action: get 1 a", True, [101, 201], True), ("user", "Observation: seen 1", False, None, True),
        ("assistant", "Action: get 1 b", True, [102, 202], False), ("user", "Observation: seen 2", False, None, True),
        ("assistant", "Action: craft 1 x", True, [103, 203], True),  # the leaf's answer is not shown
    ]  # fmt: skip
    assert (trajectory.task_id, trajectory.env, trajectory.source) == ("x", "e", "mcts")
    assert (trajectory.reward, trajectory.success, trajectory.n_steps) == (1.0, True, 3)
    assert trajectory.finish_reason == "done"
    failed = tree.trajectory(4, prefix, source="bad")
    assert (failed.reward, failed.success, failed.finish_reason, failed.source) == (
        0.0, False, "max_depth", "bad"
    )  # fmt: skip
    assert divergence(tree, 3, 4) == 2 and divergence(tree, 4, 3) == 2


def test_a_tree_renders_as_an_outline_written_out_by_hand():
    nodes = [
        TreeNode(id=0, observation="Goal: craft x.", visits=4, value=1.5, children=[1, 2]),
        TreeNode(id=1, parent=0, depth=1, action="get 1 a", observation="Got 1 a\nand more",
                 visits=3, value=1.5, children=[3, 4]),
        TreeNode(id=2, parent=0, depth=1, action="craft x", observation="Could not craft",
                 visits=1, value=0.0, finish="max_depth", score=0.0, closed=True),
        TreeNode(id=3, parent=1, depth=2, action=None, observation="y" * 100, visits=2,
                 value=1.5, finish="done", score=0.75, closed=True),
        TreeNode(id=4, parent=1, depth=2, action="look", observation="", visits=0),
    ]  # fmt: skip
    tree = SearchTree(task_id="t", env="e", nodes=nodes, iterations=3)
    assert render(tree).split("\n") == [
        "task t (e): 5 nodes, 2 leaves, 3 iterations",
        "  get 1 a -> Got 1 a and more  (n=3, q=0.50)",
        "    (no action) -> " + "y" * 80 + "  (n=2, q=0.75) [done, score 0.75]",
        "    look ->   (n=0, q=0.00)",
        "  craft x -> Could not craft  (n=1, q=0.00) [max_depth, score 0]",
    ]


@pytest.mark.parametrize("restore", [True, False])
def test_two_trees_built_together_node_by_node_as_worked_out_by_hand(chat, restore):
    from flywheel.inference import SamplingSettings, request_seed

    env = Dial()
    replies = [
        # call 0: tree t (3 samples: 'up' twice, once with a trailing space), then tree u
        ["Action: up", "Action: boom", "Action: up ", "Action: boom", "Action: boom",
         "Action: boom"],
        # call 1: tree t below node 1 (u's root closed after its only child failed)
        ["Action: win", "Action: up", "Action: win"],
    ]  # fmt: skip
    backend = ScriptedCalls(chat.tokenizer, replies)
    sampling = SamplingSettings(temperature=0.7, top_p=0.9, max_tokens=20, seed=5)
    limits = SearchLimits(iterations=3, max_depth=2, samples_per_node=3, restore_state=restore,
                          sampling=sampling)  # fmt: skip
    prefix = [Message(role="system", content="S")]
    t, u = search(env, ["t", "u"], backend, chat, prefix, limits, progress=False)

    def ids(text):
        return chat.tokenizer(text, add_special_tokens=False)["input_ids"]

    assert [
        (n.id, n.parent, n.depth, n.reply, n.action, n.observation, n.reward, n.score, n.finish,
         n.visits, n.value, n.closed, n.children, n.token_ids, n.end_generated)
        for n in t.nodes
    ] == [
        (0, None, 0, "", None, "Goal: win t.", 0.0, None, "", 3, 0.0 + 0.625 + 0.25, True, [1, 2],
         None, True),
        (1, 0, 1, "Action: up", "up", "at 1", 0.25, None, "", 2, 0.875, True, [3, 4],
         ids("Action: up"), True),
        (2, 0, 1, "Action: boom", "boom", "", 0.0, 0.0, "error: ValueError: boom", 1, 0.0, True,
         [], ids("Action: boom"), False),
        (3, 1, 2, "Action: win", "win", "You won.", 1.25, 0.625, "done", 1, 0.625, True, [],
         ids("Action: win"), True),
        (4, 1, 2, "Action: up", "up", "at 2", 0.5, 0.25, "max_depth", 1, 0.25, True, [],
         ids("Action: up"), True),
    ]  # fmt: skip
    assert (t.iterations, t.expansions, t.samples, t.duplicates) == (1, 2, 6, 2)
    assert [(n.id, n.finish, n.visits, n.closed) for n in u.nodes] == [
        (0, "", 1, True), (1, "error: ValueError: boom", 1, True)
    ]  # fmt: skip
    assert (u.iterations, u.expansions, u.samples, u.duplicates) == (1, 1, 3, 2)
    if restore:  # one step per child that the environment answered
        assert (t.env_steps, t.steps_by_depth) == (3, {1: 1, 2: 2})
        assert (u.env_steps, u.steps_by_depth) == (0, {})
    else:  # every child replays its path from a fresh episode
        assert (t.env_steps, t.steps_by_depth) == (5, {1: 1, 2: 4})
        assert (u.env_steps, u.steps_by_depth) == (0, {1: 0})
    assert all(e.closed for e in env.episodes)
    assert len(env.episodes) == (2 if restore else 2 + 3 + 2)

    # One call per step of the search: both trees' samples together, then tree t's alone; each
    # sample seeded by its task, its index and the node expanded, not by the call or its place.
    (first, first_sampling), (second, second_sampling) = backend.calls
    root_t = chat.encode(prefix + [Message(role="user", content="Goal: win t.")])[0]
    root_u = chat.encode(prefix + [Message(role="user", content="Goal: win u.")])[0]
    assert first == [root_t + chat.header_ids] * 3 + [root_u + chat.header_ids] * 3
    after_up = chat.encode(prefix + [
        Message(role="user", content="Goal: win t."),
        Message(role="assistant", content="Action: up", token_ids=ids("Action: up")),
        Message(role="user", content="Observation: at 1"),
    ])[0]  # fmt: skip
    assert second == [after_up + chat.header_ids] * 3
    settings = SamplingSettings(temperature=0.7, top_p=0.9, max_tokens=20, seed=5)
    seeds_t0 = [request_seed(5, "t", k, 0) for k in range(3)]
    seeds_u0 = [request_seed(5, "u", k, 0) for k in range(3)]
    assert first_sampling == settings.with_request_seeds(seeds_t0 + seeds_u0)
    assert second_sampling == settings.with_request_seeds(
        [request_seed(5, "t", k, 1) for k in range(3)]
    )


@pytest.mark.parametrize("restore", [True, False])
def test_below_a_reply_without_an_action_the_episode_goes_on_from_its_parents_state(chat, restore):
    """root -> 1 'up' (at 1) -> 2 no action (hint) -> 3 'up' (at 2) -> 4 'win': the reply without
    an action leaves the dial where its parent left it, restored or replayed."""
    replies = [["Action: up"], ["Thought: hmm"], ["Action: up"], ["Action: win"]]
    limits = SearchLimits(iterations=4, max_depth=4, samples_per_node=1, restore_state=restore)
    prefix = [Message(role="system", content="S")]
    (tree,) = search(Dial(), ["t"], ScriptedCalls(chat.tokenizer, replies), chat, prefix, limits,
                     progress=False)  # fmt: skip
    assert [(n.id, n.parent, n.action, n.observation, n.reward, n.finish) for n in tree.nodes] == [
        (0, None, None, "Goal: win t.", 0.0, ""),
        (1, 0, "up", "at 1", 0.25, ""),
        (2, 1, None, FORMAT_HINT, 0.25, ""),  # rewards summed along the path
        (3, 2, "up", "at 2", 0.5, ""),
        (4, 3, "win", "You won.", 1.5, "done"),
    ]  # fmt: skip


def test_a_child_whose_next_prompt_fills_the_context_exactly_is_expanded(chat):
    """room = max_model_len - the reply header - max_tokens: a child whose prompt (with its reply
    and observation) is exactly that long can still be expanded; one token longer, it ends."""
    from flywheel.inference import SamplingSettings

    prefix = [Message(role="system", content="S")]
    up = chat.tokenizer("Action: up", add_special_tokens=False)["input_ids"]
    after_up = chat.encode(prefix + [
        Message(role="user", content="Goal: win t."),
        Message(role="assistant", content="Action: up", token_ids=up),
        Message(role="user", content="Observation: at 1"),
    ])[0]  # fmt: skip
    exact = len(after_up) + len(chat.header_ids) + 20

    def first_child(max_model_len):
        limits = SearchLimits(iterations=1, max_depth=5, samples_per_node=1,
                              max_model_len=max_model_len,
                              sampling=SamplingSettings(max_tokens=20))  # fmt: skip
        backend = ScriptedCalls(chat.tokenizer, [["Action: up"]] * 3)
        (tree,) = search(Dial(), ["t"], backend, chat, prefix, limits, progress=False)
        return tree.nodes[1]

    fits, too_long = first_child(exact), first_child(exact - 1)
    assert (fits.finish, fits.children) == ("", [2])  # expanded in turn
    assert (too_long.finish, too_long.children) == ("context", [])


class LeftOrRight:
    """Every expansion samples two replies, 'left' then 'right': tied children for the coin."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, sampling):
        out = []
        for i in range(len(prompts)):
            text = format_reply("go", "left" if i % 2 == 0 else "right")
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(text, ids + [self.tokenizer.eos_token_id], "stop"))
        return out


def test_the_seed_tosses_the_tie_breaking_coin_and_is_zero_unless_told(chat):
    limits = SearchLimits(iterations=2, max_depth=3, samples_per_node=2)
    prefix = [Message(role="system", content="S")]

    def parents(**seed):
        backend = LeftOrRight(chat.tokenizer)
        (tree,) = search(Corridor(), ["t"], backend, chat, prefix, limits, progress=False, **seed)
        return [n.parent for n in tree.nodes[1:]]

    assert parents() == parents(seed=0) == [0, 0, 1, 1, 3, 3, 2, 2, 7, 7]
    assert parents(seed=1) == [0, 0, 1, 1, 3, 3, 2, 2, 8, 8]
    assert parents(seed=2) == [0, 0, 2, 2, 3, 3, 1, 1, 8, 8]
