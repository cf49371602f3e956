"""Does an Agent-R policy revise? For each evaluated stage of a run: the episodes where the game
refused an action, how many of those still reached the goal, how many answer a refusal with the
revision turn's action (the environment's no-op, TextCraft's `inventory`), and how many hold a
revision turn's thought (one the splice stage trains on, `tasks.splice.REVISION_THOUGHTS`).

    python -m experiments.revision_turns runs/agent-r-textcraft
    python -m experiments.revision_turns runs/efficacy-agent-r-seed0 --split validation
    python -m experiments.revision_turns runs/agent-r-textcraft --max-steps 6   # + the round's revisions

Agent-R's round is meant to teach the policy to notice its error and go back; a round whose
evaluations show no revision turn changed the policy some other way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.run_files import read_records
from envs.textcraft import TextCraftEnv
from experiments.failed_turns import FAILURE
from flywheel.chat import parse_reply
from flywheel.records import Trajectory
from flywheel.settings import EvaluateSettings
from tasks.splice import REVISION_THOUGHTS


def refusals(episode: Trajectory, failure: str) -> list[int]:
    """Positions of the observations saying that the agent's action was refused."""
    messages = episode.messages
    return [
        i for i in range(1, len(messages))
        if messages[i - 1].role == "assistant" and messages[i].role == "user"
        and failure in messages[i].content
    ]  # fmt: skip


def revision_behaviour(
    episodes: list[Trajectory], failure: str = FAILURE, noop: str = TextCraftEnv.noop_action
) -> dict[str, int]:
    """Episodes; those with a refused action; of those, solved; those answering a refusal with the
    no-op action; those holding a revision thought."""
    refused = solved_after_refusal = noop_after_refusal = revised = 0
    for episode in episodes:
        messages, refused_at = episode.messages, refusals(episode, failure)
        refused += bool(refused_at)
        solved_after_refusal += bool(refused_at) and episode.success
        noop_after_refusal += any(
            i + 1 < len(messages) and parse_reply(messages[i + 1].content).action == noop
            for i in refused_at
        )
        revised += has_revision_thought(episode)
    return {
        "episodes": len(episodes), "refused": refused, "solved_after_refusal": solved_after_refusal,
        "noop_after_refusal": noop_after_refusal, "revised": revised,
    }  # fmt: skip


def has_revision_thought(record: Trajectory) -> bool:
    replies = [m.content for m in record.messages if m.role == "assistant"]
    return any(thought in reply for reply in replies for thought in REVISION_THOUGHTS)


def revision_lengths(records: list[Trajectory]) -> list[int]:
    """Agent turns of each training row that holds a revision turn, shortest first: a row longer
    than the evaluation's step limit shows a recovery no evaluated episode has room for."""
    return sorted(
        sum(m.role == "assistant" for m in r.messages) for r in records if has_revision_thought(r)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a run's folder (storage_url/run_name)")
    parser.add_argument("stages", nargs="*", help="evaluated stages (default: every one)")
    parser.add_argument("--split", choices=["test", "validation"], default="test",
                        help="which evaluations: validation while choosing settings")  # fmt: skip
    parser.add_argument("--failure", default=FAILURE, help="text of a refused action's observation")
    parser.add_argument("--noop", default=TextCraftEnv.noop_action,
                        help="the revision turn's action (the environment's no-op)")  # fmt: skip
    parser.add_argument("--max-steps", type=int, default=None,
                        help="the run's env.max_steps: also list the length of every revision row "
                        "of each round's training data against it")  # fmt: skip
    args = parser.parse_args(argv)
    folder = args.run / EvaluateSettings(split=args.split).folder
    evaluated = sorted(p.name for p in folder.glob("*") if (p / "trajectories.jsonl").exists())
    for stage in args.stages:
        if stage not in evaluated:
            parser.error(f"no evaluation of stage {stage!r} in {folder}; evaluated: {evaluated}")
    if not evaluated:
        parser.error(f"no evaluated stage in {folder}: run the recipe first, or pick --split")
    print(
        "| stage | episodes | a refused action | solved after one | the no-op after one "
        "| a revision thought |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for stage in args.stages or evaluated:
        episodes = read_records(folder / stage / "trajectories.jsonl", Trajectory)
        counts = revision_behaviour(episodes, args.failure, args.noop)
        print(
            f"| {stage} | {counts['episodes']} | {counts['refused']} | "
            f"{counts['solved_after_refusal']} | {counts['noop_after_refusal']} | "
            f"{counts['revised']} |"
        )
    if args.max_steps is not None:
        rounds = sorted(args.run.glob("round-*/revisions/trajectories.jsonl"))
        if not rounds:
            print(f"no round's revision rows under {args.run} (round-*/revisions)")
        for data in rounds:
            lengths = revision_lengths(read_records(data, Trajectory))
            fit = sum(n <= args.max_steps for n in lengths)
            print(
                f"{data.parent.parent.name}: {len(lengths)} revision rows, {fit} within "
                f"{args.max_steps} agent turns; turns: {lengths}"
            )


if __name__ == "__main__":
    main()
