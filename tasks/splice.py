"""Stage: revision trajectories (Agent-R's splice), and the two baselines' data.

A revision trajectory is the bad path up to its first error, with no loss; a revision turn, with
loss ("that was a mistake ..." and a no-op action the environment really answers); then the good
path from where it leaves the bad one, with loss. The loss flags travel in the records, and the
SFT stage trains on flagged turns only. Every turn is written in the tree's turn format
(`agents.turns`): the revision turn takes the environment's `noop_action` as the format writes an
action (QA's tags: ``<search>nothing</search>``), and its answer comes back as the format wraps
an observation.

The bad prefix never holds the step that ended the bad episode (a final answer, a step the
environment failed on): nothing the agent does comes after it, so no revision can either. A pair
whose only step off the good path is that one has nothing to revise and is left out (counted).

Modes: "revision" cuts the bad path at the critique's first error (the whole path when none was
found); "direct" (Direct-Revision) always keeps the whole bad path; "good" keeps good paths only.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel

from agents.mcts import Critique, PathPair, SearchTree, step_messages
from agents.turns import ReActTurns, Turns
from flywheel.records import Message, Trajectory
from flywheel.settings import EnvSettings
from flywheel.stage import StageResult, StageRun, stage

Mode = Literal["revision", "direct", "good"]

REVISION_THOUGHTS = (
    "My last step did not bring me closer to the goal. I will go back to what worked and try "
    "a different step.",
    "That was a mistake. Let me check what I have and change my plan.",
    "I went the wrong way. I should go back to where I was right and continue from there.",
    "This is not working, and repeating it will not help. Let me take another action.",
    "I made an error just now. Let me recover and continue towards the goal.",
)


def revision_reply(noop_action: str, rng: random.Random, turns: Turns | None = None) -> str:
    """A revision thought and the no-op, written as `turns` writes an agent's turn (ReAct's
    ``Thought:`` and ``Action:`` lines when not given)."""
    return (turns or ReActTurns()).written_turn(rng.choice(REVISION_THOUGHTS), noop_action).content


def bad_prefix_end(pair: PathPair, first_error: int | None, bad_steps: int) -> int:
    """Last step (0-based) of the bad prefix: the first error, the whole path when None, and at
    least the first step off the good path (the steps before it are the good path's own)."""
    if first_error is None:
        return bad_steps - 1
    return min(max(first_error, pair.divergence), bad_steps - 1)


def revisable_steps(tree: SearchTree, pair: PathPair) -> int:
    """How many of the bad path's steps a revision can follow: all but one that ended the
    episode (done, or the environment failed on it). Fewer than `pair.divergence` + 1: the
    pair has no step off the good path to revise."""
    leaf = tree.nodes[pair.bad_leaf]
    ended = leaf.finish == "done" or leaf.finish.startswith("error")
    return leaf.depth - ended


def splice_revision(
    tree: SearchTree,
    pair: PathPair,
    first_error: int | None,
    prefix: list[Message],
    revision: str,
    revision_observation: str,
) -> Trajectory:
    """Bad prefix (see `bad_prefix_end`) + revision turn + the good path from where it leaves."""
    bad = tree.path(pair.bad_leaf)[1:]
    good = tree.path(pair.good_leaf)[1:]
    end = bad_prefix_end(pair, first_error, revisable_steps(tree, pair))
    written = tree.turns()
    turns = step_messages(bad[: end + 1], loss=False, last_observation=True, turns=written)
    turns += [
        Message(role="assistant", content=revision, loss=True),
        written.observation(revision_observation),
    ]
    turns += step_messages(
        good[pair.divergence :], loss=True, last_observation=False, turns=written
    )
    n_steps = end + 2 + len(good) - pair.divergence
    return tree.episode(pair.good_leaf, prefix, turns, n_steps, source="revision")


def observe_noop(env, tree: SearchTree, bad_leaf: int, end: int) -> str:
    """The environment's answer to the no-op after bad steps 0..end (replayed in a fresh episode)."""
    episode = env.start(tree.task_id)
    try:
        for node in tree.path(bad_leaf)[1 : end + 2]:
            if node.action is not None:
                episode.step(node.action)
        return episode.step(env.noop_action).observation
    finally:
        episode.close()


def build_training_data(
    env,
    trees: list[SearchTree],
    pairs: list[PathPair],
    good: list[dict],
    critiques: list[Critique],
    prefix: list[Message],
    mode: Mode,
    include_good: bool,
    seed: int = 0,
) -> tuple[list[Trajectory], dict[str, int]]:
    """The SFT data of one mode: revision trajectories and/or good paths."""
    by_task = {t.task_id: t for t in trees}
    errors = {c.pair: c.first_error for c in critiques}
    rng = random.Random(seed)
    revisions, unrevisable = [], 0
    if mode != "good":
        for index, pair in enumerate(pairs):
            tree = by_task[pair.task_id]
            steps = revisable_steps(tree, pair)
            if steps <= pair.divergence:
                unrevisable += 1
                continue
            cut = errors.get(index) if mode == "revision" else None
            end = bad_prefix_end(pair, cut, steps)
            observation = observe_noop(env, tree, pair.bad_leaf, end)
            reply = revision_reply(env.noop_action, rng, tree.turns())
            revisions.append(splice_revision(tree, pair, cut, prefix, reply, observation))
    good_paths = []
    if mode == "good" or include_good:
        good_paths = [by_task[g["task_id"]].trajectory(g["leaf"], prefix) for g in good]
    counts = {"revisions": len(revisions), "good_paths": len(good_paths)}
    if unrevisable:
        counts["unrevisable_pairs"] = unrevisable
    return revisions + good_paths, counts


class SpliceInputs(BaseModel):
    """Trees and the paths chosen in them (select-paths), turned into SFT data by `mode`."""

    env: EnvSettings  # answers the revision turn's no-op, replayed after the bad prefix
    trees_url: str
    pairs_url: str  # from select-paths, as are the good paths
    good_url: str
    critiques_url: str | None  # None: the baselines, which use no critique
    prefix: list[Message]
    mode: Mode
    include_good: bool  # good paths join the revisions
    seed: int  # which revision thought each revision turn says


@stage("splice")
def splice_stage(inputs: SpliceInputs, run: StageRun) -> StageResult:
    from envs import make_env

    store = run.store
    trees = store.read_records(inputs.trees_url, SearchTree)
    pairs = store.read_records(inputs.pairs_url, PathPair)
    good = store.read_json(inputs.good_url)
    critiques = store.read_records(inputs.critiques_url, Critique) if inputs.critiques_url else []
    data, counts = build_training_data(
        make_env(inputs.env), trees, pairs, good, critiques, inputs.prefix, inputs.mode,
        inputs.include_good, inputs.seed,
    )  # fmt: skip
    return StageResult(
        files={"trajectories": store.write_records(run.file("trajectories.jsonl"), data)},
        counts={"trajectories": len(data), **counts},
    )
