"""Rule lookups against a real Redis: the example file's order-status rule.

Uses the machine's Redis when ``LANEWAY_REDIS_URL`` is set, else starts an
embedded Valkey; not the session-wide stack, which this does not need."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from schemas.settings import RedisSettings
from streams.devstack.embedded import free_port
from streams.rules.rulefile import EXAMPLE_RULES_FILE, read_rule_file, read_rules


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client = RedisSettings(url=redis_url).client()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def prefix(redis: Any) -> AsyncIterator[str]:
    """A key prefix of this test only; its keys are deleted afterwards."""
    name = f"test-rules-{uuid.uuid4().hex[:8]}"
    yield name
    keys = [key async for key in redis.scan_iter(match=f"{name}:*")]
    if keys:
        await redis.delete(*keys)


async def test_order_status_reads_the_order_hash(redis: Any, prefix: str) -> None:
    book = read_rule_file(EXAMPLE_RULES_FILE)
    await redis.hset(f"{prefix}:orders:12345", mapping={"status": "shipped", "eta": "Friday"})
    await redis.hset(f"{prefix}:orders:67890", mapping={"status": "being packed"})

    match = book.match("Where is my order 12345?")
    assert match is not None and match.rule.name == "order_status"
    answer = await book.resolve(match, redis, prefix)
    assert answer is not None and answer.rule == "order_status"
    assert answer.text == "Order 12345 is shipped. Expected delivery: Friday."

    unscheduled = await book.respond("status of order #67890", redis, prefix)
    assert unscheduled is not None
    assert unscheduled.text == "Order 67890 is being packed. Expected delivery: not scheduled yet."


async def test_absent_order_gets_the_missing_answer(redis: Any, prefix: str) -> None:
    book = read_rule_file(EXAMPLE_RULES_FILE)
    answer = await book.respond("what's the status of order 424242", redis, prefix)
    assert answer is not None and answer.rule == "order_status"
    assert answer.text.startswith("I couldn't find order 424242.")


async def test_json_documents_are_read_with_get(redis: Any, prefix: str) -> None:
    book = read_rules(
        r"""
rules:
  - name: balance
    patterns: ['balance of (?P<account>[a-z0-9-]+)']
    lookup: {key: "accounts:{account}", format: json}
    answer: "{account}: {balance} {currency}"
"""
    )
    await redis.set(f"{prefix}:accounts:acme-1", '{"balance": 12.5, "currency": "EUR"}')
    answer = await book.respond("balance of acme-1", redis, prefix)
    assert answer is not None and answer.text == "acme-1: 12.5 EUR"
    assert await book.respond("balance of nobody", redis, prefix) is None  # no missing answer


async def test_dead_redis_falls_through_without_raising() -> None:
    book = read_rule_file(EXAMPLE_RULES_FILE)
    dead = RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.3).client()
    try:
        match = book.match("where is order 12345")
        assert match is not None
        started = time.monotonic()
        assert await book.resolve(match, dead, "laneway") is None
        assert await book.resolve(match, dead, "laneway") is None  # skipped, not retried
        assert time.monotonic() - started < 2.0
        # Rules that need no Redis still answer meanwhile.
        assert (await book.respond("ping", dead, "laneway")).text == "pong"  # type: ignore[union-attr]
    finally:
        await dead.aclose()
