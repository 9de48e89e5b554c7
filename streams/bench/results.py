"""The result file every ``laneway bench <mode>`` run can write: what ran,
at which commit, on which CPU, when, and every figure it printed (and the
curves it measured), one JSON file per run.

    benchmarks/results/<benchmark>/<YYYY-MM-DD>-<cpu-slug>-<commit7>.json

``--result PATH`` writes it there; ``--save`` into the repository's
``benchmarks/results`` by the naming rule. Before it is written it is
checked against ``benchmarks/result.schema.json`` (when the checkout has
it), so a file the docs cannot read is never written.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workers.cpu import cpu_info, cpu_slug

__all__ = [
    "RESULT_SCHEMA",
    "SCHEMA_FILE",
    "BenchRun",
    "Figure",
    "InvalidResult",
    "Series",
    "build_result",
    "cpu_info",
    "cpu_slug",
    "git_commit",
    "load_average",
    "repo_root",
    "result_name",
    "validate_result",
    "write_result",
]

RESULT_SCHEMA = "laneway.bench.result/1"
"""The ``schema`` field of every result file."""

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO_ROOT / "benchmarks" / "result.schema.json"


@dataclass(frozen=True, slots=True)
class Figure:
    """One headline figure: its value, unit and what it measures."""

    value: float | int | None
    unit: str
    label: str


@dataclass(frozen=True, slots=True)
class Series:
    """A curve: ``points`` are ``(x, y)`` pairs."""

    x: str
    x_unit: str
    y: str
    y_unit: str
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class BenchRun:
    """What a bench mode's run hands back: its exit status, and the figures
    (by a stable snake_case name) and curves it printed."""

    exit_code: int
    figures: Mapping[str, Figure] = field(default_factory=dict)
    series: Mapping[str, Series] = field(default_factory=dict)
    notes: str | None = None


class InvalidResult(ValueError):
    """A result that does not match the result file's schema."""


def load_average() -> list[float] | None:
    """The machine's load average over 1, 5 and 15 minutes (``None`` where
    the platform has none): a figure from a busy machine says so."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_commit(cwd: Path = REPO_ROOT) -> str:
    """``git rev-parse --short HEAD``, ``-dirty`` when tracked files have
    changes; ``"unknown"`` outside a git checkout."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if changes else head or "unknown"


def _number(value: float | int | None) -> float | int | None:
    """JSON has no NaN or infinity: a figure that is not a number is ``None``."""
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def build_result(
    benchmark: str,
    command: str,
    run: BenchRun,
    *,
    now: datetime | None = None,
    commit: str | None = None,
    cpu: Mapping[str, Any] | None = None,
    load: Mapping[str, list[float] | None] | None = None,
) -> dict[str, Any]:
    """The result file's content for ``run`` of mode ``benchmark``;
    ``load``: the load average when the run began and ended."""
    when = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
    result: dict[str, Any] = {
        "schema": RESULT_SCHEMA,
        "benchmark": benchmark,
        "command": command,
        "commit": commit if commit is not None else git_commit(),
        "date": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu": dict(cpu if cpu is not None else cpu_info()),
        "figures": {
            name: {"value": _number(f.value), "unit": f.unit, "label": f.label}
            for name, f in run.figures.items()
        },
    }
    if run.series:
        result["series"] = {
            name: {
                "x": s.x,
                "x_unit": s.x_unit,
                "y": s.y,
                "y_unit": s.y_unit,
                "points": [[_number(x), _number(y)] for x, y in s.points],
            }
            for name, s in run.series.items()
        }
    if load is not None and all(load.get(when) is not None for when in ("before", "after")):
        result["load"] = {when: load[when] for when in ("before", "after")}
    if run.notes:
        result["notes"] = run.notes
    return result


def result_name(result: Mapping[str, Any]) -> Path:
    """``<benchmark>/<YYYY-MM-DD>-<cpu-slug>-<commit7>.json``."""
    day = str(result["date"])[:10]
    commit = str(result["commit"]).removesuffix("-dirty")[:7]
    return Path(str(result["benchmark"])) / f"{day}-{cpu_slug(result['cpu'])}-{commit}.json"


def repo_root() -> Path:
    """Where ``--save`` writes: this checkout when laneway runs from one,
    else the working directory."""
    return REPO_ROOT if (REPO_ROOT / ".git").exists() else Path.cwd()


_FIGURE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def validate_result(result: Mapping[str, Any], schema_file: Path = SCHEMA_FILE) -> None:
    """Raise ``InvalidResult`` unless ``result`` matches the schema file
    (when it exists) and its figure and series names are snake_case."""
    for group in ("figures", "series"):
        for name in result.get(group, {}):
            if not _FIGURE_NAME.match(name):
                raise InvalidResult(f"{group} name {name!r} is not snake_case")
    if not schema_file.exists():
        return
    import jsonschema

    schema = json.loads(schema_file.read_text())
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(dict(result)), key=lambda e: e.path
    )
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(top)"
        raise InvalidResult(f"{where}: {errors[0].message} ({len(errors)} error(s))")


def write_result(path: Path, result: Mapping[str, Any], schema_file: Path = SCHEMA_FILE) -> Path:
    """Validate ``result`` and write it to ``path`` (folders made)."""
    validate_result(result, schema_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
