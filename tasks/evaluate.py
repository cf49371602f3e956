"""Stage: greedy episodes of a model on the held-out test tasks; success rate and reward."""

from __future__ import annotations

from flywheel.inference import SamplingSettings
from flywheel.records import Manifest, Message
from flywheel.rollout import rollout_to_store
from flywheel.settings import EnvSettings, InferenceSettings
from flywheel.stage import TrackingRef, stage_task, store_for


@stage_task("evaluate")
def evaluate_stage(
    store_url: str,
    label: str,
    model_url: str,
    env: EnvSettings,
    task_ids: list[str],
    prefix: list[Message],
    inference: InferenceSettings,
    max_steps: int,
    out_url: str,
    tracking: TrackingRef | None = None,
) -> Manifest:
    sampling = SamplingSettings(temperature=0.0, max_tokens=inference.max_tokens)
    manifest = rollout_to_store(
        store_for(store_url), "evaluate", model_url, env, task_ids, prefix,
        inference, max_steps, sampling, out_url,
    )  # fmt: skip
    if tracking:
        tracker, run_id = tracking.stage_run(f"evaluate/{label}")
        tracker.log_metrics(run_id, manifest.metrics)
        tracker.log_params(run_id, {"model_url": model_url, "episodes": len(task_ids)})
        tracker.finish(run_id)
    return manifest
