"""``laneway check``: load every configured model and run one inference
each; ``--tune``: measure each CPU model's batch sizes and keep the best."""

from __future__ import annotations

import argparse
from typing import Any

from schemas.messages import Lane
from streams.cli.common import settings_of

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check", help="load every configured model and run one inference each"
    )
    parser.add_argument(
        "--path", action="append", help="a model path to check (repeatable); default: every path"
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="measure each CPU model's tokens/s per batch size and keep it for this CPU "
        "(LANEWAY_TUNE_*): lane workers on this machine start with it",
    )
    parser.add_argument(
        "--lane",
        choices=[lane.value for lane in Lane],
        help="with --tune: the models a worker of this lane loads (default: --path, or all)",
    )
    parser.add_argument("--json", action="store_true")
    return parser


def cmd(args: argparse.Namespace) -> int:
    from workers.check import run_check, run_tune

    if args.tune:
        return run_tune(settings_of(args), args.path, args.lane, as_json=args.json)
    if args.lane is not None:
        print("laneway check: --lane goes with --tune")
        return 2
    return run_check(settings_of(args), args.path, as_json=args.json)
