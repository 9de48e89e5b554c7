"""Every benchmark result file under benchmarks/results/ validates against
benchmarks/result.schema.json, lies in its benchmark's folder, and is named by
the rule the docs and `laneway bench --save` share."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = sorted((BENCHMARKS / "results").glob("*/*.json"))
# <YYYY-MM-DD>-<cpu-slug>-<commit7>.json; a transcribed run that shares its
# date, CPU and commit with another adds a -<variant> of its own.
FILE_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9-]+-([0-9a-f]{7}|unknown)(-[a-z0-9-]+)?\.json$")


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((BENCHMARKS / "result.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_there_are_result_files() -> None:
    assert len(RESULTS) >= 10, "benchmarks/results/ lost its result files"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_result_file_validates_against_the_schema(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    errors = [
        f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in _validator().iter_errors(data)
    ]
    assert errors == []
    assert data["benchmark"] == path.parent.name
    assert FILE_NAME.match(path.name), path.name
    assert path.name.startswith(data["date"][:10])
    assert data["commit"][:7] in path.name


def test_schema_refuses_what_the_format_does_not_allow() -> None:
    validator = _validator()
    good = json.loads(RESULTS[0].read_text(encoding="utf-8"))
    assert validator.is_valid(good)
    for broken in (
        {**good, "schema": "laneway.bench.result/2"},
        {**good, "commit": "HEAD"},
        {**good, "date": "yesterday"},
        {**good, "figures": {}},
        {**good, "figures": {"Bad-Name": {"value": 1, "unit": "ms", "label": "x"}}},
        {**good, "figures": {"p99_ms": {"value": "fast", "unit": "ms", "label": "x"}}},
        {**good, "cpu": {"model": "x", "family": 6, "model_number": 1, "cores": 0}},
        {
            **good,
            "series": {
                "latency_vs_load": {"x": "a", "x_unit": "", "y": "b", "y_unit": "", "points": [[1]]}
            },
        },
        {**good, "surprise": True},
    ):
        assert not validator.is_valid(broken), broken
