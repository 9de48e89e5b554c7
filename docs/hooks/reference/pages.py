"""Every generated page of the docs site, by its path under ``docs/``."""

from __future__ import annotations

from pathlib import Path

from reference.benchmarks_page import benchmark_files
from reference.cli_page import cli_page
from reference.metrics_page import metrics_page
from reference.settings_page import settings_page
from reference.wire_page import wire_page

__all__ = ["generated_pages"]


def generated_pages(repo_root: Path) -> dict[str, str | bytes]:
    """Markdown pages (str) and figures (bytes) by their ``docs/``-relative path."""
    pages: dict[str, str | bytes] = {
        "reference/settings.md": settings_page(),
        "reference/cli.md": cli_page(),
        "reference/wire.md": wire_page(repo_root),
        "reference/metrics.md": metrics_page(repo_root),
    }
    pages.update(benchmark_files(repo_root / "benchmarks" / "results"))
    return pages
