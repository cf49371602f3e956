"""Agent-R1 (Cheng et al., 2025): a tool-using agent trained end to end by reinforcement learning.

    python -m flows.agent_r1 --config configs/agent_r1_qa.yaml [key=value ...]
    python -m flows.agent_r1 --campaign --config ...   # one more RL iteration per run

Warm start: SFT of the base model on the scripted solver's tool trajectories (search, python,
answer), so a small model writes calls the environment can run. An iteration: a group of
episodes per train question, sampled with the current policy and its log-probabilities, whole
multi-turn episodes with the tools' results between the turns → one RL update with the chosen
advantage estimator (`rl.estimator`: grpo, dr-grpo, rloo, reinforce++, ppo), loss on the tokens
the policy sampled only. Every policy is evaluated greedily on the held-out questions; success is
the answer's exact match.

The driver (ops/driver.py) evaluates each new policy and writes the report; each stage is cached
on what it read, so a re-run resumes at the first stage that did not finish. MLflow holds a curve
per rollout metric (reward, exact match, format validity, tool calls, response length, groups
with no reward variance) and per evaluation metric over the iterations.
"""

from __future__ import annotations

import random
import sys
from typing import Literal

from prefect import flow
from pydantic import Field, model_validator

from agents.rollout import agent_prefix, few_shot_examples
from flywheel.records import Manifest
from flywheel.settings import EnvSettings, RLSettings, RoundSlices, round_slice
from ops.driver import Recipe, RoundResult, RoundState, run_all_rounds, run_next_round
from ops.recipe_config import RecipeConfig
from ops.runner import cli_main, run_named
from tasks.explore import ExploreInputs, sample_stage
from tasks.pool_samples import PoolInputs, pool_samples_stage
from tasks.rl import RLInputs, rl_stage


class SampleSettings(RoundSlices):
    """Agent-R1's rollouts each round: a group of episodes per train question, sampled with the
    log-probabilities the trainer's importance ratio needs."""

    samples_per_task: int = Field(default=4, ge=2)
    """the group a group-relative baseline uses"""
    questions: Literal["warm-start", "all"] = "all"
    """The train questions the rounds sample from, in a seeded order: all of them, or the warm
    start's only (more solved episodes there, 10.4% against 4.7% at temperature 1, yet the demo's
    RL round gained less from them: +1.7 points against +3.3; README).
    """
    curriculum: Literal["none", "tool-calls"] = "none"
    """Which of them round n samples: "none" takes the next `tasks_per_round` of the seeded order;
    "tool-calls" the next ones among those whose reference solution needs at most the n-th
    smallest number of tool calls (easy first, so early groups mix successes and failures; the
    last level admits every question).
    """
    temperature: float = Field(default=1.0, gt=0)
    """the RL trainer's log-probs assume this too"""
    min_mixed_groups: int = Field(default=0, ge=0)
    """DAPO's dynamic sampling: while a round's groups hold fewer than this many with both a success
    and a failure, sample the next slice of questions too (a sample stage each), up to
    `max_slices` slices a round; the RL update trains on all of them. 0: one slice a round. Round
    n takes slices (n-1) * max_slices + 1, ..., so rounds never share a slice.
    """
    max_slices: int = Field(default=4, ge=1)
    """at most this many slices a round (dynamic sampling)"""

    @model_validator(mode="after")
    def _dynamic_sampling_needs_slices(self):
        if self.min_mixed_groups and self.tasks_per_round is None:
            raise ValueError(
                "sample.min_mixed_groups samples further slices of questions: set "
                "sample.tasks_per_round (with it unset, every slice is all of them)"
            )
        if self.min_mixed_groups and self.curriculum != "none":
            raise ValueError(
                "sample.min_mixed_groups takes the next slices in the seeded order: it needs "
                "sample.curriculum=none (the tool-call curriculum chooses its own slices)"
            )
        return self

    def slices(self, round_no: int) -> list[int]:
        """The question slices round `round_no` may sample, in order (`round_slice` numbers)."""
        if not self.min_mixed_groups:
            return [round_no]
        first = (round_no - 1) * self.max_slices + 1
        return list(range(first, first + self.max_slices))


class ToolRecipeConfig(RecipeConfig):
    """A recipe that trains a tool-using agent on the QA environment (Agent-R1, ET-Agent): a warm
    start on the scripted solver's tool trajectories, then rounds of sampled groups → RL."""

    env: EnvSettings = Field(default_factory=lambda: EnvSettings(name="qa", max_steps=8))
    sample: SampleSettings = Field(default_factory=SampleSettings)
    rl: RLSettings = Field(default_factory=RLSettings)

    @model_validator(mode="before")
    @classmethod
    def _qa_by_default(cls, data):
        """An `env` section without a name means the QA environment here, not TextCraft."""
        if isinstance(data, dict) and isinstance(data.get("env"), dict):
            data = {**data, "env": {"name": "qa", **data["env"]}}
        return data

    @model_validator(mode="after")
    def _tool_environment(self):
        if self.env.name != "qa":
            raise ValueError(
                f"env.name={self.env.name!r}: this recipe trains tool-using agents; set "
                "env.name=qa (search and python tools; env.qa.source picks the questions)"
            )
        if self.rl.temperature != self.sample.temperature:
            raise ValueError(
                f"rl.temperature={self.rl.temperature} but sample.temperature="
                f"{self.sample.temperature}: the trainer's log-probabilities must be those of the "
                "distribution the episodes were sampled from; set both to the same value"
            )
        return self


class AgentR1Config(ToolRecipeConfig):
    """One Agent-R1 run on a tool environment: a warm start (SFT on the scripted solver's tool
    trajectories, so a small model follows the call format), then `rounds` of sample groups →
    RL update, every policy evaluated on the held-out questions."""

    run_name: str = "agent-r1-qa"


def easy_first_slice(questions: list[str], calls: dict[str, int], count: int, n: int) -> list[str]:
    """Round `n`'s questions under the tool-call curriculum: for rounds 1..n in turn, the next
    `count` questions of `questions` (in order, none an earlier round took) whose reference
    solution needs at most the round's level of tool calls, the levels being the distinct counts
    in `calls`, smallest first; past the last level every question is admitted."""
    levels = sorted(set(calls.values()))
    taken: set[str] = set()
    chosen: list[str] = []
    for stage in range(1, n + 1):
        level = levels[min(stage, len(levels)) - 1]
        chosen = [q for q in questions if q not in taken and calls[q] <= level][:count]
        taken.update(chosen)
    return chosen


class AgentR1(Recipe):
    name, title, config_class = "agent-r1", "Agent-R1", AgentR1Config

    def questions(self) -> list[str]:
        """The questions RL samples from (`sample.questions`: the warm start's or every train
        question), in a seeded order, so each round's slice mixes the question types."""
        every = self.cfg.sample.questions == "all"
        questions = list(self.env.task_ids("train") if every else self.train_ids)
        random.Random(self.cfg.seed).shuffle(questions)
        return questions

    def round_questions(self, n: int, skip: int = 0) -> list[str]:
        """The questions round `n` samples, from `questions()` less its first `skip`
        (`sample.curriculum`: the next slice of them, or easy first by reference tool calls)."""
        cfg = self.cfg.sample
        pool = self.questions()[skip:]
        if cfg.curriculum == "none":
            return round_slice(pool, cfg.tasks_per_round, n)
        records = self.env.questions("train")
        calls = {q: records[q].reference_tool_calls for q in pool}
        chosen = easy_first_slice(pool, calls, cfg.tasks_per_round or len(pool), n)
        if not chosen:
            raise ValueError(
                f"round {n}: the tool-call curriculum has used all {len(pool)} train questions "
                "in earlier rounds; lower `rounds` or `sample.tasks_per_round`, or set "
                "sample.curriculum=none (its rounds wrap around)"
            )
        return chosen

    def start(self) -> RoundResult:
        """The solver's trajectories on the train questions, and the warm start: SFT on them."""
        untrained, policy = self.warm_start()
        return RoundResult(policy=policy.files["model"], evaluations=[untrained])

    def warm_start(self, evaluate_untrained: bool = True) -> tuple[tuple | None, Manifest]:
        """The untrained model's evaluation (with worked examples) and the warm start."""
        cfg = self.cfg
        base, solver = self.base_model(), self.expert_trajectories()
        untrained = None
        if evaluate_untrained:
            examples = agent_prefix(self.env, few_shot_examples(self.env, cfg.env.few_shot))
            untrained = self.evaluate("untrained", base.files["model"], examples, sampled=False)
        policy = self.sft(
            "warm-start", base.files["model"], solver.files["trajectories"], cfg.sft, "sft"
        )
        return untrained, policy

    def sample(
        self, policy: str, task_ids: list[str], seed: int, path: str, label: str
    ) -> Manifest:
        """A group of `sample.samples_per_task` episodes per question, with log-probabilities."""
        cfg = self.cfg
        return sample_stage(
            ExploreInputs(
                model_url=policy, env=cfg.env, task_ids=task_ids, prefix=self.prefix,
                inference=cfg.inference, temperature=cfg.sample.temperature,
                max_steps=cfg.env.max_steps, seed=seed,
                samples_per_task=cfg.sample.samples_per_task, logprobs=True,
            ),
            self.out(path, label),
        )  # fmt: skip

    def round(self, state: RoundState) -> RoundResult:
        """Sample a group of episodes per train question with the policy (further slices of
        questions while too few groups mix, `sample.min_mixed_groups`) → RL update."""
        cfg, n = self.cfg, state.round
        sampled = self.sample_slices(state.policy, n)
        self.log_curve(sampled.metrics, n, "rollout")
        if sampled.metrics.get("zero_variance_groups", 1.0) >= 1.0:
            return RoundResult(
                notes=[
                    f"round {n}: every group's episodes earned the same reward, so no advantage "
                    "is nonzero; sample more per question (sample.samples_per_task) or other "
                    "questions."
                ]
            )
        if cfg.rl.groups == "mixed" and not sampled.metrics.get("mixed_outcome_groups", 0.0):
            return RoundResult(
                notes=[
                    f"round {n}: no group held both a success and a failure, and rl.groups=mixed "
                    "trains on those alone; sample more per question (sample.samples_per_task), "
                    "easier questions (sample.curriculum=tool-calls), or set rl.groups=all."
                ]
            )
        policy = self.rl(state.policy, sampled.files["trajectories"], n, f"round-{n}")
        return RoundResult(policy=policy.files["model"])

    def sample_slices(self, policy: str, n: int) -> Manifest:
        """Round `n`'s sampled groups: one slice of questions, or (dynamic sampling) slices in
        turn until `sample.min_mixed_groups` groups mix or `sample.max_slices` were sampled,
        pooled into one file. The first slice is the one a round without it samples."""
        cfg, seed = self.cfg, self.cfg.seed + n * 1000
        slices, mixed = [], 0
        for index, number in enumerate(cfg.sample.slices(n)):
            suffix = f"-{index + 1}" if index else ""  # the first: a plain round's own stage
            questions = self.round_questions(number)
            slices.append(
                self.sample(policy, questions, seed + index, f"round-{n}/sample{suffix}",
                            f"round-{n}{suffix}")
            )  # fmt: skip
            mixed += mixed_groups(slices[-1], cfg.sample.samples_per_task)
            if mixed >= cfg.sample.min_mixed_groups:
                break
        if len(slices) == 1:
            return slices[0]
        pooled = pool_samples_stage(
            PoolInputs(data_urls=[s.files["trajectories"] for s in slices]),
            self.out(f"round-{n}/pooled", f"round-{n}"),
        )
        print(f"round {n}: {len(slices)} slices sampled, {pooled.counts['mixed_groups']} of "
              f"{pooled.counts['groups']} groups mixed")  # fmt: skip
        metrics = {**slices[-1].metrics, **pooled_metrics(slices, pooled)}
        return pooled.model_copy(update={"metrics": metrics})

    def rl(
        self, policy: str, data_url: str, n: int, folder: str, step: int | None = None
    ) -> Manifest:
        """One RL update of `policy` on the trajectories at `data_url` (`folder`/rl); its metrics
        go on the flow's curves at `step` (the round, unless a round has several updates)."""
        cfg = self.cfg
        inputs = RLInputs(model_url=policy, data_url=data_url, settings=cfg.rl, seed=cfg.seed + n)
        trained = rl_stage(inputs, self.out(f"{folder}/rl", folder))
        self.log_curve(trained.metrics, n if step is None else step, "train")
        return trained

    def policy_label(self, round_no: int) -> str:
        return "warm-start" if round_no == 0 else f"rl-round-{round_no}"


def mixed_groups(sampled: Manifest, samples_per_task: int) -> int:
    """Groups of a sample stage holding both a success and a failure (from its share)."""
    groups = sampled.counts.get("episodes", 0) / samples_per_task
    return round(sampled.metrics.get("mixed_outcome_groups", 0.0) * groups)


def pooled_metrics(slices: list[Manifest], pooled: Manifest) -> dict[str, float]:
    """The round's rollout curve over every slice: episode-weighted means of the slices'
    success rate, reward and zero-variance share, the pooled groups' mixed share, and how many
    slices it took."""
    episodes = [s.counts.get("episodes", 0) for s in slices]
    rates = {
        name: sum(s.metrics.get(name, 0.0) * e for s, e in zip(slices, episodes, strict=True))
        / max(sum(episodes), 1)
        for name in ("success_rate", "average_reward", "zero_variance_groups")
    }
    groups = max(pooled.counts["groups"], 1)
    return {**rates, "mixed_outcome_groups": pooled.counts["mixed_groups"] / groups,
            "slices": float(len(slices))}  # fmt: skip


@flow(name="agent-r1", log_prints=True, flow_run_name=run_named(AgentR1Config))
def agent_r1(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
) -> list[dict]:
    """All of Agent-R1 in one run. `config` (a mapping) or `config_file` (YAML), then
    `overrides` (`key=value`) on top."""
    return run_all_rounds(AgentR1, config, config_file, overrides)


@flow(name="agent-r1-campaign", log_prints=True, flow_run_name=run_named(AgentR1Config))
def agent_r1_campaign(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
):
    """One more Agent-R1 iteration per run (for schedules): round 0 is the warm start, each later
    round samples from the last published policy and updates it."""
    return run_next_round(AgentR1, config, config_file, overrides)


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        agent_r1, AgentR1Config, argv, prog="python -m flows.agent_r1",
        campaign_flow=agent_r1_campaign,
        description="Run Agent-R1: warm-start SFT on tool trajectories, then RL iterations.",
        example="rounds=2 rl.estimator=rloo sample.samples_per_task=8",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
