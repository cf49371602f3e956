"""Flow runs are named after what they attempt: the run, the recipe, the round (a campaign's) or
all rounds, and how many times that was started, so the Prefect UI's lists tell a campaign's
rounds and a run's re-runs apart (they all had the run's name)."""

from __future__ import annotations

import uuid

from flywheel.storage import ArtifactStore
from ops.runner import count_attempt, recipe_of, run_title


def test_a_title_names_run_recipe_round_and_attempt():
    assert (
        run_title("eto-textcraft", "eto", "round 2", 3) == "eto-textcraft, eto, round 2, attempt 3"
    )
    assert recipe_of("eto-campaign") == recipe_of("eto") == "eto"
    assert recipe_of(None) == "recipe"


def test_attempts_are_counted_per_part_of_the_run_in_the_store(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    counts = [count_attempt(store, "run", part) for part in ("round 1", "round 1", "round 2")]
    assert counts == [1, 2, 1]
    # Another process (or machine) on the same store goes on counting.
    assert count_attempt(ArtifactStore(str(tmp_path / "store")), "run", "round 1") == 3
    assert count_attempt(store, "other-run", "round 1") == 1


def test_an_unreadable_count_names_the_attempt_unknown_instead_of_failing(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    store.write_text(store.url("run", ".flywheel-attempts.json"), "{not json")
    assert count_attempt(store, "run", "round 1") == 0
    assert run_title("run", "eto", "round 1", 0).endswith("attempt ?")


def succeeding_round(cfg, store, tracking):
    return "done"


def test_real_flow_runs_and_their_stages_are_renamed_per_attempt(tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from flows.eto import ETOConfig
    from ops.runner import run_tracked

    run_name = f"named-{uuid.uuid4().hex[:8]}"
    config = {
        "run_name": run_name, "storage_url": str(tmp_path / "store"), "rounds": 2,
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "env": {"train_tasks": 2, "test_tasks": 1},
    }  # fmt: skip

    @flow(name="eto-campaign")
    def recipe(config: dict, attempted: str | None):
        cfg = ETOConfig.model_validate(config)  # the store given: no preflight (slow)
        store = ArtifactStore(cfg.storage_url)
        return run_tracked(cfg, succeeding_round, store=store, attempted=attempted)

    states = [recipe(config, attempted, return_state=True) for attempted in (None, None, "round 1")]
    with get_client(sync_client=True) as client:
        names, stages = [], []
        for state in states:
            run_id = state.state_details.flow_run_id
            names.append(client.read_flow_run(run_id).name)
            parent = FlowRunFilterParentFlowRunId(any_=[run_id])
            [child] = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=parent)
            )
            stages.append(child.name)
    assert names == [
        f"{run_name}, eto, rounds 0-2, attempt 1",
        f"{run_name}, eto, rounds 0-2, attempt 2",
        f"{run_name}, eto, round 1, attempt 1",
    ]
    assert stages == [f"{name}, stages" for name in names]
