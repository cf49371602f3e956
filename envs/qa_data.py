"""Question answering over a corpus: the records, the corpus file, and the embedded default data.

A question (`QARecord`) keeps its answer, the other accepted answers, its type and the ids of the
documents that support it. A corpus is a list of `Document`s; on disk it is JSON lines of
{"id", "title", "text"}, the format the search tool indexes (`read_corpus`, `write_corpus`).
Loaders for the published benchmarks are in `envs.qa_benchmarks`.

The embedded default (`generated_qa`) is a world of fictional towns, people and companies,
generated from a seed, with one short document per entity and questions that need the corpus:

- bridge: "In which town was the founder of Brannox Works born?" (company document -> founder's
  document); "In which year was the town where X has its headquarters founded?";
- comparison: "Which company was founded first: A, B or C?" (three documents; three options, so
  a guess is right a third of the time, not half);
- bridge_comparison: "Who was born earlier: the founder of A or the founder of B?" (four
  documents; the answer is a name the question does not contain);
- arithmetic over retrieved numbers, where python helps: years between two foundings, a
  founder's age at founding (bridge, then a subtraction), two towns' combined population.

Why fictional entities rather than TextCraft's recipe graph: a model has read about Minecraft
recipes in pretraining and can often answer from memory, while nothing it has read names Brannox
Works, so a right answer is evidence that it searched. Recipes also give no natural bridge,
comparison or arithmetic questions, which are the shapes HotpotQA-style training teaches.

The world is built so one search cannot answer a bridge question: a company's document never
names its founder's birth town (its headquarters is elsewhere) and a person's document never names
a company. Founding years are distinct, so comparisons have one answer.

Splits partition the entities, not the questions: a test question asks only about companies and
towns no training question names, so a policy cannot pass the test by remembering facts it was
trained on. Both splits search the same corpus.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from envs.base import Split

DEFAULT_SEED = 16
TRAIN_FRACTION = 2 / 3  # of the companies and of the towns
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class Document(BaseModel):
    """One searchable document: a line of a corpus file."""

    id: str
    title: str
    text: str


class QARecord(BaseModel):
    """One question with its gold answer(s)."""

    id: str
    question: str
    answer: str
    aliases: list[str] = []  # other answers that count as right (MuSiQue's answer_aliases)
    type: str  # bridge, comparison, arithmetic, ...; a benchmark's own type where it has one
    supporting_ids: list[str] = []  # ids of the corpus documents that hold the answer's facts
    source: str  # "generated", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"

    @property
    def answers(self) -> list[str]:
        return [self.answer, *self.aliases]

    @property
    def reference_tool_calls(self) -> int:
        """How many tool calls a reference solution needs: a search per supporting document, and
        a python call when the answer is arithmetic on what was found."""
        return len(self.supporting_ids) + (self.type == "arithmetic")


class QAData(BaseModel):
    """Questions and the corpus they are asked over."""

    questions: list[QARecord]
    corpus: list[Document]


class QAFormatError(ValueError):
    """A data file is not in the format it was read as; the message names the file and the
    record."""


# ---- corpus files -------------------------------------------------------------------------------


def read_corpus(path: str | Path) -> list[Document]:
    """Documents of a JSON-lines corpus file ({"id", "title", "text"} a line; blank lines
    skipped). Ids must be unique."""
    documents, seen = [], set()
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        document = validated(Document, parse_json_line(line, where), where)
        if document.id in seen:
            raise QAFormatError(f"{where}: duplicate document id {document.id!r}")
        seen.add(document.id)
        documents.append(document)
    return documents


def write_corpus(path: str | Path, documents: list[Document]) -> None:
    lines = [document.model_dump_json() + "\n" for document in documents]
    Path(path).write_text("".join(lines))


def parse_json_line(line: str, where: str) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise QAFormatError(
            f"{where}: not valid JSON ({error.msg}, column {error.colno})"
        ) from None


def validated(model: type[M], raw: object, where: str) -> M:
    """`raw` as a `model`, or a QAFormatError naming `where` and each field that is wrong."""
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'record'}: {e['msg']}"
            for e in error.errors()[:3]
        )
        raise QAFormatError(f"{where}: {problems}") from None


# ---- the generated world ------------------------------------------------------------------------

N_TOWNS = 30
N_COMPANIES = 90
N_OTHER_PEOPLE = 30  # people who founded nothing: search results that look like founders
# Questions per split of the templates that sample combinations (the others take every company).
SAMPLED = {"train": {"tuple": 40, "towns": 30}, "test": {"tuple": 20, "towns": 15}}

_ONSETS = ["Br", "C", "D", "F", "G", "H", "K", "L", "M", "N", "P", "R", "S", "T", "V", "W", "Th"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["n", "r", "l", "m", "s", "nd", "rk", "st", "x", "ll", "th", "v"]
_TOWN_ENDINGS = ["wick", "ford", "holm", "by", "mere", "stead", "burgh", "dale", "port", "ton"]
_REGIONS = ["Northern Vale", "Eastmarch", "Lowlands", "Coastal Reach", "Highmoor", "Westfold"]
_OCCUPATIONS = ["engineer", "chemist", "merchant", "teacher", "printer", "clockmaker", "surveyor"]
_INDUSTRIES = {  # industry -> the word ending the company's name
    "textile": "Textiles",
    "food": "Foods",
    "shipbuilding": "Shipyards",
    "instrument": "Instruments",
    "milling": "Mills",
    "publishing": "Press",
    "rail": "Railworks",
}


class Town(BaseModel):
    id: str
    name: str
    region: str
    founded: int
    population: int


class Person(BaseModel):
    id: str
    name: str
    born: int
    birth_town: str  # a town's name
    lived_town: str  # another town's name, a distractor for "where was X born"
    occupation: str


class Company(BaseModel):
    id: str
    name: str
    industry: str
    founded: int
    founder: Person
    headquarters: Town


class World(BaseModel):
    towns: list[Town]
    people: list[Person]
    companies: list[Company]


class _Names:
    """Made-up, unique names from syllables."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, syllables: int) -> str:
        parts = [
            self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
            for _ in range(syllables)
        ]
        return "".join(parts).capitalize()

    def unique(self, make: Callable[[], str]) -> str:
        while (name := make()) in self.used:
            pass
        self.used.add(name)
        return name


@functools.cache
def generated_world(seed: int = DEFAULT_SEED) -> World:
    """The fictional world of `seed`, built once per process; treat as read-only."""
    rng = random.Random(seed)
    names = _Names(rng)
    town_years = rng.sample(range(1050, 1800), N_TOWNS)  # distinct, all before any company
    towns = [
        Town(
            id=f"town-{i:03d}",
            name=names.unique(lambda: names.word(1) + rng.choice(_TOWN_ENDINGS)),
            region=rng.choice(_REGIONS),
            founded=town_years[i],
            population=rng.randrange(2_000, 900_000),
        )
        for i in range(N_TOWNS)
    ]
    company_years = rng.sample(range(1850, 2000), N_COMPANIES)  # distinct: one answer to compare
    people, companies = [], []
    for i in range(N_COMPANIES + N_OTHER_PEOPLE):
        born = (
            company_years[i] - rng.randint(22, 60) if i < N_COMPANIES else rng.randint(1790, 1970)
        )
        birth_town, lived_town = rng.sample(towns, 2)
        people.append(
            Person(
                id=f"person-{i:03d}",
                name=names.unique(lambda: f"{names.word(1)} {names.word(2)}"),
                born=born,
                birth_town=birth_town.name,
                lived_town=lived_town.name,
                occupation=rng.choice(_OCCUPATIONS),
            )
        )
    for i in range(N_COMPANIES):
        founder = people[i]
        industry = rng.choice(sorted(_INDUSTRIES))
        # headquarters anywhere but the founder's birth town: the company's document must not
        # hold the answer to "where was its founder born"
        headquarters = rng.choice([t for t in towns if t.name != founder.birth_town])
        companies.append(
            Company(
                id=f"company-{i:03d}",
                name=names.unique(lambda ind=industry: f"{names.word(2)} {_INDUSTRIES[ind]}"),
                industry=industry,
                founded=company_years[i],
                founder=founder,
                headquarters=headquarters,
            )
        )
    return World(towns=towns, people=people, companies=companies)


def _with_article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def world_documents(world: World) -> list[Document]:
    """One document per town, person and company, titled with its name."""
    entries = [(t.id, t.name, _town_text(t)) for t in world.towns]
    entries += [(p.id, p.name, _person_text(p)) for p in world.people]
    entries += [(c.id, c.name, _company_text(c)) for c in world.companies]
    return [Document(id=id, title=title, text=text) for id, title, text in entries]


def _town_text(t: Town) -> str:
    return (
        f"{t.name} is a town in the {t.region} region. It was founded in {t.founded}. "
        f"{t.name} has a population of {t.population:,}."
    )


def _person_text(p: Person) -> str:
    return (
        f"{p.name} was born in {p.born} in {p.birth_town}. {p.name.split()[0]} worked "
        f"as {_with_article(p.occupation)} and later lived in {p.lived_town}."
    )


def _company_text(c: Company) -> str:
    return (
        f"{c.name} is {_with_article(c.industry)} company with its headquarters in "
        f"{c.headquarters.name}. It was founded in {c.founded} by {c.founder.name}."
    )


# ---- question templates -------------------------------------------------------------------------


def _question(template: str, subjects: list, question: str, answer: object, type_: str, support):
    return QARecord(
        id=f"{template}/{'+'.join(s.id for s in subjects)}",
        question=question,
        answer=str(answer),
        type=type_,
        supporting_ids=[s.id for s in support],
        source="generated",
    )


def founder_birth_town(c: Company) -> QARecord:
    q = f"In which town was the founder of {c.name} born?"
    return _question("founder_birth_town", [c], q, c.founder.birth_town, "bridge", [c, c.founder])


def headquarters_founded(c: Company) -> QARecord:
    q = f"In which year was the town where {c.name} has its headquarters founded?"
    hq = c.headquarters
    return _question("headquarters_founded", [c], q, hq.founded, "bridge", [c, hq])


def founder_age(c: Company) -> QARecord:
    q = f"How many years after the birth of its founder was {c.name} founded?"
    age = c.founded - c.founder.born
    return _question("founder_age", [c], q, age, "arithmetic", [c, c.founder])


def founded_first(trio: tuple[Company, ...]) -> QARecord:
    a, b, c = trio
    q = f"Which company was founded first: {a.name}, {b.name} or {c.name}?"
    first = min(trio, key=lambda company: company.founded)
    return _question("founded_first", list(trio), q, first.name, "comparison", list(trio))


def founder_born_first(pair: tuple[Company, ...]) -> QARecord:
    a, b = pair
    q = f"Who was born earlier: the founder of {a.name} or the founder of {b.name}?"
    earlier = min((a.founder, b.founder), key=lambda person: person.born)
    support = [a, a.founder, b, b.founder]
    return _question("founder_born_first", [a, b], q, earlier.name, "bridge_comparison", support)


def years_between(pair: tuple[Company, ...]) -> QARecord:
    a, b = sorted(pair, key=lambda company: company.founded)
    q = f"How many years after {a.name} was founded was {b.name} founded?"
    return _question("years_between", [a, b], q, b.founded - a.founded, "arithmetic", [a, b])


def combined_population(pair: tuple[Town, ...]) -> QARecord:
    a, b = pair
    q = f"What is the combined population of {a.name} and {b.name}?"
    total = a.population + b.population
    return _question("combined_population", [a, b], q, total, "arithmetic", [a, b])


def _split_of(items: list[T], split: Split, rng: random.Random) -> list[T]:
    shuffled = rng.sample(items, len(items))
    cut = round(len(items) * TRAIN_FRACTION)
    return shuffled[:cut] if split == "train" else shuffled[cut:]


def _sampled(items: list[T], size: int, count: int, rng: random.Random, keep=None) -> list:
    combos = [c for c in itertools.combinations(items, size) if keep is None or keep(c)]
    return rng.sample(combos, min(count, len(combos)))


def _born_apart(pair: tuple[Company, ...]) -> bool:
    """The two founders' birth years differ, so "who was born earlier" has one answer."""
    return pair[0].founder.born != pair[1].founder.born


def generated_questions(split: Split, seed: int = DEFAULT_SEED) -> list[QARecord]:
    """The split's questions, in a fixed order, identical on every machine."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; expected 'train' or 'test'")
    world = generated_world(seed)
    # one stream per seed, whichever split is asked for: both splits cut the same shuffles
    rng = random.Random(f"split:{seed}")
    companies = _split_of(world.companies, split, rng)
    towns = _split_of(world.towns, split, rng)
    counts = SAMPLED[split]
    return [
        *map(founder_birth_town, companies),
        *map(headquarters_founded, companies),
        *map(founder_age, companies),
        *map(founded_first, _sampled(companies, 3, counts["tuple"], rng)),
        *map(founder_born_first, _sampled(companies, 2, counts["tuple"], rng, _born_apart)),
        *map(years_between, _sampled(companies, 2, counts["tuple"], rng)),
        *map(combined_population, _sampled(towns, 2, counts["towns"], rng)),
    ]


def generated_qa(split: Split, seed: int = DEFAULT_SEED) -> QAData:
    """The embedded default: the split's questions over the whole generated corpus."""
    world = generated_world(seed)
    return QAData(questions=generated_questions(split, seed), corpus=world_documents(world))
