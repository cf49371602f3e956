"""IPR's step-level pairs (Xiong et al., 2024): where along the expert's path the policy departs,
and whether the departure was worse.

From each agent turn t of an expert trajectory the policy takes over greedily (`Resume`: the
expert's first t turns replayed, then the policy), or `takeover_samples` times sampled. Where its
first action differs from the expert's, the two steps are scored by Monte-Carlo: the success rate of `rollouts` sampled policy
continuations after the expert's step, and after the policy's own step (seeded). A departure
that scores below the expert's step becomes a pair on the state both share: chosen = the expert's
continuation from turn t, rejected = the policy's greedy one (cut as ETO cuts a failed
exploration). `rollouts=0` scores the greedy continuation's success against the expert's.

Trajectory-level pairs say "the expert's episode beats yours"; a step pair says "in this state,
the expert's move beats yours", which DPO cannot misread as a rule for every state sharing a
long prefix (docs/results.md: ETO's trajectory DPO learnt "never answer after two searches").

Greedy takeovers make one-sided pairs: a step pairs only where the greedy policy errs, so a move
it gets right in one family (answer after two lookups) never appears as a chosen step, and DPO
carries the pairs' lesson (call python after two lookups) to every family (docs/notebook.md,
issue 66's candidates 4 and 5). Sampled takeovers value the moves the policy might make at every
step, including where its greedy move is the expert's, so each decision is contrasted in each
family where the policy could get it wrong.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pydantic import BaseModel, Field

from agents.rollout import ENVIRONMENT_FAILED, Resume, RolloutSettings, continue_batched
from agents.turns import turns_for
from envs.base import Environment
from flywheel.inference import SamplingSettings
from flywheel.records import Pair, Trajectory
from flywheel.settings import EnvSettings, InferenceSettings
from flywheel.stage import StageResult, StageRun, stage
from tasks.build_pairs import ends_on_agent


@dataclass(frozen=True)
class Departure:
    """The policy, handed the expert's first `step` turns, moved otherwise than the expert."""

    expert: Trajectory
    step: int  # 0-based: the agent turn where the two differ
    policy: Trajectory  # the policy's greedy continuation (`Resume(expert, step)`)

    @property
    def shared(self) -> int:
        """How many continuation messages the two sides share (the expert's first turns)."""
        return len(Resume(self.expert, self.step).kept)


def agent_actions(trajectory: Trajectory, env: Environment) -> list[str | None]:
    """Each agent turn's action as the environment reads it (None: the reply had none)."""
    turns = turns_for(env)
    replies = [m for m in trajectory.continuation if m.role == "assistant"]
    return [turns.read(m.content).action for m in replies]


def departures(
    expert: Trajectory, continued: list[list[Trajectory]], env: Environment
) -> list[Departure]:
    """The policy's moves that differ from the expert's; `continued[t]` holds the policy's
    continuations from the expert's turn t (one greedy, or several sampled). Each distinct
    move at a step departs once, with the first continuation that made it."""
    expert_actions = agent_actions(expert, env)
    found = []
    for step, takeovers in enumerate(continued):
        seen = {_normal(expert_actions[step])}
        for policy in takeovers:
            moved = agent_actions(policy, env)
            if step < len(moved) and (move := _normal(moved[step])) not in seen:
                seen.add(move)
                found.append(Departure(expert, step, policy))
    return found


def _normal(action: str | None) -> str | None:
    return " ".join(action.lower().split()) if action is not None else None


def step_pair(
    departure: Departure, expert_value: float, policy_value: float, extra_turns: int
) -> Pair | None:
    """The pair a departure makes when it scores below the expert's step (None otherwise, or when
    a side has no agent turn left). Both continue the shared state; the rejected side is cut to
    the chosen side's length plus `extra_turns` turns, as `tasks.build_pairs` cuts."""
    if policy_value >= expert_value:
        return None
    shared = departure.shared
    chosen = departure.expert.continuation[shared:]
    rejected = departure.policy.continuation[shared:][: len(chosen) + 2 * extra_turns]
    chosen, rejected = ends_on_agent(chosen), ends_on_agent(rejected)
    if not chosen or not rejected:
        return None
    kept = departure.expert.continuation[:shared]
    return Pair(
        task_id=departure.expert.task_id,
        prompt=departure.expert.prompt + kept,
        chosen=chosen,
        rejected=rejected,
        chosen_reward=expert_value,
        rejected_reward=policy_value,
        step=departure.step,
    )


# The environment's failures, and a continuation whose replay of the expert's turns went wrong
# ("replay-..."): none says anything about the policy.
FAILED_ENDINGS = (*ENVIRONMENT_FAILED, "replay")


def success_rate(trajectories: list[Trajectory]) -> float:
    return sum(t.success for t in trajectories) / len(trajectories)


class StepPairsInputs(BaseModel):
    """The policy's departures from the expert's paths on some train tasks, and their scores."""

    model_url: str
    env: EnvSettings
    expert_url: str  # `Trajectory` records of the expert, one per task
    task_ids: list[str]
    inference: InferenceSettings
    max_steps: int
    rollouts: int = Field(ge=0)  # sampled continuations per step value; 0: the greedy outcome
    # 0: the policy takes over greedily (IPR); n: n sampled takeovers from each expert turn, so
    # a move the greedy policy never makes there (answering where the expert calls python, and
    # calling python where the expert answers) is valued against the expert's too
    takeover_samples: int = Field(default=0, ge=0)
    temperature: float = Field(gt=0)  # of those continuations
    extra_turns: int  # the rejected side is cut to the chosen side's length plus this many turns
    seed: int


@dataclass
class StepPlayer:
    """One continue_batched call's settings: greedy, or sampled with the stage's seed."""

    env: Environment
    backend: object
    chat: object
    inputs: StepPairsInputs

    def __call__(self, resumes: list[Resume], sampled: bool) -> list[Trajectory]:
        if not resumes:
            return []
        i = self.inputs
        sampling = SamplingSettings(
            temperature=i.temperature if sampled else 0.0, max_tokens=i.inference.max_tokens,
            seed=i.seed,
        )  # fmt: skip
        settings = RolloutSettings(i.max_steps, i.inference.max_model_len, sampling)
        return continue_batched(self.env, resumes, self.backend, self.chat, settings)


def find_step_pairs(play: StepPlayer, experts: list[Trajectory]) -> tuple[list[Pair], Counter]:
    """The policy's takeovers from every expert turn (greedy, or `takeover_samples` sampled),
    the departures among them, their values."""
    env, k, n = play.env, play.inputs.rollouts, play.inputs.takeover_samples
    each = max(n, 1)  # takeovers per expert turn: one greedy, or n sampled
    starts = [(e, t) for e in experts for t in range(e.n_steps)]
    played = play([Resume(e, t) for e, t in starts for _ in range(each)], sampled=n > 0)
    by_expert: dict[str, list[list[Trajectory]]] = {}
    for i, (expert, _) in enumerate(starts):
        by_expert.setdefault(expert.task_id, []).append(played[i * each : (i + 1) * each])
    departed = [d for e in experts for d in departures(e, by_expert.get(e.task_id, []), env)]
    # a continuation the environment failed or lost says nothing about the policy
    found = [d for d in departed if not d.policy.finish_reason.startswith(FAILED_ENDINGS)]
    values = step_values(play, found, k)
    made = [step_pair(d, *v, play.inputs.extra_turns) for d, v in zip(found, values, strict=True)]
    pairs = [pair for pair in made if pair is not None]
    counts = Counter(expert_steps=len(starts), departures=len(found), pairs=len(pairs))
    counts["departures_unplayable"] = len(departed) - len(found)
    counts.update(f"pairs_at_step_{p.step + 1}" for p in pairs)
    return pairs, counts


def step_values(play: StepPlayer, found: list[Departure], k: int) -> list[tuple[float, float]]:
    """(expert's, policy's) value of each departure's step: the success rate of `k` sampled
    continuations after it, all played in one call; a side whose episode ended at that step
    (an answer, the step limit), and every side when `k` is 0, is worth its own outcome."""
    sides = [(side, d.step) for d in found for side in (d.expert, d.policy)]
    values = [float(side.success) for side, _ in sides]
    going_on = [i for i, (side, step) in enumerate(sides) if k and side.n_steps > step + 1]
    resumes = [Resume(sides[i][0], sides[i][1] + 1) for i in going_on]
    played = play([r for r in resumes for _ in range(k)], sampled=True)
    for j, i in enumerate(going_on):
        values[i] = success_rate(played[j * k : (j + 1) * k])
    return list(zip(values[::2], values[1::2], strict=True))


@stage("step-pairs")
def step_pairs_stage(inputs: StepPairsInputs, run: StageRun) -> StageResult:
    """IPR's step-level pairs: where the policy departs from the expert's path and does worse."""
    from transformers import AutoTokenizer

    from envs import make_env
    from flywheel.chat import ChatTokenizer
    from flywheel.inference import open_backend

    store = run.store
    wanted = set(inputs.task_ids)
    experts = [t for t in store.read_records(inputs.expert_url, Trajectory) if t.task_id in wanted]
    model_dir = str(store.local_dir(inputs.model_url))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    env = make_env(inputs.env)
    env.check()
    backend = open_backend(inputs.inference, model_dir, chat.tokenizer, inputs.rollouts > 0)
    pairs, counts = find_step_pairs(StepPlayer(env, backend, chat, inputs), experts)
    return StageResult(
        files={"pairs": store.write_records(run.file("pairs.jsonl"), pairs)},
        counts={"experts": len(experts), **counts},
    )
