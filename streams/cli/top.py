"""``laneway top``: a live view of a running stack."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from streams.cli.common import settings_of

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "top", help="a live view of a running stack (lanes, paths, cache, flow)"
    )
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    parser.add_argument("--window", type=float, default=30.0, help="seconds rates cover (live)")
    parser.add_argument(
        "--metrics",
        action="append",
        metavar="URL",
        help="a process's /metrics address, repeatable "
        "(default: the current stack's, else those of `laneway up` from --http-port-base)",
    )
    parser.add_argument(
        "--http-port-base",
        type=int,
        default=None,
        help="the `laneway up` port base to read (default: the current stack's, else 9400)",
    )
    return parser


def cmd(args: argparse.Namespace) -> int:
    from streams.top.live import default_urls, run_top

    settings = settings_of(args)
    stack = getattr(args, "current_stack", None)
    if args.metrics:
        urls = args.metrics
    elif args.http_port_base is None and stack is not None:
        urls = stack.metrics_urls()
    else:
        urls = default_urls(args.http_port_base or 9400)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(
            run_top(
                settings,
                urls,
                once=args.once,
                as_json_output=args.json,
                interval_s=args.interval,
                window_s=args.window,
            )
        )
    return 0
