"""Config files: a recipe's YAML file and `key=value` overrides read into its settings model.

Every mistake is a `ConfigError` whose message names the key to fix (an unknown key names the
nearest one); the settings models themselves are in `flywheel/settings.py` (shared sections),
the stages (`tasks/`) and the recipes (`flows/`).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import get_args

import yaml
from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what to do."""


def apply_override(data: dict, assignment: str) -> None:
    """`dpo.beta=0.2` sets data["dpo"]["beta"]; the value is parsed as YAML (numbers, lists...)."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} is not of the form key=value (e.g. rounds=3)")
    key, raw = assignment.split("=", 1)
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {assignment!r}: {part!r} is not a section")
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise ConfigError(
            f"override {assignment!r}: the value of {key.strip()} is not valid YAML: "
            f"{yaml_problem(error)}"
        ) from None


def load_config(
    model: type[BaseModel], path: str | None = None, overrides: list[str] = ()
) -> BaseModel:
    data = read_config_file(path) if path else {}
    for assignment in overrides:
        apply_override(data, assignment)
    return validate_config(model, data)


def load_config_section(model: type[BaseModel], path: str, section: str) -> BaseModel:
    """One section of a recipe config file (e.g. `env` for an environment server)."""
    data = read_config_file(path)
    try:
        return validate_config(model, data.get(section) or {})
    except ConfigError as error:
        raise ConfigError(f"{path}: section {section!r}: {error}") from None


def read_config_file(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"config file {path!r} is not valid YAML: {yaml_problem(error)}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of settings")
    return data


def yaml_problem(error: Exception) -> str:
    """The parser's complaint in one line: where (line, column and the text there, which names
    the setting) and what, instead of its multi-line report."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return problem
    where = f"line {mark.line + 1}, column {mark.column + 1}: {problem}{yaml_line(mark)}"
    start = getattr(error, "context_mark", None)
    if start is not None and start.line != mark.line:  # an unclosed [ or ' opened earlier
        where += f", {error.context} opened on line {start.line + 1}{yaml_line(start)}"
    return where


def yaml_line(mark) -> str:
    lines = (mark.buffer or "").replace("\0", "").splitlines()
    text = lines[mark.line].strip() if mark.line < len(lines) else ""
    return f" (`{text}`)" if text else ""


def validate_config(model: type[BaseModel], data: dict) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        lines = []
        for problem in error.errors():
            field = ".".join(str(p) for p in problem["loc"]) or "(top level)"
            if problem["type"] == "extra_forbidden":
                lines.append(f"  {field}: {unknown_key_message(model, problem['loc'])}")
            else:
                lines.append(f"  {field}: {problem['msg']}")
        raise ConfigError("invalid config:\n" + "\n".join(lines)) from None


def section_model(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    """The settings class at dotted `path` inside `model` (`["dpo"]` → DPOSettings), or None
    where the path leaves the settings classes (a list entry, a free-form mapping)."""
    for part in path:
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = settings_class_of(field.annotation)
        if model is None:
            return None
    return model


def settings_class_of(annotation) -> type[BaseModel] | None:
    """The settings class a field holds (also inside `X | None`), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    found = [settings_class_of(a) for a in get_args(annotation) if a is not type(None)]
    found = [a for a in found if a is not None]
    return found[0] if len(found) == 1 else None


def setting_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key a config of `model` may set (`dpo.beta`, `env.qa.format`, ...)."""
    keys = []
    for name, field in model.model_fields.items():
        nested = settings_class_of(field.annotation)
        keys += setting_keys(nested, f"{prefix}{name}.") if nested else [f"{prefix}{name}"]
    return keys


def unknown_key_message(model: type[BaseModel], loc: tuple) -> str:
    """Why a key is refused and what was probably meant: the nearest key of its section
    (`dpo.betta` → dpo.beta), else keys elsewhere with that name (`beta` → dpo.beta), else the
    section's keys."""
    *parents, leaf = [str(part) for part in loc]
    section = section_model(model, parents)
    if section is None:
        return "unknown setting"
    prefix = "".join(f"{part}." for part in parents)
    names = list(section.model_fields)
    nearest = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
    if nearest:
        return f"unknown setting; did you mean {prefix}{nearest[0]}?"
    elsewhere = [key for key in setting_keys(model) if key.rsplit(".", 1)[-1] == leaf]
    if elsewhere:
        return f"unknown setting here; did you mean {' or '.join(elsewhere)}?"
    where = f"section {prefix[:-1]}" if parents else "the top level"
    return f"unknown setting; {where} has {', '.join(names)}"
