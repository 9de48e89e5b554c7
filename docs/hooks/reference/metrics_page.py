"""The metrics reference: every Prometheus metric laneway defines (name, type, help,
labels), read from prometheus_client's registry after importing the modules that
define them."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["MetricRow", "metric_modules", "metric_rows", "metrics_page"]

PACKAGES = ("streams", "workers", "schemas")


@dataclass(frozen=True)
class MetricRow:
    name: str
    type: str
    help: str
    labels: tuple[str, ...]


def metric_modules(repo_root: Path) -> list[str]:
    """Dotted names of the modules that import prometheus_client: found by reading
    the sources, so a module that moves or starts defining metrics is not missed."""
    names = []
    for package in PACKAGES:
        for path in sorted((repo_root / package).rglob("*.py")):
            if "prometheus_client" not in path.read_text(encoding="utf-8"):
                continue
            module = path.relative_to(repo_root).with_suffix("")
            parts = module.parts[:-1] if module.name == "__init__" else module.parts
            names.append(".".join(parts))
    return names


def metric_rows(repo_root: Path) -> list[MetricRow]:
    """Every laneway metric in the default registry, by name."""
    for module in metric_modules(repo_root):
        importlib.import_module(module)
    rows = {}
    # prometheus_client keeps no public map of collectors to their label names;
    # its registry's collector map and the wrappers' attributes are read here.
    for collector in list(REGISTRY._collector_to_names):
        if not isinstance(collector, MetricWrapperBase):
            continue
        name = collector._name
        if not name.startswith("laneway_"):
            continue
        suffix = "_total" if collector._type == "counter" else ""
        rows[name] = MetricRow(
            name=f"{name}{suffix}",
            type=str(collector._type),
            help=collector._documentation,
            labels=tuple(collector._labelnames),
        )
    return [rows[name] for name in sorted(rows)]


def metrics_page(repo_root: Path) -> str:
    """The whole page, Markdown."""
    lines = [
        "# Metrics",
        "",
        "Generated at build time from prometheus_client's registry, after importing",
        "every module of `streams/`, `workers/` and `schemas/` that defines metrics.",
        "Every laneway process serves the metrics it uses on `/metrics`",
        "(`LANEWAY_HTTP_PORT`; see [Operations](../operations.md)). A histogram",
        "`x` is served as `x_bucket`, `x_sum` and `x_count`.",
        "",
        "| metric | type | labels | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for row in metric_rows(repo_root):
        labels = ", ".join(f"`{label}`" for label in row.labels) or "-"
        meaning = " ".join(row.help.split()).replace("|", "\\|")
        lines.append(f"| `{row.name}` | {row.type} | {labels} | {meaning} |")
    return "\n".join(lines) + "\n"
