"""Report: ET-Agent's behaviour of each evaluated policy (the radar), beside the success table.

Each evaluated policy's greedy test episodes are read back and measured on the five axes of
`agents.behaviour`: correctness, efficiency (correct answers per tool call), conciseness,
successful execution, reasoning length. Written to the run's folder (`behaviour.md`,
`behaviour.json`, `radar.png`), to the flow's MLflow run and as a Prefect artifact.

Conciseness here is judged by a rule, one vote per episode: an episode that repeats a tool call
it already made (same tool, same arguments) made a redundant call. The report says so.
"""

from __future__ import annotations

import base64
import io

from agents.behaviour import BehaviourMetrics, behaviour_metrics, episode_summary
from agents.formats import AgentFormat, ToolCall, make_format
from flywheel.confidence import wilson_interval
from flywheel.records import Manifest, Trajectory
from flywheel.stage import TrackingRef, publish_markdown, report_task
from flywheel.storage import ArtifactStore

AXES = ("correctness", "efficiency", "conciseness", "successful execution", "brevity")
JUDGE_NOTE = (
    "conciseness: one rule-based vote per episode (a tool call repeated with the same arguments "
    "is redundant); correctness: the answer's exact match"
)


def repeats_a_call(trajectory: Trajectory, agent_format: AgentFormat) -> bool:
    """Whether the episode calls a tool again with arguments it already used."""
    seen = set()
    for message in trajectory.continuation:
        if message.role != "assistant":
            continue
        move = agent_format.parse(message.content)
        if isinstance(move, ToolCall):
            key = (move.name, tuple(sorted((k, str(v)) for k, v in move.arguments.items())))
            if key in seen:
                return True
            seen.add(key)
    return False


def policy_behaviour(trajectories: list[Trajectory], agent_format: AgentFormat) -> dict:
    """The radar metrics of one policy, and tool calls per correct answer."""
    summaries = [
        episode_summary(t, agent_format, redundancy_votes=[repeats_a_call(t, agent_format)])
        for t in trajectories
    ]
    metrics = behaviour_metrics(summaries)
    solved = sum(t.success for t in trajectories)
    return {
        **metrics.model_dump(),
        "solved": solved,
        "calls_per_correct_answer": metrics.tool_calls / solved if solved else None,
    }


def radar_values(rows: list[dict]) -> list[list[float]]:
    """Each policy's five axes on [0, 1]: the shares as they are, efficiency as it is (at most
    one correct answer per call here), reasoning length as brevity: the shortest policy's mean
    length over this one's (1 for the shortest)."""
    shortest = min((r["reasoning_length"] for r in rows if r["reasoning_length"]), default=0)
    values = []
    for r in rows:
        brevity = shortest / r["reasoning_length"] if r["reasoning_length"] else 0.0
        values.append(
            [
                r["correctness"],
                min(1.0, r["efficiency"] or 0.0),
                r["conciseness"] or 0.0,
                r["successful_execution"] or 0.0,
                brevity,
            ]
        )
    return values


def radar_plot(rows: list[dict], title: str) -> bytes:
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    angles = [2 * math.pi * i / len(AXES) for i in range(len(AXES))]
    fig = plt.figure(figsize=(5.5, 5), dpi=100)
    ax = fig.add_subplot(polar=True)
    for row, values in zip(rows, radar_values(rows), strict=True):
        ax.plot([*angles, angles[0]], [*values, values[0]], label=row["stage"])
        ax.fill([*angles, angles[0]], [*values, values[0]], alpha=0.08)
    ax.set_xticks(angles, AXES)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(loc="lower left", bbox_to_anchor=(-0.15, -0.15), fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def behaviour_table(rows: list[dict]) -> str:
    lines = [
        "| policy | correctness (95% interval, n) | correct answers per tool call | tool calls "
        "per correct answer | concise | tool results without error | reasoning tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, high = wilson_interval(r["solved"], r["episodes"])
        per_answer, efficiency = r["calls_per_correct_answer"], r["efficiency"]
        lines.append(
            f"| {r['stage']} | {percent(r['correctness'])} ({percent(low)}–{percent(high)}, "
            f"{r['solved']}/{r['episodes']}) | "
            f"{'–' if efficiency is None else format(efficiency, '.3f')} | "
            f"{'–' if per_answer is None else format(per_answer, '.1f')} | "
            f"{percent(r['conciseness'])} | {percent(r['successful_execution'])} | "
            f"{r['reasoning_length']:.1f} |"
        )
    return "\n".join(lines) + f"\n\n{JUDGE_NOTE}.\n"


@report_task("behaviour-report")
def behaviour_report(
    store_url: str,
    run_url: str,
    title: str,
    evaluations: list[tuple[str, Manifest]],
    agent_format: str,
    tool_arguments: dict[str, str],
    tracking: TrackingRef | None = None,
) -> list[dict]:
    """The behaviour table and radar of every evaluated policy. Not cached, like the report."""
    store = ArtifactStore(store_url)
    parse = make_format(agent_format, tool_arguments)
    rows = [
        {"stage": label, **policy_behaviour(read_episodes(store, m), parse)}
        for label, m in evaluations
    ]
    table, png = behaviour_table(rows), radar_plot(rows, f"{title}: behaviour")
    store.write_json(f"{run_url}/behaviour.json", rows)
    store.write_text(f"{run_url}/behaviour.md", table)
    store.write_bytes(f"{run_url}/radar.png", png)
    if tracking:
        tracker = tracking.tracker()
        tracker.log_files(
            tracking.parent_run_id, {"behaviour.md": table.encode(), "radar.png": png}
        )
        for step, row in enumerate(rows):
            numbers = {k: v for k, v in row.items() if k in BehaviourMetrics.model_fields}
            tracker.log_metrics(
                tracking.parent_run_id,
                {f"behaviour/{k}": float(v) for k, v in numbers.items() if _number(v)},
                step,
            )
    image = base64.b64encode(png).decode()
    publish_markdown(
        f"# {title}: behaviour\n\n{table}\n![radar](data:image/png;base64,{image})\n",
        key=f"{run_url}-behaviour",
        description=f"{title}: behaviour radar",
    )
    return rows


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_episodes(store: ArtifactStore, evaluation: Manifest) -> list[Trajectory]:
    return store.read_records(evaluation.files["trajectories"], Trajectory)
