"""What the project knows about the games behind AgentGym's servers: their task prompts, experts
and oracles, for `envs.agentgym.AgentGymEnv`.

Task prompts: the first turn AgentGym's clients send for each environment (agentenv/agentenv/envs/
textcraft.py, `TextCraftEnvClient.conversation_start`, and sciworld.py, `SciWorldAdapter`'s ReAct
conversation start, at WooooDyy/AgentGym 3ef9235), word for word, and laid out as AgentGym's
clients lay it out: no system message; the prompt is the first user turn, answered by the assistant
with `PROMPT_ACKNOWLEDGEMENT` (no loss), and the task's first observation is the next user turn
(`Environment.prompt_acknowledgement`, `agents.rollout.instruction_part`).

Experts, where the game behind the server is one the project plays:
- TextCraft: the project's planner (`envs.textcraft_expert.solve`) on the server's own task text,
  its recipes and goal (item ids such as `minecraft:oak_planks` read as `oak planks`). It solves
  all 544 of AgentGym's tasks.
- SciWorld: ScienceWorld's gold path for the task and variation the server's `/reset` reports
  (`task_name`, `var_num`), generated without simplifications, as AgentGym's server loads tasks.

Oracles (`mistakes`): TextCraft's, replayed on the local game (the same rules, the `textcraft`
package's) for the goal the task text names. SciWorld has none, as the project's ScienceWorld has
none: no cheap test says whether a step made the goal unreachable.
"""

from __future__ import annotations

import functools
import re

TEXTCRAFT_PROMPT = (
    "You are given few useful crafting recipes to craft items in Minecraft. Crafting commands "
    'are of the format "craft [target object] using [input ingredients]".\nEvery round I will '
    "give you an observation, you have to respond an action based on the state and instruction. "
    'You can "get" an object (ingredients) from the inventory or the environment, look-up the '
    'game inventory by "inventory", or "craft" (target) using any of the crafting commands.\n'
    'Your output must strictly follow this format:"Thought:\nyour thoughts.\n\nAction:\nyour '
    'next action"\n\nReminder: \n1. Always specify the quantity when using "get" and "craft" '
    "commands. - Example of get: get 1 lapis lazuli - Example1 of craft: craft 1 blue dye using 1 "
    "lapis lazuli - Example2 of craft: craft 1 golden carrot using 8 gold nugget, 1 carrot\n2. "
    'When using "get" command, do not specify whether the item comes from the inventory or the '
    "environment.\n3. You can use ONLY crafting commands provided, do not use your own crafting "
    'commands. However, if the crafting command uses a generic ingredient like "planks", you can '
    'use special types of the same ingredient e.g. "dark oak planks" in the command instead.\n\n'
)
_SCIWORLD_ACTIONS = (
    ("open/close OBJ", "open/close a container"),
    ("de/activate OBJ", "activate/deactivate a device"),
    ("connect OBJ to OBJ", "connect electrical components"),
    ("disconnect OBJ", "disconnect electrical components"),
    ("use OBJ [on OBJ]", "use a device/item"),
    ("look around", "describe the current room"),
    ("look at OBJ", "describe an object in detail"),
    ("look in OBJ", "describe a container's contents"),
    ("read OBJ", "read a note or book"),
    ("move OBJ to OBJ", "move an object to a container"),
    ("pick up OBJ", "move an object to the inventory"),
    ("put down OBJ", "drop an inventory item"),
    ("pour OBJ into OBJ", "pour a liquid into a container"),
    ("dunk OBJ into OBJ", "dunk a container into a liquid"),
    ("mix OBJ", "chemically mix a container"),
    ("go to LOC", "move to a new location"),
    ("eat OBJ", "eat a food"),
    ("flush OBJ", "flush a toilet"),
    ("focus on OBJ", "signal intent on a task object"),
    ("wait", "take no action for 10 iterations"),
    ("wait1", "take no action for 1 iteration"),
)
_SCIWORLD_LAST_ACTIONS = (
    ("task", "describe current task"),
    ("inventory", "list your inventory"),
)


def _sciworld_prompt() -> str:
    """AgentGym's SciWorld ReAct prompt: its action list is JSON-like, with one entry (examine)
    written without spaces after the colons and commas, as AgentGym writes it."""
    entries = [f'{{"action": "{a}", "description": "{d}"}}' for a, d in _SCIWORLD_ACTIONS]
    entries.append(
        '{"action":"examine OBJ","description":"provides a description of the objects present '
        'on or in a receptacle."}'
    )
    entries += [f'{{"action": "{a}", "description": "{d}"}}' for a, d in _SCIWORLD_LAST_ACTIONS]
    return (
        "You are an agent for science world. Every round I will give you an observation, you "
        "have to respond an action based on the observation to finish the given task. Here are "
        f"the actions you may take: [{', '.join(entries)}]\nYour response should use the "
        "following format:\nThought:\nyour thoughts.\n\nAction:\nyour next action"
    )


SCIWORLD_PROMPT = _sciworld_prompt()
# The assistant turn AgentGym's TextCraft and SciWorld clients put after their task prompt.
PROMPT_ACKNOWLEDGEMENT = "OK. I'll follow your instructions and try my best to solve the task."
# AgentGym's SciWorld server loads every task without simplifications.
SCIWORLD_SIMPLIFICATION = ""

_ITEM_ID = re.compile(r"minecraft:([A-Za-z0-9_]+)")
_GOAL = re.compile(r"Goal: craft (.+)\.")


def readable_items(text: str) -> str:
    """`minecraft:oak_planks` → `oak planks`, as TextCraft names items in its recipes."""
    return _ITEM_ID.sub(lambda m: m[1].replace("_", " "), text)


def textcraft_plan(instruction: str) -> list[tuple[str, str]] | None:
    """The planner's (thought, action) steps for a TextCraft task text; None when it has none."""
    from envs.textcraft import tag_members
    from envs.textcraft_expert import NoPlan, solve

    try:
        plan = solve(readable_items(instruction), tag_members())
    except NoPlan:
        return None
    return [(step.thought, step.action) for step in plan] or None


def textcraft_goal(instruction: str) -> str | None:
    """The goal's item id without `minecraft:` (`mossy_stone_bricks`), from the task text."""
    match = _GOAL.search(readable_items(instruction))
    return match[1].replace(" ", "_") if match else None


def textcraft_mistakes(instruction: str, actions: list[str | None]) -> list[bool] | None:
    """TextCraft's oracle (`envs.textcraft.wasted_steps`) for the goal the task text names."""
    from envs.textcraft import is_item, wasted_steps

    goal = textcraft_goal(instruction)
    if goal is None or not is_item(goal):
        return None
    return wasted_steps(goal, actions)


@functools.cache
def _gold_paths():
    from envs.scienceworld import ScienceWorldEnv

    return ScienceWorldEnv(simplification=SCIWORLD_SIMPLIFICATION)


def sciworld_plan(reset_answer: dict) -> list[tuple[str, str]] | None:
    """ScienceWorld's gold path for the task and variation a SciWorld `/reset` answer names."""
    name, variation = reset_answer.get("task_name"), reset_answer.get("var_num")
    if not isinstance(name, str) or isinstance(variation, bool) or not isinstance(variation, int):
        return None
    return _gold_paths().expert_plan(f"{name}/{variation}")
