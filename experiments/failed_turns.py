"""How much of a training set teaches mistakes: of the assistant turns that carry a loss, how many
are answered by an observation saying the action failed.

    python -m experiments.failed_turns runs/agent-r-textcraft/round-1/sft-data/trajectories.jsonl

Expert data scores 0 here; a revision-SFT set built from sampled "good" continuations (a tree
path that reached the goal can still hold failed actions on the way) need not.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.run_files import read_records
from flywheel.records import Trajectory

FAILURE = "Could not"  # TextCraft's reply to an action it cannot carry out


def failed_turns(records: list[Trajectory], failure: str = FAILURE) -> tuple[int, int]:
    """(loss-bearing assistant turns, those whose next message reports a failure)."""
    turns = failed = 0
    for record in records:
        messages = record.messages
        for i, message in enumerate(messages):
            if message.role == "assistant" and message.loss:
                turns += 1
                following = messages[i + 1].content if i + 1 < len(messages) else ""
                failed += failure in following
    return turns, failed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", type=Path, nargs="+", help="trajectories (.jsonl), one a line")
    parser.add_argument("--failure", default=FAILURE, help="text of a failed-action observation")
    args = parser.parse_args(argv)
    for path in args.files:
        records = read_records(path, Trajectory)
        turns, failed = failed_turns(records, args.failure)
        share = f"{failed / turns:.0%}" if turns else "-"
        print(f"{path}: {len(records)} rows, {turns} trained turns, {failed} ({share}) failed")


if __name__ == "__main__":
    main()
