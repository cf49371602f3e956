"""Loaders for the multi-hop QA benchmarks users bring, in their published formats.

Each loader reads one file (one split) into `QAData`: questions as `QARecord`s and a corpus of
`Document`s for the search tool.

- HotpotQA: a JSON list of {_id, question, answer, type, level, context: [[title, [sentences]]],
  supporting_facts: [[title, sentence index]]}. Sentence indices are not checked (the published
  train set has a few past the end of their paragraph).
- 2WikiMultiHopQA: the same shape, plus `type` (comparison, bridge_comparison, inference,
  compositional) and `evidences` ([subject, relation, object] triples, not used).
- MuSiQue: JSON lines of {id, question, answer, answer_aliases, answerable, paragraphs: [{idx,
  title, paragraph_text, is_supporting}]}; the type is the id's prefix (`2hop`, `3hop1`, ...).
  Unanswerable questions (MuSiQue-Full, `answerable: false`) are left out.
- Bamboogle: CSV or a JSON list with `Question` and `Answer`; it has no paragraphs, so its corpus
  is the corpus file's or empty.

The corpus is built from each question's own paragraphs (deduplicated across questions), or read
from a local corpus file (`corpus_path`, JSON lines of {id, title, text}) when given; then a
question's supporting ids are the ids of the corpus documents titled as its supporting
paragraphs, and a supporting title the corpus lacks is an error (the question could not be
answered from it). Every malformed file raises `QAFormatError` naming the file, the record and
what is wrong.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envs.qa_data import (
    Document,
    QAData,
    QAFormatError,
    QARecord,
    parse_json_line,
    read_corpus,
    validated,
)

Benchmark = Literal["hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]


# ---- the published records ----------------------------------------------------------------------


class HotpotQARow(BaseModel):
    id: str = Field(alias="_id")
    question: str
    answer: str
    type: str = "hotpotqa"
    context: list[tuple[str, list[str]]] = []
    supporting_facts: list[tuple[str, int]] = []


class TwoWikiRow(HotpotQARow):
    type: str
    evidences: list[list[str]] = []


class MuSiQueParagraph(BaseModel):
    idx: int
    title: str
    paragraph_text: str
    is_supporting: bool = False


class MuSiQueRow(BaseModel):
    id: str
    question: str
    answer: str
    answer_aliases: list[str] = []
    answerable: bool = True
    paragraphs: list[MuSiQueParagraph] = []


class BamboogleRow(BaseModel):
    model_config = ConfigDict(str_strip_whitespace=True)
    question: str = Field(alias="Question", min_length=1)
    answer: str = Field(alias="Answer", min_length=1)


# ---- the corpus ---------------------------------------------------------------------------------


class ContextCorpus:
    """Documents from questions' own paragraphs. A paragraph seen before (same title and text)
    keeps its id; its id is its title, or `title#2`, `title#3`... for other paragraphs under the
    same title (MuSiQue has several paragraphs per title)."""

    def __init__(self):
        self.documents: list[Document] = []
        self._ids: dict[tuple[str, str], str] = {}
        self._per_title: dict[str, int] = {}

    def add(self, title: str, text: str) -> str:
        if (title, text) not in self._ids:
            n = self._per_title[title] = self._per_title.get(title, 0) + 1
            doc_id = title if n == 1 else f"{title}#{n}"
            self._ids[title, text] = doc_id
            self.documents.append(Document(id=doc_id, title=title, text=text))
        return self._ids[title, text]


class FileCorpus:
    """Documents of a local corpus file; supporting paragraphs are found by title."""

    def __init__(self, path: str | Path):
        self.path = path
        self.documents = read_corpus(path)
        self._by_title: dict[str, list[str]] = {}
        for document in self.documents:
            self._by_title.setdefault(document.title, []).append(document.id)

    def ids_titled(self, title: str, where: str) -> list[str]:
        if title not in self._by_title:
            raise QAFormatError(f"{where}: supporting title {title!r} is not in {self.path}")
        return self._by_title[title]


# ---- reading files ------------------------------------------------------------------------------


def _json_list(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise QAFormatError(
            f"{path}: not valid JSON ({error.msg}, line {error.lineno} column {error.colno})"
        ) from None
    if not isinstance(data, list):
        raise QAFormatError(f"{path}: expected a JSON list of records, found {type(data).__name__}")
    return data


def _json_lines(path: Path) -> list[tuple[str, object]]:
    """(where, record) for each non-blank line."""
    return [
        (where := f"{path}: line {number}", parse_json_line(line, where))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if line.strip()
    ]


def _where(path: Path, index: int, raw: object) -> str:
    name = raw.get("_id") or raw.get("id") if isinstance(raw, dict) else None
    return f"{path}: record {index}" + (f" ({name})" if name else "")


# ---- the loaders --------------------------------------------------------------------------------


def _supporting_titles(row: HotpotQARow, where: str) -> list[str]:
    titles = [title for title, _ in row.context]
    supporting = list(dict.fromkeys(title for title, _ in row.supporting_facts))
    if row.context and (missing := [t for t in supporting if t not in titles]):
        raise QAFormatError(f"{where}: supporting fact titles not in its context: {missing}")
    return supporting


def _hotpot_shaped(path, corpus_path, row_model: type[HotpotQARow], source: str) -> QAData:
    path = Path(path)
    corpus = FileCorpus(corpus_path) if corpus_path else ContextCorpus()
    questions = []
    for index, raw in enumerate(_json_list(path)):
        where = _where(path, index, raw)
        row = validated(row_model, raw, where)
        titles = _supporting_titles(row, where)
        if isinstance(corpus, FileCorpus):
            supporting = [i for t in titles for i in corpus.ids_titled(t, where)]
        else:
            if not row.context:
                raise QAFormatError(f"{where}: no context paragraphs; give a corpus file")
            ids = {t: corpus.add(t, " ".join(s.strip() for s in ss)) for t, ss in row.context}
            supporting = [ids[t] for t in titles]
        questions.append(
            QARecord(
                id=row.id,
                question=row.question,
                answer=row.answer,
                type=row.type,
                supporting_ids=supporting,
                source=source,
            )
        )
    return QAData(questions=questions, corpus=corpus.documents)


def load_hotpotqa(path: str | Path, corpus_path: str | Path | None = None) -> QAData:
    return _hotpot_shaped(path, corpus_path, HotpotQARow, "hotpotqa")


def load_2wikimultihopqa(path: str | Path, corpus_path: str | Path | None = None) -> QAData:
    return _hotpot_shaped(path, corpus_path, TwoWikiRow, "2wikimultihopqa")


def load_musique(path: str | Path, corpus_path: str | Path | None = None) -> QAData:
    path = Path(path)
    corpus = FileCorpus(corpus_path) if corpus_path else ContextCorpus()
    questions = []
    for where, raw in _json_lines(path):
        row = validated(MuSiQueRow, raw, where)
        if not row.answerable:
            continue
        if isinstance(corpus, FileCorpus):
            titles = dict.fromkeys(p.title for p in row.paragraphs if p.is_supporting)
            supporting = [i for t in titles for i in corpus.ids_titled(t, where)]
        else:
            if not row.paragraphs:
                raise QAFormatError(f"{where}: no paragraphs; give a corpus file")
            ids = [(corpus.add(p.title, p.paragraph_text), p.is_supporting) for p in row.paragraphs]
            supporting = [doc_id for doc_id, is_supporting in ids if is_supporting]
        questions.append(
            QARecord(
                id=row.id,
                question=row.question,
                answer=row.answer,
                aliases=row.answer_aliases,
                type=row.id.split("__")[0] if "__" in row.id else "musique",
                supporting_ids=supporting,
                source="musique",
            )
        )
    return QAData(questions=questions, corpus=corpus.documents)


def _bamboogle_rows(path: Path) -> list[tuple[str, object]]:
    if path.suffix == ".csv":
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            missing = {"Question", "Answer"} - set(reader.fieldnames or [])
            if missing:
                raise QAFormatError(f"{path}: no column {sorted(missing)} in the CSV header")
            return [(f"{path}: row {n}", row) for n, row in enumerate(reader, start=2)]
    return [(f"{path}: record {n}", row) for n, row in enumerate(_json_list(path))]


def load_bamboogle(path: str | Path, corpus_path: str | Path | None = None) -> QAData:
    path = Path(path)
    corpus = read_corpus(corpus_path) if corpus_path else []
    questions = [
        QARecord(
            id=f"bamboogle-{n:03d}",
            question=row.question,
            answer=row.answer,
            type="compositional",
            source="bamboogle",
        )
        for n, row in enumerate(validated(BamboogleRow, r, w) for w, r in _bamboogle_rows(path))
    ]
    return QAData(questions=questions, corpus=corpus)


LOADERS: dict[str, Callable[..., QAData]] = {
    "hotpotqa": load_hotpotqa,
    "2wikimultihopqa": load_2wikimultihopqa,
    "musique": load_musique,
    "bamboogle": load_bamboogle,
}


def load_benchmark(
    name: Benchmark, path: str | Path, corpus_path: str | Path | None = None
) -> QAData:
    """The benchmark file at `path` (one split), read as `name`'s published format."""
    if name not in LOADERS:
        raise ValueError(f"unknown benchmark {name!r}; expected one of {sorted(LOADERS)}")
    return LOADERS[name](path, corpus_path)
