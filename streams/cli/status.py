"""``laneway status``: what this command line is connected to, and whether
each part answers: the current-stack file it found (or none), Kafka, Redis,
the live lane workers per lane, the batch tracker and the gateway. Exit 0
when everything answers, 1 when something is down; ``--json`` for scripts."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.messages import Lane
from schemas.settings import Settings
from streams.cli.common import settings_of
from streams.devstack.stackfile import CurrentStack, FoundStack
from streams.devstack.supervisor import without_password

__all__ = ["Part", "StackStatus", "cmd", "format_status", "read_status", "subparser_init"]

PROBE_TIMEOUT_S = 5.0
"""The longest wait for any one part to answer."""


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status", help="the stack this command line reaches, and whether each part answers"
    )
    parser.add_argument("--json", action="store_true", help="the status as JSON")
    return parser


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    address: str
    up: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class StackStatus:
    stack_file: str
    stack_found: bool
    stack_note: str | None
    parts: list[Part] = field(default_factory=list)
    workers: dict[str, int] = field(default_factory=dict)
    """Live lane workers per lane."""

    @property
    def ok(self) -> bool:
        return all(part.up for part in self.parts)


def _reason(exc: BaseException) -> str:
    """An exception as one line: its message, led by its type unless the
    message already names it."""
    text = str(exc).strip()
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name


async def _kafka(settings: Settings) -> Part:
    from aiokafka.admin import AIOKafkaAdminClient

    address = settings.kafka.bootstrap
    admin = AIOKafkaAdminClient(**settings.kafka.client_options())
    try:
        await asyncio.wait_for(admin.start(), PROBE_TIMEOUT_S)
        topics = await asyncio.wait_for(admin.list_topics(), PROBE_TIMEOUT_S)
    except Exception as exc:  # any failure to answer is "down", with its reason
        return Part("kafka", address, False, _reason(exc))
    finally:
        await admin.close()
    ours = [t for t in topics if t.startswith(f"{settings.kafka.topic_prefix}.")]
    return Part("kafka", address, True, f"{len(ours)} {settings.kafka.topic_prefix}.* topics")


async def _redis(settings: Settings) -> tuple[list[Part], dict[str, int]]:
    from streams.jobs.liveness import tracker_alive
    from streams.stores.workerboard import WorkerBoard

    address = without_password(settings.redis.url)
    redis = settings.redis.client()
    try:
        await asyncio.wait_for(redis.ping(), PROBE_TIMEOUT_S)
        prefix = settings.redis.key_prefix
        board = WorkerBoard(redis, prefix, stale_s=3 * settings.worker_heartbeat_s)
        cards = await asyncio.wait_for(board.live(), PROBE_TIMEOUT_S) or []
        tracker = await asyncio.wait_for(tracker_alive(redis, prefix), PROBE_TIMEOUT_S)
    except Exception as exc:  # any failure to answer is "down", with its reason
        reason = _reason(exc)
        return [
            Part("redis", address, False, reason),
            Part("workers", address, False, "Redis does not answer"),
            Part("tracker", address, False, "Redis does not answer"),
        ], {}
    finally:
        await redis.aclose()
    per_lane = Counter(str(card.lane) for card in cards)
    workers = {lane.value: per_lane.get(lane.value, 0) for lane in Lane}
    shown = ", ".join(f"{lane} {n}" for lane, n in workers.items())
    return [
        Part("redis", address, True),
        Part("workers", address, bool(cards), f"live per lane: {shown}"),
        Part("tracker", address, tracker, "alive" if tracker else "no batch tracker heartbeat"),
    ], workers


async def _gateway(stack: CurrentStack | None) -> list[Part]:
    import httpx

    if stack is None or stack.gateway_url is None:
        return []  # nothing says where a gateway should be
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            response = await client.get(f"{stack.gateway_url}/models")
    except httpx.HTTPError as exc:
        return [Part("gateway", stack.gateway_url, False, f"{type(exc).__name__}: {exc}")]
    return [Part("gateway", stack.gateway_url, True, f"HTTP {response.status_code}")]


async def read_status(settings: Settings, found: FoundStack) -> StackStatus:
    """Probe every part at once, each bounded by ``PROBE_TIMEOUT_S``."""
    kafka, (redis_parts, workers), gateway = await asyncio.gather(
        _kafka(settings), _redis(settings), _gateway(found.stack)
    )
    return StackStatus(
        stack_file=str(found.path),
        stack_found=found.stack is not None,
        stack_note=found.note,
        parts=[kafka, *redis_parts, *gateway],
        workers=workers,
    )


def format_status(status: StackStatus, stack: CurrentStack | None) -> str:
    if stack is not None:
        head = f"stack file  {status.stack_file} (pid {stack.pid})"
    else:
        head = f"stack file  none at {status.stack_file}" + (
            f" ({status.stack_note})" if status.stack_note else ""
        )
    lines = [head]
    for part in status.parts:
        mark = "up  " if part.up else "DOWN"
        detail = f"  {part.detail}" if part.detail else ""
        lines.append(f"{part.name:10}  {mark}  {part.address}{detail}")
    return "\n".join(lines)


def cmd(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    # A broker that does not answer is reported in the table; aiokafka's own
    # error lines about it would only repeat it.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    found: FoundStack = args.found_stack
    status = asyncio.run(read_status(settings, found))
    if args.json:
        body = asdict(status)
        body["ok"] = status.ok
        print(json.dumps(body, indent=2))
    else:
        print(format_status(status, found.stack))
    return 0 if status.ok else 1
