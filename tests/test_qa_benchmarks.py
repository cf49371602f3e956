"""The benchmark loaders on small files written in each benchmark's published format
(tests/data/qa/), with their own paragraphs or a local corpus file, and malformed variants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.qa_benchmarks import (
    load_2wikimultihopqa,
    load_bamboogle,
    load_benchmark,
    load_hotpotqa,
    load_musique,
)
from envs.qa_data import QAFormatError

DATA = Path(__file__).parent / "data" / "qa"
CORPUS = DATA / "corpus.jsonl"


def test_hotpotqa_from_its_context():
    data = load_hotpotqa(DATA / "hotpotqa_sample.json")
    first = data.questions[0]
    assert [q.id for q in data.questions] == ["hp-bridge-1", "hp-comparison-2", "hp-yesno-3"]
    assert (first.answer, first.type, first.source) == ("United States", "bridge", "hotpotqa")
    assert first.supporting_ids == ["Alan Turing", "Princeton University"]
    assert data.questions[2].answers == ["yes"]
    # "Alan Turing" is in two questions' contexts with the same text: one document
    titles = [d.title for d in data.corpus]
    assert titles.count("Alan Turing") == 1 and len(titles) == 6
    turing = next(d for d in data.corpus if d.id == "Alan Turing")
    assert turing.text == (
        "Alan Mathison Turing was an English mathematician and computer scientist. "
        "He completed his PhD at Princeton University in 1938."
    )


def test_hotpotqa_with_a_corpus_file():
    data = load_hotpotqa(DATA / "hotpotqa_sample.json", CORPUS)
    assert len(data.corpus) == 10  # the file's documents, not the questions' paragraphs
    assert data.questions[0].supporting_ids == ["wiki-001", "wiki-002"]
    assert data.questions[1].supporting_ids == ["wiki-003", "wiki-004"]


def test_2wikimultihopqa_keeps_its_types():
    data = load_2wikimultihopqa(DATA / "2wikimultihopqa_sample.json")
    types = [q.type for q in data.questions]
    assert types == ["compositional", "comparison", "bridge_comparison"]
    assert data.questions[2].supporting_ids == [
        "Citizen Kane",
        "Casablanca (film)",
        "Orson Welles",
        "Michael Curtiz",
    ]
    assert {q.source for q in data.questions} == {"2wikimultihopqa"}
    assert len(data.corpus) == 6  # the films' paragraphs appear twice, stored once


def test_musique_paragraphs_aliases_and_unanswerable_questions():
    data = load_musique(DATA / "musique_sample.jsonl")
    assert [q.id for q in data.questions] == [
        "2hop__100_200",
        "3hop1__100_200_300",
    ]  # no unanswerable
    first, second = data.questions
    assert first.answers == ["Percy Bysshe Shelley", "Percy Shelley"]
    assert (first.type, second.type) == ("2hop", "3hop1")
    # two paragraphs titled "Mary Shelley" with different texts: two documents
    assert first.supporting_ids == ["Frankenstein", "Mary Shelley"]
    assert "Mary Shelley#2" in [d.id for d in data.corpus]
    assert second.supporting_ids == ["Percy Bysshe Shelley", "Frankenstein", "Mary Shelley"]
    assert len(data.corpus) == 6


def test_musique_with_a_corpus_file_finds_supporting_paragraphs_by_title():
    data = load_musique(DATA / "musique_sample.jsonl", CORPUS)
    # both documents titled "Mary Shelley" in the file count as supporting
    assert data.questions[0].supporting_ids == ["wiki-006", "wiki-007", "wiki-008"]


@pytest.mark.parametrize("name", ["bamboogle_sample.csv", "bamboogle_sample.json"])
def test_bamboogle_csv_and_json(name):
    data = load_bamboogle(DATA / name)
    assert [q.answer for q in data.questions] == ["James Madison", "Philip K. Dick", "Paris"]
    assert data.questions[1].question.startswith("Who wrote the novel, later filmed")
    assert [q.id for q in data.questions] == ["bamboogle-000", "bamboogle-001", "bamboogle-002"]
    assert data.corpus == []
    assert len(load_bamboogle(DATA / name, CORPUS).corpus) == 10


def test_load_benchmark_by_name():
    assert len(load_benchmark("musique", DATA / "musique_sample.jsonl").questions) == 2
    with pytest.raises(ValueError, match="unknown benchmark 'nq'"):
        load_benchmark("nq", DATA / "musique_sample.jsonl")


# ---- malformed files ----------------------------------------------------------------------------


def _hotpot_variant(tmp_path: Path, change) -> Path:
    records = json.loads((DATA / "hotpotqa_sample.json").read_text())
    change(records)
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r[1].pop("answer"), r"record 1 \(hp-comparison-2\): answer: Field required"),
        (lambda r: r[0]["context"][0].__setitem__(1, "one string"),
         r"record 0 \(hp-bridge-1\): context\.0\.1: Input should be a valid list"),
        (lambda r: r[2]["supporting_facts"].append(["Grace Hopper", 0]),
         r"record 2 \(hp-yesno-3\): supporting fact titles not in its context: \['Grace Hopper'\]"),
        (lambda r: r[0].__setitem__("context", []), r"record 0 \(hp-bridge-1\): no context"),
    ],
)  # fmt: skip
def test_a_malformed_hotpotqa_record_is_named(tmp_path, change, message):
    with pytest.raises(QAFormatError, match=rf"hotpot\.json: {message}"):
        load_hotpotqa(_hotpot_variant(tmp_path, change))


def test_a_file_that_is_not_a_json_list(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('[{"_id": "x",\n "question": }]')
    with pytest.raises(QAFormatError, match=r"broken\.json: not valid JSON .*line 2"):
        load_2wikimultihopqa(broken)
    musique_file_as_hotpot = DATA / "musique_sample.jsonl"
    with pytest.raises(QAFormatError, match="musique_sample.jsonl: not valid JSON"):
        load_hotpotqa(musique_file_as_hotpot)
    dict_file = tmp_path / "dict.json"
    dict_file.write_text('{"data": []}')
    with pytest.raises(QAFormatError, match=r"dict\.json: expected a JSON list .* found dict"):
        load_hotpotqa(dict_file)


def test_2wiki_without_its_type_is_refused(tmp_path):
    records = json.loads((DATA / "2wikimultihopqa_sample.json").read_text())
    del records[0]["type"]
    path = tmp_path / "2wiki.json"
    path.write_text(json.dumps(records))
    with pytest.raises(
        QAFormatError, match=r"record 0 \(2w-compositional-1\): type: Field required"
    ):
        load_2wikimultihopqa(path)


def test_malformed_musique_lines_are_named(tmp_path):
    lines = (DATA / "musique_sample.jsonl").read_text().splitlines()
    path = tmp_path / "musique.jsonl"
    path.write_text(
        "\n".join(
            [lines[0], lines[1].replace('"is_supporting": true', '"is_supporting": "maybe"', 1)]
        )
    )
    with pytest.raises(
        QAFormatError, match=r"musique\.jsonl: line 2: paragraphs\.0\.is_supporting"
    ):
        load_musique(path)
    path.write_text(lines[0] + "\n" + lines[1][:50] + "\n")
    with pytest.raises(QAFormatError, match=r"musique\.jsonl: line 2: not valid JSON"):
        load_musique(path)


def test_malformed_bamboogle_files(tmp_path):
    path = tmp_path / "bamboogle.csv"
    path.write_text("question,answer\nWho?,Someone\n")
    with pytest.raises(QAFormatError, match=r"bamboogle\.csv: no column \['Answer', 'Question'\]"):
        load_bamboogle(path)
    path.write_text("Question,Answer\nWho?,Someone\nWhat?,\n")
    with pytest.raises(QAFormatError, match=r"bamboogle\.csv: row 3: Answer: String should have"):
        load_bamboogle(path)


def test_a_supporting_title_missing_from_the_corpus_file(tmp_path):
    corpus = tmp_path / "small.jsonl"
    corpus.write_text(CORPUS.read_text().splitlines()[0] + "\n")  # Alan Turing only
    with pytest.raises(
        QAFormatError,
        match=r"record 0 \(hp-bridge-1\): supporting title 'Princeton University' is not in .*small",
    ):
        load_hotpotqa(DATA / "hotpotqa_sample.json", corpus)
