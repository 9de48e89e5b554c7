"""The README's headline figures are the result files' figures: every number in
its Figures table is a figure of a result file of that row's benchmark."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _figure_rows() -> list[tuple[str, str]]:
    """(benchmark, figure cell) of each row of the README's Figures table."""
    section = README.split("## Figures", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = re.match(r"\| [^|]+ \| `laneway bench ([a-z-]+)[^`]*` \| ([^|]+) \|", line)
        if match:
            rows.append((match.group(1), match.group(2)))
    return rows


def _values(benchmark: str) -> list[float]:
    values: list[float] = []
    for path in (ROOT / "benchmarks" / "results" / benchmark).glob("*.json"):
        for figure in json.loads(path.read_text(encoding="utf-8"))["figures"].values():
            value = figure["value"]
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.append(float(value))
                if figure["unit"] == "ratio":
                    values.append(float(value) * 100)
    return values


def _shown_as(number: str, values: list[float]) -> bool:
    """Whether ``number`` (as the README prints it) is one of ``values``
    rounded to the decimals the README shows."""
    decimals = len(number.partition(".")[2])
    shown = float(number.replace(",", ""))
    return any(round(value, decimals) == shown for value in values)


def test_every_headline_figure_comes_from_a_result_file() -> None:
    rows = _figure_rows()
    assert len(rows) >= 6, "the README's Figures table lost its rows"
    for benchmark, cell in rows:
        known = _values(benchmark)
        assert known, f"no result files for `laneway bench {benchmark}`"
        numbers = re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?", cell)
        for number in numbers:
            assert _shown_as(number, known), f"{benchmark}: {number} ({cell.strip()})"
