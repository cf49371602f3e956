"""The settings every recipe has (`RecipeConfig`): what the driver and the runner read.

A recipe's own config subclasses it in the recipe's flow file (`flows/eto.py:ETOConfig`, ...),
adding its stages' sections. It lives here, not in the core, because `ops/` is what reads these
fields (the store, tracking, task runner, lock, rounds and seed); the sections it is made of
(model, env, inference, evaluate, sft) are shared settings and stay in `flywheel/settings.py`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from flywheel.settings import (
    EnvSettings,
    EvaluateSettings,
    InferenceSettings,
    ModelSettings,
    SFTSettings,
    Strict,
)


class RecipeConfig(Strict):
    """What every recipe run has: where it stores and tracks, its model, environment, inference."""

    run_name: str = "flywheel"
    """the run's folder in the store, its lock and its MLflow runs' names"""
    storage_url: str = "runs"
    """local folder or any fsspec URL (s3://bucket/prefix)"""
    mlflow_tracking_uri: str = Field(
        default_factory=lambda: os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    )
    """MLflow's own MLFLOW_TRACKING_URI when set (a tracking server), else a local sqlite file."""
    mlflow_experiment: str = "flywheel"
    """MLflow experiment the runs are logged under"""
    task_runner: Literal["threads", "dask", "ray"] = "threads"
    """Where stages run: threads in the flow's process, or Dask / Ray worker processes."""
    task_runner_address: str | None = None
    """A running cluster for dask/ray (`tcp://scheduler:8786`, `ray://head:10001`); unset starts a
    local cluster of worker processes on this machine.
    """
    rounds: int = Field(default=2, ge=0)
    """rounds after round 0 (the starting policy)"""
    seed: int = 0
    """seeds task order, sampling and training"""
    break_lock: bool = False
    """Take the run's lock (ops/run_lock.py) even from a holder that looks alive: for a run whose
    process is gone but whose lock has not gone stale yet (`--break-lock`).
    """
    model: ModelSettings = Field(default_factory=ModelSettings)
    env: EnvSettings = Field(default_factory=EnvSettings)
    inference: InferenceSettings = Field(default_factory=InferenceSettings)
    evaluate: EvaluateSettings = Field(default_factory=EvaluateSettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    """SFT on expert trajectories"""
    expert_file: str | None = None
    """Expert trajectories to start from instead of the environment's expert: a published file in
    ETO's SFT or AgentGym's AgentTraj format (agents/trajectory_import.py). A plain path becomes
    a file:// URL, so the expert stage's cache keys on the file's content.
    """

    @model_validator(mode="after")
    def _validation_split_exists(self):
        if self.evaluate.split == "validation" and not self.env.validation_tasks:
            raise ValueError(
                "evaluate.split=validation needs a validation split: set env.validation_tasks"
            )
        return self

    @model_validator(mode="after")
    def _harder_goals_defined(self):
        harder, trained = self.evaluate.harder_max_expert_steps, self.env.max_expert_steps
        if harder is None:
            return self
        if trained is None:
            raise ValueError(
                "evaluate.harder_max_expert_steps needs env.max_expert_steps: harder goals are "
                "those longer than the trained difficulty, and with it unset every goal is trained"
            )
        if harder <= trained:
            raise ValueError(
                f"evaluate.harder_max_expert_steps={harder} must exceed env.max_expert_steps="
                f"{trained}: harder goals are the test tasks whose expert plan is longer"
            )
        if self.evaluate.split != "test":
            raise ValueError(
                "evaluate.harder_max_expert_steps reads harder goals from the test split: leave "
                "it unset while tuning on evaluate.split=validation"
            )
        return self

    @field_validator("expert_file")
    @classmethod
    def _expert_file_url(cls, value: str | None) -> str | None:
        if value is None or "://" in value:
            return value
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"{value!r} is not a file (ETO SFT or AgentGym AgentTraj JSON)")
        return "file://" + str(path.resolve())
