"""Agent-R's general instruction data mixed into revision SFT (eta)."""

import pytest

from flows.agent_r import AgentRConfig, GeneralDataSettings
from flywheel.config_files import ConfigError, load_config
from flywheel.records import Message, Trajectory
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from tasks.mix_general import (
    MixGeneralInputs,
    general_share,
    mix,
    mix_general_stage,
    read_general,
)


def revision(i: int) -> Trajectory:
    messages = [
        Message(role="system", content="agent"),
        Message(role="user", content=f"task {i}"),
        Message(role="assistant", content="Action: look", loss=True),
    ]
    return Trajectory(task_id=f"t{i}", env="textcraft", messages=messages, episode_start=1)


def test_general_share_makes_eta_of_the_mixed_set():
    assert general_share(8, 0.2) == 2  # 2 of 10 = 0.2
    assert general_share(12, 0.25) == 4  # 4 of 16
    assert general_share(3, 0.5) == 3
    assert general_share(0, 0.2) == 0
    assert general_share(9, 0.0) == 0


def test_mix_keeps_every_revision_and_adds_distinct_general_examples_first():
    revisions = [revision(i) for i in range(16)]
    general = read_general('{"instruction": "a", "response": "b"}\n' * 3, "g.jsonl")
    mixed = mix(revisions, general, 0.25, seed=0)
    assert len(mixed) == 16 + 5
    assert sorted(t.task_id for t in mixed if t.env == "textcraft") == sorted(
        t.task_id for t in revisions
    )
    drawn = [t.task_id for t in mixed if t.env == "general"]
    assert len(drawn) == 5 and set(drawn) == {"general-1", "general-2", "general-3"}
    assert mix(revisions, general, 0.25, seed=0) == mixed  # seeded
    # As many wanted as there are: each example exactly once (no draw with replacement).
    ten = read_general('{"instruction": "a", "response": "b"}\n' * 10, "g.jsonl")
    once_each = mix([revision(i) for i in range(40)], ten, 0.2, seed=0)
    assert sorted(t.task_id for t in once_each if t.env == "general") == sorted(
        t.task_id for t in ten
    )
    assert sorted(t.task_id for t in mix(revisions, [], 0.25, seed=0)) == sorted(
        t.task_id for t in revisions
    )  # no general data: nothing added


def test_general_examples_train_only_the_response():
    (example,) = read_general('{"instruction": "Name a colour.", "response": "Red."}', "g")
    assert [m.role for m in example.training_messages] == ["system", "user", "assistant"]
    assert [m.loss for m in example.training_messages] == [False, False, True]
    assert example.training_messages[-1].content == "Red."


def test_a_bad_general_row_names_its_file_and_line():
    with pytest.raises(ValueError, match=r"g.jsonl, line 2: not an instruction/response row"):
        read_general('{"instruction": "a", "response": "b"}\n{"instruction": "a"}\n', "g.jsonl")


def test_the_shipped_set_reads_and_settings_turn_it_off_or_refuse_a_missing_file(tmp_path):
    settings = GeneralDataSettings()
    store = ArtifactStore(str(tmp_path))
    assert settings.enabled and len(read_general(store.read_text(settings.url), "shipped")) == 40
    assert not GeneralDataSettings(eta=0).enabled
    assert not GeneralDataSettings(file="none").enabled
    with pytest.raises(ConfigError, match="general.file"):
        load_config(AgentRConfig, None, [f"general.file={tmp_path / 'missing.jsonl'}"])


def test_the_stage_mixes_and_is_keyed_on_the_general_file_content(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    data = store.write_records(store.url("run/revisions/trajectories.jsonl"), [revision(0)] * 4)
    general_file = tmp_path / "general.jsonl"
    general_file.write_text('{"instruction": "a", "response": "b"}\n')
    settings = GeneralDataSettings(eta=0.2, file=str(general_file))
    out = StageOutput(store_url=store.root, url=store.url("run/sft-data"))
    inputs = MixGeneralInputs(data_url=data, general_url=settings.url, eta=settings.eta, seed=0)
    first = mix_general_stage.fn(inputs, out)
    assert first.counts == {"trajectories": 4, "general": 1}
    assert len(store.read_records(first.files["trajectories"], Trajectory)) == 5
    assert mix_general_stage.fn(inputs, out).served_from_store
    general_file.write_text('{"instruction": "c", "response": "d"}\n')
    redone = mix_general_stage.fn(inputs, out)
    assert not redone.served_from_store
    mixed = store.read_records(redone.files["trajectories"], Trajectory)
    assert [m.content for t in mixed if t.env == "general" for m in t.messages][1:] == ["c", "d"]
