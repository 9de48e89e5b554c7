"""The settings reference: every ``LANEWAY_*`` variable of ``schemas.settings.Settings``,
its type, default and meaning, read from the model and its field docstrings."""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python
from pydantic_settings import BaseSettings

from schemas.settings import Settings

__all__ = ["SettingRow", "settings_page", "settings_rows"]

MISSING = "*no description in `schemas/settings.py`*"


@dataclass(frozen=True)
class SettingRow:
    """One environment variable."""

    group: str
    variable: str
    type: str
    default: str
    description: str | None


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name -> the string literal that follows its annotation in the class
    body (the convention of ``schemas/settings.py``), over the class's bases too."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        if klass.__module__.startswith("pydantic"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, following in itertools.pairwise(body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(following.value.value)
    return docs


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(to_jsonable_python(v)) for v in typing.get_args(annotation))
    if origin in (types.UnionType, typing.Union):
        return " | ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(_type_name(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    if annotation is Ellipsis:
        return "..."
    return getattr(annotation, "__name__", str(annotation))


def _constraints(field: FieldInfo) -> str:
    marks = {
        annotated_types.Ge: ("≥", "ge"),
        annotated_types.Gt: (">", "gt"),
        annotated_types.Le: ("≤", "le"),
        annotated_types.Lt: ("<", "lt"),
    }
    parts = []
    for item in field.metadata:
        for kind, (sign, attr) in marks.items():
            if isinstance(item, kind):
                parts.append(f"{sign} {getattr(item, attr)}")
    return f" ({', '.join(parts)})" if parts else ""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(to_jsonable_python(value, fallback=str))}`"


def _settings_class(field: FieldInfo) -> type[BaseSettings] | None:
    """The sub-settings class a field is built from (its factory), if any."""
    factory = field.default_factory
    if isinstance(factory, type) and issubclass(factory, BaseSettings):
        return factory
    return None


def _variable(prefix: str, name: str, field: FieldInfo) -> str:
    """The environment variable a field reads: its prefix and name, or the alias it
    is read by instead (pydantic-settings reads an alias without the prefix)."""
    alias = field.validation_alias
    if isinstance(alias, str):
        return alias.upper()
    if isinstance(alias, AliasChoices):
        return " or ".join(str(choice).upper() for choice in alias.choices)
    return f"{prefix}{name.upper()}"


def settings_rows(cls: type[BaseSettings] = Settings) -> Iterator[SettingRow]:
    """Every variable of ``cls`` and of the sub-settings it is built from, in order."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    docs = _attribute_docstrings(cls)
    nested: list[type[BaseSettings]] = []
    for name, field in cls.model_fields.items():
        sub = _settings_class(field)
        if sub is not None:
            nested.append(sub)
            continue
        description = field.description or docs.get(name)
        yield SettingRow(
            group=prefix,
            variable=_variable(prefix, name, field),
            type=_type_name(field.annotation) + _constraints(field),
            default=_default(field),
            description=description,
        )
    for sub in nested:
        yield from settings_rows(sub)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_page() -> str:
    """The whole page, Markdown."""
    rows = list(settings_rows())
    missing = sum(1 for row in rows if row.description is None)
    lines = [
        "# Settings",
        "",
        "Generated at build time from `schemas.settings.Settings`: every environment",
        "variable a laneway process reads, its type, its default and what it means.",
        "Each process reads the environment once, in `main()`, into one frozen",
        "settings object; nothing below `main()` reads the environment. Values that",
        "are lists, maps or models are given as JSON.",
        "",
    ]
    if missing:
        lines += [
            '!!! warning "Undocumented settings"',
            f"    {missing} of {len(rows)} variables have no description in",
            "    `schemas/settings.py` yet; their rows say so rather than guess.",
            "",
        ]
    group = None
    for row in rows:
        if row.group != group:
            group = row.group
            lines += [
                "",
                f"## `{group}*`",
                "",
                "| variable | type | default | meaning |",
                "| --- | --- | --- | --- |",
            ]
        meaning = _cell(row.description) if row.description else MISSING
        lines.append(f"| `{row.variable}` | {_cell(row.type)} | {_cell(row.default)} | {meaning} |")
    return "\n".join(lines) + "\n"
