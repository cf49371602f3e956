"""A scripted TextCraft expert: reads the recipes in the instruction and plans every action.

It sees what an agent sees (the instruction) plus one fact the game never shows: which items a tag
stands for (`planks` is satisfied by `oak planks`, `spruce planks`, ...), which the environment
hands it from the loaded crafting tree (`envs.textcraft.tag_members`; this module imports no
game, so the environment can use it). Items no listed recipe produces are fetched with `get`.

The plan: pick for every item the listed recipe (and for every tag the member) that needs the
fewest recipe applications to make one unit, work out how many of each item the goal needs
(recipes can yield several items per craft, so leftovers are reused), then emit gets and crafts
children first. Run `python -m envs.textcraft` for its success rate and plan lengths.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

_RECIPE = re.compile(r"craft (\d+) (.+?) using (.+)")
_INGREDIENT = re.compile(r"(\d+) (.+)")
_GOAL = re.compile(r"Goal: craft (.+)\.")


@dataclass(frozen=True)
class ExpertStep:
    thought: str
    action: str


@dataclass(frozen=True)
class _Recipe:
    count: int  # items one craft yields
    output: str
    inputs: tuple[tuple[int, str], ...]  # (count, item or tag name), as listed


class NoPlan(ValueError):
    """The listed recipes cannot make the goal (as far as the expert can tell)."""


def parse_instruction(instruction: str) -> tuple[list[_Recipe], str]:
    """The listed recipes, in order, and the goal's name."""
    recipes = []
    for line in instruction.splitlines():
        match = _RECIPE.fullmatch(line.strip())
        if match:
            inputs = tuple(
                (int(m[1]), m[2])
                for m in (_INGREDIENT.fullmatch(part.strip()) for part in match[3].split(","))
                if m
            )
            recipes.append(_Recipe(int(match[1]), match[2], inputs))
    goal = _GOAL.search(instruction)
    if goal is None:
        raise NoPlan("no 'Goal: craft X.' line in the instruction")
    return recipes, goal[1]


def _choose(
    recipes: list[_Recipe], members: Mapping[str, tuple[str, ...]]
) -> tuple[dict[str, _Recipe], dict[str, str]]:
    """Cheapest recipe per craftable item and cheapest member per tag.

    Cost = recipe applications (crafts and gets) to make one unit, found by relaxing to a fixed
    point; a recipe's inputs always cost strictly less than its output, so choices form no cycle.
    """
    by_output: dict[str, list[_Recipe]] = {}
    for recipe in recipes:
        by_output.setdefault(recipe.output, []).append(recipe)
    names = {r.output for r in recipes} | {name for r in recipes for _, name in r.inputs}
    cost = {name: 1.0 for name in names if name not in by_output and name not in members}
    recipe_of: dict[str, _Recipe] = {}
    member_of: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for tag in sorted(names & members.keys()):
            for member in members[tag]:
                if cost.get(member, math.inf) < cost.get(tag, math.inf):
                    cost[tag], member_of[tag], changed = cost[member], member, True
        for output, options in by_output.items():
            for recipe in options:
                total = 1 + sum(cost.get(name, math.inf) for _, name in recipe.inputs)
                if total < cost.get(output, math.inf):
                    cost[output], recipe_of[output], changed = total, recipe, True
    return recipe_of, member_of


def solve(instruction: str, members: Mapping[str, tuple[str, ...]]) -> list[ExpertStep]:
    """The expert's plan for a TextCraft instruction, given which items each tag stands for
    (`envs.textcraft.tag_members`); raises NoPlan when it finds none."""
    recipes, goal = parse_instruction(instruction)
    recipe_of, member_of = _choose(recipes, members)
    if goal not in recipe_of:
        raise NoPlan(f"no listed recipe chain makes {goal}")

    def resolve(name: str) -> str:
        return member_of.get(name, name)

    order: list[str] = []  # children before parents

    def visit(item: str, seen: set[str]) -> None:
        if item in seen:
            return
        seen.add(item)
        if item in recipe_of:
            for _, name in recipe_of[item].inputs:
                visit(resolve(name), seen)
        order.append(item)

    visit(goal, set())
    needed = dict.fromkeys(order, 0)
    needed[goal] = 1
    crafts: dict[str, int] = {}
    for item in reversed(order):  # parents first: an item's total is known before its inputs'
        if item in recipe_of:
            recipe = recipe_of[item]
            crafts[item] = math.ceil(needed[item] / recipe.count)
            for count, name in recipe.inputs:
                needed[resolve(name)] += count * crafts[item]

    plan = []
    for item in order:
        if item not in recipe_of:
            plan.append(
                ExpertStep(
                    f"I need {needed[item]} {item}, which no recipe makes, so I fetch it.",
                    f"get {needed[item]} {item}",
                )
            )
            continue
        recipe = recipe_of[item]
        inputs = ", ".join(f"{count} {resolve(name)}" for count, name in recipe.inputs)
        action = f"craft {recipe.count} {item} using {inputs}"
        times = crafts[item]
        for i in range(times):
            if item == goal:
                thought = f"I have everything for the goal; craft {item} from {inputs}."
            elif i == 0 and times == 1:
                pronoun = "it" if needed[item] == 1 else "them"
                thought = f"I need {needed[item]} {item}; craft {pronoun} from {inputs}."
            elif i == 0:
                thought = (
                    f"I need {needed[item]} {item}; craft it {times} times, each from {inputs}."
                )
            else:
                thought = f"Craft {item} again ({i + 1} of {times})."
            plan.append(ExpertStep(thought, action))
    return plan
