"""TextCraft adapter: deterministic tasks and instructions, a tree that never grows, safe steps."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envs.base import StepResult
from envs.textcraft import (
    TextCraftEnv,
    all_task_ids,
    instruction_for,
    load_game,
    reachable_recipes,
    split_of,
)

ROOT = Path(__file__).resolve().parents[1]

# Prints a digest of every task id, split and instruction. With REVERSE_LISTDIR set, os.listdir
# returns names in reverse order, as another filesystem might.
_DIGEST_SCRIPT = """
import hashlib, json, os, sys
if os.environ.get("REVERSE_LISTDIR"):
    _listdir = os.listdir
    os.listdir = lambda path: list(reversed(_listdir(path)))
from envs.textcraft import TextCraftEnv, instruction_for
env = TextCraftEnv()
data = {s: {t: instruction_for(t) for t in env.task_ids(s)} for s in ("train", "test")}
print(hashlib.sha256(json.dumps(data).encode()).hexdigest())
"""


def _digest_here() -> str:
    env = TextCraftEnv()
    data = {s: {t: instruction_for(t) for t in env.task_ids(s)} for s in ("train", "test")}
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()


def _digest_in_subprocess(hash_seed: str, reverse_listdir: bool = False) -> str:
    python_path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": python_path}
    env.pop("REVERSE_LISTDIR", None)
    if reverse_listdir:
        env["REVERSE_LISTDIR"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _DIGEST_SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout.strip()


def test_tasks_and_instructions_identical_across_processes_and_hash_seeds():
    here = _digest_here()
    assert _digest_in_subprocess("0") == here
    assert _digest_in_subprocess("12345") == here
    assert _digest_in_subprocess("777", reverse_listdir=True) == here


def test_task_ids_are_sorted_names_without_prefix():
    ids = all_task_ids()
    assert list(ids) == sorted(ids)
    assert len(ids) == len(set(ids)) == 419  # textcraft 0.0.3, recipes loaded in sorted order
    assert "yellow_bed" in ids
    assert not any(t.startswith("minecraft:") for t in ids)


def test_split_is_disjoint_stable_and_covers_all_tasks():
    env = TextCraftEnv()
    train, test = env.task_ids("train"), env.task_ids("test")
    assert set(train).isdisjoint(test)
    assert sorted(train + test) == list(all_task_ids())
    assert train == sorted(train) and test == sorted(test)
    assert (len(train), len(test)) == (321, 98)
    assert env.task_ids("test") == test  # same list on every call
    # pinned: the split is a function of the id alone (sha1 of the id)
    assert split_of("yellow_bed") == "train"
    assert split_of("acacia_button") == "test"
    assert split_of("beehive") == "test"
    with pytest.raises(ValueError):
        env.task_ids("dev")  # type: ignore[arg-type]
    assert env.task_ids("validation") == []  # none held out unless the run asks for some


def test_instruction_format():
    instruction = TextCraftEnv().start("yellow_bed").instruction
    head, goal = instruction.split("\n\n")
    assert goal == "Goal: craft yellow bed."
    lines = head.splitlines()
    assert lines[0] == "Crafting commands:"
    assert all(line.startswith("craft ") and " using " in line for line in lines[1:])
    assert len(lines[1:]) == len(set(lines[1:]))
    assert "craft 1 yellow bed using 1 white bed, 1 yellow dye" in lines
    assert "minecraft:" not in instruction


def _recipe_count() -> int:
    tree = load_game().crafting_tree
    return sum(map(len, tree.itemid_recipes.values())) + sum(map(len, tree.tag_recipes.values()))


def test_starting_episodes_never_grows_the_tree():
    env = TextCraftEnv()
    before = _recipe_count()
    first = instruction_for.__wrapped__("yellow_bed")  # bypass the cache: rebuild from the tree
    for task_id in all_task_ids()[:50]:
        episode = env.start(task_id)
        episode.step("get 1 oak logs")
        episode.step("craft 4 oak planks using 1 oak logs")
    for _ in range(50):
        assert env.start("yellow_bed").instruction == first
    assert instruction_for.__wrapped__("yellow_bed") == first
    assert _recipe_count() == before


def test_a_recipe_reached_along_two_paths_is_listed_once():
    # an anvil takes iron blocks and iron ingots; the blocks are made of ingots too
    recipes = reachable_recipes(load_game().crafting_tree, "minecraft:anvil")
    assert [
        (r.output_item.item_tag.name, [(i.item_tag.name, i.count) for i in r.input_items])
        for r in recipes
    ] == [
        ("minecraft:anvil", [("minecraft:iron_block", 3), ("minecraft:iron_ingot", 4)]),
        ("minecraft:iron_ingot", [("minecraft:iron_nugget", 9)]),
        ("minecraft:iron_block", [("minecraft:iron_ingot", 9)]),
    ]


def test_an_unknown_split_is_refused_by_name():
    with pytest.raises(
        ValueError, match="unknown split 'dev'; expected 'train', 'validation' or 'test'"
    ):
        TextCraftEnv().task_ids("dev")


def test_an_episode_knows_its_task():
    assert TextCraftEnv().start("anvil").task_id == "anvil"


def test_observations_use_readable_names():
    episode = TextCraftEnv().start("yellow_bed")
    assert episode.step("get 1 oak logs") == StepResult("Got 1 oak logs", 0.0, False)
    assert episode.step("craft 4 oak planks using 1 oak logs") == StepResult(
        "Crafted 4 oak planks", 0.0, False
    )
    assert episode.step("inventory").observation == "Inventory: [oak planks] (4)"
    assert episode.inventory == {"minecraft:oak_planks": 4}
    assert "None" not in episode.step("craft 4 planks using 1 oak logs").observation


BAD_ACTIONS = [
    "",
    "   ",
    "\n",
    "hello",
    "get",
    "get 1",
    "get 1 ",
    "get planks",
    "get 1 planks",  # a tag: never fetchable
    "get 1 stick",  # craftable: not fetchable
    "get 1 unobtainium",
    "craft",
    "craft 1 stick",
    "craft x using y",
    "craft 4 planks using 1 oak logs",
    "craft 1 yellow bed using 3 planks, 3 white wool",
    "craft 1 stick using 2 oak planks",  # nothing in the inventory
    "craft 1 stick using , , ,",
    "get " + "9" * 5000 + " oak logs",
    "x" * 10_000,
    "crafté 1 ☃ using 2 💎",
    "get 1 ☃",
    "\x00\x01\x02",
    "inventory" * 1000,
]


@pytest.mark.parametrize("action", BAD_ACTIONS, ids=range(len(BAD_ACTIONS)))
def test_bad_actions_give_an_observation_and_leave_the_inventory_as_it_was(action, capsys):
    episode = TextCraftEnv().start("yellow_bed")
    # After a good step, so that a bad one that empties or changes the inventory shows.
    assert episode.step("get 2 oak logs").observation == "Got 2 oak logs"
    result = episode.step(action)
    assert isinstance(result, StepResult)
    assert isinstance(result.observation, str) and result.observation
    assert len(result.observation) < 1000 and not result.observation.startswith(("Got", "Crafted"))
    assert (result.reward, result.done) == (0.0, False)
    assert episode.inventory == {"minecraft:oak_logs": 2}
    assert episode.step("inventory").observation == "Inventory: [oak logs] (2)"
    assert capsys.readouterr().out == ""


def test_a_step_the_game_fails_halfway_is_undone(monkeypatch):
    episode = TextCraftEnv().start("yellow_bed")
    episode.step("get 2 oak logs")

    def crash_mid_craft(action):  # as a craft that removed its inputs, then raised
        episode._game.inventory.pop("minecraft:oak_logs")
        raise RuntimeError("output item lookup failed")

    monkeypatch.setattr(episode._game, "step", crash_mid_craft)
    result = episode.step("craft 4 oak planks using 1 oak logs")
    assert result == StepResult(
        "Could not execute craft 4 oak planks using 1 oak logs: RuntimeError", 0.0, False
    )
    assert episode.inventory == {"minecraft:oak_logs": 2}


def test_a_huge_count_is_a_valid_get():
    # The game takes any count it can parse: not a bad action, and not refused by the adapter.
    episode = TextCraftEnv().start("yellow_bed")
    episode.step("get 2 oak logs")
    result = episode.step("get " + "9" * 250 + " oak logs")
    assert result.observation.startswith("Got 999") and len(result.observation) < 1000
    assert episode.inventory == {"minecraft:oak_logs": 2 + int("9" * 250)}


def test_non_string_action_is_refused():
    episode = TextCraftEnv().start("yellow_bed")
    episode.step("get 2 oak logs")
    result = episode.step(None)  # type: ignore[arg-type]
    assert result == StepResult("Actions are text, not NoneType.", 0.0, False)
    assert episode.inventory == {"minecraft:oak_logs": 2}


def test_wrong_input_count_is_silent(capsys):
    episode = TextCraftEnv().start("yellow_bed")
    episode.step("get 2 oak logs")
    result = episode.step("craft 4 oak planks using 2 oak logs")  # the package prints here
    assert result == StepResult("Could not find a valid recipe for 4 oak planks", 0.0, False)
    assert capsys.readouterr().out == ""


def test_episodes_are_independent():
    env = TextCraftEnv()
    a, b = env.start("yellow_bed"), env.start("yellow_bed")
    a.step("get 3 string")
    assert a.inventory == {"minecraft:string": 3}
    assert b.inventory == {}
    assert load_game().inventory == {}


def test_snapshot_restore_round_trip():
    episode = TextCraftEnv().start("yellow_bed")
    episode.step("get 2 oak logs")
    state = episode.snapshot()
    episode.step("craft 4 oak planks using 1 oak logs")
    assert episode.inventory == {"minecraft:oak_logs": 1, "minecraft:oak_planks": 4}
    assert state == {"inventory": {"minecraft:oak_logs": 2}, "done": False}  # not aliased
    episode.restore(state)
    assert episode.inventory == {"minecraft:oak_logs": 2}
    episode.step("craft 4 oak planks using 1 oak logs")
    episode.restore(state)  # the same snapshot restores again
    assert episode.inventory == {"minecraft:oak_logs": 2}
    assert state == {"inventory": {"minecraft:oak_logs": 2}, "done": False}


def test_goal_ends_the_episode_and_restore_reopens_it():
    episode = TextCraftEnv().start("yellow_bed")
    episode.step("get 1 sunflower")
    episode.step("craft 2 yellow dye using 1 sunflower")
    episode.step("get 12 string")
    for _ in range(3):
        episode.step("craft 1 white wool using 4 string")
    episode.step("get 1 oak logs")
    episode.step("craft 4 oak planks using 1 oak logs")
    episode.step("craft 1 white bed using 3 white wool, 3 oak planks")
    before = episode.snapshot()
    result = episode.step("craft 1 yellow bed using 1 white bed, 1 yellow dye")
    assert result == StepResult("Crafted 1 yellow bed", 1.0, True)
    again = episode.step("craft 1 yellow bed using 1 white bed, 1 yellow dye")
    assert (again.reward, again.done) == (0.0, True)
    episode.restore(before)
    assert episode.step("craft 1 yellow bed using 1 white bed, 1 yellow dye").done


def test_unknown_task_id_raises_key_error_naming_it():
    env = TextCraftEnv()
    for bad in ["no_such_item", "minecraft:yellow_bed", "oak_planks"]:  # oak planks: depth 1
        with pytest.raises(KeyError, match=re.escape(bad)):
            env.start(bad)


def test_a_restored_finished_episode_stays_over_and_says_so():
    finished = {"inventory": {"minecraft:yellow_bed": 1}, "done": True}
    episode = TextCraftEnv().start("yellow_bed")
    episode.restore(finished)
    over = StepResult("The goal is already crafted; the episode is over.", 0.0, True)
    assert episode.step("get 1 oak logs") == over
    assert episode.inventory == {"minecraft:yellow_bed": 1}


def test_refused_actions_are_told_word_for_word_what_is_wrong():
    episode = TextCraftEnv().start("yellow_bed")
    assert episode.step(3) == StepResult("Actions are text, not int.", 0.0, False)  # type: ignore[arg-type]
    assert episode.step("  ") == StepResult(
        "Empty action. Use 'get N item', 'craft N item using N item, ...' or 'inventory'.",
        0.0,
        False,
    )


def test_tidy_names_tags_and_items_as_the_instruction_does():
    from envs.textcraft import _tidy

    tag = "ItemTagWithCount(item_tag=ItemTag(tag='minecraft:planks', item_id=None), count=3)"
    item = "ItemTagWithCount(item_tag=ItemTag(tag=None, item_id='minecraft:oak_planks'), count=4)"
    assert (_tidy(tag), _tidy(item)) == ("3 planks", "4 oak planks")
    assert _tidy("Could not find enough items to craft None") == (
        "Could not find enough items for that recipe"
    )


def test_an_action_of_exactly_the_length_limit_is_played_and_one_longer_refused():
    from envs.textcraft import MAX_ACTION_CHARS

    episode = TextCraftEnv().start("yellow_bed")
    at_limit = episode.step("x" * MAX_ACTION_CHARS).observation
    assert not at_limit.startswith("Action too long")
    too_long = episode.step("x" * (MAX_ACTION_CHARS + 1)).observation
    assert too_long == f"Action too long ({MAX_ACTION_CHARS + 1} characters); send one command."
