"""The body the explore, sample and evaluate stages share: play a model on tasks and store the
episodes, failing (instead of publishing) when episodes were lost to unreachable servers."""

from __future__ import annotations

import time

from agents.episode_metrics import (
    ending_counts,
    episode_metric_means,
    generated_tokens,
    mixed_outcome_share,
    reward_groups,
    zero_variance_share,
)
from agents.rollout import RolloutSettings, run_batched
from flywheel.chat import ChatTokenizer
from flywheel.inference import InferenceBackend, SamplingSettings, open_backend
from flywheel.records import EpisodeStats, Message, Trajectory
from flywheel.settings import EnvSettings
from flywheel.stage import StageResult
from flywheel.storage import ArtifactStore


def rollout_to_store(
    store: ArtifactStore,
    stage: str,
    model_url: str,
    env_settings: EnvSettings,
    task_ids: list[str],
    prefix: list[Message],
    inference,
    max_steps: int,
    sampling: SamplingSettings,
    trajectories_url: str,
    samples_per_task: int = 1,
) -> StageResult:
    """Roll the model out on `task_ids`, store the trajectories, and return their statistics
    (the evaluate and explore stages publish them)."""
    from transformers import AutoTokenizer

    from envs import make_env

    model_dir = str(store.local_dir(model_url))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    settings = RolloutSettings(max_steps, inference.max_model_len, sampling)
    env = make_env(env_settings)
    env.check()
    backend = open_backend(inference, model_dir, chat.tokenizer, sampling.temperature > 0)
    started = time.perf_counter()
    trajectories = run_batched(
        env, task_ids, backend, chat, prefix, settings, samples_per_task=samples_per_task
    )
    seconds = time.perf_counter() - started
    url = store.write_records(trajectories_url, trajectories)
    raise_if_lost(trajectories, url)
    endings = ending_counts(trajectories)
    if endings["retried"]:
        moved = sorted({t.task_id for t in trajectories if t.recoveries})
        print(f"{stage}: {endings['retried']} episodes moved to another environment server "
              f"({', '.join(moved)})")  # fmt: skip
    stats = EpisodeStats.of(trajectories)
    generated = sum(generated_tokens(t) for t in trajectories)
    groups = reward_groups(trajectories)
    group_metrics = (
        {
            "zero_variance_groups": zero_variance_share(groups),
            "mixed_outcome_groups": mixed_outcome_share(trajectories),
        }
        if groups
        else {}
    )
    return StageResult(
        files={"trajectories": url},
        counts={"episodes": stats.episodes, "successes": stats.successes, **endings},
        metrics={
            "success_rate": stats.success_rate,
            "average_reward": stats.average_reward,
            "average_steps": stats.average_steps,
            "generated_tokens_per_episode": generated / len(trajectories) if trajectories else 0,
            **episode_metric_means(trajectories),
            **group_metrics,
            "seconds": seconds,
            "generated_tokens_per_s": generated / seconds if seconds else 0.0,
            "deterministic_sampling": float(promises_determinism(backend)),
        },
        notes=determinism_notes(backend),
    )


def promises_determinism(backend: InferenceBackend) -> bool:
    """Whether the backend says a re-run samples the same episodes; one that does not say
    (a test's scripted backend, a new one) is taken to promise nothing."""
    return bool(getattr(backend, "deterministic_sampling", False))


def determinism_notes(backend: InferenceBackend) -> list[str]:
    """What a manifest says when the backend cannot promise the same episodes on a re-run."""
    if promises_determinism(backend):
        return []
    return [
        f"{type(backend).__name__} does not promise reproducible samples: every request carries "
        "its seed, but the engine's kernels or the server's batching can change its numbers, so a "
        "re-run may sample different episodes (docs/determinism.md)."
    ]


class EpisodesLost(ConnectionError):  # transient: a stage retries it (flywheel.stage)
    """Some episodes could not be played to an end because their environment was unreachable."""


def raise_if_lost(trajectories: list[Trajectory], url: str) -> None:
    """A stage with lost episodes fails instead of publishing: a lost episode is not the agent's
    failure, and a re-run (servers back) plays the stage again instead of reusing it."""
    lost = [t for t in trajectories if t.finish_reason.startswith("lost")]
    if lost:
        raise EpisodesLost(
            f"{len(lost)} of {len(trajectories)} episodes were lost: no environment server could "
            f"play them (first: task {lost[0].task_id}: {lost[0].finish_reason}). All episodes, "
            f"with their reasons, are in {url}. Bring the servers back (env.servers) and re-run."
        )
