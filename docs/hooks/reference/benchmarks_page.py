"""The benchmarks page, drawn from the result files under ``benchmarks/results/``:
one table per benchmark (a row per CPU and command, the latest run first, older
runs of each listed below it) and an SVG plot per series, drawn with matplotlib's
Agg backend at build time."""

from __future__ import annotations

import io
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

__all__ = ["BenchmarkRun", "benchmark_files", "load_runs", "plot_series", "series_groups"]

PAGE = "benchmarks.md"
FIGURE_DIR = "assets/benchmarks"
SCHEMA = "result.schema.json"


@dataclass(frozen=True)
class BenchmarkRun:
    """One result file."""

    path: Path
    data: dict[str, Any]

    @property
    def benchmark(self) -> str:
        return str(self.data["benchmark"])

    @property
    def date(self) -> str:
        return str(self.data["date"])

    @property
    def cpu_name(self) -> str:
        cpu = self.data["cpu"]
        name = str(cpu["model"])
        if cpu["family"] is not None and cpu["model_number"] is not None:
            name += f" (family {cpu['family']} model {cpu['model_number']})"
        return f"{name}, {cpu['cores']} cores"

    @property
    def cpu_short(self) -> str:
        """The CPU without its core count, for a plot's legend."""
        return self.cpu_name.rsplit(", ", 1)[0]

    @property
    def row_key(self) -> tuple[str, str]:
        """Runs of one CPU and one command share a row; the newest shows."""
        return self.cpu_name, str(self.data["command"])


def load_runs(results_dir: Path) -> list[BenchmarkRun]:
    """Every result file, validated against ``benchmarks/result.schema.json``; a file
    that does not validate, or lies in another benchmark's folder, stops the build."""
    schema = json.loads((results_dir.parent / SCHEMA).read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    runs = []
    for path in sorted(results_dir.glob("*/*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "(top)"
            raise ValueError(f"{path}: {where}: {errors[0].message}")
        if data["benchmark"] != path.parent.name:
            raise ValueError(
                f"{path}: benchmark {data['benchmark']!r} lies in folder {path.parent.name!r}"
            )
        runs.append(BenchmarkRun(path, data))
    return runs


def _value(figure: dict[str, Any]) -> str:
    value = figure["value"]
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = f"{value:,}" if isinstance(value, int) else f"{value:,.6g}"
    unit = figure["unit"]
    if unit in ("", "count", "requests", "decodes", "ratio", "share", "AUC", "bool"):
        return text
    return f"{text}{unit}" if unit in ("x", "%") else f"{text} {unit}"


def _figure_names(runs: Iterable[BenchmarkRun]) -> list[tuple[str, str]]:
    names: dict[str, str] = {}
    for run in runs:
        for name, figure in run.data["figures"].items():
            names.setdefault(name, figure["label"])
    return list(names.items())


def _table(runs: list[BenchmarkRun], with_command: bool) -> list[str]:
    columns = _figure_names(runs)
    head = ["CPU", "date", "commit"] + (["command"] if with_command else [])
    head += [label for _, label in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for run in runs:
        cells = [run.cpu_name, run.date[:10], f"`{run.data['commit']}`"]
        if with_command:
            cells.append(f"`{run.data['command']}`")
        for name, _ in columns:
            figure = run.data["figures"].get(name)
            cells.append(_value(figure) if figure else "-")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def plot_series(names: list[str], runs: list[BenchmarkRun]) -> bytes:
    """One SVG: the series ``names`` (a curve and its companions, e.g. a baseline)
    of each run, a line each, labelled by the run's CPU (and the curve's y)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    first = next(run.data["series"][names[0]] for run in runs if names[0] in run.data["series"])
    with matplotlib.rc_context({"svg.hashsalt": "laneway", "font.size": 9}):
        figure, axes = pyplot.subplots(figsize=(7.0, 5.0))
        try:
            for run in runs:
                for name in names:
                    curve = run.data.get("series", {}).get(name)
                    if curve is None:
                        continue
                    label = run.cpu_short + _variant(run, runs)
                    if len(names) > 1:
                        label = f"{curve['y']}, {label}"
                    points = [(x, y) for x, y in curve["points"] if x is not None and y is not None]
                    xs = [x for x, _ in points]
                    ys = [y for _, y in points]
                    axes.plot(xs, ys, marker="o", label=label)
            x_unit, y_unit = first["x_unit"], first["y_unit"]
            axes.set_xlabel(f"{first['x']} ({x_unit})" if x_unit else first["x"])
            y_name = first["y"] if len(names) == 1 else first["y"].split(",")[0]
            axes.set_ylabel(f"{y_name} ({y_unit})" if y_unit else y_name)
            axes.grid(True, alpha=0.3)
            axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))
            figure.tight_layout()
            out = io.StringIO()
            figure.savefig(out, format="svg", metadata={"Date": None})
        finally:
            pyplot.close(figure)
    return out.getvalue().encode("utf-8")


def _variant(run: BenchmarkRun, runs: list[BenchmarkRun]) -> str:
    """What sets a run's command apart from the others drawn beside it: the words
    of its command that not every one of theirs has (empty when all match)."""
    commands = [set(str(other.data["command"]).split()) for other in runs]
    common = set.intersection(*commands) if commands else set()
    own = [word for word in str(run.data["command"]).split() if word not in common]
    return f" [{' '.join(own)}]" if own else ""


def series_groups(names: Iterable[str]) -> dict[str, list[str]]:
    """Series drawn together: ``x_y`` joins ``x`` when both are present (a
    curve's companion, such as ``quality_vs_heavy_share_random``)."""
    present = sorted(set(names))
    groups: dict[str, list[str]] = {}
    for name in present:
        bases = [other for other in present if name.startswith(other + "_")]
        base = max(bases, key=len) if bases else name
        while True:  # the outermost base holds the group
            outer = [o for o in present if base.startswith(o + "_")]
            if not outer:
                break
            base = max(outer, key=len)
        groups.setdefault(base, []).append(name)
    return groups


def _benchmark_section(
    benchmark: str, runs: list[BenchmarkRun]
) -> tuple[list[str], dict[str, bytes]]:
    by_row: dict[tuple[str, str], list[BenchmarkRun]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: r.date, reverse=True):
        by_row[run.row_key].append(run)
    latest = [row[0] for row in by_row.values()]
    older = [run for row in by_row.values() for run in row[1:]]
    with_command = len({run.data["command"] for run in runs}) > 1
    lines = [f"## `{benchmark}`", ""]
    if not with_command:
        lines += ["```bash", str(latest[0].data["command"]), "```", ""]
    lines += [*_table(latest, with_command), ""]
    if older:
        lines += [f'??? note "Older runs of `{benchmark}`"', ""]
        lines += ["    " + line for line in _table(older, with_command)] + [""]
    for run in latest:
        said = [" ".join(str(run.data["notes"]).split())] if run.data.get("notes") else []
        if run.data.get("load"):
            before, after = run.data["load"]["before"][0], run.data["load"]["after"][0]
            said.append(f"load average (1 min) {before:g} before the run, {after:g} after it.")
        if said:
            lines += [f"- **{run.cpu_name}**: {' '.join(said)}"]
    lines.append("")
    figures: dict[str, bytes] = {}
    names = [name for run in latest for name in run.data.get("series", {})]
    for base, group in series_groups(names).items():
        with_series = [run for run in latest if set(group) & set(run.data.get("series", {}))]
        uri = f"{FIGURE_DIR}/{benchmark}-{base}.svg"
        figures[uri] = plot_series(group, with_series)
        lines += [f"![{benchmark}: {base.replace('_', ' ')}]({uri})", ""]
    return lines, figures


def benchmark_files(results_dir: Path) -> dict[str, str | bytes]:
    """The page (Markdown) and its plots (SVG), by their ``docs/``-relative path."""
    runs = load_runs(results_dir)
    by_benchmark: dict[str, list[BenchmarkRun]] = defaultdict(list)
    for run in runs:
        by_benchmark[run.benchmark].append(run)
    lines = [
        "# Benchmarks",
        "",
        "Generated at build time from the result files under `benchmarks/results/`",
        "(one JSON file per run, [schema](#the-result-file)): one table per benchmark,",
        "a row per CPU (and command, where a benchmark was run more than one way),",
        "the latest run first and older runs of the same CPU folded below it. Every",
        "run so far was on a 2-core machine with everything (broker, Valkey, the",
        "laneway processes and the benchmark client) on the same two cores, often",
        "shared with other work, so single runs sway; the notes under each table",
        "say what limits its figures. See [Running the benchmarks](benchmarks-guide.md)",
        "for what each mode measures and its target.",
        "",
    ]
    files: dict[str, str | bytes] = {}
    for benchmark in sorted(by_benchmark):
        section, figures = _benchmark_section(benchmark, by_benchmark[benchmark])
        lines += section
        files.update(figures)
    lines += [
        "## The result file",
        "",
        "`laneway bench <mode> --save` writes one into",
        "`benchmarks/results/<mode>/<YYYY-MM-DD>-<cpu-slug>-<commit7>.json`; commit it",
        "and the next build of this page shows it. Its JSON Schema is",
        "`benchmarks/result.schema.json`, and a test validates every file against it.",
        "",
    ]
    files[PAGE] = "\n".join(lines)
    return files
