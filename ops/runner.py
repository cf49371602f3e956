"""What a recipe flow does before its first stage: check the config's outside world, pick the
task runner, and open the flow run's MLflow parent run."""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import UTC, datetime

from prefect import flow

from flywheel.config_files import ConfigError
from flywheel.records import FailedStage
from flywheel.stage import (
    TrackingRef,
    artifact_key,
    fenced,
    headline,
    is_superseded,
    plain_markdown,
)
from flywheel.storage import FAILED, ArtifactStore
from flywheel.tracking import Tracker, end_open_children, end_status
from flywheel.watchdog import watchdog
from ops.run_lock import RunLock, RunLocked
from ops.shutdown import flow_process, prefect_uses_temporary_server, stopping_children_on_error


def preflight(cfg) -> ArtifactStore:
    """Refuse a run whose storage cannot be written or whose trainer settings trl rejects.

    The checks that create nothing come first: a config refused for its tasks or trainer
    settings leaves no MLflow database behind (a local store is created by its check)."""
    store = open_store(cfg.storage_url)
    from ops.model_checks import check_model_shape

    # Seconds, before trl's import: a Hub id not to be had, frozen layers the model lacks.
    shape_checked = check_model_shape(cfg)
    check_trainer_settings(cfg)
    check_task_lists(cfg)
    from agents.chat_template import check_model

    check_model(cfg.model, cfg.env)  # a Hub id resolves (downloads) now; its template renders
    if not shape_checked:
        check_model_shape(cfg)  # the Hub id's config.json is in the Hub cache now
    make_task_runner(cfg)  # a missing prefect-dask / prefect-ray is named now, not mid-run
    check_mlflow(cfg)
    return store


# Schemes of fsspec's registry that can hold a run's artifacts (not archives, caches or
# read-only sources such as http or github).
STORE_SCHEMES = ("file", "s3", "gs", "az", "abfs", "oci", "oss", "sftp", "ftp", "smb", "webdav")


def open_store(url: str) -> ArtifactStore:
    """The run's store, written to once: a scheme fsspec does not know, one whose package is
    missing, or a store that refuses a write is a `ConfigError` naming what to install or set."""
    scheme = url.split("://", 1)[0] if "://" in url else "file"
    if problem := scheme_problem(scheme):
        raise ConfigError(f"storage_url {url!r}: {problem}")
    try:
        store = ArtifactStore(url)
    except Exception as error:  # the filesystem's own checks: credentials, options, a bad path
        raise ConfigError(
            f"storage_url {url!r} cannot be opened: {type(error).__name__}: {error}"
        ) from None
    try:
        store.check_writable()
    except OSError as error:
        raise ConfigError(f"storage_url: {error}") from None
    return store


def scheme_problem(scheme: str) -> str | None:
    """Why fsspec cannot open `scheme` here (unknown, or its package missing), or None."""
    from fsspec.registry import get_filesystem_class, known_implementations

    if scheme not in known_implementations:
        try:
            get_filesystem_class(scheme)  # a filesystem registered by an installed package
            return None
        except (ImportError, ValueError):
            usable, missing = store_schemes()
            return (
                f"unknown scheme {scheme!r}; schemes that work here: {', '.join(usable)} (or a "
                f"local folder); with their package installed: {', '.join(missing)}"
            )
    try:
        get_filesystem_class(scheme)
    except ImportError:
        package = package_of(scheme)
        hint = known_implementations[scheme].get("err") or f"it needs the {package} package"
        return f"{hint} (`pip install {package}` into this environment, then run again)"
    return None


def store_schemes() -> tuple[list[str], list[str]]:
    """The store schemes whose filesystem imports in this environment (`s3://`), and the
    others with the package they need (`gs:// (gcsfs)`)."""
    from fsspec.registry import get_filesystem_class

    usable, missing = [], []
    for scheme in STORE_SCHEMES:
        try:
            get_filesystem_class(scheme)
            usable.append(f"{scheme}://")
        except ImportError:
            missing.append(f"{scheme}:// ({package_of(scheme)})")
    return usable, missing


def package_of(scheme: str) -> str:
    """The package a scheme's filesystem needs: its own (gcsfs), or the one fsspec's message
    names for an implementation fsspec ships (sftp: "paramiko")."""
    from fsspec.registry import known_implementations

    known = known_implementations[scheme]
    root = known["class"].split(".", 1)[0]
    named = re.search(r'"([\w-]+)"', known.get("err", ""))
    return named.group(1) if root == "fsspec" and named else root


MLFLOW_CHECK_TIMEOUT_S = 5.0


def check_mlflow(cfg) -> None:
    """MLflow answers within seconds: a tracking server that is down is named now, not after
    MLflow's own retries (minutes, mid-run). A local store is created here, once (see
    `tracking.store_setup_lock`)."""
    import httpx

    from flywheel.tracking import Tracker

    uri = cfg.mlflow_tracking_uri
    source = " (from MLFLOW_TRACKING_URI)" if os.environ.get("MLFLOW_TRACKING_URI") == uri else ""
    fix = "start it, or point MLFLOW_TRACKING_URI / mlflow_tracking_uri at one that runs"
    if uri.startswith(("http://", "https://")):
        health = uri.rstrip("/") + "/health"
        try:
            answer = httpx.get(health, timeout=MLFLOW_CHECK_TIMEOUT_S)
        except httpx.HTTPError as error:
            raise ConfigError(
                f"mlflow_tracking_uri {uri!r}{source} does not answer within "
                f"{MLFLOW_CHECK_TIMEOUT_S:.0f} s ({type(error).__name__}: {error}); {fix}"
            ) from None
        if answer.status_code != 200:
            raise ConfigError(
                f"mlflow_tracking_uri {uri!r}{source}: {health} answered "
                f"{answer.status_code}, not 200; is it an MLflow server? {fix}"
            )
    elif "://" not in uri or uri.startswith(("sqlite:", "file:")):  # a store on this machine
        try:
            Tracker(uri, cfg.mlflow_experiment)
        except Exception as error:
            raise ConfigError(
                f"mlflow_tracking_uri {uri!r}{source} cannot be opened: {error}"
            ) from None


def check_task_lists(cfg) -> None:
    """The environment can run (its servers answer), both splits keep at least one task under
    the config's filters, and there is an expert to start from."""
    from envs import make_env
    from envs.task_selection import task_list

    env = make_env(cfg.env)
    try:
        env.check()
    except ValueError as error:
        raise ConfigError(f"env: {error}") from None
    train = task_list(env, "train", cfg.env, cfg.seed)
    task_list(env, "test", cfg.env, cfg.seed)
    if cfg.expert_file is None and env.expert_plan(train[0]) is None:
        raise ConfigError(
            f"env.name={cfg.env.name!r} has no expert trajectories, and the recipes start from "
            "SFT on them: set expert_file (ETO's SFT or AgentGym's AgentTraj format), or use a "
            "Flywheel environment (textcraft, scienceworld), with env.servers to run its episodes "
            "on environment servers"
        )


# trl's lazy module fails ("cannot import name 'DPOConfig'") when two threads import it first at
# the same moment, as two flow runs in one process do.
TRL_IMPORT = threading.Lock()


def check_trainer_settings(cfg) -> None:
    """Build trl's configs from the settings now, so a bad `trl_args` fails before any work."""
    import tempfile

    with TRL_IMPORT:
        from trl import DPOConfig, SFTConfig

    from flywheel.settings import DPOSettings, SFTSettings
    from tasks.dpo import dpo_trl_args
    from tasks.sft import sft_trl_args
    from training.job import TrainingJob, trainer_defaults

    checks = []  # every trainer section of the config: sft, dpo, revision_sft, ...
    for field in type(cfg).model_fields:
        section = getattr(cfg, field)
        if isinstance(section, SFTSettings):
            checks.append((field, SFTConfig, section, sft_trl_args(section)))
        elif isinstance(section, DPOSettings):
            checks.append((field, DPOConfig, section, dpo_trl_args(section)))
    with tempfile.TemporaryDirectory() as scratch:
        for field, config_class, settings, args in checks:
            job = TrainingJob(
                model_dir="", data_file="", output_dir=f"{scratch}/out", settings=settings,
                seed=cfg.seed, trl_args=args,
            )  # fmt: skip
            try:
                config_class(**trainer_defaults(job))
            except (TypeError, ValueError) as error:
                raise ConfigError(
                    f"{field}.trl_args: trl's {config_class.__name__} says: {error}"
                ) from None


def make_task_runner(cfg):
    """Threads by default; Dask or Ray run stages in other processes: a local cluster of worker
    processes, or the cluster at `task_runner_address` (other machines)."""
    name, address = cfg.task_runner, cfg.task_runner_address
    if name == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=4)
    if name == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError:
            raise ConfigError("task_runner: 'dask' needs `pip install prefect-dask`") from None
        if address:  # its workers need DASK_DISTRIBUTED__WORKER__DAEMON=False, as below
            return DaskTaskRunner(address=address)
        import dask

        # vLLM and trainers start processes of their own, which daemonic workers may not.
        dask.config.set({"distributed.worker.daemon": False})
        share_prefect_api()
        # One thread per worker process: a stage holds a whole inference engine or trainer.
        return DaskTaskRunner(cluster_kwargs={"processes": True, "threads_per_worker": 1})
    if name == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError:
            raise ConfigError("task_runner: 'ray' needs `pip install prefect-ray`") from None
        return RayTaskRunner(address=address) if address else RayTaskRunner()
    raise ConfigError(f"task_runner: unknown runner {name!r}")


def share_prefect_api() -> None:
    """Processes started from here (Dask workers) report to this process's Prefect API: without
    a server (`PREFECT_API_URL` unset) that is the ephemeral one, which each worker would
    otherwise start again for itself."""
    if not prefect_uses_temporary_server():
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the process's one ephemeral server, started if need be
    server.start()
    os.environ["PREFECT_API_URL"] = server.api_url


def start_tracking(cfg, flow_run_id: str | None) -> TrackingRef:
    tracker = Tracker(cfg.mlflow_tracking_uri, cfg.mlflow_experiment)
    name = f"{cfg.run_name}/{flow_run_id or 'local'}"
    run_id = tracker.start(name, tags={"flywheel.run_name": cfg.run_name})
    tracker.log_config(run_id, cfg)  # config.yaml and one param per setting
    return TrackingRef(
        tracking_uri=cfg.mlflow_tracking_uri,
        experiment=cfg.mlflow_experiment,
        parent_run_id=run_id,
    )


@flow(name="stages", log_prints=True)
def stages_flow(body, cfg, store_url: str, tracking: TrackingRef, extra: list | None = None):
    """The stages of one recipe run, as a subflow: its task runner comes from the run's config,
    which a deployment's parameters only give at run time. Stages keep no Prefect results: their
    manifests in the store are the record (flywheel.stage)."""
    watch_flow_run()
    with stopping_children_on_error():  # before Prefect waits for the stages' threads
        return body(cfg, ArtifactStore(store_url), tracking, *(extra or []))


def watch_flow_run() -> None:
    """Have the watchdog set this flow run Crashed if this process is SIGKILLed: Prefect's
    engine, which reports every other end, dies with it (`flywheel/watchdog.py`)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if flow_run_id := flow_run.get_id():
        api_url = str(get_client(sync_client=True).api_url)
        watchdog().tell(flow_run=[api_url, flow_run_id])


def run_tracked(
    cfg, body, *extra, store: ArtifactStore | None = None, locked: bool = False,
    attempted: str | None = None,
):  # fmt: skip
    """Run a recipe's `body(cfg, store, tracking, *extra)` under the flow run's MLflow parent
    run, on the configured task runner. A failure marks the MLflow run failed, leaves a
    Prefect artifact naming the failed stages and where their records are, and is returned as
    a Failed state whose message leads with the stage and cause (`failed_state`); a run told to
    stop (SIGTERM, Ctrl-C) raises.

    The run holds its lock in the store (`ops/run_lock.py`) throughout, unless the caller
    already does (`locked`: a campaign holds it around its whole round). Under the lock the
    flow run is renamed after what it attempts (`attempted`: `round 2` for a campaign's run,
    all rounds by default) and how many times that was started (`run_title`)."""
    from prefect.runtime import flow_run

    store = store or preflight(cfg)
    if not locked:
        with RunLock(store.root, cfg.run_name).hold(cfg.break_lock):
            return run_tracked(cfg, body, *extra, store=store, locked=True, attempted=attempted)
    attempted = attempted or f"rounds 0-{cfg.rounds}"
    attempt = count_attempt(store, cfg.run_name, attempted)
    title = run_title(cfg.run_name, recipe_of(flow_run.get_flow_name()), attempted, attempt)
    rename_flow_run(title)
    tracking = start_tracking(cfg, flow_run.get_id())
    run_id = tracking.parent_run_id
    watchdog().tell(open_run=[tracking.tracking_uri, run_id])  # KILLED if we are SIGKILLed
    watch_flow_run()  # and Crashed in Prefect
    started = datetime.now(UTC).isoformat(timespec="seconds")
    stages = stages_flow.with_options(
        name=f"{flow_run.get_flow_name() or 'recipe'}-stages",
        flow_run_name=f"{title}, stages",
        task_runner=make_task_runner(cfg),
    )
    try:
        result = stages(body, cfg, store.root, tracking, list(extra))
        tracking.tracker().finish(run_id)
        mark_run_failure_superseded(cfg)
    except BaseException as error:
        failed: list[tuple[FailedStage, str]] = []
        try:
            failed = report_failed_run(cfg, store, tracking, started, error, title)
        except Exception as report_error:  # the run's own error is the one to raise
            print(f"could not record the failure ({report_error!r})")
        if not isinstance(error, Exception):  # told to stop (SIGTERM, Ctrl-C): stop
            raise
        log_cause(error, failed)
        return failed_state(error, failed)
    finally:
        watchdog().tell(closed_run=run_id)
    return result


def failed_state(error: Exception, failed: list[tuple[FailedStage, str]]):
    """The flow run's Failed state, its message leading with the failed stage and the cause
    (`dpo/round-1: no pair fits in max_length=64 → raise dpo.max_length (…)`): the UI's run
    list and the CLI show this message, which Prefect's own ("Flow run encountered an exception:
    TrainingFailed: training.dpo exited …") cut before the cause. `data` keeps the error, so
    `state.result()` raises it as before."""
    from prefect.states import Failed

    return Failed(message=failure_summary(error, [record for record, _ in failed]), data=error)


def log_cause(error: Exception, failed: list[tuple[FailedStage, str]]) -> None:
    """The cause as an ERROR line of the flow run's own logs, the tab its page opens on: the
    stage's traceback is in the stages subflow's logs, collapsed on that page."""
    from prefect.context import FlowRunContext
    from prefect.logging import get_run_logger

    if FlowRunContext.get() is None:
        return
    summary = failure_summary(error, [record for record, _ in failed])
    where = [
        f"record {url}" + "".join(f", log {log}" for log in logs_of(record))
        for record, url in failed
    ]
    get_run_logger().error("\n".join([f"Failed: {summary}", *where]))


def failure_summary(error: BaseException, failed: list[FailedStage]) -> str:
    """`<stage>/<label>: <cause>` for the first failed stage (`and N more failed stages`), or
    the error's own cause where no stage failed (before or between stages)."""
    if not failed:
        return headline(f"{type(error).__name__}: {error}") or type(error).__name__
    first = min(failed, key=lambda record: record.failed_at)  # the one that failed the run
    more = f" (and {len(failed) - 1} more failed stages)" if len(failed) > 1 else ""
    return f"{first.task_run}: {headline(first.message)}{more}"


def report_failed_run(
    cfg, store: ArtifactStore, tracking: TrackingRef, started: str, error, title: str = ""
) -> list[tuple[FailedStage, str]]:
    """Mark the run's MLflow run failed, leave the Prefect artifact naming the failed stages,
    headed by the stage and its cause (the flow run's first artifact, the one its page shows);
    the failed stages' records (this run's), each with its URL."""
    from prefect.artifacts import create_markdown_artifact

    tracker = tracking.tracker()
    status = end_status(error)  # KILLED for a run told to stop
    message = f"{type(error).__name__}: {error}".strip()
    tracker.tag_error(tracking.parent_run_id, message)
    end_open_children(tracker.client, tracking.parent_run_id, status)
    tracker.finish(tracking.parent_run_id, status)
    run_url = store.url(cfg.run_name)
    failed = []
    for url in store.list_files(run_url):
        if url.endswith(f"/{FAILED}"):
            record = FailedStage.model_validate_json(store.read_text(url))
            if record.failed_at >= started:  # this run's, not an older run's
                failed.append((record, url))
    summary = failure_summary(error, [record for record, _ in failed])
    lines = [
        f"# Failed: {plain_markdown(summary)}",
        "",
        f"Run `{cfg.run_name}` failed{f' ({title})' if title else ''}:",
        "",
        *fenced(message),
        "",
        "## Failed stages",
        *([failed_stage_line(r, url) for r, url in failed] or [NO_FAILED_STAGE]),
        "",
        f"- Artifacts: `{run_url}`",
        f"- MLflow run: {tracker.run_url(tracking.parent_run_id)}",
    ]
    create_markdown_artifact(
        "\n".join(lines),
        key=artifact_key(f"{cfg.run_name}-failed"),
        description=plain_markdown(summary),  # a card shows ~45 characters: the cause first
    )
    return failed


NO_FAILED_STAGE = "- (none recorded: the failure came before or between stages)"


def failed_stage_line(record: FailedStage, url: str) -> str:
    """`dpo`: the cause (plain text), where the record and the stage's log are."""
    where = f"record `{url}`" + "".join(f", log `{log}`" for log in logs_of(record))
    return f"- `{record.stage}`: {plain_markdown(headline(record.message))} ({where})"


def logs_of(record: FailedStage) -> list[str]:
    """The failed stage's logs kept in the store (the trainer's `train.log`)."""
    return [u for u in record.partial_outputs if u.endswith(".log")]


def mark_run_failure_superseded(cfg) -> None:
    """A run that succeeds after a failed one: its failure artifact gets a new version saying
    so, so that the UI's latest version of `<run>-failed` is not a failure already fixed."""
    from prefect.artifacts import Artifact, create_markdown_artifact
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:  # no Prefect run to publish into
        return
    key = artifact_key(f"{cfg.run_name}-failed")
    latest = Artifact.get(key)
    if latest is None or is_superseded(str(latest.data)):
        return
    now = datetime.now(UTC).isoformat(timespec="seconds")
    create_markdown_artifact(
        f"# Superseded: run `{cfg.run_name}` re-run succeeded at {now}\n\nThe failure recorded "
        "before (the previous version of this artifact) is history.",
        key=key,
        description=plain_markdown(f"superseded: {cfg.run_name} re-run succeeded at {now}"),
    )


ATTEMPTS_FILE = ".flywheel-attempts.json"  # in the run's folder: starts of each part of the run


def count_attempt(store: ArtifactStore, run_name: str, attempted: str) -> int:
    """Count one more start of `attempted` (`round 2`, `rounds 0-3`) of the run, and return
    the count (1 the first time). Kept in the run's folder, beside its stages: it spans Prefect
    servers and machines as the run does (Prefect's own `run_count` counts retries of one flow
    run, and a re-run is a new flow run). Callers hold the run's lock, so no two count at once.
    0 when the store will not keep the count: a name is no reason to fail a run."""
    url = store.url(run_name, ATTEMPTS_FILE)
    try:
        counts = json.loads(store.read_text(url)) if store.exists(url) else {}
        counts[attempted] = counts.get(attempted, 0) + 1
        store.write_text(url, json.dumps(counts, indent=2, sort_keys=True))
    except (OSError, ValueError) as error:
        print(f"warning: could not count this attempt in {url} ({error!r})")
        return 0
    return counts[attempted]


def run_title(run_name: str, recipe: str, attempted: str, attempt: int) -> str:
    """A flow run's name: `eto-textcraft, eto, round 2, attempt 3`, so that the UI's lists
    tell a campaign's rounds and a run's re-runs apart. Plain ASCII: the run graph's canvas
    font has no `·` (seen in Chromium)."""
    return ", ".join([run_name, recipe, attempted, f"attempt {attempt or '?'}"])


def recipe_of(flow_name: str | None) -> str:
    """The recipe a flow runs: `eto` for the `eto` and `eto-campaign` flows."""
    return (flow_name or "recipe").removesuffix("-campaign")


def rename_flow_run(name: str) -> None:
    """Give the current flow run `name`: Prefect names it when it starts, before the run's
    round and attempt are known (they are read from the store under the run's lock)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:  # called outside a flow run
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(context.flow_run.id, name=name)
    context.flow_run.name = name


def run_named(config_class):
    """A recipe flow's `flow_run_name`: its runs are named after the run they are (`eto-tiny`,
    the config's run_name), read from their parameters, rather than Prefect's random names."""

    def flow_run_name() -> str:
        from prefect.runtime import flow_run

        params = flow_run.parameters
        try:
            config = recipe_config(
                config_class, params.get("config"), params.get("config_file"),
                params.get("overrides"),
            )  # fmt: skip
        except (ConfigError, OSError):  # the flow's own preflight says what is wrong
            return config_class.model_fields["run_name"].default
        return config.run_name

    return flow_run_name


def recipe_config(config_class, config: dict | None, config_file: str | None, overrides):
    """A recipe flow's parameters → its checked config: `config` (a mapping) or `config_file`
    (YAML), then `overrides` (`key=value`) on top."""
    from flywheel.config_files import load_config, validate_config

    if config is not None:
        return checked_environment(validate_config(config_class, config))
    return checked_environment(load_config(config_class, config_file, overrides or []))


def checked_environment(cfg):
    """`cfg`, once its environment's name resolves and its options fit the environment's own
    settings model: the core validates neither (it knows no environment, envs/registry.py)."""
    from envs.registry import check_env_settings

    check_env_settings(cfg.env)
    return cfg


def cli_main(
    flow_function, config_class, argv, prog: str, description: str, example: str,
    campaign_flow=None,
) -> int:  # fmt: skip
    """A recipe's command line: `--config FILE` and `key=value` overrides, checked before work."""
    import argparse
    import sys

    from flywheel.config_files import load_config
    from flywheel.setting_docs import sections_summary, settings_help

    argv = sys.argv[1:] if argv is None else argv
    values, source = help_values(config_class, argv)
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Overrides use dotted keys, e.g. {example} storage_url=s3://bucket/runs; a "
        "config file sets the same keys as nested YAML.\n\n"
        f"Settings (key (type) = value  # what it does), the values from {source}:\n\n"
        f"{settings_help(config_class, values, sections=[''])}\n\n"
        f"Sections (`--settings SECTION ...` lists their settings; `--settings` all):\n\n"
        f"{sections_summary(config_class)}",
    )
    parser.add_argument("--config", help="YAML config file (defaults apply where it is silent)")
    parser.add_argument(
        "--settings", nargs="*", metavar="SECTION",
        help="list every setting of these sections (all without one), with the values --config "
        "and the overrides give them, and exit",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="settings to override")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the run's resolved config (defaults, file, overrides) as YAML and exit",
    )
    if campaign_flow is not None:
        parser.add_argument(
            "--campaign",
            action="store_true",
            help="run one more round of the campaign stored under run_name (round 0: SFT)",
        )
    parser.add_argument(
        "--break-lock",
        action="store_true",
        help="take the run's lock even if another process seems to hold it (break_lock=true)",
    )
    args = parser.parse_intermixed_args(argv)
    if args.settings is not None:
        print(settings_help(config_class, values, sections=args.settings or None))
        return 0
    campaign = getattr(args, "campaign", False)
    if campaign:
        flow_function = campaign_flow
    try:
        cfg = checked_environment(load_config(config_class, args.config, args.overrides))
        if args.break_lock:
            cfg.break_lock = True
        if args.print_config:
            print(config_yaml(cfg), end="")
            return 0
        if not campaign:  # a campaign run waits for its slot, then for the lock
            # before the other checks: a held run is refused before any database or server
            RunLock(open_store(cfg.storage_url).root, cfg.run_name).check(cfg.break_lock)
        preflight(cfg)
    except (ConfigError, OSError, RunLocked) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with flow_process():  # SIGTERM exits cleanly; a watchdog cleans up after a SIGKILL
        state = flow_function(config=cfg.model_dump(), return_state=True)
    if not state.is_completed():
        print(f"error: {state.message}", file=sys.stderr)
        return 1
    return 0


def help_values(config_class, argv) -> tuple[dict | None, str]:
    """The values `--config` and the overrides in `argv` give every setting, for the help (the
    class defaults where they do not load: the run itself then says why)."""
    from flywheel.config_files import load_config

    config, overrides = None, [a for a in argv if "=" in a and not a.startswith("-")]
    for position, arg in enumerate(argv):
        if arg == "--config" and position + 1 < len(argv):
            config = argv[position + 1]
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
    if config is None and not overrides:
        return None, "the defaults"
    try:
        cfg = load_config(config_class, config, overrides)
    except Exception as error:  # the help still shows; the run reports the error itself
        return None, f"the defaults ({config or 'the overrides'} did not load: {error})"
    given = " and the overrides" if overrides else ""
    return cfg.model_dump(mode="json"), f"{config or 'the defaults'}{given}"


def config_yaml(cfg) -> str:
    """A config as the YAML file that gives it back (`--config` of the printed file)."""
    import yaml

    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
