"""What every stage task receives besides its inputs: where to store and where to track.

`tracking` is left out of Prefect's cache key (`STAGE_CACHE`), so a re-run with a
new MLflow parent run still hits the cache of every finished stage; `env` enters it only through
`EnvSettings.identity()`.
"""

from __future__ import annotations

from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy
from prefect.utilities.hashing import hash_objects
from pydantic import BaseModel

from flywheel.storage import ArtifactStore
from flywheel.tracking import Tracker


class StoreIdentity(CachePolicy):
    """Keys a stage's cache on the identity of the folder it writes to (the top folder of its
    `out_url` in `store_url`), so a result cached for a run folder or store that was deleted
    since is not reused: its files are gone."""

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        store_url = inputs.get("store_url")
        if not store_url:
            return None
        store = ArtifactStore(store_url)
        return hash_objects(store.identity(store.top_folder(inputs.get("out_url") or "")))


class EnvIdentity(CachePolicy):
    """Keys a stage's cache on `env.identity()` instead of all environment settings: which
    servers episodes ran on, or how many tasks the run took, does not change a stage's result."""

    def compute_key(self, task_ctx, inputs, flow_parameters, **kwargs) -> str | None:
        env = inputs.get("env")
        return hash_objects(env.identity()) if env is not None else None


STAGE_CACHE = (INPUTS + TASK_SOURCE) - "tracking" - "env" + StoreIdentity() + EnvIdentity()


class TrackingRef(BaseModel):
    tracking_uri: str
    experiment: str
    parent_run_id: str

    def tracker(self) -> Tracker:
        return Tracker(self.tracking_uri, self.experiment)

    def stage_run(self, name: str) -> tuple[Tracker, str]:
        tracker = self.tracker()
        return tracker, tracker.start(name, parent_id=self.parent_run_id)

    def log_stage(self, name: str, manifest) -> None:
        """A child run holding a finished stage's counts and metrics, and where its output is."""
        tracker, run_id = self.stage_run(name)
        numbers = {**manifest.counts, **manifest.metrics}
        tracker.log_metrics(run_id, {k: float(v) for k, v in numbers.items()})
        tracker.log_params(run_id, {"output_url": manifest.url})
        tracker.finish(run_id)


def store_for(store_url: str) -> ArtifactStore:
    return ArtifactStore(store_url)
