"""``laneway topics create|list``: the topic registry."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from streams.cli.common import settings_of

__all__ = ["cmd", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "topics", help="manage the topic registry"
    )
    parser.add_argument("action", choices=["create", "list"])
    return parser


def cmd(args: argparse.Namespace) -> int:
    from streams.kafka.topics import create_topics, topic_specs, wait_for_broker

    settings = settings_of(args)
    if args.action == "list":
        for spec in topic_specs(settings):
            print(f"{spec.name:40} {spec.partitions:3}  {spec.purpose}")
        return 0

    async def create() -> None:
        await wait_for_broker(settings)
        for spec in await create_topics(settings):
            print(f"{spec.name} ({spec.partitions} partitions)")

    asyncio.run(create())
    return 0
