"""Train one Agent-R1 RL update on a finished run's stored samples, and evaluate it.

    .venv/bin/python -m experiments.rl_from_samples --run runs/agent-r1-qa --name dr-grpo \\
        rl.estimator=dr-grpo rl.learning_rate=2e-4

Takes the run's warm start (`<run>/sft/model`) and its first round's sampled groups
(`<run>/round-1/sample`), so settings of the RL step are compared on the same episodes, which a
fresh flow run cannot do (vLLM's batching makes each run's draw differ). Runs the RL stage and
the evaluation on the config's held-out questions without Prefect or the cache, writes under
`--out/<name>`, prints one JSON line and appends it to `--out/results.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> dict:
    from agents.rollout import agent_prefix
    from envs import make_env
    from envs.task_selection import task_list
    from flows.agent_r1 import AgentR1Config
    from flywheel.config_files import load_config
    from flywheel.stage import StageOutput
    from tasks.evaluate import EvaluateInputs, evaluate_stage
    from tasks.rl import RLInputs, rl_stage

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished Agent-R1 run's folder")
    parser.add_argument("--name", required=True, help="this variant's folder under --out")
    parser.add_argument("--config", default=str(ROOT / "configs" / "agent_r1_qa.yaml"))
    parser.add_argument("--out", default=str(ROOT / "runs" / "rl-from-samples"))
    parser.add_argument("overrides", nargs="*", help="key=value on top of --config")
    args = parser.parse_args(argv)
    run = Path(args.run).resolve()
    samples = run / "round-1" / "sample" / "trajectories.jsonl"
    if not (run / "sft" / "model").is_dir() or not samples.is_file():
        parser.error(f"{run} has no sft/model or round-1/sample/trajectories.jsonl: run the flow")
    cfg = load_config(AgentR1Config, args.config, args.overrides)
    out = Path(args.out).resolve() / args.name
    started = time.perf_counter()
    trained = rl_stage.fn(
        RLInputs(model_url=f"file://{run}/sft/model", data_url=f"file://{samples}",
                 settings=cfg.rl, seed=cfg.seed + 1),
        StageOutput(store_url=f"file://{out}", url=f"file://{out}/rl"),
    )  # fmt: skip
    trained_s = time.perf_counter() - started
    env = make_env(cfg.env)
    evaluated = evaluate_stage.fn(
        EvaluateInputs(
            model_url=trained.files["model"], env=cfg.env,
            task_ids=task_list(env, "test", cfg.env, cfg.seed), prefix=agent_prefix(env, []),
            inference=cfg.inference, max_steps=cfg.env.max_steps,
        ),
        StageOutput(store_url=f"file://{out}", url=f"file://{out}/evaluate"),
    )  # fmt: skip
    result = {
        "name": args.name, "run": str(run), "overrides": args.overrides,
        "solved": evaluated.counts["successes"], "episodes": evaluated.counts["episodes"],
        "eval_metrics": evaluated.metrics, "rl_metrics": trained.metrics,
        "rl_s": trained_s, "eval_s": time.perf_counter() - started - trained_s,
    }  # fmt: skip
    print(json.dumps(result))
    with open(out.parent / "results.jsonl", "a") as log:
        log.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":  # vLLM's engine process re-imports this module
    main()
