"""Does an Agent-R policy revise? For each evaluated stage of a run: the episodes where the game
refused an action, how many of those still reached the goal, and how many episodes hold a
revision turn (one of the thoughts the splice stage trains on, `tasks.splice.REVISION_THOUGHTS`).

    python -m bench.revision_turns runs/agent-r-textcraft
    python -m bench.revision_turns runs/efficacy-agent-r-seed0 --split validation

Agent-R's round is meant to teach the policy to notice its error and go back; a round whose
evaluations show no revision turn changed the policy some other way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.failed_turns import FAILURE
from flywheel.records import Trajectory
from flywheel.settings import EvaluateSettings
from tasks.splice import REVISION_THOUGHTS


def revision_behaviour(episodes: list[Trajectory], failure: str = FAILURE) -> dict[str, int]:
    """Episodes; those with a refused action; of those, solved; those with a revision turn."""
    refused = solved_after_refusal = revised = 0
    for episode in episodes:
        replies = [m.content for m in episode.messages if m.role == "assistant"]
        observations = [
            later.content
            for earlier, later in zip(episode.messages, episode.messages[1:], strict=False)
            if earlier.role == "assistant" and later.role == "user"
        ]
        was_refused = any(failure in text for text in observations)
        refused += was_refused
        solved_after_refusal += was_refused and episode.success
        revised += any(thought in reply for reply in replies for thought in REVISION_THOUGHTS)
    return {
        "episodes": len(episodes), "refused": refused,
        "solved_after_refusal": solved_after_refusal, "revised": revised,
    }  # fmt: skip


def read_episodes(path: Path) -> list[Trajectory]:
    lines = path.read_text().splitlines()
    return [Trajectory.model_validate_json(line) for line in lines if line.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a run's folder (storage_url/run_name)")
    parser.add_argument("stages", nargs="*", help="evaluated stages (default: every one)")
    parser.add_argument("--split", choices=["test", "validation"], default="test",
                        help="which evaluations: validation while choosing settings")  # fmt: skip
    parser.add_argument("--failure", default=FAILURE, help="text of a refused action's observation")
    args = parser.parse_args(argv)
    folder = args.run / EvaluateSettings(split=args.split).folder
    evaluated = sorted(p.name for p in folder.glob("*") if (p / "trajectories.jsonl").exists())
    for stage in args.stages:
        if stage not in evaluated:
            parser.error(f"no evaluation of stage {stage!r} in {folder}; evaluated: {evaluated}")
    if not evaluated:
        parser.error(f"no evaluated stage in {folder}: run the recipe first, or pick --split")
    print("| stage | episodes | a refused action | solved after one | a revision turn |")
    print("|---|---:|---:|---:|---:|")
    for stage in args.stages or evaluated:
        counts = revision_behaviour(
            read_episodes(folder / stage / "trajectories.jsonl"), args.failure
        )
        print(
            f"| {stage} | {counts['episodes']} | {counts['refused']} | "
            f"{counts['solved_after_refusal']} | {counts['revised']} |"
        )


if __name__ == "__main__":
    main()
