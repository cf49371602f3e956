"""ETO (Song et al., 2024): SFT on expert trajectories, then rounds of explore → pairs → DPO.

    python -m flows.eto --config configs/eto_textcraft.yaml [key=value ...]

Each stage is a cached Prefect task that publishes a manifest; a re-run skips every finished
stage and resumes at the first one that did not finish.
"""

from __future__ import annotations

import sys

from prefect import flow, unmapped

from envs import make_env
from flywheel.records import Manifest
from flywheel.rollout import agent_prefix, few_shot_examples, task_list
from flywheel.runner import cli_main, run_tracked
from flywheel.settings import ETOConfig, load_config, validate_config
from tasks.build_pairs import build_pairs_stage
from tasks.dpo import dpo_stage
from tasks.evaluate import evaluate_stage
from tasks.expert_data import expert_data_stage
from tasks.explore import explore_stage, shard
from tasks.prepare_model import model_stage_url, prepare_model_stage
from tasks.report import report_stage
from tasks.sft import sft_stage


@flow(name="eto", log_prints=True)
def eto(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
) -> list[dict]:
    """`config` (a mapping) or `config_file` (YAML), then `overrides` (`key=value`) on top."""
    if config is not None:
        cfg: ETOConfig = validate_config(ETOConfig, config)
    else:
        cfg = load_config(ETOConfig, config_file, overrides or [])
    return run_tracked(cfg, run_rounds)


def run_rounds(cfg: ETOConfig, store, tracking) -> list[dict]:
    run = store.url(cfg.run_name)
    env = make_env(cfg.env)
    train_ids = task_list(env, "train", cfg.env, cfg.seed)
    test_ids = task_list(env, "test", cfg.env, cfg.seed)
    # Worked examples help the untrained model only; trained models are prompted as they were
    # trained, without them (with them, the SFT model solved 0 of 12 train tasks, without 4).
    untrained_prefix = agent_prefix(env, few_shot_examples(env, cfg.env.few_shot))
    prefix = agent_prefix(env, [])

    def evaluate(label: str, model: Manifest, prefix=prefix) -> tuple[str, Manifest]:
        result = evaluate_stage(
            store.root, label, model.files["model"], cfg.env, test_ids, prefix,
            cfg.inference, cfg.env.max_steps, f"{run}/evaluate/{label}", tracking,
        )  # fmt: skip
        return label, result

    base = prepare_model_stage(store.root, cfg.model.base, model_stage_url(store, cfg.model.base))
    expert = expert_data_stage(store.root, cfg.env, train_ids, prefix, f"{run}/expert")
    evaluations = [evaluate("untrained", base, untrained_prefix)]
    policy = sft_stage(
        store.root, "expert", base.files["model"], expert.files["trajectories"], cfg.sft,
        cfg.seed, f"{run}/sft", tracking,
    )  # fmt: skip
    evaluations.append(evaluate("sft", policy))
    notes = []
    for round_no in range(1, cfg.rounds + 1):
        round_url = f"{run}/round-{round_no}"
        shards = shard(train_ids, cfg.explore.shards, cfg.explore.samples_per_task)
        explored = explore_stage.map(
            store.root, policy.files["model"], unmapped(cfg.env), shards, unmapped(prefix),
            unmapped(cfg.inference), unmapped(cfg.explore), cfg.env.max_steps,
            [cfg.seed + round_no * 1000 + i for i in range(len(shards))],
            [f"{round_url}/explore/shard-{i}" for i in range(len(shards))],
        ).result()  # fmt: skip
        pairs = build_pairs_stage(
            store.root, [m.files["trajectories"] for m in explored],
            expert.files["trajectories"], f"{round_url}/pairs", cfg.dpo.rejected_extra_turns,
        )  # fmt: skip
        if pairs.counts["pairs"] == 0:
            notes.append(
                f"round {round_no}: no preference pairs ({pairs.counts}); stopped before DPO."
            )
            print(notes[-1])
            break
        policy = dpo_stage(
            store.root, f"round-{round_no}", policy.files["model"], pairs.files["pairs"],
            cfg.dpo, cfg.seed, f"{round_url}/dpo", tracking,
        )  # fmt: skip
        evaluations.append(evaluate(f"eto-round-{round_no}", policy))
    table = report_stage(store.root, run, f"ETO on {env.name}", evaluations, notes, tracking)
    print(table)
    return [dict(stage=label, **m.metrics) for label, m in evaluations]


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        eto, ETOConfig, argv, prog="python -m flows.eto",
        description="Run ETO: SFT on expert trajectories, then explore → pairs → DPO rounds.",
        example="rounds=1 env.test_tasks=20 dpo.beta=0.2",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
