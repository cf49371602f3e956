"""Monte Carlo Tree Search over an agent's actions (Agent-R's data collection), many trees at once.

One tree per task. An iteration descends from the root: a node without children is expanded with
N sampled replies (identical replies kept once), then UCT picks the child to descend into
(unvisited children first, ties broken by a seeded coin), until every child of the current node
is closed. A child is terminal when the environment says done, at `max_depth`, or on a failure
(an environment error, a full context); a terminal child back-propagates its score (final reward
normalised to [0, 1]) up to the root. A node whose children are all closed is closed too; a
tree whose root is closed stops early.

Replies are read and answered in the environment's own turn format (`agents.turns`), as the
rollout reads them: a ReAct reply without an action takes no step and is told the format; a tool
format's reply that cannot be parsed is stepped as a malformed action, so the environment scores
the format and answers with what is wrong. A tree records its format, so its paths become
trajectories in it. A leaf records whether its episode was solved where the environment decides
it (`Episode.solved`: QA's exact match, where the reward gives partial credit).

Trees advance together: every tree that needs an expansion puts its N prompts into the same
generate call. A child's environment state comes from its parent's snapshot where the
environment can snapshot (one step per child); otherwise a fresh episode replays the whole path
(`depth` steps per child), which is what Agent-R's own code does for every child.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field
from tqdm import tqdm

from agents.turns import Reply, Turns, format_turns, turns_for
from envs.base import Environment, EnvironmentUnavailable, Episode
from flywheel.chat import ChatTokenizer
from flywheel.inference import (
    Generation,
    InferenceBackend,
    SamplingSettings,
    request_seed,
    sample_indices,
)
from flywheel.records import Message, Trajectory


class TreeNode(BaseModel):
    """A state after a path of agent turns; the root is the task's first observation."""

    id: int
    parent: int | None = None
    depth: int = 0  # agent turns from the root
    reply: str = ""  # the agent's reply that led here (empty at the root)
    token_ids: list[int] | None = None  # the reply's ids as generated, without the end token
    end_generated: bool = True  # whether the model generated the end token (see Message)
    action: str | None = None  # the action read from the reply; None: it took no step
    malformed: bool = False  # `action` stepped a reply that could not be parsed (tool formats)
    observation: str = ""  # the environment's answer (the root: the instruction)
    reward: float = 0.0  # raw reward summed along the path
    score: float | None = None  # terminal nodes: the reward normalised to [0, 1]
    # Terminal nodes: whether the episode solved its task, where the environment decides it
    # (`Episode.solved`); None: a full score is success.
    success: bool | None = None
    finish: str = ""  # terminal nodes: "done", "max_depth", "context" or "error: ..."
    visits: int = 0
    value: float = 0.0  # sum of the scores back-propagated through this node
    closed: bool = False  # terminal, or every child closed: nothing left to search below
    children: list[int] = Field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return bool(self.finish)

    @property
    def solved(self) -> bool:
        """A leaf where the environment said done, and its episode solved the task: by the
        environment's verdict where it gives one, else with the full normalised reward."""
        if self.success is not None:
            return self.finish == "done" and self.success
        return self.finish == "done" and (self.score or 0.0) >= 1.0


class SearchTree(BaseModel):
    """One task's tree, as stored (`trees.jsonl`), with what building it cost."""

    task_id: str
    env: str
    nodes: list[TreeNode]
    agent_format: str = "react"  # how its replies were read and answered (`agents.turns`)
    tool_arguments: dict[str, str] = Field(default_factory=dict)  # tool formats' tools
    iterations: int = 0  # descents made (fewer than asked when the root closed early)
    expansions: int = 0  # nodes expanded
    samples: int = 0  # replies sampled
    duplicates: int = 0  # sampled replies dropped as identical to a sibling's
    env_steps: int = 0  # environment steps taken to build the children
    steps_by_depth: dict[int, int] = Field(default_factory=dict)  # child depth -> those steps

    def path(self, node_id: int) -> list[TreeNode]:
        """Root ... node."""
        path = [self.nodes[node_id]]
        while path[-1].parent is not None:
            path.append(self.nodes[path[-1].parent])
        return path[::-1]

    def leaves(self) -> list[TreeNode]:
        return [n for n in self.nodes if n.terminal]

    def turns(self) -> Turns:
        """The turn format its replies were read in and its observations written in."""
        return format_turns(self.agent_format, self.tool_arguments)

    def trajectory(self, leaf_id: int, prefix: list[Message], source: str = "mcts") -> Trajectory:
        """The root-to-leaf path as an episode after `prefix` (system prompt, examples)."""
        turns = step_messages(
            self.path(leaf_id)[1:], loss=True, last_observation=False, turns=self.turns()
        )
        return self.episode(leaf_id, prefix, turns, self.nodes[leaf_id].depth, source)

    def episode(
        self, leaf_id: int, prefix: list[Message], turns: list[Message], n_steps: int, source: str
    ) -> Trajectory:
        """An episode after `prefix` from the task's instruction through `turns`, ending with
        the outcome of `leaf_id` (a spliced path ends at its good leaf)."""
        leaf = self.nodes[leaf_id]
        instruction = Message(role="user", content=self.nodes[0].observation)
        return Trajectory(
            task_id=self.task_id,
            env=self.env,
            messages=[*prefix, instruction, *turns],
            episode_start=len(prefix),
            reward=leaf.reward,
            success=leaf.solved,
            n_steps=n_steps,
            source=source,
            finish_reason=leaf.finish,
        )


def step_messages(
    steps: list[TreeNode], loss: bool, last_observation: bool, turns: Turns
) -> list[Message]:
    """Agent turn + observation per step (the last observation only if asked), the observations
    written as `turns` (the tree's format) answers a turn."""
    messages = []
    for i, node in enumerate(steps):
        messages.append(
            Message(
                role="assistant",
                content=node.reply,
                loss=loss,
                token_ids=node.token_ids,
                end_generated=node.end_generated,
            )
        )
        if last_observation or i < len(steps) - 1:
            messages.append(turns.observation(node.observation, node.malformed))
    return messages


def uct_choice(
    parent: TreeNode, children: list[TreeNode], c: float, rng: random.Random
) -> TreeNode | None:
    """The open child with the highest UCT score; unvisited ones first; ties by `rng`."""
    candidates = [child for child in children if not child.closed]
    if not candidates:
        return None

    def score(child: TreeNode) -> float:
        if child.visits == 0:
            return math.inf
        explore = c * math.sqrt(math.log(parent.visits) / child.visits) if parent.visits else 0.0
        return child.value / child.visits + explore

    scores = [score(child) for child in candidates]
    best = max(scores)
    return rng.choice([child for child, s in zip(candidates, scores, strict=True) if s == best])


def backpropagate(tree: SearchTree, node_id: int, score: float) -> None:
    """Add `score` to the node and its ancestors; close those whose children are all closed."""
    node: TreeNode | None = tree.nodes[node_id]
    while node is not None:
        node.visits += 1
        node.value += score
        node.closed = node.terminal or (
            bool(node.children) and all(tree.nodes[c].closed for c in node.children)
        )
        node = tree.nodes[node.parent] if node.parent is not None else None


def unique_replies(generations: list[Generation]) -> tuple[list[Generation], int]:
    """Replies with distinct text (after trimming), in sampling order, and how many were dropped."""
    seen, kept = set(), []
    for generation in generations:
        key = generation.text.strip()
        if key not in seen:
            seen.add(key)
            kept.append(generation)
    return kept, len(generations) - len(kept)


@dataclass(frozen=True)
class SearchLimits:
    """What bounds a search (from `MCTSSettings` and the inference settings)."""

    iterations: int = 8  # descents from the root per tree
    max_depth: int = 12  # agent steps on one path
    samples_per_node: int = 4  # sampled replies per expansion, before de-duplication
    exploration_constant: float = 0.25  # UCT's c (Agent-R's)
    restore_state: bool = True  # a child from its parent's snapshot, not a replayed path
    max_model_len: int = 4096
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(temperature=1.0))


@dataclass
class _Search:
    """A tree being built: where its current descent is, and what it caches per node."""

    tree: SearchTree
    turns: Turns  # the environment's turn format: how replies are read and answered
    rng: random.Random
    episode: Episode | None  # reused through snapshots; None in replay mode
    ids: dict[int, list[int]]  # open node -> prompt ids up to its observation
    states: dict[int, Any] = field(default_factory=dict)  # open node -> environment snapshot
    cursor: int | None = None
    occurrence: int = 0  # trees of the same task before this one in the call (their seeds)


def search(
    env: Environment,
    task_ids: list[str],
    backend: InferenceBackend,
    chat: ChatTokenizer,
    prefix: list[Message],
    limits: SearchLimits,
    seed: int = 0,
    progress: bool = True,
) -> list[SearchTree]:
    """Build one tree per task; every pending expansion shares one generate call."""
    prefix_ids, _ = chat.encode(prefix)
    searches = [_start(env, task_id, prefix_ids, chat, limits, seed) for task_id in task_ids]
    for s, occurrence in zip(searches, sample_indices(task_ids), strict=True):
        s.occurrence = occurrence
    bar = tqdm(
        total=len(searches) * limits.iterations, desc="mcts iterations", disable=not progress
    )
    calls = 0
    while True:
        pending = []
        for s in searches:
            before = s.tree.iterations
            if _descend(s, limits):
                pending.append(s)
            bar.update(s.tree.iterations - before)
        if not pending:
            break
        n = limits.samples_per_node
        prompts = [s.ids[s.cursor] + chat.header_ids for s in pending for _ in range(n)]
        generations = backend.generate(prompts, expansion_sampling(limits.sampling, pending, n))
        calls += 1
        for k, s in enumerate(pending):
            _expand(env, chat, s, generations[k * n : (k + 1) * n], limits)
        bar.set_postfix(calls=calls, nodes=sum(len(s.tree.nodes) for s in searches))
    bar.close()
    for s in searches:
        if s.episode is not None:
            s.episode.close()
    return [s.tree for s in searches]


def expansion_sampling(sampling: SamplingSettings, pending: list[_Search], n: int):
    """`sampling` with the seeds of each pending tree's `n` samples: the run's seed, the task,
    the sample (k-th of the node's, of the task's k-th tree) and the node expanded (the turn's
    place in the tree); never the call count or the tree's place among the pending ones, which
    depend on how the other trees grow."""
    seeds = [
        request_seed(sampling.seed, s.tree.task_id, s.occurrence * n + k, s.cursor)
        for s in pending
        for k in range(n)
    ]
    return sampling.with_request_seeds(seeds)


def _start(env, task_id, prefix_ids, chat, limits: SearchLimits, seed: int) -> _Search:
    episode = env.start(task_id)
    root = TreeNode(id=0, observation=episode.instruction)
    tree = SearchTree(
        task_id=task_id, env=env.name, nodes=[root], agent_format=env.agent_format,
        tool_arguments=dict(env.tool_arguments),
    )  # fmt: skip
    first = Message(role="user", content=episode.instruction)
    ids = {0: prefix_ids + chat.message_ids(first)[0]}
    rng, turns = random.Random(f"{seed}:{task_id}"), turns_for(env)
    snapshot = episode.snapshot() if limits.restore_state else None
    if snapshot is None:  # replay mode: every child starts a fresh episode
        episode.close()
        return _Search(tree, turns, rng, None, ids)
    return _Search(tree, turns, rng, episode, ids, {0: snapshot})


def _descend(s: _Search, limits: SearchLimits) -> bool:
    """Move the cursor down to the next node to expand; False when the tree is finished."""
    nodes = s.tree.nodes
    while True:
        if s.cursor is None:
            if s.tree.iterations >= limits.iterations or nodes[0].closed:
                return False
            s.tree.iterations += 1
            s.cursor = 0
        node = nodes[s.cursor]
        if not node.children:
            return True
        child = uct_choice(
            node, [nodes[c] for c in node.children], limits.exploration_constant, s.rng
        )
        if child is None:  # every child closed: this descent is over
            node.closed = True
            s.cursor = None
        else:
            s.cursor = child.id


def _expand(env, chat, s: _Search, generations: list[Generation], limits: SearchLimits) -> None:
    tree = s.tree
    parent = tree.nodes[s.cursor]
    replies, dropped = unique_replies(generations)
    tree.expansions += 1
    tree.samples += len(generations)
    tree.duplicates += dropped
    children = [_child(env, chat, s, parent, generation, limits) for generation in replies]
    # Every sibling is attached before any is back-propagated: a terminal first child would
    # otherwise close its parent (all children it has so far are closed) and, up the path, the
    # root, and its siblings would never be searched.
    parent.children += [child.id for child in children]
    for child in children:
        if child.terminal:
            backpropagate(tree, child.id, child.score)
    # The parent's caches are only needed to build its children.
    s.ids.pop(parent.id, None)
    s.states.pop(parent.id, None)
    if parent.closed:
        s.cursor = None


def _child(env, chat, s: _Search, parent: TreeNode, generation: Generation, limits) -> TreeNode:
    tree = s.tree
    generated = chat.generated_message(generation.text, generation.token_ids)
    read = s.turns.read(generation.text)
    child = TreeNode(
        id=len(tree.nodes),
        parent=parent.id,
        depth=parent.depth + 1,
        reply=generation.text,
        token_ids=generated.token_ids,
        end_generated=generated.end_generated,
        action=read.action,
        malformed=read.malformed,
        reward=parent.reward,
    )
    tree.nodes.append(child)
    try:
        outcome = _step(env, s, parent, read)
    except EnvironmentUnavailable:
        raise  # no server to play on says nothing about the branch: the stage fails, re-run
    except Exception as error:  # the environment failed on this action: the branch ends here
        child.finish = f"error: {type(error).__name__}: {error}"
    else:
        child.observation = outcome.observation
        child.reward += outcome.reward
        if outcome.done:
            child.finish = "done"
        elif child.depth >= limits.max_depth:
            child.finish = "max_depth"
        else:
            _keep_open(chat, s, parent, child, outcome.snapshot, limits)
        if child.terminal:
            child.success = outcome.solved
    if child.terminal:
        child.score = env.normalise(child.reward)
        child.closed = True
    return child


def _keep_open(chat, s: _Search, parent: TreeNode, child: TreeNode, snapshot, limits) -> None:
    """Cache the child's prompt (and state) for its expansion, or end it when the prompt leaves
    no room for a reply."""
    reply = Message(role="assistant", content=child.reply, token_ids=child.token_ids)
    seen = s.turns.observation(child.observation, child.malformed)
    ids = s.ids[parent.id] + chat.message_ids(reply)[0] + chat.message_ids(seen)[0]
    room = limits.max_model_len - len(chat.header_ids) - limits.sampling.max_tokens
    if len(ids) > room:
        child.finish = "context"
        return
    s.ids[child.id] = ids
    if snapshot is not None:
        s.states[child.id] = snapshot


@dataclass(frozen=True)
class _Outcome:
    """What a child's step came to, in its parent's state."""

    observation: str
    reward: float = 0.0
    done: bool = False
    solved: bool | None = None  # the episode's own verdict after the step (`Episode.solved`)
    snapshot: Any = None  # the state after it (restore mode)


def _step(env, s: _Search, parent: TreeNode, reply: Reply) -> _Outcome:
    """The outcome of `reply`'s action taken in the parent's state."""
    if reply.action is None:  # no step (ReAct): the agent is told the format; the state stays
        return _Outcome(reply.error or "", snapshot=s.states.get(parent.id))
    if s.episode is not None:
        s.episode.restore(s.states[parent.id])
        result = s.episode.step(reply.action)
        _count_steps(s.tree, parent.depth + 1, 1)
        solved, snapshot = s.episode.solved(), s.episode.snapshot()
        return _Outcome(result.observation, result.reward, result.done, solved, snapshot)
    episode = env.start(s.tree.task_id)
    steps = 0
    try:
        for node in s.tree.path(parent.id)[1:]:
            if node.action is not None:
                episode.step(node.action)
                steps += 1
        result = episode.step(reply.action)
        steps += 1
        solved = episode.solved()
    finally:
        episode.close()
        _count_steps(s.tree, parent.depth + 1, steps)
    return _Outcome(result.observation, result.reward, result.done, solved)


def _count_steps(tree: SearchTree, depth: int, steps: int) -> None:
    tree.env_steps += steps
    tree.steps_by_depth[depth] = tree.steps_by_depth.get(depth, 0) + steps


def render(tree: SearchTree) -> str:
    """An indented outline of a tree: action, observation, visits, mean value, how it ended."""
    lines = [f"task {tree.task_id} ({tree.env}): {len(tree.nodes)} nodes, "
             f"{len(tree.leaves())} leaves, {tree.iterations} iterations"]  # fmt: skip

    def walk(node: TreeNode, indent: str) -> None:
        mean = node.value / node.visits if node.visits else 0.0
        ending = f" [{node.finish}, score {node.score:g}]" if node.terminal else ""
        action = node.action if node.action is not None else "(no action)"
        observation = node.observation.replace("\n", " ")[:80]
        lines.append(f"{indent}{action} -> {observation}  (n={node.visits}, q={mean:.2f}){ending}")
        for child in node.children:
            walk(tree.nodes[child], indent + "  ")

    for child in tree.nodes[0].children:
        walk(tree.nodes[child], "  ")
    return "\n".join(lines)


class PathPair(BaseModel):
    """Two root-to-leaf paths of one tree: a good leaf and a worse one (Agent-R's pairing)."""

    task_id: str
    good_leaf: int
    bad_leaf: int
    good_score: float
    bad_score: float
    divergence: int  # agent turns the two paths share from the root


class Critique(BaseModel):
    """The actor's step-by-step judgement of a pair's bad path, from where the paths diverge."""

    task_id: str
    pair: int  # index into the round's pairs
    judged_from: int  # first judged step (0-based agent turn) = the pair's divergence
    verdicts: list[str | None]  # "good" | "bad" | "uncertain" | None (no verdict found)
    responses: list[str]
    first_error: int | None  # first step judged "bad"; None: none was
    oracle_first_error: int | None = None  # the environment oracle's, where it has one
    oracle: bool = False  # whether the environment has an oracle


def divergence(tree: SearchTree, first: int, second: int) -> int:
    """How many agent turns the paths to two leaves share."""
    a, b = tree.path(first)[1:], tree.path(second)[1:]
    shared = 0
    while shared < min(len(a), len(b)) and a[shared].id == b[shared].id:
        shared += 1
    return shared
