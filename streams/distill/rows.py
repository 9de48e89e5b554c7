"""The training set's rows: one per answered model request, as
``laneway distill export`` writes them and ``train`` and ``report`` read
them, in JSONL (always) or Parquet (``pyarrow``, the ``distill`` extra).

Fields of a row (``ExportRow``): the request (``id``, ``ts_ms``, ``tenant``,
``prompt`` — the text the router reads — ``max_tokens``, ``features``: the
router's ``RequestFeatures`` as a mapping), what answered it (``lane``,
``path``, ``model``, ``version`` when the result names one, ``success``,
``error_code``, ``degraded``, ``explored``, ``output``), what it cost
(``latency_ms``, ``prompt_tokens``, ``completion_tokens``, ``cost`` in
registry units), the client's ``feedback`` (mean score, ``None`` when none
came) and, where the same prompt was answered by both paths in the window
(or by a shadow), ``light_output`` and ``heavy_output``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ExportRow",
    "RowsError",
    "parse_when",
    "prompt_key",
    "read_rows",
    "write_rows",
]


class RowsError(ValueError):
    """Rows or a time that cannot be read; the message says which and why."""


@dataclass(slots=True)
class ExportRow:
    id: str
    ts_ms: int
    prompt: str
    features: dict[str, Any]
    path: str
    success: bool
    tenant: str | None = None
    max_tokens: int = 0
    lane: str | None = None
    model: str | None = None
    version: str | None = None
    error_code: str | None = None
    degraded: bool = False
    explored: bool = False
    output: str | None = None
    latency_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    feedback: float | None = None
    feedback_count: int = 0
    light_output: str | None = None
    heavy_output: str | None = None
    sources: list[str] = field(default_factory=list)
    """Where the light/heavy answers came from: ``window`` (the same prompt
    answered on both paths), ``shadow``."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExportRow:
        known = {f.name for f in fields(cls)}
        missing = [
            n for n in ("id", "ts_ms", "prompt", "features", "path", "success") if n not in data
        ]
        if missing:
            raise RowsError(f"row {data.get('id', '?')!r} lacks {missing}")
        return cls(**{k: v for k, v in data.items() if k in known})


def prompt_key(text: str) -> str:
    """What makes two prompts the same one: case and spacing folded."""
    return " ".join(text.lower().split())


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """``now``, a duration back from now (``90s``, ``30m``, ``2h``, ``7d``,
    ``1w``), epoch milliseconds, or an ISO 8601 time (UTC when no offset)."""
    now = now or datetime.now(UTC)
    value = text.strip().lower()
    if value == "now":
        return now
    relative = _RELATIVE.match(value)
    if relative:
        return now - timedelta(seconds=float(relative.group(1)) * _UNITS[relative.group(2)])
    if value.isdigit() and len(value) >= 12:
        return datetime.fromtimestamp(int(value) / 1000, UTC)
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise RowsError(
            f"time {text!r}: not 'now', a duration like 2h / 30m / 7d, epoch ms or an ISO 8601 time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _format_of(path: Path, fmt: str | None) -> Literal["jsonl", "parquet"]:
    if fmt is not None:
        if fmt not in ("jsonl", "parquet"):
            raise RowsError(f"format {fmt!r}: jsonl or parquet")
        return fmt  # type: ignore[return-value]
    return "parquet" if path.suffix == ".parquet" else "jsonl"


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RowsError(
            "Parquet needs pyarrow (pip install 'laneway[distill]'); JSONL needs nothing"
        ) from None
    return pa, pq


def write_rows(rows: Iterable[ExportRow], path: Path, fmt: str | None = None) -> int:
    """Write ``rows`` to ``path`` (a new file, renamed in place); returns how many."""
    kind = _format_of(path, fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    n = 0
    if kind == "jsonl":
        with partial.open("w") as out:
            for row in rows:
                out.write(json.dumps(row.as_dict(), ensure_ascii=False) + "\n")
                n += 1
    else:
        pa, pq = _pyarrow()
        # Features vary in their keys' types (intent may be null): one JSON column.
        records = []
        for row in rows:
            data = row.as_dict()
            data["features"] = json.dumps(data["features"])
            records.append(data)
        n = len(records)
        pq.write_table(pa.Table.from_pylist(records), partial)
    partial.replace(path)
    return n


def read_rows(path: Path, fmt: str | None = None) -> Iterator[ExportRow]:
    """The rows of an export file, JSONL or Parquet by suffix (or ``fmt``)."""
    kind = _format_of(path, fmt)
    if not path.is_file():
        raise RowsError(f"{path}: no such file")
    if kind == "parquet":
        _, pq = _pyarrow()
        for data in pq.read_table(path).to_pylist():
            data["features"] = json.loads(data["features"])
            yield ExportRow.from_dict(data)
        return
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError as exc:
                raise RowsError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(data, dict):
                raise RowsError(f"{path}:{number}: not a JSON object")
            try:
                yield ExportRow.from_dict(data)
            except (RowsError, TypeError) as exc:
                raise RowsError(f"{path}:{number}: {exc}") from None
