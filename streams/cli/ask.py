"""``laneway ask``: ask one question through a running stack."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from schemas.messages import Lane
from streams.cli.common import settings_of
from streams.cli.reach import NOT_ALIVE, missing_workers

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "ask", help="ask one question through a running stack"
    )
    parser.add_argument("prompt")
    parser.add_argument("--lane", choices=[lane.value for lane in Lane])
    parser.add_argument("--deadline-ms", type=int)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--stream", action="store_true", help="print the answer as it is generated, then its result"
    )
    return parser


def cmd(args: argparse.Namespace) -> int:
    from streams.client import LanewayClient, result_summary

    settings = settings_of(args)
    missing = asyncio.run(missing_workers(settings))
    if missing is not None:
        print(f"laneway ask: {missing}", file=sys.stderr)
        return NOT_ALIVE

    async def ask() -> int:
        async with LanewayClient(settings.kafka) as client:
            fields: dict[str, Any] = {"max_tokens": args.max_tokens}
            if args.lane:
                fields["lane"] = args.lane
            if args.deadline_ms:
                fields["deadline_ms"] = args.deadline_ms
            if not args.stream:
                result = await client.ask(args.prompt, timeout_s=args.timeout_s, **fields)
                print(result_summary(result))
                return 0 if result.status == "ok" else 1
            final = None
            async for delta in client.stream(args.prompt, timeout_s=args.timeout_s, **fields):
                if delta.restart:
                    print("\n[the answer was restarted by another attempt]", flush=True)
                print(delta.text, end="", flush=True)
                final = delta.result
            print()
            assert final is not None  # the stream ends with its result
            print(result_summary(final).splitlines()[0], f"finish={final.finish_reason}")
            return 0 if final.status == "ok" else 1

    return asyncio.run(ask())
