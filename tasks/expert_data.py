"""Stage: expert trajectories on the train tasks, in the agent's own chat format.

They come from the environment's expert (TextCraft: a solver over the listed recipes) or from a
published file in ETO's SFT or AgentGym's AgentTraj format (`expert_file`, a URL so the cache
keys on its content); the manifest counts what the file held, what was imported, which ids were
mapped and what was dropped and why (agents/trajectory_import.py).
"""

from __future__ import annotations

from pydantic import BaseModel
from tqdm import tqdm

from agents.episode_metrics import recovery_counts
from agents.eto_format import write_eto_sft
from agents.rollout import expert_trajectory
from agents.trajectory_import import import_trajectories, recording_notes, task_goal_reader
from envs import make_env
from flywheel.records import Message, Trajectory
from flywheel.settings import EnvSettings
from flywheel.stage import StageResult, StageRun, stage


def collect_expert(
    env, task_ids: list[str], prefix: list[Message]
) -> tuple[list[Trajectory], list[str]]:
    """Expert trajectories for the tasks it solves, and the ids of those it does not."""
    solved, unsolved = [], []
    for task_id in tqdm(task_ids, desc="expert trajectories", unit="task"):
        trajectory = expert_trajectory(env, task_id, prefix)
        (solved.append(trajectory) if trajectory else unsolved.append(task_id))
    return solved, unsolved


def import_summary(expert_file: str, counts: dict[str, int], notes: list[str]) -> str:
    """What an expert file gave, for the console (the manifest holds the same counts)."""
    head = (
        f"expert file {expert_file}: read {counts['imported_read']}, imported "
        f"{counts['imported']} ({counts['imported_mapped']} with ids mapped), dropped "
        f"{counts['imported_dropped']}"
    )
    return "\n".join([head, *(f"  {note}" for note in notes)])


class ExpertDataInputs(BaseModel):
    """The train tasks to collect expert trajectories for, in the agent's chat format."""

    env: EnvSettings
    task_ids: list[str]
    prefix: list[Message]
    expert_file: str | None = None  # a published file instead of the environment's expert


@stage("expert-trajectories")
def expert_data_stage(inputs: ExpertDataInputs, run: StageRun) -> StageResult:
    store, env, task_ids, prefix = run.store, inputs.env, inputs.task_ids, inputs.prefix
    counts, notes = {}, []
    if inputs.expert_file:
        items = store.read_json(inputs.expert_file)
        goal_of = task_goal_reader(env)  # AgentGym's TextCraft items are matched by goal
        trajectories, imported = import_trajectories(items, env.name, prefix, task_ids, goal_of)
        unsolved = sorted(set(task_ids) - {t.task_id for t in trajectories})
        counts = imported.counts()
        notes = recording_notes(items, env.name, env.scienceworld.simplification)
        notes += imported.notes()
        print(import_summary(inputs.expert_file, counts, notes))
    else:
        trajectories, unsolved = collect_expert(make_env(env), task_ids, prefix)
        counts = recovery_counts(trajectories)  # the expert's episodes may move servers too
    url = store.write_records(run.file("expert.jsonl"), trajectories)
    eto_url = store.write_json(run.file("eto_sft.json"), write_eto_sft(trajectories))
    if unsolved:
        notes.append(f"no expert trajectory for: {', '.join(unsolved)}")
    return StageResult(
        files={"trajectories": url, "eto_sft": eto_url},
        counts={"trajectories": len(trajectories), "unsolved": len(unsolved), **counts},
        notes=notes,
    )
