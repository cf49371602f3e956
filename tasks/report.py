"""Stage: the results table and a success-rate plot, into the store, MLflow and the Prefect UI.

Beside each stage's success rate, the report compares each stage with the stage it started from
(SFT with the untrained model, round 1 with SFT, ...) task by task, since every stage is
evaluated on the same tasks: tasks gained, tasks lost, the exact McNemar p-value and a paired
bootstrap interval of the difference (`flywheel.confidence`). It names the split it read
(validation while tuning, test for the reported tables) and lists the validation and test tasks,
so a reader can check they are disjoint from each other and from training."""

from __future__ import annotations

import base64
import io

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flywheel.confidence import paired_comparison, wilson_interval
from flywheel.inference import sample_indices
from flywheel.records import Manifest, Trajectory
from flywheel.stage import TrackingRef, artifact_key, report_task
from flywheel.storage import ArtifactStore
from tasks.evaluate import label_variant, variant_label


def results_rows(evaluations: list[tuple[str, Manifest]]) -> list[dict]:
    rows = []
    for label, m in evaluations:
        solved, episodes = m.counts.get("successes", 0), m.counts.get("episodes", 0)
        low, high = wilson_interval(solved, episodes)
        rows.append(
            {
                "stage": label,
                "success_rate": round(m.metrics["success_rate"], 4),
                "ci95_low": round(low, 4),
                "ci95_high": round(high, 4),
                "solved": f"{solved}/{episodes}",
                "average_reward": round(m.metrics["average_reward"], 4),
                "average_steps": round(m.metrics["average_steps"], 2),
            }
        )
    return rows


def markdown_table(rows: list[dict]) -> str:
    header = (
        "| stage | success rate | 95% interval (Wilson) | solved (n) | average reward "
        "| average steps |\n|---|---|---|---|---|---|\n"
    )
    return header + "".join(
        f"| {r['stage']} | {r['success_rate']:.1%} | {r['ci95_low']:.1%}–{r['ci95_high']:.1%} "
        f"| {r['solved']} | {r['average_reward']:.3f} | {r['average_steps']:.1f} |\n"
        for r in rows
    )


def task_outcomes(store: ArtifactStore, manifest: Manifest) -> list[dict[str, bool]]:
    """Per sample index, task id -> solved, from an evaluation's trajectories: one dict for a
    greedy evaluation (one episode per task), k for k sampled episodes per task (a task's
    episodes are stored in sample order). Solved is the episode's success, never its reward:
    QA gives a wrong answer in the right format 0.1."""
    url = manifest.files.get("trajectories")
    if url is None:
        return []
    return outcomes_by_sample([(t.task_id, t.success) for t in store.read_records(url, Trajectory)])


def outcomes_by_sample(played: list[tuple[str, bool]]) -> list[dict[str, bool]]:
    """(task id, solved) per episode, a task's episodes in sample order -> per sample index,
    task id -> solved."""
    samples: list[dict[str, bool]] = []
    for (task_id, solved), index in zip(
        played, sample_indices([task_id for task_id, _ in played]), strict=True
    ):
        if index == len(samples):
            samples.append({})
        samples[index][task_id] = solved
    return samples


def started_from(labels: list[str], lineage: list[str], branches: dict[str, str]) -> dict[str, str]:
    """Evaluation label -> the label of the evaluation of the policy it was trained from.

    `lineage`: the policies in training order, each trained from the one before it (untrained,
    SFT, round 1, ...); a stage is compared with the nearest earlier one evaluated (a campaign
    round that trained nothing keeps the policy before it). `branches`: stages trained off the
    lineage (Agent-R's baselines, from SFT) -> their start."""
    present = set(labels)
    starts, last = {}, None
    for label in lineage:
        if label not in present:
            continue
        if last is not None:
            starts[label] = last
        last = label
    starts.update({k: v for k, v in branches.items() if k in present and v in present})
    return starts


def paired_rows(
    labels: list[str],
    outcomes: dict[str, list[dict[str, bool]]],
    starts: dict[str, str],
    resamples: int = 2000,
    seed: int = 0,
) -> list[dict]:
    """Per stage with a start: (task, sample) cells gained and lost against it, the difference
    in success rate over the cells both read, its paired bootstrap 95% interval, the exact
    McNemar p. Sample i of a stage is paired with sample i of its start (the same seeds); the
    bootstrap resamples tasks and samples as the efficacy bench resamples tasks and seeds."""
    rows = []
    for label in labels:
        start = starts.get(label)
        if start is None:
            continue
        pairs = list(zip(outcomes[start], outcomes[label], strict=False))
        shared = len(set.intersection(*(b.keys() & a.keys() for b, a in pairs))) if pairs else 0
        if shared == 0:
            continue
        compared = paired_comparison(pairs, resamples, seed)
        rows.append(
            {
                "stage": label,
                "started_from": start,
                "tasks": shared,
                "samples": len(pairs),
                "gained": compared["gained"],
                "lost": compared["lost"],
                "difference": round(compared["difference"], 4),
                "difference_ci95_low": round(compared["low"], 4),
                "difference_ci95_high": round(compared["high"], 4),
                "mcnemar_p": round(compared["p"], 4),
            }
        )
    return rows


def paired_table(rows: list[dict]) -> str:
    header = (
        "| stage | against (its start) | tasks | gained | lost | difference "
        "| 95% interval (paired bootstrap over tasks) | McNemar exact p |\n"
        "|---|---|---:|---:|---:|---:|---|---:|\n"
    )
    return header + "".join(
        f"| {r['stage']} | {r['started_from']} | {cells(r)} | {r['gained']} | {r['lost']} "
        f"| {r['difference']:+.1%} | {r['difference_ci95_low']:+.1%} to "
        f"{r['difference_ci95_high']:+.1%} | {r['mcnemar_p']:.4f} |\n"
        for r in rows
    )


def cells(row: dict) -> str:
    """The paired cells: `26`, or `26 × 4` for 4 samples per task."""
    samples = row.get("samples", 1)
    return f"{row['tasks']} × {samples}" if samples > 1 else str(row["tasks"])


def splits_text(evaluated: str, splits: dict[str, list[str]]) -> str:
    """Which split the rates are on, and each evaluation split's task ids."""
    lines = [f"Evaluated on the **{evaluated}** split ({len(splits.get(evaluated, []))} tasks)."]
    if evaluated == "test":
        lines[0] += " Choose settings on the validation split, not here (docs/evaluation.md)."
    lines += [
        f"- {name} tasks ({len(ids)}): {', '.join(ids) or 'none'}" for name, ids in splits.items()
    ]
    return "\n".join(lines) + "\n"


def success_plot(
    rows: list[dict], title: str, paired: list[dict] | None = None, split: str = "test"
) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, right) = plt.subplots(1, 2, figsize=(11, 3.4), dpi=100)
    labels = [r["stage"] for r in rows]
    values = [100 * r["success_rate"] for r in rows]
    errors = [
        [100 * (r["success_rate"] - r["ci95_low"]) for r in rows],
        [100 * (r["ci95_high"] - r["success_rate"]) for r in rows],
    ]
    bars = ax.bar(labels, values, color="#4c72b0", yerr=errors, capsize=4, ecolor="#333333")
    ax.bar_label(
        bars, labels=[f"{v:.1f}% ({r['solved']})" for v, r in zip(values, rows, strict=True)]
    )
    ax.set_ylabel(f"success rate on {split} tasks (%)\nbars: 95% Wilson interval")
    ax.set_ylim(
        0, min(100.0, max(10.0, max((100 * r["ci95_high"] for r in rows), default=0) * 1.15))
    )
    ax.set_title(title)
    difference_plot(right, paired or [])
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def difference_plot(ax, paired: list[dict]) -> None:
    """Each stage's difference from its start (points) with the paired bootstrap interval."""
    labels = [f"{r['stage']}\nvs {r['started_from']}" for r in paired]
    values = [100 * r["difference"] for r in paired]
    errors = [
        [100 * (r["difference"] - r["difference_ci95_low"]) for r in paired],
        [100 * (r["difference_ci95_high"] - r["difference"]) for r in paired],
    ]
    ax.axhline(0, color="#999999", linewidth=1)
    ax.errorbar(range(len(paired)), values, yerr=errors, fmt="o", capsize=4, color="#c44e52")
    for x, r in enumerate(paired):
        ax.annotate(
            f"+{r['gained']} -{r['lost']}, p={r['mcnemar_p']:.3f}", (x, values[x]),
            fontsize=7, xytext=(6, 0), textcoords="offset points", va="center",
        )  # fmt: skip
    ax.set_xticks(range(len(paired)), labels, fontsize=7)
    ax.set_xlim(-0.5, max(len(paired), 1) - 0.5 + 0.6)
    ax.set_ylabel("difference from its start (points)\nbars: 95% paired bootstrap")
    ax.set_title("each stage against the stage it started from")


VARIANT_TITLES = {
    "sampled": "Sampled episodes: success over every task's samples (pass@1 over k)",
    "harder": "Harder goals (test tasks beyond the trained difficulty), greedy",
    "harder-sampled": "Harder goals, sampled episodes (pass@1 over k)",
}


def report_tables(
    store: ArtifactStore,
    evaluations: list[tuple[str, Manifest]],
    lineage: list[str],
    branches: dict[str, str],
) -> dict[str, tuple[list[dict], list[dict]]]:
    """Per variant ("" for the greedy evaluations of the split's tasks, then "sampled",
    "harder", ...): the rates' rows and the paired rows (each stage against the stage it
    started from, both evaluated the same way on the same tasks)."""
    by_variant: dict[str, list[tuple[str, Manifest]]] = {}
    for label, manifest in evaluations:
        by_variant.setdefault(label_variant(label)[1], []).append((label, manifest))
    tables = {}
    for variant, group in sorted(by_variant.items(), key=lambda item: item[0] != ""):
        stages = [label_variant(label)[0] for label, _ in group]
        outcomes = {
            stage: task_outcomes(store, m) for stage, (_, m) in zip(stages, group, strict=True)
        }
        starts = started_from(stages, lineage, branches)
        paired = paired_rows(stages, outcomes, starts)
        for row in paired:  # named as in the rates' table
            row["stage"], row["started_from"] = (
                variant_label(row["stage"], variant), variant_label(row["started_from"], variant)
            )  # fmt: skip
        tables[variant] = results_rows(group), paired
    return tables


def report_markdown(
    tables: dict[str, tuple[list[dict], list[dict]]],
    evaluated_split: str,
    splits: dict[str, list[str]],
) -> str:
    text = ""
    for variant, (rows, paired) in tables.items():
        if variant:
            text += f"\n### {VARIANT_TITLES.get(variant, variant)}\n\n"
        text += markdown_table(rows)
        if paired:
            text += "\nEach stage against the stage it started from, task by task:\n\n"
            text += paired_table(paired)
    if splits:
        text += "\n" + splits_text(evaluated_split, splits)
    return text


def write_table_files(store: ArtifactStore, run_url: str, tables) -> None:
    """results.json and paired.json (the greedy tables), results-<variant>.json and
    paired-<variant>.json for each other evaluation this run made. A variant's files that an
    earlier run of the same name left are removed: readers (bench/efficacy.py) take a file's
    presence to mean this run evaluated that variant, and its episodes would be another policy's."""
    for variant in VARIANT_TITLES.keys() - tables.keys():
        for name in ("results", "paired"):
            store.remove(f"{run_url}/{name}-{variant}.json")
    for variant, (rows, paired) in tables.items():
        suffix = f"-{variant}" if variant else ""
        store.write_json(f"{run_url}/results{suffix}.json", rows)
        store.write_json(f"{run_url}/paired{suffix}.json", paired)


@report_task("report")
def report_stage(
    store_url: str,
    run_url: str,
    title: str,
    evaluations: list[tuple[str, Manifest]],
    notes: list[str],
    tracking: TrackingRef | None = None,
    lineage: list[str] | None = None,
    branches: dict[str, str] | None = None,
    evaluated_split: str = "test",
    splits: dict[str, list[str]] | None = None,
    header: str = "",
) -> str:
    """Not cached: every flow run writes its own report into its own MLflow parent run.
    `lineage` and `branches` say which stage started from which (`started_from`); `splits`: the
    evaluation splits' task ids, printed for a reader to check; `header`: a line above the
    tables (the precision the run computed in)."""
    store = ArtifactStore(store_url)
    tables = report_tables(store, evaluations, lineage or [], branches or {})
    rows, paired = tables.get("", ([], []))
    table = (f"{header}\n\n" if header else "") + report_markdown(
        tables, evaluated_split, splits or {}
    )
    png = success_plot(rows, title, paired, evaluated_split)
    write_table_files(store, run_url, tables)
    noted = table + ("\n" + "".join(f"- {n}\n" for n in notes) if notes else "")
    store.write_text(f"{run_url}/results.md", noted)  # the tables, and why rounds stopped
    store.write_bytes(f"{run_url}/success_rate.png", png)
    links = [f"- Artifacts: `{run_url}`"]
    if tracking:
        log_to_mlflow(tracking, noted, png, tables, evaluated_split)
        links.append(f"- MLflow run: {tracking.tracker().run_url(tracking.parent_run_id)}")
    image = base64.b64encode(png).decode()
    markdown = "\n".join(
        [f"# {title}", "", table, f"![success rate](data:image/png;base64,{image})", "", *links]
        + ([""] + [f"- {n}" for n in notes] if notes else [])
    )
    key = artifact_key(run_url)
    create_table_artifact(rows, key=f"{key}-results", description=title)
    create_markdown_artifact(markdown, key=f"{key}-report", description=title)
    return table


def log_to_mlflow(tracking: TrackingRef, noted: str, png: bytes, tables, split) -> None:
    tracker = tracking.tracker()
    tracker.log_files(
        tracking.parent_run_id, {"results.md": noted.encode(), "success_rate.png": png}
    )
    for variant, (rows, paired) in tables.items():
        suffix = f"-{variant}" if variant else ""
        for name, table in ((f"results{suffix}.json", rows), (f"paired{suffix}.json", paired)):
            if table:
                columns = {key: [row[key] for row in table] for key in table[0]}
                tracker.client.log_table(tracking.parent_run_id, columns, name)
    for step, row in enumerate(
        tables.get("", ([], []))[0]
    ):  # "test_success_rate", or "validation_..." while tuning
        tracker.log_metrics(
            tracking.parent_run_id, {f"{split}_success_rate": row["success_rate"]}, step
        )
