"""Stage: step pairs with each decision's votes balanced, so that DPO learns where a shared
decision goes differently, not which way it goes on the whole.

Several families of tasks meet the same decision at the same point of the expert's path (on the
QA world, after two lookups: answer, or call python?). Each family's step pairs vote its own
way, and DPO on a small policy can move the reply that opens the decision for every task alike:
on one seed the pairs after two lookups voted answering +13 and python +1 over all families, and
the round answered there in every family, losing every task that needs python (docs/notebook.md,
issue 66's candidates 6 and 7, `experiments.step_decisions`).

Here, among the pairs at one step position, every contrast of two kinds of move (the tool a
reply calls, or the verb of a text action) keeps as many pairs in each direction: the larger side
is subsampled with the seed, so what a two-way contrast still teaches is which families want
which move, not which move is commoner. A contrast with one direction only (every family that
meets it agrees) is kept whole.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable

from pydantic import BaseModel

from envs.tools import CallRequest, read_action
from flywheel.records import Pair
from flywheel.settings import EnvSettings
from flywheel.stage import StageResult, StageRun, stage


def move_kind(action: str | None) -> str:
    """What kind of move an environment action is: a tool's name (`answer` for the final
    answer), or a text action's first word (`craft`, `get`); `-` for no readable move."""
    if not action:
        return "-"
    call = read_action(action)
    if isinstance(call, CallRequest):
        return call.name
    return "-" if action.lstrip().startswith("{") else action.split(maxsplit=1)[0].lower()


def balanced(pairs: list[Pair], kind: Callable[[Pair], tuple[str, str]], seed: int) -> list[Pair]:
    """`pairs` less the surplus of each contrast's larger direction at each step position (drawn
    with `seed`); pairs whose two sides make the same kind of move, and pairs of no step (whole
    trajectories), are kept. The kept pairs stay in their order."""
    contrasts: dict[tuple, dict[tuple[str, str], list[int]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for i, pair in enumerate(pairs):
        chosen, rejected = kind(pair)
        if pair.step is not None and chosen != rejected:
            contrasts[(pair.step, *sorted((chosen, rejected)))][(chosen, rejected)].append(i)
    dropped: set[int] = set()
    draw = random.Random(f"step-balance:{seed}")
    for key in sorted(contrasts):
        sides = list(contrasts[key].values())
        if len(sides) == 2:
            fewer = min(map(len, sides))
            for side in sides:
                dropped |= set(side) - set(draw.sample(side, fewer))
    return [p for i, p in enumerate(pairs) if i not in dropped]


class StepBalanceInputs(BaseModel):
    """The step pairs to balance, and how their replies are read."""

    pairs_url: str
    env: EnvSettings
    seed: int


@stage("step-balance")
def step_balance_stage(inputs: StepBalanceInputs, run: StageRun) -> StageResult:
    """The step pairs in `pairs.jsonl`, balanced; how many were found and dropped."""
    from agents.turns import turns_for
    from envs import make_env

    turns = turns_for(make_env(inputs.env))

    def kinds(pair: Pair) -> tuple[str, str]:
        return tuple(
            move_kind(turns.read(side[0].content).action) for side in (pair.chosen, pair.rejected)
        )

    pairs = run.store.read_records(inputs.pairs_url, Pair)
    kept = balanced(pairs, kinds, inputs.seed)
    return StageResult(
        files={"pairs": run.store.write_records(run.file("pairs.jsonl"), kept)},
        counts={
            "pairs": len(kept),
            "step_pairs_found": len(pairs),
            "dropped": len(pairs) - len(kept),
        },
    )
