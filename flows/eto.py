"""ETO (Song et al., 2024): SFT on expert trajectories, then rounds of explore → pairs → DPO.

    python -m flows.eto --config configs/eto_textcraft.yaml [key=value ...]
    python -m flows.eto --campaign --config ...   # one more round of the campaign

`eto` runs every round; `eto-campaign` runs one more round per run (scheduled deployments),
continuing from the last round published in the artifact store.

Each stage is a cached Prefect task that publishes a manifest; a re-run skips every finished
stage and resumes at the first one that did not finish.
"""

from __future__ import annotations

import sys

from prefect import flow, unmapped

from envs import make_env
from flywheel.campaign import new_round, run_campaign
from flywheel.records import Campaign, Manifest
from flywheel.rollout import agent_prefix, few_shot_examples, task_list
from flywheel.runner import cli_main, recipe_config, run_tracked
from flywheel.settings import ETOConfig
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
    """All of ETO in one run. `config` (a mapping) or `config_file` (YAML), then `overrides`
    (`key=value`) on top."""
    return run_tracked(recipe_config(ETOConfig, config, config_file, overrides), all_rounds)


@flow(name="eto-campaign", log_prints=True)
def eto_campaign(
    config: dict | None = None, config_file: str | None = None, overrides: list[str] | None = None
):
    """One more round of an ETO campaign per run (for schedules): round 0 is SFT on expert
    trajectories, each later round explores from the last published policy. Ends cleanly, with
    nothing done, once rounds 0..`rounds` are published."""
    cfg = recipe_config(ETOConfig, config, config_file, overrides)
    return run_campaign(cfg, "eto", next_round)


class ETORun:
    """ETO's stages bound to one run's settings, store and tracking."""

    def __init__(self, cfg: ETOConfig, store, tracking):
        self.cfg, self.store, self.tracking = cfg, store, tracking
        self.run = store.url(cfg.run_name)
        env = make_env(cfg.env)
        self.env_name = env.name
        self.train_ids = task_list(env, "train", cfg.env, cfg.seed)
        self.test_ids = task_list(env, "test", cfg.env, cfg.seed)
        # Worked examples help the untrained model only; trained models are prompted as they were
        # trained, without them (with them, the SFT model solved 0 of 12 train tasks, without 4).
        self.untrained_prefix = agent_prefix(env, few_shot_examples(env, cfg.env.few_shot))
        self.prefix = agent_prefix(env, [])

    def evaluate(self, label: str, model_url: str, prefix=None) -> tuple[str, Manifest]:
        cfg = self.cfg
        result = evaluate_stage(
            self.store.root, label, model_url, cfg.env, self.test_ids, prefix or self.prefix,
            cfg.inference, cfg.env.max_steps, f"{self.run}/evaluate/{label}", self.tracking,
        )  # fmt: skip
        return label, result

    def start(self) -> tuple[Manifest, Manifest, list[tuple[str, Manifest]]]:
        """Expert trajectories and the SFT policy, with the untrained and SFT evaluations."""
        cfg, store = self.cfg, self.store
        base = prepare_model_stage(
            store.root, cfg.model.base, model_stage_url(store, cfg.model.base)
        )
        expert = expert_data_stage(
            store.root, cfg.env, self.train_ids, self.prefix, f"{self.run}/expert", cfg.expert_file
        )
        untrained = self.evaluate("untrained", base.files["model"], self.untrained_prefix)
        policy = sft_stage(
            store.root, "expert", base.files["model"], expert.files["trajectories"], cfg.sft,
            cfg.seed, f"{self.run}/sft", self.tracking,
        )  # fmt: skip
        return expert, policy, [untrained, self.evaluate("sft", policy.files["model"])]

    def round(self, round_no: int, policy_url: str, expert_url: str) -> Manifest | str:
        """Explore with the policy → failure/success pairs → DPO: the new policy's manifest, or
        why there is none."""
        cfg, store = self.cfg, self.store
        round_url = f"{self.run}/round-{round_no}"
        explored_ids = cfg.explore.tasks_for_round(self.train_ids, round_no)
        shards = shard(explored_ids, cfg.explore.shards, cfg.explore.samples_per_task)
        explored = explore_stage.map(
            store.root, policy_url, unmapped(cfg.env), shards, unmapped(self.prefix),
            unmapped(cfg.inference), unmapped(cfg.explore), cfg.env.max_steps,
            [cfg.seed + round_no * 1000 + i for i in range(len(shards))],
            [f"{round_url}/explore/shard-{i}" for i in range(len(shards))],
        ).result()  # fmt: skip
        pairs = build_pairs_stage(
            store.root, [m.files["trajectories"] for m in explored], expert_url,
            f"{round_url}/pairs", cfg.dpo.rejected_extra_turns,
        )  # fmt: skip
        if pairs.counts["pairs"] == 0:
            return f"round {round_no}: no preference pairs ({pairs.counts}); stopped before DPO."
        return dpo_stage(
            store.root, f"round-{round_no}", policy_url, pairs.files["pairs"],
            cfg.dpo.for_round(round_no), cfg.seed, f"{round_url}/dpo", self.tracking,
        )  # fmt: skip

    def report(self, evaluations, notes) -> str:
        title = f"ETO on {self.env_name}"
        return report_stage(self.store.root, self.run, title, evaluations, notes, self.tracking)


def all_rounds(cfg: ETOConfig, store, tracking) -> list[dict]:
    eto_run = ETORun(cfg, store, tracking)
    expert, policy, evaluations = eto_run.start()
    notes = []
    for round_no in range(1, cfg.rounds + 1):
        trained = eto_run.round(round_no, policy.files["model"], expert.files["trajectories"])
        if isinstance(trained, str):
            notes.append(trained)
            print(trained)
            break
        policy = trained
        evaluations.append(eto_run.evaluate(f"eto-round-{round_no}", policy.files["model"]))
    print(eto_run.report(evaluations, notes))
    return [dict(stage=label, **m.metrics) for label, m in evaluations]


def next_round(cfg: ETOConfig, store, tracking, campaign: Campaign) -> Campaign:
    """The campaign's next round: the starting point first, then one ETO round."""
    eto_run = ETORun(cfg, store, tracking)
    round_no = len(campaign.rounds)
    if round_no == 0:
        expert, policy, evaluations = eto_run.start()
        campaign = campaign.model_copy(update={"expert": expert.files["trajectories"]})
        published = new_round(0, policy.files["model"], evaluations)
    else:
        policy_url = campaign.rounds[-1].policy
        trained = eto_run.round(round_no, policy_url, campaign.expert)
        if isinstance(trained, str):  # the policy stays; the next round explores anew
            published = new_round(round_no, policy_url, [], [trained])
        else:
            label = f"eto-round-{round_no}"
            evaluation = eto_run.evaluate(label, trained.files["model"])
            published = new_round(round_no, trained.files["model"], [evaluation])
    done = [*campaign.rounds, published]
    eto_run.report([e for r in done for e in r.evaluations], [n for r in done for n in r.notes])
    return campaign.model_copy(update={"rounds": done})


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        eto, ETOConfig, argv, prog="python -m flows.eto", campaign_flow=eto_campaign,
        description="Run ETO: SFT on expert trajectories, then explore → pairs → DPO rounds.",
        example="rounds=1 env.test_tasks=20 dpo.beta=0.2",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
