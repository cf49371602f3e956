"""Which tasks of a split a run uses: those within the expert's step limit, then a seeded sample."""

from __future__ import annotations

import random

from envs.base import Environment


def within_expert_steps(env: Environment, task_ids: list[str], limit: int | None) -> list[str]:
    """The tasks the environment's expert solves in at most `limit` steps (all when None)."""
    if limit is None:
        return list(task_ids)
    return [t for t in task_ids if len(env.expert_plan(t) or ()) in range(1, limit + 1)]


def select_tasks(task_ids: list[str], limit: int | None, seed: int) -> list[str]:
    """A seeded sample of `limit` tasks (all when None), in the split's own order."""
    if limit is None or limit >= len(task_ids):
        return list(task_ids)
    chosen = set(random.Random(seed).sample(task_ids, limit))
    return [t for t in task_ids if t in chosen]


def task_list(env: Environment, split, env_settings, seed: int) -> list[str]:
    """The split's tasks a run uses: within `max_expert_steps`, then a seeded sample."""
    from flywheel.config_files import ConfigError

    limit = env_settings.train_tasks if split == "train" else env_settings.test_tasks
    eligible = within_expert_steps(env, env.task_ids(split), env_settings.max_expert_steps)
    if not env.task_ids(split):
        raise ConfigError(f"{env.name} has no {split} tasks: no run can use it")
    if not eligible:
        shortest = min(len(env.expert_plan(t) or ()) for t in env.task_ids(split))
        raise ConfigError(
            f"env.max_expert_steps={env_settings.max_expert_steps} leaves no {split} task of "
            f"{env.name}; its shortest expert plan has {shortest} steps"
        )
    if limit is not None and limit > len(eligible):  # never run fewer tasks than asked, silently
        within = (
            f" within env.max_expert_steps={env_settings.max_expert_steps}"
            if env_settings.max_expert_steps is not None
            else ""
        )
        raise ConfigError(
            f"env.{split}_tasks={limit}: the {split} split of {env.name} holds {len(eligible)} "
            f"tasks{within}; ask for at most {len(eligible)}, or leave env.{split}_tasks unset "
            "for all of them"
        )
    return select_tasks(eligible, limit, seed)
