"""``laneway doctor``: diagnose a slow stack (``streams.doctor``): what got
slower, resources, where the time goes, the model layer."""

from __future__ import annotations

import argparse
from typing import Any

from streams.cli.common import settings_of
from streams.doctor.cli import DEFAULTS, parse_duration, parse_time, run_doctor

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    doctor: argparse.ArgumentParser = subparsers.add_parser(
        "doctor",
        help="diagnose a slow stack: what got slower, resources, where the time goes, versions",
    )
    doctor.add_argument(
        "--recent",
        type=parse_duration,
        default=3600.0,
        help="the recent part of the window, judged against the rest (default 1h)",
    )
    doctor.add_argument(
        "--window",
        type=parse_duration,
        default=86_400.0,
        help="the whole window read; before --recent is the baseline (default 1d)",
    )
    doctor.add_argument(
        "--until",
        type=parse_time,
        default=None,
        help="end the window here instead of now (ISO 8601 or epoch seconds): a past "
        "incident's window; processes, GPUs and disk are read now whatever it is",
    )
    doctor.add_argument(
        "--metrics",
        action="append",
        help="[NAME=]URL of a process's /metrics (repeatable); default: the current stack's, "
        "else laneway up's from --http-port-base",
    )
    doctor.add_argument(
        "--http-port-base",
        type=int,
        default=None,
        help="the `laneway up` port base to read (default: the current stack's, else 9400)",
    )
    doctor.add_argument(
        "--slower",
        type=float,
        default=DEFAULTS.slower_ratio,
        help="a median this many times its baseline's is slower (default 1.5)",
    )
    doctor.add_argument(
        "--slower-ms",
        type=float,
        default=DEFAULTS.slower_min_ms,
        help="... and at least this many ms more (default 100)",
    )
    doctor.add_argument(
        "--min-samples",
        type=int,
        default=DEFAULTS.min_samples,
        help="results a group needs, recent and baseline, to be judged (default 5)",
    )
    doctor.add_argument("--json", action="store_true", help="the findings and readings as JSON")
    return doctor


def cmd(args: argparse.Namespace) -> int:
    stack = getattr(args, "current_stack", None)
    if not args.metrics and args.http_port_base is None and stack is not None:
        args.metrics = [
            f"{name}=http://127.0.0.1:{port}/metrics" for name, port in stack.metrics.items()
        ]
    if args.http_port_base is None:
        args.http_port_base = 9400
    return run_doctor(settings_of(args), args)
