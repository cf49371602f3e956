"""Every setting of a config, with its type, default and one line of documentation, read from the
settings classes themselves (`flywheel/settings.py`, a stage's own in `tasks/`, a recipe's config
in `flows/`).

A field's documentation is its description: the docstring below it (pydantic's
`use_attribute_docstrings`, on every settings class through `Strict`) or `Field(description=...)`.
So the settings classes stay the one place a setting is explained, and `--help` cannot drift
from them.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from flywheel.config_files import settings_class_of


class SettingDoc:
    """One settable key: `dpo.beta`, its type, its default and what it does."""

    def __init__(self, key: str, type_name: str, default: Any, doc: str, owner: str = ""):
        self.key, self.type_name, self.default, self.doc = key, type_name, default, doc
        self.owner = owner  # the settings class the key's section is

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
        doc = field_doc(model, name)
        setting = SettingDoc(
            f"{prefix}{name}", type_name(field.annotation), defaults.get(name), doc
        )
        setting.owner = model.__name__
        yield setting


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
    """The first sentence of the field's description (its docstring), from the nearest class of
    `model`'s lineage that documents it: a subclass that only changes a default keeps its
    base's words."""
    for owner in model.__mro__:
        field = getattr(owner, "model_fields", {}).get(name)
        if field is not None and field.description:
            return first_sentence(field.description)
    return ""


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


def settings_help(
    config_class: type[BaseModel], values: dict | None = None, sections: list[str] | None = None
) -> str:
    """The settings listing: each section's summary once, then its keys with type = value and
    their documentation as a trailing `# comment`. `values` (a config's `model_dump(mode="json")`)
    shows what a config file and overrides set instead of the class defaults; `sections` keeps
    only those sections (and the sections below them)."""
    summaries = section_docs(config_class)
    by_section: dict[str, list[SettingDoc]] = {}
    for setting in setting_docs(config_class):
        section = setting.key.rsplit(".", 1)[0] if "." in setting.key else ""
        by_section.setdefault(section, []).append(setting)
    lines = []
    for section, settings in by_section.items():
        if sections is not None and not any(
            section == s or section.startswith(s + ".") for s in sections
        ):
            continue
        if section:
            lines += ["", f"{section}: {summaries.get(section, '')}".rstrip()]
        for setting in settings:
            value = lookup(values, setting.key) if values is not None else setting.default
            line = f"  {setting.key} ({setting.type_name}) = {shown_value(value)}"
            lines.append(f"{line}  # {setting.doc}" if setting.doc else line)
        lines += trl_lines(section, settings)
    return "\n".join(lines).lstrip("\n")


def sections_summary(config_class: type[BaseModel]) -> str:
    """One line per section: its name, how many settings it has, and its summary."""
    counts: dict[str, int] = {}
    for setting in setting_docs(config_class):
        if "." in setting.key:
            section = setting.key.split(".", 1)[0]
            counts[section] = counts.get(section, 0) + 1
    summaries = section_docs(config_class)
    return "\n".join(
        f"  {name:<13} {count:>3} settings  {summaries.get(name, '')}".rstrip()
        for name, count in counts.items()
    )


def lookup(values: dict, key: str):
    for part in key.split("."):
        values = values.get(part) if isinstance(values, dict) else None
    return values


# The trl configs a trainer section's `trl_args` go to (training/job.py builds them).
TRL_CONFIGS = {"SFTSettings": "SFTConfig", "DPOSettings": "DPOConfig"}


def trl_lines(section: str, settings: list[SettingDoc]) -> list[str]:
    """For a section with `trl_args`: the fields of trl's own config class (not those of
    transformers' TrainingArguments it extends) that trl_args may set, with trl's defaults."""
    if not any(s.key == f"{section}.trl_args" for s in settings):
        return []
    owner = section_class(settings)
    trl_name = TRL_CONFIGS.get(owner, "")
    if not trl_name:
        return []
    import dataclasses

    import transformers
    import trl

    trl_class = getattr(trl, trl_name)
    inherited = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    own = [f for f in dataclasses.fields(trl_class) if f.name not in inherited]
    shown = ", ".join(
        f"{f.name}={shown_value(f.default)}" for f in own if f.default is not dataclasses.MISSING
    )
    return [
        f"  ({section}.trl_args: any field of trl.{trl_name} or transformers' TrainingArguments "
        f"that no setting above covers; trl.{trl_name}'s own: {shown})"
    ]


def section_class(settings: list[SettingDoc]) -> str:
    return settings[0].owner if settings else ""
