"""Markdown reference of every setting in ``params.yaml``, generated from the pydantic models.

The models in ``model_code/config.py`` (and the settings model each retriever kind declares) are
the one place a setting is described: its type, constraints, default and ``description=``. This
module walks them and renders one table per section, with the value of the shipped
``params.yaml`` where it differs from the model default::

    python -m model_code.params_doc > docs/params.md

``undocumented()`` lists the keys whose field has no description (a test keeps it empty).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from model_code.config import Params, RetrieverParams

ROOT = Path(__file__).resolve().parents[1]
PARAMS_FILE = ROOT / "params.yaml"
COMMAND = "python -m model_code.params_doc > docs/params.md"


@dataclass(frozen=True)
class Setting:
    """One key of the reference: a leaf field, or a field (or retriever kind) holding a section."""

    key: str  # dotted, e.g. train.hce.mode
    type: str
    default: Any  # PydanticUndefined when required; None for a section
    description: str | None
    section: type[BaseModel] | None = None  # the model of a nested section
    annotation: Any = None


@dataclass(frozen=True)
class Section:
    key: str  # dotted; "" for the top level
    model: type[BaseModel]
    settings: list[Setting]


def _doc(model: type[BaseModel]) -> str | None:
    """The class's own docstring (not one inherited from a base), cleaned."""
    doc = model.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if doc else None


def _summary(model: type[BaseModel]) -> str | None:
    doc = _doc(model)
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "`") if doc else None


def _section_model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _retriever_kinds() -> list[tuple[str, type[BaseModel] | None]]:
    from model_code.retrievers.registry import kind_class, kind_names

    return [(name, kind_class(name).settings_model) for name in kind_names()]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def sections(model: type[BaseModel] = Params, prefix: str = "") -> Iterator[Section]:
    """Depth first: ``model``'s own section, then each nested section (and, under a
    ``RetrieverParams``, the settings section of every registered kind that has settings)."""
    settings, nested = [], []
    for name, field in model.model_fields.items():
        key = _join(prefix, name)
        sub = _section_model(field.annotation)
        if sub is not None:
            settings.append(Setting(key, "section", None, field.description or _summary(sub), sub, field.annotation))
            nested.append((key, sub))
        else:
            default = field.get_default(call_default_factory=True)
            settings.append(Setting(key, _type(field.annotation, field), default, field.description,
                                    annotation=field.annotation))
    if isinstance(model, type) and issubclass(model, RetrieverParams):
        for kind, sub in _retriever_kinds():
            if sub is not None:
                key = _join(prefix, kind)
                settings.append(Setting(key, f"section (kind `{kind}`)", None, _summary(sub), sub, sub))
                nested.append((key, sub))
    yield Section(prefix, model, settings)
    for key, sub in nested:
        yield from sections(sub, key)


def settings(model: type[BaseModel] = Params) -> dict[str, Setting]:
    """Every key of ``model`` (sections and leaves), by dotted name."""
    return {s.key: s for section in sections(model) for s in section.settings}


def undocumented(model: type[BaseModel] = Params) -> list[str]:
    """Dotted keys with no description: a leaf field without ``description=``, or a nested
    section whose field has no description and whose model has no docstring."""
    return [key for key, s in settings(model).items() if not (s.description or "").strip()]


# -- rendering -------------------------------------------------------------------------------------


def _code(value: str) -> str:
    return f"`{value}`"


def _type(annotation: Any, field: FieldInfo | None = None) -> str:
    text = _annotation(annotation)
    bounds = []
    for item in field.metadata if field is not None else []:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(item, getattr(annotated_types, attr.capitalize())):
                bounds.append(f"{sign} {_yaml(getattr(item, attr))}")
    return f"{text}, {', '.join(bounds)}" if bounds else text


def _annotation(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return ", ".join(_code(_yaml(a)) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_annotation(a) for a in args)
    if origin is list:
        return f"list of {_annotation(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping {_annotation(args[0])} → {_annotation(args[1])}" if args else "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _yaml(value: Any) -> str:
    """``value`` as it would be written in params.yaml (flow style, one line)."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _shipped(raw: Any, key: str) -> tuple[bool, Any]:
    for part in key.split("."):
        if not isinstance(raw, dict) or part not in raw:
            return False, None
        raw = raw[part]
    return True, raw


def _differs(setting: Setting, value: Any) -> bool:
    with contextlib.suppress(ValidationError):  # compared as written; the config tests report invalid values
        value = TypeAdapter(setting.annotation).validate_python(value)
    return value != setting.default


def _table(section: Section, shipped: dict[str, Any]) -> list[str]:
    lines = ["| key | type / allowed values | default | params.yaml | description |", "|---|---|---|---|---|"]
    for s in section.settings:
        if s.section is not None:
            default = value = ""
        else:
            default = "required" if s.default is PydanticUndefined else _code(_yaml(s.default))
            present, raw = _shipped(shipped, s.key)
            value = _code(_yaml(raw)) if present and _differs(s, raw) else ""
        lines.append(f"| {_code(s.key)} | {_cell(s.type)} | {_cell(default)} | {_cell(value)} | "
                     f"{_cell(s.description or '')} |")
    return lines


def render(model: type[BaseModel] = Params, params_file: Path = PARAMS_FILE) -> str:
    """The Markdown reference (the content of ``docs/params.md``)."""
    shipped = yaml.safe_load(params_file.read_text()) or {}
    out = [
        "# `params.yaml` reference",
        "",
        f"<!-- Generated by `{COMMAND}` from the pydantic models in",
        "     model_code/config.py and the retriever kinds' settings models; do not edit by hand. -->",
        "",
        "`params.yaml` is the single source of configuration: DVC declares its sections as stage params,",
        "and Dagster reads the same file, where each asset's run config may take `overrides`, a mapping",
        "merged over it for that run (e.g. `{train: {max_steps: 5}}`). Every key is typed and validated",
        "by the models in `model_code/config.py` when the file is read: an unknown key, a file holding",
        "no parameters (`{}` takes every default) and settings that contradict each other (such as",
        "`data.min_text_chars` above `data.max_text_chars`) are errors naming the file and the keys.",
        "",
        "Columns: *default* is the model's default (used when the key is left out); *params.yaml* is",
        "the value in the shipped `params.yaml`, shown only where it differs from the default.",
    ]
    for section in sections(model):
        leaves = [s for s in section.settings if s.section is None]
        if not section.key and not leaves:
            continue
        intro = _doc(section.model)
        out += ["", f"## {_code(section.key) if section.key else 'Top level'}", ""]
        if intro:
            out += [intro.replace("``", "`"), ""]
        if isinstance(section.model, type) and issubclass(section.model, RetrieverParams):
            bare = [kind for kind, sub in _retriever_kinds() if sub is None]
            if bare:
                out += [f"Kinds without settings: {', '.join(_code(k) for k in bare)}.", ""]
        out += _table(section, shipped)
    return "\n".join(out) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
