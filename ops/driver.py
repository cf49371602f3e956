"""The round driver: how every recipe is run, round after round or one round per campaign run.

A recipe (flows/) is a `Recipe` subclass with two methods: `start()`, round 0 (the starting
policy, e.g. SFT on expert trajectories), and `round(state)`, one iteration of its algorithm from
the current policy. The driver does the rest the same way for every recipe: it runs the rounds,
evaluates each new policy on the test tasks, stops when a round trained nothing, keeps a
campaign's state between scheduled runs, and writes the report.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field

from agents.rollout import agent_prefix
from envs import make_env
from envs.task_selection import task_list
from flywheel.records import Campaign, CampaignRound, Manifest
from flywheel.settings import TrainerSettings
from flywheel.stage import StageOutput
from ops.campaign import new_round, run_campaign
from ops.runner import recipe_config, run_tracked
from tasks.evaluate import (
    EvaluateInputs,
    evaluate_stage,
    evaluation_splits,
    harder_tasks,
    variant_inputs,
    variant_label,
)
from tasks.expert_data import ExpertDataInputs, expert_data_stage
from tasks.prepare_model import model_stage_url, prepare_model_inputs, prepare_model_stage
from tasks.report import report_stage
from tasks.sft import SFTInputs, sft_stage

# The seed that samples a run's test tasks (`env.test_tasks` of a larger split): one for every
# run seed, so that the seeds of a bench evaluate the same tasks and pair task by task. The train
# tasks stay the run seed's sample; the validation split is seeded apart already. 0 keeps the
# test lists that runs of seed 0 were measured on.
HELD_OUT_SEED = 0


def run_task_lists(env, env_settings, seed: int) -> dict[str, list[str]]:
    """A run's task lists by split: "train" (its seed's sample), and the held-out "validation"
    (when set) and "test" (`HELD_OUT_SEED`'s sample, the same for every seed). The recipes, the
    efficacy bench and the tests all take them from here."""
    return {
        "train": task_list(env, "train", env_settings, seed),
        **evaluation_splits(env, env_settings, HELD_OUT_SEED),
    }


def harder_step_budget(env_settings, longest: int) -> int:
    """Steps an episode on a harder goal (plans up to `longest` steps) may take: its longest plan
    plus the slack the trained goals have (`env.max_steps` past `env.max_expert_steps`). At the
    trained `env.max_steps` a goal of more steps than that could not be reached at all, and the
    harder table would count it as a failure of the policy."""
    slack = max(env_settings.max_steps - (env_settings.max_expert_steps or 0), 0)
    return max(env_settings.max_steps, longest + slack)


class RoundResult(BaseModel):
    """What round 0 (`Recipe.start`) or a later round (`Recipe.round`) produced."""

    # The new policy's model URL; None when the round had nothing to train on (the policy stays,
    # and a run of all rounds stops there).
    policy: str | None = None
    # Evaluations the recipe ran itself (the untrained model, baselines); the driver evaluates
    # the new policy.
    evaluations: list[tuple[str, Manifest]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    # URLs that later rounds read (ETO: the expert trajectories), kept in a campaign's state.
    carry: dict[str, str] = Field(default_factory=dict)


class RoundState(BaseModel):
    """Where round `round` starts: the current policy, round 0's policy, and what start carried."""

    round: int
    policy: str
    start_policy: str
    carry: dict[str, str] = Field(default_factory=dict)


class Recipe:
    """A recipe bound to one run: its settings, store and MLflow run, the environment's train
    and test tasks, and the prompt prefix trained models are prompted with (as they were
    trained: without worked examples). Subclasses set `name`, `title`, `config_class` and write
    `start` and `round`."""

    name: ClassVar[str]  # "eto": the campaign's recipe, evaluation labels ("eto-round-1")
    title: ClassVar[str]  # "ETO": the report's title
    config_class: ClassVar[type[BaseModel]]
    # The evaluation round 0's policy started from, which the report compares it with.
    lineage_start: ClassVar[str] = "untrained"
    # Evaluations of policies trained off the line of rounds -> the evaluation of their start.
    branches: ClassVar[dict[str, str]] = {}
    # The variants' evaluations (`evaluate`) not yet handed to a round (`take_variants`);
    # replaced, never mutated, so the class's empty default is never shared.
    pending_variants: tuple[tuple[str, Manifest], ...] = ()

    def __init__(self, cfg, store, tracking):
        self.cfg, self.store, self.tracking = cfg, store, tracking
        self.run_url = store.url(cfg.run_name)
        self.env = make_env(cfg.env)
        # The held-out task lists; every policy is evaluated on `evaluate.split`'s.
        self.splits = run_task_lists(self.env, cfg.env, cfg.seed)
        self.train_ids = self.splits.pop("train")
        self.evaluation_ids = self.splits[cfg.evaluate.split]
        longest = cfg.evaluate.harder_max_expert_steps
        self.harder_ids = harder_tasks(self.env, cfg.env, longest) if longest else None
        if self.harder_ids:
            self.splits["harder"] = self.harder_ids
        self.prefix = agent_prefix(self.env, [])

    def start(self) -> RoundResult:
        raise NotImplementedError

    def round(self, state: RoundState) -> RoundResult:
        raise NotImplementedError

    def out(self, path: str, label: str = "") -> StageOutput:
        """Where a stage of this run writes (`path` inside the run's folder) and reports."""
        return StageOutput(
            store_url=self.store.root, url=f"{self.run_url}/{path}", label=label,
            tracking=self.tracking,
        )  # fmt: skip

    def evaluate(
        self, label: str, model_url: str, prefix=None, sampled: bool = True
    ) -> tuple[str, Manifest]:
        """The model's greedy episodes on the held-out tasks, a row `label` of the report. The
        variants `evaluate` asks for (sampled episodes, harder goals) run too; the driver adds
        them to the round's evaluations (`take_variants`), so recipes name only the greedy one.
        `sampled=False` leaves out the sampled variants (the untrained model's: at temperature
        1.0 it writes every reply to `max_tokens`, so its sampled episodes cost more than every
        trained stage's together, to show a rate its greedy row already puts near 0)."""
        inputs = EvaluateInputs(
            model_url=model_url, env=self.cfg.env, task_ids=self.evaluation_ids,
            prefix=prefix or self.prefix, inference=self.cfg.inference,
            max_steps=self.cfg.env.max_steps,
        )  # fmt: skip
        folder = self.cfg.evaluate.folder  # a split's own: its training stages serve either
        greedy = evaluate_stage(inputs, self.out(f"{folder}/{label}", label))
        settings = self.cfg.evaluate
        for variant in settings.variants():
            if not sampled and variant.endswith("sampled"):
                continue
            named = variant_label(label, variant)
            varied = variant_inputs(inputs, variant, settings, self.harder_ids, self.cfg.seed)
            if variant.startswith("harder"):
                # The episodes' step budget is the driver's, as for the greedy evaluation.
                steps = harder_step_budget(self.cfg.env, settings.harder_max_expert_steps)
                varied = varied.model_copy(update={"max_steps": steps})
            out = self.out(f"{folder}-{variant}/{label}", named)
            self.pending_variants += ((named, evaluate_stage(varied, out)),)
        return label, greedy

    def take_variants(self) -> list[tuple[str, Manifest]]:
        """The variants' evaluations run since the last call."""
        taken, self.pending_variants = list(self.pending_variants), ()
        return taken

    def base_model(self) -> Manifest:
        """The base model as a folder in the store (`<store>/models/<name>`, shared by runs)."""
        base = self.cfg.model.base
        out = StageOutput(
            store_url=self.store.root, url=model_stage_url(self.store, base), label=base,
            tracking=self.tracking,
        )  # fmt: skip
        return prepare_model_stage(prepare_model_inputs(self.cfg.model), out)

    def expert_trajectories(self) -> Manifest:
        """The expert's trajectories on the train tasks (or those of `expert_file`)."""
        inputs = ExpertDataInputs(
            env=self.cfg.env, task_ids=self.train_ids, prefix=self.prefix,
            expert_file=self.cfg.expert_file,
        )  # fmt: skip
        return expert_data_stage(inputs, self.out("expert"))

    def sft(self, label: str, model_url: str, data_url: str, settings, path: str) -> Manifest:
        """SFT of `model_url` on the trajectories at `data_url` (their `loss` turns)."""
        inputs = SFTInputs(
            model_url=model_url, data_url=data_url, settings=settings, seed=self.cfg.seed
        )
        return sft_stage(inputs, self.out(path, label))

    def log_curve(self, metrics: dict[str, float], round_no: int, prefix: str) -> None:
        """`metrics` on the flow's own MLflow run at step `round_no`: one curve per metric over
        the rounds (`prefix/name`), beside each stage's own run."""
        if self.tracking is not None:
            named = {f"{prefix}/{k}": v for k, v in metrics.items()}
            self.tracking.tracker().log_metrics(self.tracking.parent_run_id, named, round_no)

    def policy_label(self, round_no: int) -> str:
        return "sft" if round_no == 0 else f"{self.name}-round-{round_no}"

    def report(self, evaluations: list[tuple[str, Manifest]], notes: list[str]) -> str:
        return report_stage(
            store_url=self.store.root, run_url=self.run_url,
            title=f"{self.title} on {self.env.name}", evaluations=evaluations, notes=notes,
            tracking=self.tracking, lineage=self.lineage(), branches=self.branches,
            evaluated_split=self.cfg.evaluate.split, splits=self.splits,
            header=precision_line(self.cfg),
        )  # fmt: skip

    def lineage(self) -> list[str]:
        """The policies' evaluations in training order, each trained from the one before."""
        rounds = range(self.cfg.rounds + 1)
        return [self.lineage_start, *(self.policy_label(n) for n in rounds)]


def precision_line(cfg) -> str:
    """The number formats the run computed in, as its settings resolved them on this machine
    (flywheel/precision.py): the engine's, then each trainer's."""
    trainers = {
        name: value.precision
        for name in type(cfg).model_fields
        if isinstance(value := getattr(cfg, name), TrainerSettings)
    }
    listed = ", ".join(f"{name} {precision}" for name, precision in trainers.items())
    return f"Precision: inference {cfg.inference.precision}; trainers: {listed}."


def evaluated(recipe: Recipe, round_no: int, result: RoundResult) -> RoundResult:
    """`result` with its new policy's evaluation added, and every variant evaluation the round
    ran (of the new policy, and of what the recipe evaluated itself)."""
    evaluations = list(result.evaluations)
    if result.policy is not None:
        evaluation = recipe.evaluate(recipe.policy_label(round_no), result.policy)
        recipe.log_curve(evaluation[1].metrics, round_no, "evaluate")
        evaluations.append(evaluation)
    evaluations += recipe.take_variants()
    return result.model_copy(update={"evaluations": evaluations})


STOPPED = "rounds stopped: a round that trained nothing leaves the policy as it was."


def all_rounds(cfg, store, tracking, recipe_class: type[Recipe]) -> list[dict]:
    """Round 0, then rounds 1..`cfg.rounds`, stopping after a round that trained nothing."""
    recipe = recipe_class(cfg, store, tracking)
    start = evaluated(recipe, 0, recipe.start())
    done, policy = [start], start.policy
    for round_no in range(1, cfg.rounds + 1):
        state = RoundState(
            round=round_no, policy=policy, start_policy=start.policy, carry=start.carry
        )
        result = evaluated(recipe, round_no, recipe.round(state))
        done.append(result)
        if result.policy is None:
            print("\n".join(result.notes))
            done.append(RoundResult(notes=[STOPPED]))
            break
        policy = result.policy
    print(report(recipe, done))
    return [dict(stage=label, **m.metrics) for r in done for label, m in r.evaluations]


def next_round(cfg, store, tracking, campaign: Campaign, recipe_class: type[Recipe]) -> Campaign:
    """The campaign's next round (round 0 first), evaluated, reported with all earlier ones."""
    recipe = recipe_class(cfg, store, tracking)
    round_no = len(campaign.rounds)
    if round_no == 0:
        result = evaluated(recipe, 0, recipe.start())
        campaign = campaign.model_copy(update={"carry": result.carry})
    else:
        last, first = campaign.rounds[-1].policy, campaign.rounds[0].policy
        state = RoundState(round=round_no, policy=last, start_policy=first, carry=campaign.carry)
        result = evaluated(recipe, round_no, recipe.round(state))
    # A round that trained nothing keeps the policy; the campaign's next round tries again.
    policy = result.policy or campaign.rounds[-1].policy
    done = [*campaign.rounds, new_round(round_no, policy, result.evaluations, result.notes)]
    report(recipe, done)
    return campaign.model_copy(update={"rounds": done})


def report(recipe: Recipe, rounds: list[RoundResult] | list[CampaignRound]) -> str:
    """The results table of every round's evaluations, with every round's notes."""
    evaluations = [e for r in rounds for e in r.evaluations]
    return recipe.report(evaluations, [note for r in rounds for note in r.notes])


def run_all_rounds(recipe_class: type[Recipe], config, config_file, overrides) -> list[dict]:
    """A recipe flow's body: all rounds in one tracked run. `config` (a mapping) or
    `config_file` (YAML), then `overrides` (`key=value`) on top."""
    cfg = recipe_config(recipe_class.config_class, config, config_file, overrides)
    return run_tracked(cfg, all_rounds, recipe_class)


def run_next_round(recipe_class: type[Recipe], config, config_file, overrides):
    """A recipe's campaign flow's body: one more round, under the campaign's slot."""
    cfg = recipe_config(recipe_class.config_class, config, config_file, overrides)
    return run_campaign(cfg, recipe_class.name, next_round, recipe_class)
