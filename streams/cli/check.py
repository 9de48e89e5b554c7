"""``laneway check``: load every configured model and run one inference each."""

from __future__ import annotations

import argparse
from typing import Any

from streams.cli.common import settings_of

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check", help="load every configured model and run one inference each"
    )
    parser.add_argument(
        "--path", action="append", help="a model path to check (repeatable); default: every path"
    )
    parser.add_argument("--json", action="store_true")
    return parser


def cmd(args: argparse.Namespace) -> int:
    from workers.check import run_check

    return run_check(settings_of(args), args.path, as_json=args.json)
