"""ETO (Song et al., 2024): SFT on expert trajectories, then rounds of explore → pairs → DPO;
with `explore.level=step`, IPR's (Xiong et al., 2024) step pairs beside ETO's.

    python -m flows.eto --config configs/eto_textcraft.yaml [key=value ...]
    python -m flows.eto --campaign --config ...   # one more round of the campaign

`eto` runs every round; `eto-campaign` runs one more round per run (scheduled deployments),
continuing from the last round published in the artifact store. The driver (ops/driver.py)
evaluates each new policy and writes the report; each stage is cached on what it read, so a
re-run resumes at the first stage that did not finish.
"""

from __future__ import annotations

import sys
from typing import Literal

from prefect import flow
from pydantic import Field, model_validator

from agents.rollout import agent_prefix, few_shot_examples
from flywheel.records import Manifest
from flywheel.settings import DPOSettings, RoundSlices
from ops.driver import Recipe, RoundResult, RoundState, run_all_rounds, run_next_round
from ops.recipe_config import RecipeConfig
from ops.runner import cli_main, run_named
from tasks.build_pairs import BuildPairsInputs, build_pairs_stage
from tasks.dpo import DPOInputs, dpo_stage
from tasks.expert_pairs import ExpertPairsInputs, expert_pairs_stage
from tasks.explore import ExploreInputs, explore_stage, shard
from tasks.step_balance import StepBalanceInputs, step_balance_stage
from tasks.step_pairs import StepPairsInputs, step_pairs_stage


class ExploreSettings(RoundSlices):
    """Exploration of the train tasks; ETO explores each task once, greedily."""

    temperature: float = Field(default=0.0, ge=0)
    """0 explores greedily"""
    samples_per_task: int = Field(default=1, ge=1)
    """episodes per train task"""
    shards: int = Field(default=2, ge=1)
    """mapped Prefect tasks"""
    level: Literal["trajectory", "step"] = "trajectory"
    """"trajectory": ETO's pairs of whole episodes. "step": those and IPR's step pairs, where the
    policy departs from the expert's path and does worse (tasks/step_pairs.py)."""
    step_rollouts: int = Field(default=3, ge=0)
    """Step level: sampled continuations that value each of the two steps (IPR's Monte-Carlo
    step reward); 0 values them by the greedy continuation's outcome and the expert's."""
    step_temperature: float = Field(default=1.0, gt=0)
    """Step level: the temperature of those continuations."""
    step_samples: int = Field(default=0, ge=0)
    """Step level: 0, the policy takes over greedily from each expert turn (IPR); n, n sampled
    takeovers (at step_temperature), each move unlike the expert's valued against it: pairs on
    both sides of a decision, not only where the greedy policy errs."""
    step_balance: bool = False
    """Step level: at each step position, keep as many pairs choosing one kind of move over
    another as the other way round (the larger side subsampled with the seed), so a decision
    several families share is taught where they differ, not by which family gave more pairs
    (tasks/step_balance.py)."""
    expert_sft_ratio: float = Field(default=0.0, ge=0)
    """IPR's SFT term: expert trajectories (of the train tasks, drawn with the seed) per
    preference pair of the round, joining DPO as pairs with themselves, so that `dpo.nll_weight`
    trains on them and the preference term ignores them (tasks/expert_pairs.py); 0: none."""


class ETOConfig(RecipeConfig):
    """One ETO run: SFT on expert trajectories, then `rounds` of explore → pairs → DPO."""

    run_name: str = "eto-textcraft"
    dpo: DPOSettings = Field(default_factory=DPOSettings)
    explore: ExploreSettings = Field(default_factory=ExploreSettings)

    @model_validator(mode="after")
    def _step_settings_need_their_level(self) -> ETOConfig:
        if self.explore.step_samples > 0 and self.explore.level != "step":
            raise ValueError(
                "explore.step_samples samples the policy's takeovers for step pairs: set "
                "explore.level=step, or explore.step_samples=0"
            )
        if self.explore.step_balance and self.explore.level != "step":
            raise ValueError(
                "explore.step_balance balances the step pairs' votes: set explore.level=step, "
                "or explore.step_balance=false"
            )
        return self

    @model_validator(mode="after")
    def _expert_sft_needs_the_nll_term(self) -> ETOConfig:
        if self.explore.expert_sft_ratio > 0 and not self.dpo.nll_weight:
            raise ValueError(
                "explore.expert_sft_ratio > 0 trains on expert trajectories through DPO's NLL "
                "term: set dpo.nll_weight > 0 (IPR: 1.0), or explore.expert_sft_ratio=0"
            )
        return self


class ETO(Recipe):
    name, title, config_class = "eto", "ETO", ETOConfig

    def start(self) -> RoundResult:
        """Expert trajectories on the train tasks, and SFT of the base model on them."""
        cfg = self.cfg
        base, expert = self.base_model(), self.expert_trajectories()
        # Worked examples help the untrained model only; trained models are prompted as they were
        # trained, without them (with them, the SFT model solved 0 of 12 train tasks, without 4).
        examples = agent_prefix(self.env, few_shot_examples(self.env, cfg.env.few_shot))
        untrained = self.evaluate("untrained", base.files["model"], examples, sampled=False)
        policy = self.sft(
            "expert", base.files["model"], expert.files["trajectories"], cfg.sft, "sft"
        )
        return RoundResult(
            policy=policy.files["model"],
            evaluations=[untrained],
            carry={"expert": expert.files["trajectories"]},
        )

    def round(self, state: RoundState) -> RoundResult:
        """Explore the train tasks with the policy → pair each exploration with the expert's
        trajectory on its task (and, at the step level, the policy's worse departures from the
        expert's path with it, IPR) → DPO on the pairs."""
        cfg, n = self.cfg, state.round
        explored_ids = cfg.explore.tasks_for_round(self.train_ids, n)
        explored = self.explore(state, explored_ids)
        pairs = build_pairs_stage(
            BuildPairsInputs(
                explored_urls=[m.files["trajectories"] for m in explored],
                expert_url=state.carry["expert"], extra_turns=cfg.dpo.rejected_extra_turns,
            ),
            self.out(f"round-{n}/pairs", f"round-{n}"),
        )  # fmt: skip
        found = [pairs]
        if cfg.explore.level == "step":
            found.append(self.step_pairs(state, explored_ids))
        preferences = sum(m.counts["pairs"] for m in found)
        if preferences == 0:
            return RoundResult(notes=[f"round {n}: no preference pairs ({pairs.counts})."])
        if cfg.explore.expert_sft_ratio > 0:
            found.append(self.expert_pairs(state, preferences))
        settings = cfg.dpo.for_round(n)
        reference = state.start_policy if settings.reference == "start" else None
        policy = dpo_stage(
            DPOInputs(
                model_url=state.policy, pairs_urls=[m.files["pairs"] for m in found],
                settings=settings, seed=cfg.seed, reference_url=reference,
            ),
            self.out(f"round-{n}/dpo", f"round-{n}"),
        )  # fmt: skip
        return RoundResult(policy=policy.files["model"])

    def explore(self, state: RoundState, task_ids: list[str]) -> list[Manifest]:
        """The policy's episodes on `task_ids`, in `explore.shards` mapped Prefect tasks."""
        cfg, n = self.cfg, state.round
        shards = shard(task_ids, cfg.explore.shards, cfg.explore.samples_per_task)
        return explore_stage.map(
            [
                ExploreInputs(
                    model_url=state.policy, env=cfg.env, task_ids=tasks, prefix=self.prefix,
                    inference=cfg.inference, temperature=cfg.explore.temperature,
                    max_steps=cfg.env.max_steps, seed=cfg.seed + n * 1000 + i,
                )
                for i, tasks in enumerate(shards)
            ],
            [
                self.out(f"round-{n}/explore/shard-{i}", f"round-{n}-shard-{i}")
                for i in range(len(shards))
            ],
        ).result()  # fmt: skip

    def expert_pairs(self, state: RoundState, preferences: int) -> Manifest:
        """IPR's SFT term: expert trajectories as pairs with themselves, in proportion."""
        cfg, n = self.cfg, state.round
        return expert_pairs_stage(
            ExpertPairsInputs(
                expert_url=state.carry["expert"], seed=cfg.seed + n * 1000,
                count=round(preferences * cfg.explore.expert_sft_ratio),
            ),
            self.out(f"round-{n}/expert-pairs", f"round-{n}"),
        )  # fmt: skip

    def step_pairs(self, state: RoundState, task_ids: list[str]) -> Manifest:
        """IPR's step pairs: the policy takes over from each step of the expert's path (greedily,
        or `explore.step_samples` times sampled); with `explore.step_balance`, each decision's
        votes balanced."""
        cfg, n = self.cfg, state.round
        found = step_pairs_stage(
            StepPairsInputs(
                model_url=state.policy, env=cfg.env, expert_url=state.carry["expert"],
                task_ids=task_ids, inference=cfg.inference, max_steps=cfg.env.max_steps,
                rollouts=cfg.explore.step_rollouts, temperature=cfg.explore.step_temperature,
                takeover_samples=cfg.explore.step_samples,
                extra_turns=cfg.dpo.rejected_extra_turns, seed=cfg.seed + n * 1000,
            ),
            self.out(f"round-{n}/step-pairs", f"round-{n}"),
        )  # fmt: skip
        if not cfg.explore.step_balance:
            return found
        return step_balance_stage(
            StepBalanceInputs(pairs_url=found.files["pairs"], env=cfg.env, seed=cfg.seed + n * 1000),
            self.out(f"round-{n}/step-balance", f"round-{n}"),
        )  # fmt: skip


@flow(name="eto", log_prints=True, flow_run_name=run_named(ETOConfig))
def eto(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
) -> list[dict]:
    """All of ETO in one run. `config` (a mapping) or `config_file` (YAML), then `overrides`
    (`key=value`) on top."""
    return run_all_rounds(ETO, config, config_file, overrides)


@flow(name="eto-campaign", log_prints=True, flow_run_name=run_named(ETOConfig))
def eto_campaign(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
):
    """One more round of an ETO campaign per run (for schedules): round 0 is SFT on expert
    trajectories, each later round explores from the last published policy. Ends cleanly, with
    nothing done, once rounds 0..`rounds` are published."""
    return run_next_round(ETO, config, config_file, overrides)


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        eto, ETOConfig, argv, prog="python -m flows.eto", campaign_flow=eto_campaign,
        description="Run ETO: SFT on expert trajectories, then explore → pairs → DPO rounds.",
        example="rounds=1 env.test_tasks=20 dpo.beta=0.2",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
