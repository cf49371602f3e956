"""Every setting of a config, with its type, default and one line of documentation, read from the
settings classes themselves (`flywheel/settings.py`, a stage's own in `tasks/`, a recipe's config
in `flows/`).

A field's documentation is its `Field(description=...)` where it has one, else the `# comment`
written with it: the comment lines right above the field and the one at the end of its line. So
the source stays the one place a setting is explained, and `--help` cannot drift from it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import json
import re
import textwrap
import tokenize
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from flywheel.config_files import settings_class_of

# Comments that tell tools something, not people.
PRAGMA = re.compile(r"^(fmt:|noqa|type:|pragma)")
# "num_processes ... # as in SFTSettings": the doc is that class's doc of the same field.
SEE_ALSO = re.compile(r"^as in (\w+)$")


class SettingDoc:
    """One settable key: `dpo.beta`, its type, its default and what it does."""

    def __init__(self, key: str, type_name: str, default: Any, doc: str):
        self.key, self.type_name, self.default, self.doc = key, type_name, default, doc

    def __repr__(self) -> str:
        return f"SettingDoc({self.key!r}, {self.type_name!r}, {self.default!r}, {self.doc!r})"


def setting_docs(config_class: type[BaseModel]) -> list[SettingDoc]:
    """Every key of `config_class`, in the order of its fields, defaults as the recipe has them
    (a recipe may change a section's defaults: Agent-R1's `env` is the QA environment)."""
    return list(walk(config_class, config_class().model_dump(mode="json"), ""))


def walk(model: type[BaseModel], defaults: dict, prefix: str):
    for name, field in model.model_fields.items():
        nested = settings_class_of(field.annotation)
        if nested is not None and isinstance(defaults.get(name), dict):
            yield from walk(nested, defaults[name], f"{prefix}{name}.")
            continue
        doc = field.description or field_doc(model, name)
        yield SettingDoc(f"{prefix}{name}", type_name(field.annotation), defaults.get(name), doc)


def section_docs(config_class: type[BaseModel]) -> dict[str, str]:
    """Section key (`dpo`, `env.qa`) -> the first line of its class's docstring."""
    found = {}

    def visit(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            nested = settings_class_of(field.annotation)
            if nested is not None:
                found[f"{prefix}{name}"] = first_sentence(inspect.getdoc(nested) or "")
                visit(nested, f"{prefix}{name}.")

    visit(config_class, "")
    return found


def field_doc(model: type[BaseModel], name: str) -> str:
    """The first sentence of the comment on `name` in the nearest class of `model`'s lineage
    that comments it."""
    for owner in model.__mro__:
        comment = class_comments(owner).get(name, "")
        if match := SEE_ALSO.match(comment):
            other = next(
                (c for c in owner.__mro__ if c.__name__ == match.group(1)),
                getattr(inspect.getmodule(owner), match.group(1), None),
            )
            comment = field_doc(other, name) if other is not None else comment
        if comment:
            return first_sentence(comment)
    return ""


@functools.cache
def class_comments(owner: type) -> dict[str, str]:
    """Field name -> the comment lines above its definition in `owner`'s body and the comment
    at the end of it, joined (only `owner`'s own fields; pragmas left out)."""
    if not (isinstance(owner, type) and issubclass(owner, BaseModel)) or owner is BaseModel:
        return {}
    try:
        source = textwrap.dedent(inspect.getsource(owner))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}  # line number -> comment text
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            if not PRAGMA.match(text):
                comments[token.start[0]] = text
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(token.start[0])
    found = {}
    for statement in ast.parse(source).body[0].body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        above, line = [], statement.lineno - 1
        while line in comments and line not in code_lines:  # a comment block of its own
            above.insert(0, comments[line])
            line -= 1
        trailing = [
            comments[n]
            for n in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
            if n in comments
        ]
        text = " ".join(above + trailing).strip()
        if text:
            found[statement.target.id] = text
    return found


def first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence ("e.g. 0.2" does not)."""
    text = " ".join(text.split())
    return re.split(r"(?<=[a-z0-9)\]'\"`]\.)\s+(?=[A-Z])", text, maxsplit=1)[0]


def type_name(annotation) -> str:
    """How a person writes the type in YAML: `int | null`, `grpo | ppo`, `list[str]`."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


def shown_value(value: Any) -> str:
    """A default as it would be written in YAML: `null`, `true`, `[]`, a bare word."""
    if isinstance(value, str) and value and value.strip() == value and ": " not in value:
        return value
    return json.dumps(value)


def settings_help(config_class: type[BaseModel]) -> str:
    """The `--help` listing: each section's summary, then its keys with type = default and
    their documentation as a trailing `# comment`."""
    sections = section_docs(config_class)
    lines, section = [], ""
    top_level_first = sorted(setting_docs(config_class), key=lambda s: "." in s.key)
    for setting in top_level_first:
        here = setting.key.rsplit(".", 1)[0] if "." in setting.key else ""
        if here != section:
            section = here
            lines += ["", f"{section}: {sections.get(section, '')}".rstrip()]
        line = f"  {setting.key} ({setting.type_name}) = {shown_value(setting.default)}"
        lines.append(f"{line}  # {setting.doc}" if setting.doc else line)
    return "\n".join(lines).lstrip("\n")
