"""The docs site's generated pages (docs/hooks/reference/), built from the code
and the repository's files exactly as `mkdocs build` builds them."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))

from reference.benchmarks_page import benchmark_files, series_groups  # noqa: E402
from reference.cli_page import _build_parser, cli_page, commands  # noqa: E402
from reference.metrics_page import metric_rows, metrics_page  # noqa: E402
from reference.settings_page import MISSING, settings_page, settings_rows  # noqa: E402
from reference.wire_page import wire_page  # noqa: E402


def _settings_classes(cls: type[BaseSettings]) -> list[type[BaseSettings]]:
    found = [cls]
    for field in cls.model_fields.values():
        factory = field.default_factory
        if isinstance(factory, type) and issubclass(factory, BaseSettings):
            found += _settings_classes(factory)
    return found


def test_settings_page_lists_every_variable_with_its_default_and_meaning() -> None:
    rows = {row.variable: row for row in settings_rows()}
    page = settings_page()
    assert len(rows) > 150
    for variable in rows:
        assert f"`{variable}`" in page
    bootstrap = rows["LANEWAY_KAFKA_BOOTSTRAP"]
    assert bootstrap.default == "`127.0.0.1:9092`"
    assert bootstrap.description is not None and "brokers" in bootstrap.description
    # Each lane's settings come from its own class, with its own prefix and defaults.
    assert rows["LANEWAY_REALTIME_MAX_BATCH_SIZE"].default == "`2`"
    assert rows["LANEWAY_BULK_MAX_BATCH_SIZE"].default == "`32`"
    assert rows["LANEWAY_KAFKA_PARTITIONS"].type == "int (≥ 1)"
    # A field read by an alias (OpenTelemetry's own variables) is listed by it.
    aliased = [
        str(field.validation_alias).upper()
        for cls in _settings_classes(Settings)
        for field in cls.model_fields.values()
        if isinstance(field.validation_alias, str)
    ]
    for variable in aliased:
        assert variable in rows
    missing = [row for row in rows.values() if row.description is None]
    if missing:
        assert MISSING in page and f"{len(missing)} of {len(rows)} variables" in page


def test_cli_page_has_a_section_for_every_command() -> None:
    page = cli_page()
    lines = [line for line, _ in commands(_build_parser())]
    assert "laneway batch submit" in lines and "laneway models canary" in lines
    for line in lines:
        assert f"`{line}`" in page
    assert "usage: laneway ask" in page


def test_metrics_page_lists_the_registry_with_types_and_labels() -> None:
    rows = {row.name: row for row in metric_rows(ROOT)}
    assert rows["laneway_results_total"].type == "counter"
    assert "lane" in rows["laneway_results_total"].labels
    assert rows["laneway_lane_backlog"].labels == ("lane",)
    assert rows["laneway_flow_level"].labels == ()
    page = metrics_page(ROOT)
    for name in rows:
        assert f"`{name}`" in page


def test_wire_page_has_the_contract_and_every_schema() -> None:
    page = wire_page(ROOT)
    assert "## Delivery" in page and "## Message schemas" in page
    for path in (ROOT / "schemas" / "json").glob("*.schema.json"):
        assert f"### `{path.name.removesuffix('.schema.json')}`" in page
    assert "](schemas/json/)" not in page


def test_benchmarks_page_has_a_table_per_benchmark_and_a_plot_per_series() -> None:
    files = benchmark_files(ROOT / "benchmarks" / "results")
    page = files["benchmarks.md"]
    assert isinstance(page, str)
    for folder in (ROOT / "benchmarks" / "results").iterdir():
        assert f"## `{folder.name}`" in page
    plots = {uri: svg for uri, svg in files.items() if uri.endswith(".svg")}
    assert "assets/benchmarks/overload-latency_vs_load.svg" in plots
    assert "assets/benchmarks/router-quality_vs_heavy_share.svg" in plots
    for uri, svg in plots.items():
        assert isinstance(svg, bytes) and svg.lstrip().startswith(b"<?xml"), uri
        assert f"]({uri})" in page


def test_series_and_their_companions_share_a_plot() -> None:
    assert series_groups(["quality_vs_heavy_share", "quality_vs_heavy_share_random"]) == {
        "quality_vs_heavy_share": ["quality_vs_heavy_share", "quality_vs_heavy_share_random"]
    }
    assert series_groups(["latency_vs_load"]) == {"latency_vs_load": ["latency_vs_load"]}


def test_a_result_file_that_does_not_validate_stops_the_page(tmp_path: Path) -> None:
    shutil.copy(ROOT / "benchmarks" / "result.schema.json", tmp_path / "result.schema.json")
    source = next((ROOT / "benchmarks" / "results" / "pipeline").glob("*.json"))
    data = json.loads(source.read_text(encoding="utf-8"))
    del data["cpu"]
    (tmp_path / "results" / "pipeline").mkdir(parents=True)
    (tmp_path / "results" / "pipeline" / source.name).write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"{source.name}: \(top\): 'cpu' is a required"):
        benchmark_files(tmp_path / "results")
    data = json.loads(source.read_text(encoding="utf-8"))
    (tmp_path / "results" / "pipeline").rename(tmp_path / "results" / "backend")
    (tmp_path / "results" / "backend" / source.name).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="lies in folder 'backend'"):
        benchmark_files(tmp_path / "results")
