"""Importing published expert trajectories (ETO's SFT files, AgentGym's AgentTraj) from small
samples in tests/samples written in those formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from agents.trajectory_import import (
    ETO_SCIWORLD_FAMILIES,
    import_trajectories,
    scienceworld_task_name,
    task_goal_reader,
)
from flows.agent_r import AgentRConfig
from flows.eto import ETOConfig
from flywheel.records import Message, Trajectory
from flywheel.settings import EnvSettings
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from tasks.expert_data import ExpertDataInputs, expert_data_stage

SAMPLES = Path(__file__).parent / "samples"
PREFIX = [Message(role="system", content="This run's system prompt.")]
SCIWORLD_TRAIN = ["find-plant/3", "lifespan-longest-lived/7", "boil/0"]


def sample(name: str) -> list[dict]:
    return json.loads((SAMPLES / name).read_text())


def test_eto_sciworld_ids_map_to_the_projects_family_names_and_drops_say_why():
    items = sample("eto_sciworld_sft.json")
    trajectories, counts = import_trajectories(items, "scienceworld", PREFIX, SCIWORLD_TRAIN)
    assert [t.task_id for t in trajectories] == ["find-plant/3", "lifespan-longest-lived/7"]
    assert counts.counts() == {
        "imported_read": 5, "imported_mapped": 2, "imported": 2, "imported_dropped": 3,
    }  # fmt: skip
    assert counts.dropped == {
        "sciworld id names no scienceworld task": 1,  # 5_1: a family ETO left out
        "not among this run's train tasks": 1,  # 11_2 = find-animal/2
        "a second trajectory for the same task": 1,
    }
    first = trajectories[0]
    assert first.messages[0] == PREFIX[0] and first.episode_start == 1
    assert first.messages[1].content.startswith("Your task is to find a(n) plant")
    assert [m.loss for m in first.messages[1:]] == [False, True, False, True, False, True]
    original = items[0]["conversations"][3:]  # ETO's turns are already in the project's layout
    assert [m.content for m in first.messages[2:]] == [turn["value"] for turn in original]


def test_every_eto_family_is_a_scienceworld_task_name():
    from scienceworld.constants import ID2TASK  # the package's own names, no JVM needed

    names = {scienceworld_task_name(name) for name in ETO_SCIWORLD_FAMILIES.values()}
    assert names <= set(ID2TASK.values()), names - set(ID2TASK.values())
    assert scienceworld_task_name("task-9-mendellian-genetics-(known-plant)") == (
        "mendelian-genetics-known-plant"
    )


# The goals of an AgentGym server's tasks where its numbering is the recording machine's, and
# where it is not (AgentGym numbers TextCraft's goals in its recipe files' listing order).
SAME_NUMBERING = {"12": "acacia_boat", "13": "oak_planks", "40": "blue_dye"}.get
OTHER_NUMBERING = {"3": "acacia_boat", "12": "blue_dye", "13": "oak_planks"}.get


def test_agenttraj_indices_are_agentgym_task_ids_and_other_envs_are_dropped():
    items = sample("agenttraj_mixed.json")
    trajectories, counts = import_trajectories(
        items, "agentgym-textcraft", PREFIX, ["12", "13"], SAME_NUMBERING
    )
    assert [t.task_id for t in trajectories] == ["12"]
    assert counts.imported == 1 and counts.mapped == 1 and counts.read == 4
    assert counts.dropped == {
        "not among this run's train tasks": 1,  # textcraft_40
        "recorded on webshop, not for agentgym-textcraft": 1,
        "recorded on sciworld, not for agentgym-textcraft": 1,
    }
    assert trajectories[0].n_steps == 3 and trajectories[0].messages[-1].loss


def test_agenttraj_textcraft_items_go_to_the_servers_task_with_their_goal_not_their_index():
    items = sample("agenttraj_mixed.json")  # textcraft_12: acacia boat; textcraft_40: blue dye
    trajectories, counts = import_trajectories(
        items, "agentgym-textcraft", PREFIX, ["3", "12", "13"], OTHER_NUMBERING
    )
    assert [(t.task_id, t.messages[1].content.rpartition("\n")[2]) for t in trajectories] == [
        ("3", "Goal: craft acacia boat."),
        ("12", "Goal: craft blue dye."),
    ]
    assert counts.mapped == 2 and counts.imported == 2
    # A goal none of the run's tasks has is dropped as such, whatever its index.
    _, counts = import_trajectories(items, "agentgym-textcraft", PREFIX, ["12"], OTHER_NUMBERING)
    assert counts.dropped["not among this run's train tasks"] == 1 and counts.imported == 1


def test_agenttraj_textcraft_items_need_the_servers_goals():
    items = sample("agenttraj_mixed.json")
    with pytest.raises(ValueError, match="matched to agentgym-textcraft tasks by goal"):
        import_trajectories(items, "agentgym-textcraft", PREFIX, ["12"])
    assert task_goal_reader(EnvSettings(name="textcraft")) is None
    servers = EnvSettings(
        name="agentgym-textcraft",
        servers=["http://127.0.0.1:9"],
        agentgym={"train": (0, 10), "test": (10, 12)},
    )
    assert callable(task_goal_reader(servers))  # reads nothing from a server until called


def test_agentgym_turns_are_rewritten_in_the_projects_layout():
    items = sample("agenttraj_mixed.json")
    [trajectory], _ = import_trajectories(
        items, "agentgym-textcraft", PREFIX, ["12"], SAME_NUMBERING
    )
    task, reply, observation = trajectory.messages[1:4]
    assert task.content.endswith("Goal: craft acacia boat.")  # the task turn stays as recorded
    assert reply.content == "Thought: I need planks.\nAction: get 2 acacia log" and reply.loss
    assert observation.content == "Observation: Got 2 acacia log" and not observation.loss


def test_agenttraj_textcraft_maps_to_the_projects_textcraft_by_its_goal():
    items = sample("agenttraj_mixed.json")
    trajectories, counts = import_trajectories(items, "textcraft", PREFIX, ["acacia_boat"])
    assert [t.task_id for t in trajectories] == ["acacia_boat"]
    assert counts.dropped["not among this run's train tasks"] == 1  # blue_dye


@pytest.mark.parametrize(
    ("name", "environment"),
    [("eto_webshop_sft.json", "WebShop"), ("agenttraj_alfworld.json", "ALFWorld")],
)
def test_webshop_and_alfworld_files_are_refused_by_name(name, environment):
    with pytest.raises(ValueError, match=f"holds {environment} trajectories.*no such environment"):
        import_trajectories(sample(name), "scienceworld", PREFIX, SCIWORLD_TRAIN)


def test_the_projects_own_eto_export_still_imports_under_its_ids():
    [item] = sample("eto_sciworld_sft.json")[:1]
    item = {**item, "id": "acacia_boat"}
    item["conversations"][0] = {"from": "human", "value": "Flywheel's own system prompt."}
    trajectories, counts = import_trajectories([item], "textcraft", PREFIX, ["acacia_boat"])
    assert [t.task_id for t in trajectories] == ["acacia_boat"] and counts.mapped == 0


def test_expert_file_setting_becomes_a_file_url_and_must_exist(tmp_path):
    path = shutil.copy(SAMPLES / "eto_sciworld_sft.json", tmp_path / "sft.json")
    assert ETOConfig(expert_file=str(path)).expert_file == f"file://{path}"
    assert AgentRConfig(expert_file="s3://b/sft.json").expert_file == "s3://b/sft.json"
    assert ETOConfig().expert_file is None
    with pytest.raises(ValidationError, match="is not a file"):
        ETOConfig(expert_file=str(tmp_path / "missing.json"))


def test_expert_stage_counts_the_import_and_keys_its_cache_on_the_files_content(tmp_path):
    path = tmp_path / "sft.json"
    path.write_text((SAMPLES / "eto_sciworld_sft.json").read_text())
    expert_file = ETOConfig(expert_file=str(path)).expert_file
    store = ArtifactStore(str(tmp_path / "store"))
    env = EnvSettings(name="scienceworld")
    out = StageOutput(store_url=store.root, url=store.url("run/expert"))
    inputs = ExpertDataInputs(
        env=env, task_ids=SCIWORLD_TRAIN, prefix=PREFIX, expert_file=expert_file
    )
    manifest = expert_data_stage.fn(inputs, out)
    assert manifest.counts == {
        "trajectories": 2, "unsolved": 1, "imported_read": 5, "imported_mapped": 2,
        "imported": 2, "imported_dropped": 3,
    }  # fmt: skip
    assert "dropped 1 imported item(s): not among this run's train tasks" in manifest.notes
    assert any("simplification 'easy'" in note for note in manifest.notes)
    assert any("what `look around` shows" in note for note in manifest.notes)
    assert [t.task_id for t in store.read_records(manifest.files["trajectories"], Trajectory)] == [
        "find-plant/3", "lifespan-longest-lived/7",
    ]  # fmt: skip

    path.write_text(json.dumps(sample("eto_sciworld_sft.json")[1:2]))  # same URL, new content
    again = expert_data_stage.fn(inputs, out)
    assert again.counts["imported"] == 1 and again.counts["imported_read"] == 1
