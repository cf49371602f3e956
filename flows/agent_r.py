"""Agent-R (Yuan et al., 2025): learn to revise from MCTS trees, round after round.

    python -m flows.agent_r --config configs/agent_r_textcraft.yaml [key=value ...]
    python -m flows.agent_r --campaign --config ...   # one more round of the campaign

Starting point: SFT on expert trajectories. A round: MCTS on the train tasks with the current
model → pairs of good and bad paths (alpha rising per round) → the model finds the first error of
each bad path → revision trajectories (bad prefix + revision turn + good continuation) → SFT of
the current model. Baselines, trained from the starting point on round 1's trees:
Direct-Revision (whole bad path + revision + good path) and good paths only.

With `revisions.source: expert` (as IPR and STeCa do), the good continuation is the expert's
instead of a solved tree's, so every failed episode gives a revision: a round explores the train
tasks with the current model → each failed episode's bad prefix up to the oracle's first error +
revision turn + the expert's plan from there (tasks/expert_revisions.py), with expert
trajectories mixed in → SFT of the current model.

The driver (ops/driver.py) evaluates each new policy and writes the report; each stage is cached
on what it read, so a re-run resumes at the first stage that did not finish.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from prefect import flow
from pydantic import Field, field_validator

from flywheel.records import Manifest
from flywheel.settings import RoundSlices, SFTSettings, Strict
from ops.driver import Recipe, RoundResult, RoundState, run_all_rounds, run_next_round
from ops.recipe_config import RecipeConfig
from ops.runner import cli_main, run_named
from tasks.critique import CritiqueInputs, CritiqueSettings, critique_stage
from tasks.expert_revisions import ExpertRevisionsInputs, expert_revisions_stage
from tasks.explore import ExploreInputs, explore_stage
from tasks.mcts import MCTSInputs, MCTSSettings, mcts_stage
from tasks.mix_general import MixGeneralInputs, mix_general_stage
from tasks.select_paths import SelectPathsInputs, select_paths_stage
from tasks.splice import SpliceInputs, splice_stage


class PathSettings(Strict):
    """Which root-to-leaf paths become training data. Scores are rewards normalised to [0, 1]
    per environment, so the thresholds mean the same on every environment."""

    alpha: list[float] = Field(default_factory=lambda: [0.5, 0.7, 1.0], min_length=1)
    """Round r pairs only good leaves scoring at least alpha[r-1] (the last value after that). "At
    least", not "above": on TextCraft's {0, 1} rewards alpha 1.0 must admit a solved task.
    """
    beta: float = Field(default=0.2, ge=0)
    """the good leaf must beat the bad one by more than this"""
    max_pairs_per_task: int = Field(default=4, ge=1)
    """bad/good path pairs kept per tree"""
    max_good_per_task: int = Field(default=2, ge=0)
    """good paths kept per tree"""
    include_good_paths: bool = True
    """Train each round on the good paths too, next to the revisions (Agent-R collects both)."""

    @field_validator("alpha")
    @classmethod
    def _in_unit_range(cls, value: list[float]) -> list[float]:
        if any(not 0.0 <= a <= 1.0 for a in value):
            raise ValueError(f"alpha values are normalised scores in [0, 1], got {value}")
        return value

    def alpha_for(self, round_no: int) -> float:
        return self.alpha[min(round_no, len(self.alpha)) - 1]


class RevisionSettings(RoundSlices):
    """Where a revision's good continuation comes from."""

    source: Literal["mcts", "expert"] = "mcts"
    """"mcts" (Agent-R): a solved path of the task's search tree. "expert" (IPR, STeCa): the
    environment's expert plan, played from the state the failed episode's first error leaves;
    each round explores the train tasks (`tasks_per_round` of them) instead of searching them,
    and every failed episode can give a revision, where MCTS needs a solved tree.
    """
    expert_sft_ratio: float = Field(default=0.5, ge=0)
    """source expert: expert trajectories trained on per revision (0.5: one per two; 0: none)"""
    temperature: float = Field(default=0.0, ge=0)
    """source expert: the exploration's sampling temperature (0: greedy, as ETO explores)"""


SHIPPED_GENERAL_CHAT = Path(__file__).resolve().parent.parent / "configs/data/general_chat.jsonl"


class GeneralDataSettings(Strict):
    """General instruction data mixed into Agent-R's revision SFT, so the policy keeps its
    general abilities (the paper's eta = 0.2). Off when `eta` is 0 or `file` is "none"."""

    eta: float = Field(default=0.2, ge=0, lt=1)
    """Share of general examples in each revision SFT set: eta / (1 - eta) per trajectory."""
    file: str = ""
    """JSON lines of {"instruction": ..., "response": ...}; "" is the small shipped set."""

    @property
    def enabled(self) -> bool:
        return self.eta > 0 and self.file != "none"

    @property
    def url(self) -> str:
        path = Path(self.file).expanduser() if self.file else SHIPPED_GENERAL_CHAT
        return "file://" + str(path.resolve())

    @field_validator("file")
    @classmethod
    def _file_exists(cls, value: str) -> str:
        if value not in ("", "none") and not Path(value).expanduser().is_file():
            raise ValueError(f"{value!r} is not a file (JSON lines of instruction/response)")
        return value


class AgentRConfig(RecipeConfig):
    """One Agent-R run: SFT on expert trajectories (the starting point), then `rounds` of
    MCTS → path pairs → first-error critique → revision splice → SFT, and two baselines trained
    from the starting point on round 1's trees (Direct-Revision, good paths only). With
    `revisions.source: expert`, rounds of explore → expert-anchored revisions → SFT instead."""

    run_name: str = "agent-r-textcraft"
    rounds: int = Field(default=3, ge=0)
    mcts: MCTSSettings = Field(default_factory=MCTSSettings)
    paths: PathSettings = Field(default_factory=PathSettings)
    critique: CritiqueSettings = Field(default_factory=CritiqueSettings)
    revisions: RevisionSettings = Field(default_factory=RevisionSettings)
    revision_sft: SFTSettings = Field(default_factory=SFTSettings)
    """each round's SFT"""
    general: GeneralDataSettings = Field(default_factory=GeneralDataSettings)
    baselines: bool = True
    """train and evaluate Direct-Revision and good-paths-only (revisions.source mcts only)"""


class AgentR(Recipe):
    name, title, config_class = "agent-r", "Agent-R", AgentRConfig
    # The baselines are trained from the starting point (SFT), not from a round.
    branches = {"direct-revision": "sft", "good-paths-only": "sft"}

    def start(self) -> RoundResult:
        """The starting point: SFT of the base model on expert trajectories."""
        base, expert = self.base_model(), self.expert_trajectories()
        policy = self.sft(
            "expert", base.files["model"], expert.files["trajectories"], self.cfg.sft, "sft"
        )
        return RoundResult(
            policy=policy.files["model"], carry={"expert": expert.files["trajectories"]}
        )

    def round(self, state: RoundState) -> RoundResult:
        """A round with the good continuations from `revisions.source`."""
        if self.cfg.revisions.source == "expert":
            return self.expert_round(state)
        return self.mcts_round(state)

    def mcts_round(self, state: RoundState) -> RoundResult:
        """MCTS → path pairs → first-error critique → revision splice → SFT (and, in round 1,
        the baselines on the same trees)."""
        cfg, n, policy = self.cfg, state.round, state.policy
        trees = mcts_stage(
            MCTSInputs(
                model_url=policy, env=cfg.env,
                task_ids=cfg.mcts.tasks_for_round(self.train_ids, n),
                prefix=self.prefix,
                inference=cfg.inference, settings=cfg.mcts, seed=cfg.seed + n,
            ),
            self.out(f"round-{n}/mcts", f"round-{n}"),
        )  # fmt: skip
        paths = select_paths_stage(
            SelectPathsInputs(
                trees_url=trees.files["trees"], alpha=cfg.paths.alpha_for(n), beta=cfg.paths.beta,
                max_pairs_per_task=cfg.paths.max_pairs_per_task,
                max_good_per_task=cfg.paths.max_good_per_task, seed=cfg.seed,
            ),
            self.out(f"round-{n}/paths", f"round-{n}"),
        )  # fmt: skip
        critiques = critique_stage(
            CritiqueInputs(
                model_url=policy, env=cfg.env, trees_url=trees.files["trees"],
                pairs_url=paths.files["pairs"], inference=cfg.inference, settings=cfg.critique,
            ),
            self.out(f"round-{n}/critique", f"round-{n}"),
        )  # fmt: skip
        revisions = self.splice(trees, paths, critiques, "revision", f"round-{n}/revisions")
        result = RoundResult(notes=[round_note(n, trees, paths, critiques, revisions)])
        if n == 1 and cfg.baselines:
            result = self.baselines(state.start_policy, trees, paths)
            result.notes.insert(0, round_note(n, trees, paths, critiques, revisions))
        if revisions.counts["trajectories"] == 0:
            result.notes.append(f"round {n}: no training data ({paths.counts}).")
            return result
        trained = self.train(f"round-{n}", policy, revisions, f"round-{n}/sft")
        return result.model_copy(update={"policy": trained.files["model"]})

    def expert_round(self, state: RoundState) -> RoundResult:
        """Explore the train tasks with the current model → each failed episode's bad prefix +
        revision turn + the expert's continuation, expert trajectories mixed in → SFT."""
        cfg, n = self.cfg, state.round
        explored = explore_stage(
            ExploreInputs(
                model_url=state.policy, env=cfg.env,
                task_ids=cfg.revisions.tasks_for_round(self.train_ids, n), prefix=self.prefix,
                inference=cfg.inference, temperature=cfg.revisions.temperature,
                max_steps=cfg.env.max_steps, seed=cfg.seed + n,
            ),
            self.out(f"round-{n}/explore", f"round-{n}"),
        )  # fmt: skip
        ratio = cfg.revisions.expert_sft_ratio
        revisions = expert_revisions_stage(
            ExpertRevisionsInputs(
                explored_urls=[explored.files["trajectories"]], env=cfg.env, prefix=self.prefix,
                seed=cfg.seed + n, expert_url=self.expert_url(state) if ratio else None,
                expert_sft_ratio=ratio,
            ),
            self.out(f"round-{n}/expert-revisions", f"round-{n}"),
        )  # fmt: skip
        result = RoundResult(notes=[expert_round_note(n, revisions)])
        if n == 1 and cfg.baselines:
            result.notes.append("baselines: not trained (they splice MCTS trees; source expert)")
        if revisions.counts["rows"] == 0:
            result.notes.append(f"round {n}: no training data ({revisions.counts}).")
            return result
        trained = self.train(f"round-{n}", state.policy, revisions, f"round-{n}/sft")
        return result.model_copy(update={"policy": trained.files["model"]})

    def expert_url(self, state: RoundState) -> str:
        """The expert trajectories round 0 carried; a campaign begun before round 0 carried
        them gets the (cached) stage's."""
        return state.carry.get("expert") or self.expert_trajectories().files["trajectories"]

    def splice(self, trees, paths, critiques: Manifest | None, mode: str, path: str) -> Manifest:
        """Training trajectories cut from the trees: revisions, or a baseline's data."""
        cfg = self.cfg
        inputs = SpliceInputs(
            env=cfg.env, trees_url=trees.files["trees"], pairs_url=paths.files["pairs"],
            good_url=paths.files["good"],
            critiques_url=critiques.files["critiques"] if critiques else None,
            prefix=self.prefix, mode=mode, include_good=cfg.paths.include_good_paths,
            seed=cfg.seed,
        )  # fmt: skip
        return splice_stage(inputs, self.out(path, f"{mode}-{path.split('/')[0]}"))

    def train(self, label: str, start_url: str, data: Manifest, path: str) -> Manifest:
        """Revision SFT from `start_url`, with a share eta of general instruction data mixed
        in (Agent-R)."""
        cfg, data_url = self.cfg, data.files["trajectories"]
        if cfg.general.enabled:
            mixed = mix_general_stage(
                MixGeneralInputs(
                    data_url=data_url,
                    general_url=cfg.general.url,
                    eta=cfg.general.eta,
                    seed=cfg.seed,
                ),
                self.out(f"{path}-data", label),
            )
            data_url = mixed.files["trajectories"]
        return self.sft(label, start_url, data_url, cfg.revision_sft, path)

    def baselines(self, start_url: str, trees: Manifest, paths: Manifest) -> RoundResult:
        """Direct-Revision and good-paths-only, trained from the start on round 1's trees."""
        result = RoundResult()
        for mode, label in [("direct", "direct-revision"), ("good", "good-paths-only")]:
            data = self.splice(trees, paths, None, mode, f"baselines/{label}/data")
            if data.counts["trajectories"] == 0:
                result.notes.append(f"{label}: no training data in round 1's trees; not trained.")
                continue
            model = self.train(label, start_url, data, f"baselines/{label}/sft")
            result.evaluations.append(self.evaluate(label, model.files["model"]))
        return result


def round_note(round_no: int, trees, paths, critiques, revisions) -> str:
    """One line for the report: what the round's trees and critique yielded."""
    t, c = trees.counts, critiques.metrics
    agreement = c.get("first_error_oracle_agreement")
    return (
        f"round {round_no}: {t['trees_with_solution']}/{t['trees']} trees reached a solution "
        f"({t['nodes']} nodes), {paths.counts['pairs']} pairs, first error found in "
        f"{critiques.counts['first_errors_found']}/{critiques.counts['pairs']}"
        + (f" (agrees with the oracle in {agreement:.0%})" if agreement is not None else "")
        + f", {revisions.counts['revisions']} revisions + {revisions.counts['good_paths']} good "
        f"paths trained on."
    )


def expert_round_note(round_no: int, revisions: Manifest) -> str:
    """One line for the report: what the round's failed episodes yielded."""
    c = revisions.counts
    return (
        f"round {round_no}: {c['failed']}/{c['episodes']} explored episodes failed, "
        f"{c['rows']} revisions with the expert's continuation (first error at step "
        f"{revisions.metrics['first_error_step_mean']:.1f} on average), skipped "
        f"{c['skipped_no_first_error']} without a first error and "
        f"{c['skipped_no_continuation'] + c['skipped_replay_mismatch']} without a continuation; "
        f"{c['expert_trajectories']} expert trajectories trained on beside them."
    )


@flow(name="agent-r", log_prints=True, flow_run_name=run_named(AgentRConfig))
def agent_r(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
) -> list[dict]:
    """All of Agent-R in one run. `config` (a mapping) or `config_file` (YAML), then
    `overrides` (`key=value`) on top."""
    return run_all_rounds(AgentR, config, config_file, overrides)


@flow(name="agent-r-campaign", log_prints=True, flow_run_name=run_named(AgentRConfig))
def agent_r_campaign(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
):
    """One more round of an Agent-R campaign per run (for schedules): round 0 is the SFT start,
    each later round searches with the last published policy; round 1 also trains the baselines.
    Ends cleanly, with nothing done, once rounds 0..`rounds` are published."""
    return run_next_round(AgentR, config, config_file, overrides)


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        agent_r, AgentRConfig, argv, prog="python -m flows.agent_r", campaign_flow=agent_r_campaign,
        description="Run Agent-R: SFT start, then MCTS → first-error critique → revision SFT "
        "rounds, with Direct-Revision and good-paths-only baselines.",
        example="rounds=2 mcts.iterations=4 paths.beta=0.3",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
