"""ET-Agent (2025): calibrate how a tool-integrated agent behaves, not only whether it is right.

    python -m flows.et_agent --config configs/et_agent_qa.yaml [key=value ...]

    warm start   SFT of the base model on the scripted solver's tool trajectories (as Agent-R1)
    evolve       roll out each train question; up to `evolve.rounds` times evolve the best
                 trajectory not yet used: a correct one enhanced (the judge's redundant step cut
                 and re-generated, else its reasoning text rewritten shorter, else a fresh
                 rollout), a wrong one reflected (cut at the judge's first flaw, or its answer
                 withdrawn, and continued after a hint); keep the correct ones, each with the
                 operator that made it (records.jsonl: parent, verdict, hint, why kept)
    RFT          SFT of the warm start on the evolved correct trajectories
    stage s      (each curriculum stage, from the last one's policy; its questions easy first:
                 stage s admits those whose reference solution needs at most the s-th fewest
                 tool calls, none `evolve` saw) `calibration.iterations`
                 times: K episodes per question → group-wise Pareto sampling (tool-call and
                 correctness variance, mixed groups only) → efficiency reward
                 r = correctness * f_tool * f_length + f_format, sigmas falling to 0 over the
                 stage → RL update (GRPO by default)

Every policy is evaluated greedily on the held-out questions (exact match) and measured on the
radar's five axes (correctness, efficiency, conciseness, successful execution, reasoning length).
"""

from __future__ import annotations

import sys

from prefect import flow
from pydantic import Field, model_validator

from flows.agent_r1 import AgentR1, SampleSettings, ToolRecipeConfig
from flywheel.records import Manifest
from flywheel.settings import SFTSettings
from ops.driver import RoundResult, RoundState, run_all_rounds, run_next_round
from ops.runner import cli_main, run_named
from tasks.behaviour_report import behaviour_report
from tasks.calibrate import CalibrateInputs, CalibrationSettings, calibrate_stage
from tasks.evolve import EvolveInputs, EvolveSettings, evolve_stage

# Keys renamed for what they do (they were named after the paper's "data flywheel").
RENAMED_KEYS = {"flywheel": "evolve", "flywheel_tasks": "evolve_tasks"}


# ET-Agent's sampling: K = 8 episodes per question, curriculum stages by tool calls, easy first.
PAPER_SAMPLING = {"samples_per_task": 8, "curriculum": "tool-calls"}


class ETAgentConfig(ToolRecipeConfig):
    """One ET-Agent run on a tool environment: the warm start (SFT on the solver's tool
    trajectories), data evolution on train questions and SFT on its correct trajectories (the
    RFT policy), then `rounds` curriculum stages of behaviour-calibration RL: groups sampled →
    Pareto-selected → efficiency-rewarded → RL, each stage from the last one's policy."""

    run_name: str = "et-agent-qa"
    rounds: int = Field(default=2, ge=0)
    """curriculum stages"""
    evolve_tasks: int = Field(default=64, ge=1)
    """Train questions the evolve stage rolls out and evolves (a seeded slice of all of them)."""
    rft: SFTSettings = Field(default_factory=SFTSettings)
    """SFT on the evolved trajectories"""
    sample: SampleSettings = Field(default_factory=lambda: SampleSettings(**PAPER_SAMPLING))
    """K = 8 episodes per question, stages easy first; a `sample` section changes only what it names
    """
    calibration: CalibrationSettings = Field(default_factory=CalibrationSettings)
    evolve: EvolveSettings = Field(default_factory=EvolveSettings)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        """The keys named after the paper's "data flywheel" before they were named for what
        they do: refused, naming the new key (a silently ignored section would run defaults)."""
        if isinstance(data, dict):
            for old, new in RENAMED_KEYS.items():
                if old in data:
                    raise ValueError(f"{old} is now called {new}: write {new} instead")
        return data

    @model_validator(mode="after")
    def _no_dynamic_sampling(self):
        if self.sample.min_mixed_groups:
            raise ValueError(
                "sample.min_mixed_groups is Agent-R1's: ET-Agent's calibration keeps only groups "
                "that mix already (calibration.iterations samples again); leave it unset"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _paper_sampling(cls, data):
        if isinstance(data, dict):
            given = data.get("sample") or {}
            if isinstance(given, dict):
                data = {**data, "sample": {**PAPER_SAMPLING, **given}}
        return data


class ETAgent(AgentR1):
    name, title, config_class = "et-agent", "ET-Agent", ETAgentConfig
    lineage_start = "warm-start"  # RFT (round 0) trains from the warm start

    def start(self) -> RoundResult:
        """Warm start → data evolution → RFT (SFT on the evolved correct trajectories)."""
        cfg = self.cfg
        _, warm = self.warm_start(evaluate_untrained=False)
        warm_eval = self.evaluate("warm-start", warm.files["model"])
        evolved = evolve_stage(
            EvolveInputs(
                model_url=warm.files["model"], env=cfg.env,
                task_ids=self.questions()[: cfg.evolve_tasks], prefix=self.prefix,
                inference=cfg.inference, settings=cfg.evolve, max_steps=cfg.env.max_steps,
                seed=cfg.seed,
            ),
            self.out("evolve", "evolve"),
        )  # fmt: skip
        self.log_curve(evolved.metrics, 0, "evolve")
        if not evolved.counts.get("kept", 0):
            return RoundResult(
                policy=warm.files["model"],
                evaluations=[warm_eval],
                notes=["data evolution kept no correct trajectory: RFT skipped, RL starts from "
                       "the warm start"],
            )  # fmt: skip
        rft = self.sft("rft", warm.files["model"], evolved.files["trajectories"], cfg.rft, "rft")
        return RoundResult(policy=rft.files["model"], evaluations=[warm_eval])

    def round(self, state: RoundState) -> RoundResult:
        """One curriculum stage: sample → Pareto-select → efficiency reward → RL, repeated."""
        cfg, n = self.cfg, state.round
        policy, notes = state.policy, []
        questions = self.round_questions(n, skip=cfg.evolve_tasks)  # none RFT trained on
        iterations = cfg.calibration.iterations
        for i in range(iterations):
            folder, seed = f"stage-{n}/iteration-{i + 1}", cfg.seed + n * 1000 + i
            step = (n - 1) * iterations + i + 1  # the curves' x: calibration iterations so far
            sampled = self.sample(policy, questions, seed, f"{folder}/sample", folder)
            calibrated = calibrate_stage(
                CalibrateInputs(
                    data_url=sampled.files["trajectories"], settings=cfg.calibration, iteration=i
                ),
                self.out(f"{folder}/calibrate", folder),
            )
            self.log_curve({**sampled.metrics, **calibrated.metrics}, step, "rollout")
            if not calibrated.counts["kept_groups"]:
                notes.append(
                    f"stage {n}, iteration {i + 1}: no sampled group had both a success and a "
                    "failure, so nothing to calibrate on; sample more per question "
                    "(sample.samples_per_task) or more questions (sample.tasks_per_round)"
                )
                continue
            trained = self.rl(policy, calibrated.files["trajectories"], n, folder, step)
            policy = trained.files["model"]
        if policy == state.policy:
            return RoundResult(notes=notes)
        return RoundResult(policy=policy, notes=notes)

    def policy_label(self, round_no: int) -> str:
        return "rft" if round_no == 0 else f"stage-{round_no}"

    def report(self, evaluations: list[tuple[str, Manifest]], notes: list[str]) -> str:
        table = super().report(evaluations, notes)
        behaviour_report(
            store_url=self.store.root, run_url=self.run_url, title=f"{self.title} on qa",
            evaluations=evaluations, agent_format=self.env.agent_format,
            tool_arguments=dict(self.env.tool_arguments), tracking=self.tracking,
        )  # fmt: skip
        return table


@flow(name="et-agent", log_prints=True, flow_run_name=run_named(ETAgentConfig))
def et_agent(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
) -> list[dict]:
    """All of ET-Agent in one run. `config` (a mapping) or `config_file` (YAML), then
    `overrides` (`key=value`) on top."""
    return run_all_rounds(ETAgent, config, config_file, overrides)


@flow(name="et-agent-campaign", log_prints=True, flow_run_name=run_named(ETAgentConfig))
def et_agent_campaign(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
):
    """One more ET-Agent round per run (for schedules): round 0 is warm start, data evolution and RFT;
    each later round one curriculum stage from the last published policy."""
    return run_next_round(ETAgent, config, config_file, overrides)


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        et_agent, ETAgentConfig, argv, prog="python -m flows.et_agent",
        campaign_flow=et_agent_campaign,
        description="Run ET-Agent: warm start, data evolution and RFT, then curriculum stages of "
        "behaviour-calibration RL (Pareto sampling, efficiency reward).",
        example="rounds=3 calibration.sigma_tool=0.3 evolve.rounds=2",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
