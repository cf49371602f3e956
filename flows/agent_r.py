"""Agent-R (Yuan et al., 2025): learn to revise from MCTS trees, round after round.

    python -m flows.agent_r --config configs/agent_r_textcraft.yaml [key=value ...]
    python -m flows.agent_r --campaign --config ...   # one more round of the campaign

Starting point: SFT on expert trajectories. A round: MCTS on the train tasks with the current
model → pairs of good and bad paths (alpha rising per round) → the model finds the first error of
each bad path → revision trajectories (bad prefix + revision turn + good continuation) → SFT of
the current model → evaluation. Baselines, trained from the starting point on round 1's trees:
Direct-Revision (whole bad path + revision + good path) and good paths only.

Each stage is a cached Prefect task that publishes a manifest; a re-run skips every finished
stage and resumes at the first one that did not finish.
"""

from __future__ import annotations

import sys

from prefect import flow

from envs import make_env
from flywheel.campaign import new_round, run_campaign
from flywheel.records import Campaign, Manifest
from flywheel.rollout import agent_prefix, task_list
from flywheel.runner import cli_main, recipe_config, run_tracked
from flywheel.settings import AgentRConfig, round_slice
from tasks.critique import critique_stage
from tasks.evaluate import evaluate_stage
from tasks.expert_data import expert_data_stage
from tasks.mcts import mcts_stage
from tasks.mix_general import mix_general_stage
from tasks.prepare_model import model_stage_url, prepare_model_stage
from tasks.report import report_stage
from tasks.select_paths import select_paths_stage
from tasks.sft import sft_stage
from tasks.splice import splice_stage


@flow(name="agent-r", log_prints=True)
def agent_r(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
) -> list[dict]:
    """All of Agent-R in one run. `config` (a mapping) or `config_file` (YAML), then
    `overrides` (`key=value`) on top."""
    return run_tracked(recipe_config(AgentRConfig, config, config_file, overrides), all_rounds)


@flow(name="agent-r-campaign", log_prints=True)
def agent_r_campaign(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
):
    """One more round of an Agent-R campaign per run (for schedules): round 0 is the SFT start,
    each later round searches with the last published policy; round 1 also trains the baselines.
    Ends cleanly, with nothing done, once rounds 0..`rounds` are published."""
    cfg = recipe_config(AgentRConfig, config, config_file, overrides)
    return run_campaign(cfg, "agent-r", next_round)


class AgentRRun:
    """Agent-R's stages bound to one run's settings, store and tracking."""

    def __init__(self, cfg: AgentRConfig, store, tracking):
        self.cfg, self.store, self.tracking = cfg, store, tracking
        self.run = store.url(cfg.run_name)
        env = make_env(cfg.env)
        self.env_name = env.name
        self.train_ids = task_list(env, "train", cfg.env, cfg.seed)
        self.test_ids = task_list(env, "test", cfg.env, cfg.seed)
        self.prefix = agent_prefix(env, [])  # trained models are prompted as they were trained

    def evaluate(self, label: str, model_url: str) -> tuple[str, Manifest]:
        cfg = self.cfg
        result = evaluate_stage(
            self.store.root, label, model_url, cfg.env, self.test_ids, self.prefix,
            cfg.inference, cfg.env.max_steps, f"{self.run}/evaluate/{label}", self.tracking,
        )  # fmt: skip
        return label, result

    def train(self, label: str, start_url: str, data: Manifest, out_url: str) -> Manifest:
        """Revision SFT, with a share eta of general instruction data mixed in (Agent-R)."""
        cfg = self.cfg
        if cfg.general.enabled:
            data = mix_general_stage(
                self.store.root, data.files["trajectories"], cfg.general, cfg.seed,
                f"{out_url}-data",
            )  # fmt: skip
        return sft_stage(
            self.store.root, label, start_url, data.files["trajectories"],
            cfg.revision_sft, cfg.seed, out_url, self.tracking,
        )  # fmt: skip

    def start(self) -> Manifest:
        """The starting point: SFT on expert trajectories."""
        cfg, store = self.cfg, self.store
        base = prepare_model_stage(
            store.root, cfg.model.base, model_stage_url(store, cfg.model.base)
        )
        expert = expert_data_stage(
            store.root, cfg.env, self.train_ids, self.prefix, f"{self.run}/expert", cfg.expert_file
        )
        return sft_stage(
            store.root, "expert", base.files["model"], expert.files["trajectories"], cfg.sft,
            cfg.seed, f"{self.run}/sft", self.tracking,
        )  # fmt: skip

    def round(self, round_no: int, policy_url: str):
        """MCTS → path pairs → first-error critique → revision splice → SFT. Returns the new
        policy's manifest (None when the round found nothing to train on), the round's note, and
        its trees and paths (the baselines train on round 1's)."""
        cfg, store = self.cfg, self.store
        round_url = f"{self.run}/round-{round_no}"
        trees = mcts_stage(
            store.root, policy_url, cfg.env,
            round_slice(self.train_ids, cfg.mcts.tasks_per_round, round_no), self.prefix,
            cfg.inference, cfg.mcts, cfg.seed + round_no, f"{round_url}/mcts",
        )  # fmt: skip
        paths = select_paths_stage(
            store.root, trees.files["trees"], cfg.paths.alpha_for(round_no), cfg.paths.beta,
            cfg.paths.max_pairs_per_task, cfg.paths.max_good_per_task, cfg.seed,
            f"{round_url}/paths",
        )  # fmt: skip
        critiques = critique_stage(
            store.root, policy_url, cfg.env, trees.files["trees"], paths.files["pairs"],
            cfg.inference, cfg.critique, f"{round_url}/critique",
        )  # fmt: skip
        revisions = splice_stage(
            store.root, cfg.env, trees.files["trees"], paths, critiques.files["critiques"],
            self.prefix, "revision", cfg.paths.include_good_paths, cfg.seed,
            f"{round_url}/revisions",
        )  # fmt: skip
        for stage, manifest in [("mcts", trees), ("paths", paths), ("critique", critiques)]:
            self.tracking.log_stage(f"{stage}/round-{round_no}", manifest)
        notes = [round_note(round_no, trees, paths, critiques, revisions)]
        if revisions.counts["trajectories"] == 0:
            notes.append(f"round {round_no}: no training data ({paths.counts}).")
            return None, notes, (trees, paths)
        policy = self.train(f"round-{round_no}", policy_url, revisions, f"{round_url}/sft")
        return policy, notes, (trees, paths)

    def baselines(self, start_url: str, trees: Manifest, paths: Manifest):
        """Direct-Revision and good-paths-only, trained from the start on round 1's trees."""
        cfg, evaluations, notes = self.cfg, [], []
        for mode, label in [("direct", "direct-revision"), ("good", "good-paths-only")]:
            data = splice_stage(
                self.store.root, cfg.env, trees.files["trees"], paths, None, self.prefix, mode,
                cfg.paths.include_good_paths, cfg.seed, f"{self.run}/baselines/{label}/data",
            )  # fmt: skip
            if data.counts["trajectories"] == 0:
                notes.append(f"{label}: no training data in round 1's trees; not trained.")
                continue
            model = self.train(label, start_url, data, f"{self.run}/baselines/{label}/sft")
            evaluations.append(self.evaluate(label, model.files["model"]))
        return evaluations, notes

    def report(self, evaluations, notes) -> str:
        title = f"Agent-R on {self.env_name}"
        return report_stage(self.store.root, self.run, title, evaluations, notes, self.tracking)


def all_rounds(cfg: AgentRConfig, store, tracking) -> list[dict]:
    agent = AgentRRun(cfg, store, tracking)
    start = agent.start()
    evaluations, notes = [agent.evaluate("sft", start.files["model"])], []
    policy_url, first_round = start.files["model"], None
    for round_no in range(1, cfg.rounds + 1):
        policy, round_notes, searched = agent.round(round_no, policy_url)
        notes += round_notes
        first_round = first_round or searched
        if policy is None:
            notes.append("rounds stopped: a round without training data leaves the policy as is.")
            print(notes[-2])
            break
        policy_url = policy.files["model"]
        evaluations.append(agent.evaluate(f"agent-r-round-{round_no}", policy_url))
    if cfg.baselines and first_round is not None:
        baseline_evaluations, baseline_notes = agent.baselines(start.files["model"], *first_round)
        evaluations += baseline_evaluations
        notes += baseline_notes
    print(agent.report(evaluations, notes))
    return [dict(stage=label, **m.metrics) for label, m in evaluations]


def next_round(cfg: AgentRConfig, store, tracking, campaign: Campaign) -> Campaign:
    """The campaign's next round: the SFT start first, then one Agent-R round."""
    agent = AgentRRun(cfg, store, tracking)
    round_no = len(campaign.rounds)
    if round_no == 0:
        start = agent.start()
        published = new_round(
            0, start.files["model"], [agent.evaluate("sft", start.files["model"])]
        )
    else:
        last_policy = campaign.rounds[-1].policy
        policy, notes, searched = agent.round(round_no, last_policy)
        evaluations = []
        if policy is not None:
            evaluations.append(agent.evaluate(f"agent-r-round-{round_no}", policy.files["model"]))
        if round_no == 1 and cfg.baselines:
            baseline_evaluations, baseline_notes = agent.baselines(
                campaign.rounds[0].policy, *searched
            )
            evaluations += baseline_evaluations
            notes += baseline_notes
        # A round without training data keeps the policy; the next round searches anew.
        new_policy = policy.files["model"] if policy is not None else last_policy
        published = new_round(round_no, new_policy, evaluations, notes)
    done = [*campaign.rounds, published]
    agent.report([e for r in done for e in r.evaluations], [n for r in done for n in r.notes])
    return campaign.model_copy(update={"rounds": done})


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


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        agent_r, AgentRConfig, argv, prog="python -m flows.agent_r", campaign_flow=agent_r_campaign,
        description="Run Agent-R: SFT start, then MCTS → first-error critique → revision SFT "
        "rounds, with Direct-Revision and good-paths-only baselines.",
        example="rounds=2 mcts.iterations=4 paths.beta=0.3",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
