"""Stage: the results table and a success-rate plot, into the store, MLflow and the Prefect UI."""

from __future__ import annotations

import base64
import io

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flywheel.confidence import wilson_interval
from flywheel.records import Manifest
from flywheel.stage import TrackingRef, artifact_key
from flywheel.storage import ArtifactStore


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


def success_plot(rows: list[dict], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
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
    ax.set_ylabel("success rate on test tasks (%)\nbars: 95% Wilson interval")
    ax.set_ylim(
        0, min(100.0, max(10.0, max((100 * r["ci95_high"] for r in rows), default=0) * 1.15))
    )
    ax.set_title(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


@task(name="report")
def report_stage(
    store_url: str,
    run_url: str,
    title: str,
    evaluations: list[tuple[str, Manifest]],
    notes: list[str],
    tracking: TrackingRef | None = None,
) -> str:
    """Not cached: every flow run writes its own report into its own MLflow parent run."""
    store = ArtifactStore(store_url)
    rows = results_rows(evaluations)
    table = markdown_table(rows)
    png = success_plot(rows, title)
    store.write_json(f"{run_url}/results.json", rows)
    noted = table + ("\n" + "".join(f"- {n}\n" for n in notes) if notes else "")
    store.write_text(f"{run_url}/results.md", noted)  # the table, and why rounds stopped
    store.write_bytes(f"{run_url}/success_rate.png", png)
    links = [f"- Artifacts: `{run_url}`"]
    if tracking:
        tracker = tracking.tracker()
        tracker.log_files(
            tracking.parent_run_id, {"results.md": noted.encode(), "success_rate.png": png}
        )
        if rows:
            columns = {key: [row[key] for row in rows] for key in rows[0]}
            tracker.client.log_table(tracking.parent_run_id, columns, "results.json")
        for step, row in enumerate(rows):
            tracker.log_metrics(
                tracking.parent_run_id, {"test_success_rate": row["success_rate"]}, step
            )
        links.append(f"- MLflow run: {tracker.run_url(tracking.parent_run_id)}")
    image = base64.b64encode(png).decode()
    markdown = "\n".join(
        [f"# {title}", "", table, f"![success rate](data:image/png;base64,{image})", "", *links]
        + ([""] + [f"- {n}" for n in notes] if notes else [])
    )
    key = artifact_key(run_url)
    create_table_artifact(rows, key=f"{key}-results", description=title)
    create_markdown_artifact(markdown, key=f"{key}-report", description=title)
    return table
