"""Agent-R (Yuan et al., 2025): learn to revise from MCTS trees, round after round.

    python -m flows.agent_r --config configs/agent_r_textcraft.yaml [key=value ...]

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
from flywheel.records import Manifest
from flywheel.rollout import agent_prefix, task_list
from flywheel.runner import cli_main, recipe_config, run_tracked
from flywheel.settings import AgentRConfig
from tasks.critique import critique_stage
from tasks.evaluate import evaluate_stage
from tasks.expert_data import expert_data_stage
from tasks.mcts import mcts_stage
from tasks.prepare_model import model_stage_url, prepare_model_stage
from tasks.report import report_stage
from tasks.select_paths import select_paths_stage
from tasks.sft import sft_stage
from tasks.splice import splice_stage


@flow(name="agent-r", log_prints=True)
def agent_r(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
) -> list[dict]:
    """`config` (a mapping) or `config_file` (YAML), then `overrides` (`key=value`) on top."""
    return run_tracked(recipe_config(AgentRConfig, config, config_file, overrides), run_rounds)


def run_rounds(cfg: AgentRConfig, store, tracking) -> list[dict]:
    run = store.url(cfg.run_name)
    env = make_env(cfg.env)
    train_ids = task_list(env, "train", cfg.env, cfg.seed)
    test_ids = task_list(env, "test", cfg.env, cfg.seed)
    prefix = agent_prefix(env, [])  # trained models are prompted as they were trained

    def evaluate(label: str, model: Manifest) -> tuple[str, Manifest]:
        result = evaluate_stage(
            store.root, label, model.files["model"], cfg.env, test_ids, prefix,
            cfg.inference, cfg.env.max_steps, f"{run}/evaluate/{label}", tracking,
        )  # fmt: skip
        return label, result

    def train(label: str, start: Manifest, data: Manifest, out_url: str) -> Manifest:
        return sft_stage(
            store.root, label, start.files["model"], data.files["trajectories"],
            cfg.revision_sft, cfg.seed, out_url, tracking,
        )  # fmt: skip

    base = prepare_model_stage(store.root, cfg.model.base, model_stage_url(store, cfg.model.base))
    expert = expert_data_stage(store.root, cfg.env, train_ids, prefix, f"{run}/expert")
    start = sft_stage(
        store.root, "expert", base.files["model"], expert.files["trajectories"], cfg.sft,
        cfg.seed, f"{run}/sft", tracking,
    )  # fmt: skip
    evaluations, notes = [evaluate("sft", start)], []
    policy, first_round = start, None
    for round_no in range(1, cfg.rounds + 1):
        round_url = f"{run}/round-{round_no}"
        trees = mcts_stage(
            store.root, policy.files["model"], cfg.env, train_ids, prefix, cfg.inference,
            cfg.mcts, cfg.seed + round_no, f"{round_url}/mcts",
        )  # fmt: skip
        paths = select_paths_stage(
            store.root, trees.files["trees"], cfg.paths.alpha_for(round_no), cfg.paths.beta,
            cfg.paths.max_pairs_per_task, cfg.paths.max_good_per_task, cfg.seed,
            f"{round_url}/paths",
        )  # fmt: skip
        critiques = critique_stage(
            store.root, policy.files["model"], cfg.env, trees.files["trees"],
            paths.files["pairs"], cfg.inference, cfg.critique, f"{round_url}/critique",
        )  # fmt: skip
        revisions = splice_stage(
            store.root, cfg.env, trees.files["trees"], paths, critiques.files["critiques"],
            prefix, "revision", cfg.paths.include_good_paths, cfg.seed, f"{round_url}/revisions",
        )  # fmt: skip
        for stage, manifest in [("mcts", trees), ("paths", paths), ("critique", critiques)]:
            tracking.log_stage(f"{stage}/round-{round_no}", manifest)
        notes.append(round_note(round_no, trees, paths, critiques, revisions))
        if round_no == 1:
            first_round = (trees, paths)
        if revisions.counts["trajectories"] == 0:
            notes.append(f"round {round_no}: no training data ({paths.counts}); rounds stopped.")
            print(notes[-1])
            break
        policy = train(f"round-{round_no}", policy, revisions, f"{round_url}/sft")
        evaluations.append(evaluate(f"agent-r-round-{round_no}", policy))
    if cfg.baselines and first_round is not None:
        trees, paths = first_round
        for mode, label in [("direct", "direct-revision"), ("good", "good-paths-only")]:
            data = splice_stage(
                store.root, cfg.env, trees.files["trees"], paths, None, prefix, mode,
                cfg.paths.include_good_paths, cfg.seed, f"{run}/baselines/{label}/data",
            )  # fmt: skip
            if data.counts["trajectories"] == 0:
                notes.append(f"{label}: no training data in round 1's trees; not trained.")
                continue
            model = train(label, start, data, f"{run}/baselines/{label}/sft")
            evaluations.append(evaluate(label, model))
    table = report_stage(store.root, run, f"Agent-R on {env.name}", evaluations, notes, tracking)
    print(table)
    return [dict(stage=label, **m.metrics) for label, m in evaluations]


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
        agent_r, AgentRConfig, argv, prog="python -m flows.agent_r",
        description="Run Agent-R: SFT start, then MCTS → first-error critique → revision SFT "
        "rounds, with Direct-Revision and good-paths-only baselines.",
        example="rounds=2 mcts.iterations=4 paths.beta=0.3",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
