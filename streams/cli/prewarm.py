"""``laneway prewarm``: refresh the cache entries of the most asked questions."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from streams.cli.common import settings_of

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "prewarm", help="refresh the cache entries of the most asked questions (nightly)"
    )
    parser.add_argument("--top", type=int, help="at most this many (LANEWAY_PREWARM_TOP)")
    parser.add_argument("--min-count", type=int, help="asked at least this often")
    parser.add_argument("--days", type=int, help="ranked over this many days")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def cmd(args: argparse.Namespace) -> int:
    from streams.cache.prewarm import format_report, prewarm

    settings = settings_of(args)
    chosen = {"top": args.top, "min_count": args.min_count, "days": args.days}
    options = settings.prewarm.model_copy(
        update={name: value for name, value in chosen.items() if value is not None}
    )
    try:
        report = asyncio.run(prewarm(settings.model_copy(update={"prewarm": options})))
    except ValueError as exc:
        print(f"laneway prewarm: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict()) if args.json else format_report(report))
    return 1 if report.failed else 0
