"""The embedded question-answering data: generated offline, deterministic, answerable only by
searching its corpus, with splits that share no subject."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from envs.qa_data import (
    Document,
    QAFormatError,
    generated_qa,
    generated_questions,
    generated_world,
    read_corpus,
    write_corpus,
)


@pytest.fixture(scope="module")
def splits():
    return {split: generated_qa(split) for split in ("train", "test")}


def test_sizes_and_types(splits):
    train, test = splits["train"].questions, splits["test"].questions
    assert 200 <= len(train) <= 500 and len(test) >= 100
    types = {q.type for q in train}
    assert types == {"bridge", "comparison", "bridge_comparison", "arithmetic"}
    assert {q.type for q in test} == types
    ids = [q.id for q in train + test]
    assert len(ids) == len(set(ids))


def test_the_same_seed_gives_the_same_data_and_another_seed_other_data():
    def digest(questions):
        return hashlib.sha256(json.dumps([q.model_dump() for q in questions]).encode()).hexdigest()

    generated_world.cache_clear()  # built again, not served from the cache
    assert digest(generated_questions("test")) == digest(generated_qa("test").questions)
    assert digest(generated_questions("test", seed=17)) != digest(generated_questions("test"))


def test_the_default_data_is_pinned():
    """Every machine and Python version must build the same splits (`random.Random` is stable for
    int and str seeds); a change here changes every stored result on this data."""
    test = generated_questions("test")
    assert (test[0].id, test[0].answer) == ("founder_birth_town/company-008", "Wolldale")
    assert (test[-1].id, test[-1].answer) == ("combined_population/town-026+town-017", "1099175")


def test_supporting_documents_exist_and_hold_the_answer(splits):
    corpus = {d.id: d for d in splits["train"].corpus}
    assert len(corpus) == len(splits["train"].corpus)  # ids are unique
    for question in splits["train"].questions + splits["test"].questions:
        support = " ".join(corpus[i].text for i in question.supporting_ids)
        if question.type == "arithmetic":
            # the operands are in the documents; the answer is computed from them
            numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", support)]
            assert any(a - b == int(question.answer) for a in numbers for b in numbers) or any(
                a + b == int(question.answer) for a in numbers for b in numbers
            ), question
        else:
            assert question.answer in support, question


def test_one_document_never_answers_a_bridge_question(splits):
    """No document names both the question's subject and the answer: one search is not enough."""
    corpus = splits["train"].corpus
    for question in splits["train"].questions:
        if question.type != "bridge":
            continue
        subject = re.search(r"(?:founder of|where) (.+?) (?:born|has)", question.question)[1]
        for document in corpus:
            assert not (subject in document.text and question.answer in document.text), (
                question,
                document,
            )


def test_answers_are_not_in_the_question_except_comparison_options(splits):
    for question in splits["train"].questions + splits["test"].questions:
        inside = question.answer in question.question
        assert inside == (question.type == "comparison"), question


def test_no_test_question_names_a_company_or_town_a_training_question_names(splits):
    world = generated_world()
    names = [c.name for c in world.companies] + [t.name for t in world.towns]

    def named(questions):
        return {n for n in names for q in questions if re.search(rf"\b{n}\b", q.question)}

    train, test = named(splits["train"].questions), named(splits["test"].questions)
    assert train and test and not train & test


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="unknown split"):
        generated_questions("dev")


def test_corpus_file_round_trip(tmp_path):
    documents = [Document(id="a", title="A", text="Alpha."), Document(id="b", title="B", text="")]
    write_corpus(tmp_path / "corpus.jsonl", documents)
    assert read_corpus(tmp_path / "corpus.jsonl") == documents


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"id": "a", "title": "A", "text": "x"}\n{"id": "a", "title": "B", "text": "y"}\n',
         r"line 2: duplicate document id 'a'"),
        ('{"id": "a", "title": "A"}\n', r"line 1: text: Field required"),
        ('{"id": "a", "title": "A", "text": "x"}\n\n{"id": "b", "title": \n',
         r"line 3: not valid JSON"),
    ],
)  # fmt: skip
def test_a_malformed_corpus_file_names_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text(content)
    with pytest.raises(QAFormatError, match=rf"corpus.jsonl: {message}"):
        read_corpus(path)


def test_each_entity_has_one_document_that_states_its_facts():
    from envs.qa_data import Company, Person, Town, World, world_documents

    town = Town(id="town-1", name="Ovel", region="north", founded=1801, population=12345)
    person = Person(id="person-1", name="Ada Brin", born=1950, birth_town="Ovel",
                    lived_town="Kest", occupation="engineer")  # fmt: skip
    company = Company(id="company-1", name="Brin Works", industry="rail", founded=1990,
                      founder=person, headquarters=town)  # fmt: skip
    docs = world_documents(World(towns=[town], people=[person], companies=[company]))
    assert [(d.id, d.title, d.text) for d in docs] == [
        ("town-1", "Ovel", "Ovel is a town in the north region. It was founded in 1801. "
                           "Ovel has a population of 12,345."),
        ("person-1", "Ada Brin", "Ada Brin was born in 1950 in Ovel. Ada worked as an engineer "
                                 "and later lived in Kest."),
        ("company-1", "Brin Works", "Brin Works is a rail company with its headquarters in Ovel. "
                                    "It was founded in 1990 by Ada Brin."),
    ]  # fmt: skip
