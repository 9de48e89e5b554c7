"""The wire reference: CONTRACT.md's prose, then every message's JSON Schema from
``schemas/json/`` (exported from the pydantic models by ``laneway schema``) as a
table of its fields."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

__all__ = ["schema_section", "type_of", "wire_page"]

# CONTRACT.md is written to be read in the repository; on the site its one link
# into the tree points at the schemas rendered below it.
CONTRACT_LINKS = {"](schemas/json/)": "](#message-schemas)"}


def type_of(schema: dict[str, Any]) -> str:
    """A short reading of a JSON Schema node's type: ``string | null``, ``array of
    ChatMessage``, ``"realtime" | "medium"``, ``integer (≥ 1)``."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " | ".join(json.dumps(value) for value in schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " | ".join(type_of(option) for option in schema[key])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " | ".join(kind)
    if kind == "array" and "items" in schema:
        kind = f"array of {type_of(schema['items'])}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        kind = f"object of {type_of(schema['additionalProperties'])}"
    bounds = []
    for key, sign in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ):
        if key in schema:
            bounds.append(f"{sign} {schema[key]}")
    if "pattern" in schema:
        bounds.append(f"pattern `{schema['pattern']}`")
    return f"{kind} ({', '.join(bounds)})" if bounds else str(kind)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _fields_table(schema: dict[str, Any]) -> list[str]:
    properties: dict[str, Any] = schema.get("properties", {})
    if not properties:
        return [f"Type: {type_of(schema)}.", ""]
    required = set(schema.get("required", []))
    lines = [
        "| field | type | required | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, node in properties.items():
        default = f"`{json.dumps(node['default'])}`" if "default" in node else "-"
        lines.append(
            f"| `{name}` | {_cell(type_of(node))} | {'yes' if name in required else 'no'} "
            f"| {_cell(default)} | {_cell(node.get('description', ''))} |"
        )
    return [*lines, ""]


def schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    """One message: its description, its fields, its definitions, the raw schema."""
    lines = [f"### `{name}`", ""]
    if schema.get("description"):
        lines += [_one_line(schema["description"]), ""]
    extra = schema.get("additionalProperties") is False
    lines += _fields_table(schema)
    if extra:
        lines += ["Fields not listed are refused (`additionalProperties: false`).", ""]
    for def_name, definition in schema.get("$defs", {}).items():
        lines += [f"**{def_name}**", ""]
        if definition.get("description"):
            lines += [_one_line(definition["description"]), ""]
        lines += _fields_table(definition)
    raw = json.dumps(schema, indent=2, sort_keys=False)
    lines += [
        f'??? note "JSON Schema of `{name}`"',
        "",
        "    ```json",
        textwrap.indent(raw, "    "),
        "    ```",
        "",
    ]
    return lines


def wire_page(repo_root: Path) -> str:
    """The whole page, Markdown."""
    contract = (repo_root / "CONTRACT.md").read_text(encoding="utf-8")
    for old, new in CONTRACT_LINKS.items():
        contract = contract.replace(old, new)
    lines = [
        contract.rstrip(),
        "",
        "## Message schemas",
        "",
        "Generated at build time from `schemas/json/*.schema.json`, the JSON Schemas",
        "`laneway schema` exports from the pydantic models (a test fails when they",
        "and the models disagree).",
        "",
    ]
    for path in sorted((repo_root / "schemas" / "json").glob("*.schema.json")):
        name = path.name.removesuffix(".schema.json")
        lines += schema_section(name, json.loads(path.read_text(encoding="utf-8")))
    return "\n".join(lines)
