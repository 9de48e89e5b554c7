"""``laneway doctor``: the source article's diagnosis flow (§4.1) run against
a live stack, in its order: (1) what got slower, (2) resources, (3) where
the time goes, (4) the model layer. One line per finding, with what to look
at next; ``--json`` for scripts. Exit 0: nothing found; 1: a check found
something; 2: the stack could not be read at all.

    laneway doctor [--recent 1h] [--window 1d] [--until TIME] [--metrics URL ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
from datetime import UTC, datetime
from typing import Any

from schemas.settings import Settings
from streams.doctor.diagnose import STEPS, Report, Thresholds, diagnose
from streams.doctor.gather import UP_NAMES, gather
from streams.doctor.readings import Readings

__all__ = [
    "as_json",
    "format_report",
    "metrics_targets",
    "parse_duration",
    "parse_time",
    "run_doctor",
    "span",
]

TITLES = {
    "slower": "1. what got slower (recent against its own baseline)",
    "resources": "2. resources: processes, GPUs, disk, workers",
    "time": "3. where the time goes, per lane and path",
    "model": "4. the model layer: versions and drift",
}

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``1h``, ``1d`` as seconds."""
    text = text.strip().lower()
    unit = _UNITS.get(text[-1:]) if text else None
    number = text[:-1] if unit else text
    try:
        seconds = float(number) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (e.g. 90s, 15m, 1h, 1d)"
        ) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"a duration must be positive, got {text!r}")
    return seconds


DEFAULTS = Thresholds()


def parse_time(text: str) -> int:
    """``2026-12-07T03:00:00Z`` or epoch seconds, as epoch milliseconds."""
    try:
        return int(float(text) * 1000)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601, e.g. 2026-12-07T03:00:00Z, or epoch seconds)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def span(seconds: float) -> str:
    """A duration as a person reads it: ``45 s``, ``12 min``, ``1.5 h``, ``2 d``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.0f} d"


def metrics_targets(values: list[str] | None, base: int) -> tuple[list[str], list[str]]:
    """``(urls, names)`` from ``--metrics [NAME=]URL`` values; none given:
    ``laneway up``'s processes from ``base``."""
    if not values:
        urls = [f"http://127.0.0.1:{base + i}/metrics" for i in range(len(UP_NAMES))]
        return urls, list(UP_NAMES)
    urls, names = [], []
    for value in values:
        name, _, url = value.partition("=") if "=" in value.split("://")[0] else ("", "", value)
        urls.append(url)
        names.append(name or url.split("//")[-1].split("/")[0])
    return urls, names


def format_report(report: Report, readings: Readings) -> str:
    lines = [
        f"laneway doctor: {len(readings.samples)} results in the last "
        f"{span(readings.window_ms / 1000)}, recent = the last {span(readings.recent_ms / 1000)}"
    ]
    for step in STEPS:
        lines.append("")
        lines.append(TITLES[step])
        found = report.of(step)  # type: ignore[arg-type]
        lines.extend(f.line() for f in found)
        if not any(f.level == "warn" for f in found):
            lines.append("   nothing found")
    for note in report.notes:
        lines.append(f"note: {note}")
    warns = sum(1 for f in report.findings if f.level == "warn")
    lines.append("")
    lines.append(f"{warns} finding(s)" if warns else "nothing found")
    return "\n".join(lines)


def as_json(report: Report, readings: Readings) -> str:
    body: dict[str, Any] = {
        "found": report.found,
        "findings": [dataclasses.asdict(f) for f in report.findings],
        "notes": report.notes,
        "window": {
            "now_ms": readings.now_ms,
            "recent_ms": readings.recent_ms,
            "window_ms": readings.window_ms,
            "results": len(readings.samples),
        },
        "processes": [dataclasses.asdict(p) for p in readings.processes],
        "gpus": None if readings.gpus is None else [dataclasses.asdict(g) for g in readings.gpus],
        "disks": [dataclasses.asdict(d) for d in readings.disks],
    }
    return json.dumps(body, indent=2)


def run_doctor(settings: Settings, args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.recent >= args.window:
        print(f"--recent ({args.recent:.0f} s) must be shorter than --window ({args.window:.0f} s)")
        return 2
    urls, names = metrics_targets(args.metrics, args.http_port_base)
    readings = asyncio.run(
        gather(
            settings,
            urls,
            names=names,
            recent_s=args.recent,
            window_s=args.window,
            until_ms=args.until,
        )
    )
    limits = Thresholds(
        slower_ratio=args.slower, slower_min_ms=args.slower_ms, min_samples=args.min_samples
    )
    report = diagnose(readings, limits)
    print(as_json(report, readings) if args.json else format_report(report, readings))
    unreadable = not readings.samples and not any(p.answered for p in readings.processes)
    if unreadable and readings.notes:
        return 2
    return 1 if report.found else 0
