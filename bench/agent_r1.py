"""Agent-R1 bench: the advantage estimators side by side, the tools' speed, and rollouts with tool
calls against the machine's decode bound. Results are appended to bench/results-agent-r1.md.

Three parts (`--parts`, all by default):

estimators: the Agent-R1 flow (`python -m flows.agent_r1`), once per estimator, on the same
    store, config and seed, in that order. Every stage is cached in the store on its inputs, so
    the base model, the solver's trajectories, the warm start, its evaluation and round 1's
    sampled groups are computed by the first run and served to the others; each later run
    computes only its RL update and that policy's evaluation. The runs share the RL stage's and
    the evaluation's folders (the run name), so each estimator's numbers are read right after its
    own run (and kept in <store>/<run_name>/bench-estimators.json). The table, like the paper's:
    held-out exact match with n and its Wilson 95% interval, the warm start's row, tokens
    trained (forwarded: rows' tokens x epochs; loss tokens: the ones the policy sampled), the
    RL stage's wall seconds (its MLflow run, from its start to its last metric), and the
    trainer's mean KL to the starting policy and clip fraction. One run of the shipped config
    takes about 30 minutes on 2 CPU cores, the first (warm start included) longer.
tools: the python sandbox's start latency (`print(1)` through PythonTool.execute, one after
    another, then through execute_batch: median and p90 ms a call, calls/s), and BM25 search
    over the generated corpus (the test split's, as evaluation uses it) one query a call and
    batched (SearchTool.execute_batch): queries/s, median and p90 ms.
rollout: greedy episodes of the QA environment on test questions with vLLM, through
    agents.rollout.run_batched (every live episode's prompt in one generate call a step, the tool
    calls batched per tool): generated tokens/s over the wall time and over the generate calls
    alone, the time the environment's steps took (the tools), and the decode bound measured in
    the same run as bench/rollout_throughput.py does (a float32 matmul on 1 thread and on all;
    bound = FLOP/s / (2 x (non-embedding + lm_head parameters)) tokens/s).

    python -m bench.agent_r1 --parts tools rollout --questions 16     # ~2 min on 2 cores
    python -m bench.agent_r1 --parts estimators --estimators grpo rloo  # two estimators
    python -m bench.agent_r1                                           # all five, ~3 hours
    python -m bench.agent_r1 --parts rollout --model-dir runs-agent-r1/agent-r1-qa/sft/model

The estimators part needs a local store folder (the runs' manifests are read from it). The
rollout part uses the config's environment and inference settings (max_steps, max_tokens,
max_model_len, KV cache); the untrained model is prompted with `env.few_shot` worked examples,
as the flow's "untrained" row is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from flywheel.confidence import wilson_interval

ROOT = Path(__file__).resolve().parents[1]

PARTS = ("estimators", "tools", "rollout")
ESTIMATORS = ("grpo", "dr-grpo", "rloo", "reinforce++", "ppo")
# Agent-R1's published HotpotQA exact match (Qwen3-4B), for the reader's comparison only.
PAPER_EM = {"react": 25.8, "grpo": 59.4, "ppo": 56.7, "rloo": 55.2, "reinforce++": 52.8}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--config", default="configs/agent_r1_qa.yaml", help="Agent-R1 config")
    parser.add_argument(
        "--overrides", nargs="*", default=[], metavar="KEY=VALUE",
        help="config overrides, as the flow takes them (e.g. rounds=1 sample.samples_per_task=8)",
    )  # fmt: skip
    # estimators
    parser.add_argument("--estimators", nargs="+", choices=ESTIMATORS, default=list(ESTIMATORS))
    parser.add_argument(
        "--store", default=str(ROOT / "runs-agent-r1-bench"), help="store folder the runs share"
    )
    # tools
    parser.add_argument("--python-runs", type=int, default=20, help="sandbox starts, each way")
    parser.add_argument("--search-queries", type=int, default=512, help="queries, each way")
    parser.add_argument("--search-batch", type=int, default=32, help="queries a batched call")
    # rollout
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--model", choices=("smollm2-135m", "tiny"), default="smollm2-135m",
        help="built-in model for the rollout part (as bench/rollout_throughput.py)",
    )  # fmt: skip
    which.add_argument("--model-dir", help="a Hugging Face model folder (e.g. a warm start)")
    parser.add_argument("--questions", type=int, default=32, help="test questions rolled out")
    parser.add_argument(
        "--few-shot", type=int, help="worked examples in the prompt (default: the config's)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results-agent-r1.md")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    for name in ("python_runs", "search_queries", "search_batch", "questions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if "estimators" in args.parts and "://" in args.store.removeprefix("file://"):
        parser.error("--store: the estimators part reads the runs' manifests from a local folder")
    return args


def load_cfg(args):
    from flows.agent_r1 import AgentR1Config
    from flywheel.config_files import load_config

    config = str(ROOT / args.config) if not Path(args.config).is_absolute() else args.config
    return load_config(AgentR1Config, config, [f"storage_url={store_dir(args)}", *args.overrides])


def store_dir(args) -> Path:
    return Path(args.store.removeprefix("file://")).resolve()


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) by linear interpolation between the sorted values."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# --- 1. the estimators side by side --------------------------------------------------------------


def run_flow(args, estimator: str) -> float:
    """One Agent-R1 run with `estimator` on the shared store; its wall seconds."""
    command = [
        sys.executable, "-m", "flows.agent_r1", "--config", str(ROOT / args.config),
        f"storage_url={store_dir(args)}", *args.overrides, f"rl.estimator={estimator}",
    ]  # fmt: skip
    print("+", shlex.join(command), flush=True)
    started = time.monotonic()
    subprocess.run(command, check=True, cwd=ROOT)
    return time.monotonic() - started


def read_manifest(folder: Path) -> dict | None:
    path = folder / "_MANIFEST.json"
    return json.loads(path.read_text()) if path.is_file() else None


def evaluation_row(run: Path, label: str) -> dict:
    """A policy's held-out exact match: rate, solved of n and the Wilson interval."""
    manifest = read_manifest(run / "evaluate" / label) or {}
    counts = manifest.get("counts", {})
    solved, n = counts.get("successes", 0), counts.get("episodes", 0)
    low, high = wilson_interval(solved, n)
    return {
        "stage": label, "solved": solved, "n": n, "exact_match": solved / n if n else 0.0,
        "ci95": [low, high], "seconds": manifest.get("metrics", {}).get("seconds"),
    }  # fmt: skip


def stage_seconds(cfg, output_url: str, published_at: str) -> float | None:
    """Wall seconds of the stage run that computed the manifest at `output_url`: the latest
    MLflow run of that stage begun before the manifest was published (a run served from the
    store begins after), from its start to the last metric logged on it (the stage's own, logged
    when it finished). None when MLflow has no such run."""
    from mlflow.tracking import MlflowClient

    uri = cfg.mlflow_tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{ROOT / uri.removeprefix('sqlite:///')}"  # as the flow, from ROOT
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.mlflow_experiment)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        f"tags.`flywheel.output_url` = '{output_url}' and attributes.start_time <= "
        f"{int(datetime.fromisoformat(published_at).timestamp() * 1000) + 999}",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        return None
    run = runs[0]
    ends = [
        m.timestamp
        for key in run.data.metrics
        for m in client.get_metric_history(run.info.run_id, key)
    ]
    return (max(ends) - run.info.start_time) / 1000 if ends else None


def rl_metrics(manifest: dict, epochs: int) -> dict:
    """The RL stage's trainer numbers the table shows."""
    m = manifest.get("metrics", {})
    return {
        "tokens_trained": round(m.get("tokens_per_epoch", 0) * epochs),
        "loss_tokens_trained": round(m.get("loss_tokens_trained", 0)),
        "kl": m.get("kl"),
        "clip_fraction": m.get("clip_fraction"),
        "reward_mean": m.get("reward_mean"),
        "groups": m.get("groups"),
        "groups_zero_reward_variance": m.get("groups_zero_reward_variance"),
    }


def collect(cfg, estimator: str, wall: float) -> dict:
    """What one estimator's run left in the store, read before the next run replaces it."""
    run = store_dir_of(cfg) / cfg.run_name
    stages = [row["stage"] for row in json.loads((run / "results.json").read_text())]
    rl_labels = [s for s in stages if s.startswith("rl-round-")]
    result = {
        "estimator": estimator, "flow_seconds": wall, "stages": stages,
        "evaluations": {s: evaluation_row(run, s) for s in stages},
        "rounds": [], "notes": [],
    }  # fmt: skip
    for label in rl_labels:
        n = int(label.rsplit("-", 1)[1])
        manifest = read_manifest(run / f"round-{n}" / "rl") or {}
        seconds = None
        if manifest.get("published_at"):
            seconds = stage_seconds(cfg, manifest["url"], manifest["published_at"])
        result["rounds"].append(
            {"round": n, "rl_seconds": seconds, **rl_metrics(manifest, cfg.rl.epochs)}
        )
    if not rl_labels:
        result["notes"].append(
            "no RL update: every sampled group's episodes earned the same reward "
            "(see the run's results.md)"
        )
    return result


def store_dir_of(cfg) -> Path:
    return Path(cfg.storage_url.removeprefix("file://"))


def warm_start(cfg) -> dict:
    """The warm start's SFT numbers: tokens trained and its trainer's runtime."""
    m = (read_manifest(store_dir_of(cfg) / cfg.run_name / "sft") or {}).get("metrics", {})
    return {
        "tokens_trained": round(m.get("tokens_per_epoch", 0) * m.get("epoch", 1)),
        "loss_tokens_trained": round(m.get("loss_tokens_per_epoch", 0) * m.get("epoch", 1)),
        "seconds": m.get("train_runtime"),
    }


def estimators_part(args, cfg) -> dict:
    """Each estimator's run in turn; the rows kept next to the run as they come in."""
    kept = store_dir(args) / cfg.run_name / "bench-estimators.json"
    results = []
    for estimator in args.estimators:
        wall = run_flow(args, estimator)
        results.append(collect(cfg, estimator, wall))
        kept.write_text(json.dumps(results, indent=2) + "\n")
    return {"runs": results, "warm_start": warm_start(cfg)}


def _num(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def estimators_table(part: dict) -> list[str]:
    runs = part["runs"]
    lines = [
        "| policy | held-out exact match | 95% interval (Wilson) | solved / n | tokens trained "
        "(forwarded / loss) | training wall s | KL to start | clip fraction | RL reward mean "
        "| paper (Qwen3-4B, HotpotQA) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(label, e, tokens, loss, seconds, kl=None, clip=None, reward=None, paper=None):
        low, high = e["ci95"]
        return (
            f"| {label} | {e['exact_match']:.1%} | {low:.1%}–{high:.1%} | {e['solved']}/{e['n']} "
            f"| {tokens:,} / {loss:,} | {_num(seconds, '.0f')} | {_num(kl, '.4f')} "
            f"| {_num(clip, '.3f')} | {_num(reward, '.3f')} | {_num(paper, '.1f')} |"
        )

    if not runs:
        return lines
    first = runs[0]["evaluations"]
    if "untrained" in first:
        lines.append(row("untrained (few-shot prompt)", first["untrained"], 0, 0, None,
                         paper=PAPER_EM["react"]))  # fmt: skip
    warm = part["warm_start"]
    if "warm-start" in first:
        lines.append(
            row("warm start (SFT)", first["warm-start"], warm["tokens_trained"],
                warm["loss_tokens_trained"], warm["seconds"])
        )  # fmt: skip
    for run in runs:
        labels = [s for s in run["stages"] if s.startswith("rl-round-")]
        if not labels:  # its note says why, below the table
            lines.append(f"| {run['estimator']} | no RL update | | | | | | | | |")
            continue
        last, rounds = run["evaluations"][labels[-1]], run["rounds"]
        seconds = [r["rl_seconds"] for r in rounds]
        lines.append(
            row(
                f"{run['estimator']} ({labels[-1]})", last,
                sum(r["tokens_trained"] for r in rounds),
                sum(r["loss_tokens_trained"] for r in rounds),
                None if None in seconds else sum(seconds),
                rounds[-1]["kl"], rounds[-1]["clip_fraction"], rounds[-1]["reward_mean"],
                PAPER_EM.get(run["estimator"]),
            )
        )  # fmt: skip
    flows = ", ".join(f"{r['estimator']} {r['flow_seconds'] / 60:.1f} min" for r in runs)
    return lines + ["", f"Flow wall time per run (the first computes the shared stages): {flows}."]


# --- 2. the tools --------------------------------------------------------------------------------


def timed_calls(tool, calls: list, batched: bool) -> tuple[list[float], float, list[str]]:
    """Per-call seconds (each call timed where it runs), the wall seconds, and the outputs."""
    seconds: list[float] = []
    execute = tool.execute

    def timed(arguments):
        start = time.perf_counter()
        try:
            return execute(arguments)
        finally:
            seconds.append(time.perf_counter() - start)

    tool.execute = timed  # execute_batch calls self.execute
    try:
        start = time.perf_counter()
        outputs = tool.execute_batch(calls) if batched else [tool.execute(c) for c in calls]
        wall = time.perf_counter() - start
    finally:
        del tool.execute
    return seconds, wall, outputs


def tools_part(args, cfg) -> dict:
    from envs import make_env
    from envs.qa_env import searchable_text
    from envs.tools import PythonTool, SearchTool

    env = make_env(cfg.env)
    python = PythonTool(env.tool_settings)
    python.execute({"code": "print(1)"})  # warm the interpreter's file cache
    out: dict = {"python": {}, "search": {}}
    calls = [{"code": "print(1)"}] * args.python_runs
    for way, batched in (("execute", False), ("execute_batch", True)):
        seconds, wall, outputs = timed_calls(python, calls, batched)
        bad = [o for o in outputs if o != "1"]
        if bad:
            raise RuntimeError(f"the sandbox did not print 1: {bad[0]!r}")
        out["python"][way] = summary(seconds, wall, len(calls))
    out["python"]["workers"] = python.settings.workers

    corpus = env.data("test").corpus  # the test split's, as evaluation searches it
    started = time.perf_counter()  # a fresh index (the environment's may be built already)
    search = SearchTool(
        [searchable_text(d) for d in corpus], k=env.settings.search_k, settings=env.tool_settings
    )
    out["search"]["index_seconds"] = time.perf_counter() - started
    out["search"]["documents"] = len(corpus)
    # What an agent searches for: the documents' titles (entity names), cycled.
    titles = [d.title for d in corpus]
    queries = [{"query": titles[i % len(titles)]} for i in range(args.search_queries)]
    seconds, wall, outputs = timed_calls(search, queries, batched=False)
    out["search"]["single"] = summary(seconds, wall, len(queries))
    batches, wall, per_batch = [], 0.0, []
    for i in range(0, len(queries), args.search_batch):
        chunk = queries[i : i + args.search_batch]
        start = time.perf_counter()
        batches += search.execute_batch(chunk)
        per_batch.append(time.perf_counter() - start)
    wall = sum(per_batch)
    if batches != outputs:
        raise RuntimeError("batched search returned other results than single queries")
    out["search"]["batched"] = summary(per_batch, wall, len(queries)) | {"batch": args.search_batch}
    return out


def summary(seconds: list[float], wall: float, calls: int) -> dict:
    return {
        "calls": calls,
        "wall_s": wall,
        "per_s": calls / wall,
        "median_ms": 1000 * statistics.median(seconds),
        "p90_ms": 1000 * percentile(seconds, 0.9),
    }


def tools_table(part: dict) -> list[str]:
    py, se = part["python"], part["search"]
    return [
        "| tool | way | calls | wall s | calls/s | median ms | p90 ms |",
        "|---|---|---:|---:|---:|---:|---:|",
        *(
            f"| python `print(1)` | {label} | {py[k]['calls']} | {py[k]['wall_s']:.2f} "
            f"| {py[k]['per_s']:.1f} | {py[k]['median_ms']:.1f} | {py[k]['p90_ms']:.1f} |"
            for k, label in (
                ("execute", "execute, one after another"),
                ("execute_batch", f"execute_batch ({py['workers']} workers; ms: each call)"),
            )
        ),
        *(
            f"| search (BM25, {se['documents']} documents) | {label} | {se[k]['calls']} "
            f"| {se[k]['wall_s']:.2f} | {se[k]['per_s']:,.0f} | {se[k]['median_ms']:.2f} "
            f"| {se[k]['p90_ms']:.2f} |"
            for k, label in (
                ("single", "execute, one query a call"),
                ("batched", f"execute_batch, {se['batched']['batch']} a call (ms: each call)"),
            )
        ),
        "",
        f"Search index built in {se['index_seconds']:.2f} s (bm25s, imported on first use).",
    ]


# --- 3. rollouts with tool calls against the decode bound ----------------------------------------


def rollout_part(args, cfg) -> dict:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    from agents.episode_metrics import episode_metric_means
    from agents.rollout import RolloutSettings, agent_prefix, few_shot_examples, run_batched
    from bench.rollout_throughput import RequestLog, matmul_flops, model_shape, resolve_model
    from envs import make_env
    from envs.task_selection import task_list
    from flywheel.chat import ChatTokenizer
    from flywheel.inference import SamplingSettings, VLLMBackend

    label, model_dir = resolve_model(args)
    shape = model_shape(model_dir)
    cpus = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    print(f"timing float32 matmuls on 1 and {cpus} threads ...", file=sys.stderr)
    flops = {1: matmul_flops(1)}
    if cpus > 1:
        flops[cpus] = matmul_flops(cpus)

    inference = cfg.inference
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    # The engine starts before anything builds a search index: bm25s loads llvmlite, which
    # breaks a vLLM CPU worker started after it (envs/tools.py).
    backend = VLLMBackend.from_settings(str(model_dir), inference)
    try:
        env = make_env(cfg.env)
        test = task_list(env, "test", cfg.env, cfg.seed)
        if args.questions > len(test):
            sys.exit(f"--questions {args.questions}: the config holds {len(test)} test questions")
        task_ids = test[: args.questions]
        few_shot = cfg.env.few_shot if args.few_shot is None else args.few_shot
        prefix = agent_prefix(env, few_shot_examples(env, few_shot))
        sampling = SamplingSettings(temperature=0.0, max_tokens=inference.max_tokens)
        settings = RolloutSettings(cfg.env.max_steps, inference.max_model_len, sampling)
        env.tools("test")  # the index is built outside the timings, as a run's first step does
        backend.generate([chat.encode(prefix)[0] + chat.header_ids], sampling)  # warm-up
        log = RequestLog(backend.llm)
        clock = {"generate": 0.0, "step_all": 0.0, "steps": 0}
        generate, step_all = backend.generate, env.step_all

        def timed_generate(*a, **k):
            start = time.perf_counter()
            try:
                return generate(*a, **k)
            finally:
                clock["generate"] += time.perf_counter() - start

        def timed_step_all(moves):
            start = time.perf_counter()
            try:
                return step_all(moves)
            finally:
                clock["step_all"] += time.perf_counter() - start
                clock["steps"] += 1

        backend.generate, env.step_all = timed_generate, timed_step_all
        backend.llm.reset_prefix_cache()
        started = time.perf_counter()
        trajectories = run_batched(env, task_ids, backend, chat, prefix, settings, progress=False)
        seconds = time.perf_counter() - started
    finally:
        backend.close()

    load_after = os.getloadavg()[0]
    replies = [m for t in trajectories for m in t.messages[t.episode_start :] if m.token_ids]
    means = episode_metric_means(trajectories)
    requests = log.requests
    cached = sum(r.cached or 0 for r in requests)
    computed = sum(len(r.prompt) for r in requests) - cached
    engine_generated = sum(len(r.generated) for r in requests)
    return {
        "model": label, "model_dir": str(model_dir), "questions": len(task_ids),
        "few_shot": few_shot, "max_steps": cfg.env.max_steps, "max_tokens": inference.max_tokens,
        "seconds": seconds, "generate_seconds": clock["generate"],
        "tool_seconds": clock["step_all"], "generate_calls": log.calls,
        "generated_tokens": sum(len(m.token_ids) for m in replies),
        "engine_generated_tokens": engine_generated,
        "prompt_tokens_computed": computed, "prompt_tokens_cached": cached,
        "tool_calls": round(means.get("episode_tool_calls", 0.0) * len(trajectories)),
        "exact_match": sum(t.success for t in trajectories),
        "steps": sum(t.n_steps for t in trajectories),
        "flops": {str(k): v for k, v in flops.items()},
        "flops_per_token": shape.flops_per_token, "parameters": shape.parameters,
        "cpus": cpus, "load": load, "load_after": load_after,
    }  # fmt: skip


def si(value: float) -> str:
    import bench.rollout_throughput

    return bench.rollout_throughput.si(value)


def rollout_table(r: dict) -> list[str]:
    per_token = r["flops_per_token"]
    wall_rate = r["generated_tokens"] / r["seconds"]
    decode_rate = r["engine_generated_tokens"] / r["generate_seconds"]
    threads = list(r["flops"])
    lines = [
        f"{r['questions']} test questions, {r['model']}, greedy, <= {r['max_steps']} steps, "
        f"<= {r['max_tokens']} tokens a reply, {r['few_shot']}-shot prompt: {r['steps']} "
        f"steps, {r['tool_calls']} tool calls, {r['exact_match']} exact matches.",
        "",
        "| wall s | generate s | tools s (env.step_all) | generate calls | generated tokens "
        "| tokens/s (wall) | tokens/s (in generate) | prompt tokens computed / from cache |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['seconds']:.1f} | {r['generate_seconds']:.1f} | {r['tool_seconds']:.2f} "
        f"({r['tool_seconds'] / r['seconds']:.1%}) | {r['generate_calls']} "
        f"| {r['generated_tokens']:,} | {wall_rate:.1f} | {decode_rate:.1f} "
        f"| {r['prompt_tokens_computed']:,} / {r['prompt_tokens_cached']:,} |",
        "",
        "| decode bound | " + " | ".join(f"{t} thread{'s' * (t != '1')}" for t in threads) + " |",
        "|---|" + "---:|" * len(threads),
        "| float32 1024x1024 matmul FLOP/s | "
        + " | ".join(f"{si(f)}FLOP/s" for f in r["flops"].values())
        + " |",
        f"| decode bound at {si(per_token)}FLOPs a token (tokens/s) | "
        + " | ".join(f"{f / per_token:,.0f}" for f in r["flops"].values())
        + " |",
        "| generated tokens/s over the wall time, fraction of the bound | "
        + " | ".join(f"{wall_rate * per_token / f:.1%}" for f in r["flops"].values())
        + " |",
        "| model FLOP/s incl. prefill over the wall time, fraction of matmul FLOP/s | "
        + " | ".join(
            f"{(r['prompt_tokens_computed'] + r['engine_generated_tokens']) * per_token / r['seconds'] / f:.1%}"  # noqa: E501
            for f in r["flops"].values()
        )
        + " |",
        "",
        f"Model: {r['parameters'] / 1e6:.1f}M parameters; attention over the context is not "
        "counted, so the bound is optimistic. vLLM's CPU backend decodes on every core "
        "(flywheel/inference.py). "
        f"{r['cpus']} CPUs, load average {r['load']:.2f} at the start, "
        f"{r.get('load_after', r['load']):.2f} at the end"
        + (
            " (other processes were busy: timings are noisy)."
            if max(r["load"], r.get("load_after", 0)) >= 0.5
            else "."
        ),
    ]
    if any(wall_rate * per_token > f for f in r["flops"].values()):
        lines.append(
            "**The decode bound is not valid in this run:** the rollout ran faster than the "
            "matmul timing allows, so the matmuls were timed while other processes held the "
            "cores. Re-run on an idle machine."
        )
    return lines


# --- the report ----------------------------------------------------------------------------------


def machine() -> str:
    import torch

    try:
        import vllm

        engine = f", vLLM {vllm.__version__}"
    except ImportError:
        engine = ""
    return (
        f"{len(os.sched_getaffinity(0))} CPU cores ({platform.processor() or platform.machine()}), "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}{engine}"
    )


def report(command: str, cfg_file: str, overrides: list[str], results: dict) -> str:
    lines = [
        f"## {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {', '.join(results)}",
        "",
        f"Command: `{command}`. Config: `{cfg_file}`"
        + (f" with `{' '.join(overrides)}`" if overrides else "")
        + f". Machine: {machine()}.",
        "",
    ]
    if "estimators" in results:
        lines += ["### Estimators side by side (same warm start, same round-1 samples)", ""]
        lines += estimators_table(results["estimators"])
        lines += [
            f"- {r['estimator']}: " + "; ".join(r["notes"])
            for r in results["estimators"]["runs"]
            if r["notes"]
        ]
        lines.append("")
    if "rollout" in results:
        lines += ["### Rollouts with tool calls against the decode bound", ""]
        lines += rollout_table(results["rollout"]) + [""]
    if "tools" in results:
        lines += ["### Tools", ""] + tools_table(results["tools"]) + [""]
    return "\n".join(lines)


HEADER = """# Agent-R1 bench (`bench/agent_r1.py`)

Each section is one run: its command, the machine, its tables. `python -m bench.agent_r1 --help`
says what each part measures; `make bench-agent-r1` runs all of them.
"""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_cfg(args)
    results: dict = {}
    # The rollout part before the tools: its vLLM engine must start before bm25s is loaded.
    if "estimators" in args.parts:
        results["estimators"] = estimators_part(args, cfg)
    if "rollout" in args.parts:
        results["rollout"] = rollout_part(args, cfg)
    if "tools" in args.parts:
        results["tools"] = tools_part(args, cfg)
    command = "python -m bench.agent_r1 " + shlex.join(argv if argv is not None else sys.argv[1:])
    section = report(command.strip(), args.config, args.overrides, results)
    print(section)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    existing = args.out.read_text() if args.out.is_file() else HEADER
    args.out.write_text(existing.rstrip("\n") + "\n\n" + section + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
