"""Stage: Agent-R's revision trajectories with the expert's continuation (as IPR and STeCa do).

Agent-R takes a revision's good continuation from a solved MCTS tree, and a weak policy solves
few trees. Here every failed episode of the policy can give a row: its bad prefix up to its first
error (the environment's oracle), a revision turn taking the no-op, then the expert's plan from
the state the episode is in. The row is played for real in a fresh episode (the prefix's actions
replayed, the no-op, the expert's steps), so every observation in it is one the environment gave.

As in the splice, the bad prefix never holds a step that ended the episode (QA's wrong answer):
nothing comes after it, so the prefix stops before it. TextCraft's episodes end only when solved.
The expert's part is the environment's own continuation where it has one
(`Environment.expert_continuation`: QA redoes the lookups its answer needs), else the shortest
suffix of the expert's plan that solves the task.

Loss as in the splice: none on the bad prefix, on the revision turn and the expert's turns.
Expert trajectories may be mixed in, `expert_sft_ratio` per revision row, so that the policy
keeps learning to solve a task from its start too.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, model_validator

from agents.rollout import ENVIRONMENT_FAILED, is_solved
from agents.turns import Reply, Turns, turns_for
from flywheel.records import Message, Trajectory
from flywheel.settings import EnvSettings
from flywheel.stage import StageResult, StageRun, stage
from tasks.mix_general import draw_cycling
from tasks.splice import REVISION_THOUGHTS

SOURCE = "expert-revision"
SKIPS = ("no_first_error", "no_continuation", "replay_mismatch")


class Skip(Exception):
    """A failed episode that gives no row; `reason` (one of SKIPS) names the count it adds to."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def is_failure(trajectory: Trajectory) -> bool:
    return not trajectory.success and not trajectory.finish_reason.startswith(ENVIRONMENT_FAILED)


def agent_turns(trajectory: Trajectory) -> list[tuple[Message, Message | None]]:
    """Each agent turn of the episode and the message that answered it (None after the last)."""
    episode = trajectory.continuation
    return [
        (message, episode[i + 1] if i + 1 < len(episode) else None)
        for i, message in enumerate(episode)
        if message.role == "assistant"
    ]


def first_error(env, turns: Turns, trajectory: Trajectory) -> int:
    """The first agent turn (0-based) the environment's oracle calls a mistake. The critique
    judges MCTS pairs, not explored episodes, so without an oracle there is no first error."""
    actions = [turns.read(turn.content).action for turn, _ in agent_turns(trajectory)]
    flags = env.mistakes(trajectory.task_id, actions)
    if not flags or True not in flags:
        raise Skip("no_first_error")
    return flags.index(True)


def bad_prefix_end(trajectory: Trajectory, error: int) -> int:
    """The bad prefix's last agent turn: the first error, or the turn before it when that error
    ended the episode (nothing comes after it to revise). An episode ended by its first turn
    leaves nothing to revise."""
    ended = trajectory.finish_reason == "done" and error == len(agent_turns(trajectory)) - 1
    if error - ended < 0:
        raise Skip("no_continuation")
    return error - ended


@dataclass
class Played:
    """A row's episode as it was played: its instruction, then every turn and answer."""

    instruction: str
    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    steps: int = 0
    done: bool = False
    solved: bool = False


def take_turn(played: Played, episode, turns: Turns, turn: Message, reply: Reply) -> Message | None:
    """Append `turn`, step its action, and append what answered it: the observation, or the
    rollout's hint for a reply without an action; nothing once the episode is over."""
    played.messages.append(turn)
    played.steps += 1
    if reply.action is None:
        answer = turns.observation(reply.error or "", reply.malformed)
    else:
        result = episode.step(reply.action)
        played.reward += result.reward
        played.done = result.done
        if result.done:
            return None
        answer = turns.observation(result.observation, reply.malformed)
    played.messages.append(answer)
    return answer


def replay_prefix(
    played: Played, episode, turns: Turns, prefix: list[tuple[Message, Message | None]]
):
    """The bad prefix's agent turns again, without loss; each answer must be the recorded one
    (the row is to hold only what the environment really says)."""
    for turn, recorded in prefix:
        reply = turns.read(turn.content)
        answer = take_turn(played, episode, turns, turn.model_copy(update={"loss": False}), reply)
        if played.done:  # a step of the prefix ended the episode: nothing left to revise
            raise Skip("no_continuation")
        if recorded is not None and recorded.content != answer.content:
            raise Skip("replay_mismatch")


def play_row(env, turns: Turns, trajectory: Trajectory, end: int, revision: Message, suffix):
    """The bad prefix (agent turns 0..end), the revision turn and the expert `suffix` of
    (thought, action) steps, played in a fresh episode until it ends."""
    episode = env.start(trajectory.task_id)
    played = Played(episode.instruction)
    try:
        replay_prefix(played, episode, turns, agent_turns(trajectory)[: end + 1])
        take_turn(played, episode, turns, revision, Reply("", env.noop_action))
        for thought, action in suffix:
            if played.done:
                break
            take_turn(
                played, episode, turns, turns.written_turn(thought, action), Reply("", action)
            )
        played.solved = played.done and is_solved(env, episode, played.reward)
    finally:
        episode.close()
    return played


def expert_continuations(env, turns: Turns, trajectory: Trajectory, end: int) -> list:
    """The expert parts to try, in order: the environment's own continuation from where the
    prefix and the no-op leave the task (none when it has no steps), or else every suffix of
    the expert's plan, shortest first (the full plan last: it may redo what the prefix already
    did, which teaches the policy to waste steps)."""
    prefix = [turns.read(turn.content).action for turn, _ in agent_turns(trajectory)[: end + 1]]
    steps = env.expert_continuation(trajectory.task_id, [*prefix, env.noop_action])
    if steps is not None:
        return [steps] if steps else []
    plan = env.expert_plan(trajectory.task_id) or []
    return [plan[start:] for start in reversed(range(len(plan)))]


def expert_continuation(env, turns: Turns, trajectory: Trajectory, end: int, revision: Message):
    """The row with the first expert part (`expert_continuations`) that solves the task from
    where the revision leaves it."""
    for suffix in expert_continuations(env, turns, trajectory, end):
        played = play_row(env, turns, trajectory, end, revision, suffix)
        if played.solved:
            return played
    raise Skip("no_continuation")


def revision_row(trajectory: Trajectory, played: Played, prefix: list[Message]) -> Trajectory:
    instruction = Message(role="user", content=played.instruction)
    return Trajectory(
        task_id=trajectory.task_id,
        env=trajectory.env,
        messages=[*prefix, instruction, *played.messages],
        episode_start=len(prefix),
        reward=played.reward,
        success=True,
        n_steps=played.steps,
        source=SOURCE,
        finish_reason="done",
    )


def build_rows(
    env, episodes: list[Trajectory], prefix: list[Message], seed: int
) -> tuple[list[Trajectory], Counter, list[int]]:
    """A revision row for each failed episode that gives one; the skips by reason; and the step
    (1-based) of each row's first error."""
    turns, rng = turns_for(env), random.Random(seed)
    rows, skipped, error_steps = [], Counter(), []
    for trajectory in filter(is_failure, episodes):
        # drawn for every failed episode, so a skipped one leaves the others' thoughts as they were
        revision = turns.written_turn(rng.choice(REVISION_THOUGHTS), env.noop_action)
        try:
            error = first_error(env, turns, trajectory)
            end = bad_prefix_end(trajectory, error)
            played = expert_continuation(env, turns, trajectory, end, revision)
        except Skip as skip:
            skipped[skip.reason] += 1
            continue
        rows.append(revision_row(trajectory, played, prefix))
        error_steps.append(error + 1)
    return rows, skipped, error_steps


def mix_expert(
    rows: list[Trajectory], expert: list[Trajectory], ratio: float, seed: int
) -> list[Trajectory]:
    """`rows`, then round(len(rows) * ratio) expert trajectories drawn with `seed`, without
    replacement while they last (then again from all of them)."""
    rng = random.Random(f"expert-sft:{seed}")  # apart from the revision thoughts' draws
    return rows + draw_cycling(expert, round(len(rows) * ratio), rng)


def error_step_counts(error_steps: list[int]) -> dict[str, int]:
    """How many rows have their first error at each step: {"first_error_step_1": n, ...}."""
    return {f"first_error_step_{step}": n for step, n in sorted(Counter(error_steps).items())}


class ExpertRevisionsInputs(BaseModel):
    """The policy's episodes on train tasks, turned into revision rows with the expert's help."""

    explored_urls: list[str]  # explore stages' trajectories
    env: EnvSettings  # plays every row again, and its oracle and expert
    prefix: list[Message]
    seed: int  # which revision thought each row says, which expert trajectories are mixed in
    expert_url: str | None = None  # expert trajectories to mix in
    expert_sft_ratio: float = Field(default=0.0, ge=0)  # expert trajectories per revision row

    @model_validator(mode="after")
    def _ratio_needs_expert(self) -> ExpertRevisionsInputs:
        if self.expert_sft_ratio > 0 and self.expert_url is None:
            raise ValueError("expert_sft_ratio > 0 needs expert_url: the trajectories to mix in")
        return self


@stage("expert-revisions")
def expert_revisions_stage(inputs: ExpertRevisionsInputs, run: StageRun) -> StageResult:
    from envs import make_env

    store = run.store
    episodes = [t for url in inputs.explored_urls for t in store.read_records(url, Trajectory)]
    rows, skipped, error_steps = build_rows(
        make_env(inputs.env), episodes, inputs.prefix, inputs.seed
    )
    expert = store.read_records(inputs.expert_url, Trajectory) if inputs.expert_url else []
    data = mix_expert(rows, expert, inputs.expert_sft_ratio, inputs.seed)
    mean_step = sum(error_steps) / len(error_steps) if error_steps else 0.0
    return StageResult(
        files={"trajectories": store.write_records(run.file("trajectories.jsonl"), data)},
        counts={
            "episodes": len(episodes),
            "failed": sum(map(is_failure, episodes)),
            "rows": len(rows),
            **{f"skipped_{reason}": skipped[reason] for reason in SKIPS},
            "expert_trajectories": len(data) - len(rows),
            "trajectories": len(data),
            **error_step_counts(error_steps),
        },
        metrics={"first_error_step_mean": mean_step},
    )
