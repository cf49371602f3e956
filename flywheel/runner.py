"""What a recipe flow does before its first stage: check the config's outside world, pick the
task runner, and open the flow run's MLflow parent run."""

from __future__ import annotations

from flywheel.settings import ConfigError
from flywheel.stage import TrackingRef
from flywheel.storage import ArtifactStore
from flywheel.tracking import Tracker


def preflight(cfg) -> ArtifactStore:
    """Refuse a run whose storage cannot be written or whose trainer settings trl rejects."""
    store = ArtifactStore(cfg.storage_url)
    try:
        store.check_writable()
        for folder in ("", "models", cfg.run_name.split("/")[0]):
            store.identity(folder)  # created here, before stages run in parallel
    except OSError as error:
        raise ConfigError(f"storage_url: {error}") from None
    check_trainer_settings(cfg)
    check_task_lists(cfg)
    return store


def check_task_lists(cfg) -> None:
    """The environment can run (its servers answer), both splits keep at least one task under
    the config's filters, and there is an expert to start from."""
    from envs import make_env
    from flywheel.rollout import task_list

    env = make_env(cfg.env)
    try:
        env.check()
    except ValueError as error:
        raise ConfigError(f"env: {error}") from None
    train = task_list(env, "train", cfg.env, cfg.seed)
    task_list(env, "test", cfg.env, cfg.seed)
    if env.expert_plan(train[0]) is None:
        raise ConfigError(
            f"env.name={cfg.env.name!r} has no expert trajectories, and the recipes start from "
            "SFT on them: use a Flywheel environment (textcraft, scienceworld), with env.servers "
            "to run its episodes on environment servers"
        )


def check_trainer_settings(cfg) -> None:
    """Build trl's configs from the settings now, so a bad `trl_args` fails before any work."""
    import tempfile

    from trl import DPOConfig, SFTConfig

    from flywheel.settings import DPOSettings, SFTSettings
    from tasks.dpo import dpo_trl_args
    from tasks.sft import sft_trl_args
    from training.job import TrainingJob, trainer_defaults

    checks = []  # every trainer section of the config: sft, dpo, revision_sft, ...
    for field in type(cfg).model_fields:
        section = getattr(cfg, field)
        if isinstance(section, SFTSettings):
            checks.append((field, SFTConfig, sft_trl_args(section, cfg.seed)))
        elif isinstance(section, DPOSettings):
            checks.append((field, DPOConfig, dpo_trl_args(section, cfg.seed)))
    with tempfile.TemporaryDirectory() as scratch:
        for field, config_class, args in checks:
            job = TrainingJob(
                model_dir="", data_file="", output_dir=f"{scratch}/out", trl_args=args
            )
            try:
                config_class(**trainer_defaults(job))
            except (TypeError, ValueError) as error:
                raise ConfigError(
                    f"{field}.trl_args: trl's {config_class.__name__} says: {error}"
                ) from None


def make_task_runner(name: str):
    """Threads by default; Dask or Ray spread stages over processes or machines."""
    if name == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=4)
    if name == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError:
            raise ConfigError("task_runner: 'dask' needs `pip install prefect-dask`") from None
        return DaskTaskRunner()
    if name == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError:
            raise ConfigError("task_runner: 'ray' needs `pip install prefect-ray`") from None
        return RayTaskRunner()
    raise ConfigError(f"task_runner: unknown runner {name!r}")


def start_tracking(cfg, flow_run_id: str | None) -> TrackingRef:
    tracker = Tracker(cfg.mlflow_tracking_uri, cfg.mlflow_experiment)
    name = f"{cfg.run_name}/{flow_run_id or 'local'}"
    run_id = tracker.start(name, tags={"flywheel.run_name": cfg.run_name})
    tracker.log_params(run_id, {"config": cfg.model_dump_json()})
    return TrackingRef(
        tracking_uri=cfg.mlflow_tracking_uri,
        experiment=cfg.mlflow_experiment,
        parent_run_id=run_id,
    )


def run_tracked(cfg, body):
    """Run a recipe's `body(cfg, store, tracking)` under the flow run's MLflow parent run."""
    from prefect.runtime import flow_run

    store = preflight(cfg)
    tracking = start_tracking(cfg, flow_run.get_id())
    try:
        result = body(cfg, store, tracking)
    except BaseException:
        tracking.tracker().finish(tracking.parent_run_id, "FAILED")
        raise
    tracking.tracker().finish(tracking.parent_run_id)
    return result


def cli_main(flow_function, config_class, argv, prog: str, description: str, example: str) -> int:
    """A recipe's command line: `--config FILE` and `key=value` overrides, checked before work."""
    import argparse
    import sys

    from flywheel.settings import load_config

    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=f"Overrides use dotted keys, e.g. {example} storage_url=s3://bucket/runs. "
        "Every field is documented in flywheel/settings.py.",
    )
    parser.add_argument("--config", help="YAML config file (defaults apply where it is silent)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="settings to override")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(config_class, args.config, args.overrides)
        preflight(cfg)
    except (ConfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    runner = make_task_runner(cfg.task_runner)
    flow_function.with_options(task_runner=runner)(config=cfg.model_dump())
    return 0
