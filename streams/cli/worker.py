"""``laneway worker --lane L``: run one lane worker."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from schemas.messages import Lane
from streams.cli.common import ops_endpoints, settings_of

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser("worker", help="run one lane worker")
    parser.add_argument("--lane", required=True, choices=[lane.value for lane in Lane])
    parser.add_argument(
        "--drain-s", type=float, default=30.0, help="grace for the batch in flight on SIGTERM"
    )
    return parser


def cmd(args: argparse.Namespace) -> int:
    from workers.serve import serve_lane

    settings = settings_of(args)
    with ops_endpoints(settings) as state:
        asyncio.run(serve_lane(settings, Lane(args.lane), state, args.drain_s))
    return 0
