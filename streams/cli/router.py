"""``laneway router``: run the quality loop that keeps the route statistics."""

from __future__ import annotations

import argparse
from typing import Any

from streams.cli.common import run_faust, settings_of

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "router", help="run the quality loop that keeps the route statistics (faust)"
    )
    return parser


def cmd(args: argparse.Namespace) -> int:
    from streams.quality.loop import build_quality_app

    return run_faust(settings_of(args), build_quality_app)
