"""A student's training pairs: a prompt and the teacher's answer to it.

Two sources:

- export rows (``laneway distill export``): a heavy-path row's own answer,
  or the ``heavy_output`` a light-path row carries (the same prompt answered
  heavy in the window, or by a shadow). A heavy answer the client rated bad
  (mean ``feedback`` below 0) is never a target, nor the same answer to the
  same prompt carried by another row; a heavy request that failed, or
  answered nothing, is never a target either. Each is counted.
- the fine-tune set (``distill train --finetune-out``): chat JSONL, one
  ``{"messages": [user..., assistant]}`` per line. It holds no ratings:
  ``write_finetune`` already took only answers that exist.

One pair per distinct prompt (``rows.prompt_key``), the first seen. The
held-out share is drawn by prompt with a seeded shuffle, so one seed gives
one split, and a prompt is never on both sides.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from streams.distill.rows import ExportRow, RowsError, prompt_key, read_rows

__all__ = [
    "Pair",
    "StudentData",
    "StudentError",
    "load_pairs",
    "pairs_from_chat",
    "pairs_from_rows",
    "split",
]


class StudentError(ValueError):
    """A student cannot be trained from this input; the message says why."""


@dataclass(frozen=True, slots=True)
class Pair:
    prompt: str
    answer: str
    """The teacher's answer: the training target."""


@dataclass(frozen=True, slots=True)
class StudentData:
    pairs: list[Pair]
    dropped_bad: int = 0
    dropped_failed: int = 0
    teacher: str | None = None
    """The heavy model named by the rows (the most frequent), when they name one."""
    start_ms: int | None = None
    end_ms: int | None = None

    def window(self) -> dict[str, str] | None:
        if self.start_ms is None or self.end_ms is None:
            return None
        return {"start": _iso(self.start_ms), "end": _iso(self.end_ms)}


def _iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def _rated_bad(row: ExportRow) -> bool:
    return row.feedback is not None and row.feedback < 0


def pairs_from_rows(rows: Sequence[ExportRow]) -> StudentData:
    """Pairs from export rows (see the module's docstring)."""
    bad: set[tuple[str, str]] = set()
    dropped_bad = dropped_failed = 0
    for row in rows:
        if row.path != "heavy":
            continue
        if not row.success or not (row.output or "").strip():
            dropped_failed += 1
        elif _rated_bad(row):
            bad.add((prompt_key(row.prompt), (row.output or "").strip()))
            dropped_bad += 1
    pairs: dict[str, Pair] = {}
    teachers: dict[str, int] = {}
    stamps: list[int] = []
    for row in rows:
        key = prompt_key(row.prompt)
        if row.path == "heavy":
            answer = (row.output or "").strip() if row.success else ""
        else:
            answer = (row.heavy_output or "").strip()
        if not answer or (key, answer) in bad or (row.path == "heavy" and _rated_bad(row)):
            continue
        if row.path == "heavy" and row.model:
            teachers[row.model] = teachers.get(row.model, 0) + 1
        stamps.append(row.ts_ms)
        pairs.setdefault(key, Pair(row.prompt, answer))
    return StudentData(
        pairs=list(pairs.values()),
        dropped_bad=dropped_bad,
        dropped_failed=dropped_failed,
        teacher=max(teachers, key=lambda name: teachers[name]) if teachers else None,
        start_ms=min(stamps) if stamps else None,
        end_ms=max(stamps) if stamps else None,
    )


def pairs_from_chat(lines: Iterable[str], source: str = "chat JSONL") -> StudentData:
    """Pairs from chat JSONL: the last user message and the assistant's answer."""
    pairs: dict[str, Pair] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
            user = [m["content"] for m in messages if m["role"] == "user"]
            assistant = [m["content"] for m in messages if m["role"] == "assistant"]
        except (ValueError, KeyError, TypeError) as exc:
            raise StudentError(
                f"{source}:{number}: not a chat line {{'messages': [...]}}: {exc!r}"
            ) from None
        if not user or not assistant or not str(assistant[-1]).strip():
            continue
        pairs.setdefault(prompt_key(user[-1]), Pair(user[-1], str(assistant[-1]).strip()))
    return StudentData(pairs=list(pairs.values()))


def load_pairs(path: Path) -> StudentData:
    """Pairs from a file: chat JSONL when its first line has ``messages``,
    else export rows (JSONL or Parquet)."""
    if not path.is_file():
        raise StudentError(f"{path}: no such file")
    if path.suffix != ".parquet":
        with path.open() as lines:
            first = next((line for line in lines if line.strip()), "")
        try:
            is_chat = "messages" in json.loads(first) if first else False
        except ValueError as exc:
            raise StudentError(f"{path}:1: not JSON: {exc}") from None
        if is_chat:
            with path.open() as lines:
                return pairs_from_chat(lines, str(path))
    try:
        return pairs_from_rows(list(read_rows(path)))
    except RowsError as exc:
        raise StudentError(str(exc)) from None


def split(pairs: Sequence[Pair], share: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """``(train, held_out)``: ``share`` of the prompts (at least one when
    ``share > 0`` and there are two or more) held out by a seeded shuffle."""
    if not 0 <= share < 1:
        raise StudentError(f"held-out share {share} is not within 0..1 (1 excluded)")
    order = sorted(range(len(pairs)), key=lambda i: prompt_key(pairs[i].prompt))
    random.Random(seed).shuffle(order)
    n = math.ceil(share * len(pairs)) if share > 0 and len(pairs) >= 2 else 0
    n = min(n, len(pairs) - 1) if pairs else 0
    held = set(order[:n])
    return (
        [p for i, p in enumerate(pairs) if i not in held],
        [p for i, p in enumerate(pairs) if i in held],
    )
