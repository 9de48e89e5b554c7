"""Per-key minute limits shared through Redis (streams.gateway.shared_limits)
on a real Valkey: two limiters, as two gateway replicas hold, spend one
budget; with Redis away each falls back to its own count."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from streams.devstack.embedded import free_port
from streams.gateway.shared_limits import SharedLimiter
from streams.ops import REDIS_ERRORS


def replica(url: str, prefix: str) -> SharedLimiter:
    return SharedLimiter(
        aioredis.from_url(url, socket_timeout=0.3, socket_connect_timeout=0.3), prefix
    )


async def test_two_replicas_admit_a_keys_requests_per_minute_between_them(
    redis_url: str, prefix: str
) -> None:
    one, two = replica(redis_url, prefix), replica(redis_url, prefix)
    try:
        verdicts = await asyncio.gather(*(r.admit("k-1", rpm=5, tpm=None) for r in [one, two] * 5))
        assert sum(v.admitted for v in verdicts) == 5, verdicts
        refused = [v for v in verdicts if not v.admitted]
        assert all(v.shared and v.requests == 5 and 0 < v.wait_s <= 60 for v in refused)
        assert (await one.admit("k-2", rpm=5, tpm=None)).admitted, "another key is apart"
        assert (await two.admit("k-1", rpm=None, tpm=None)).admitted, "no limit is no limit"
    finally:
        await one.redis.aclose()
        await two.redis.aclose()


async def test_tokens_spent_on_one_replica_hold_back_the_other(redis_url: str, prefix: str) -> None:
    one, two = replica(redis_url, prefix), replica(redis_url, prefix)
    try:
        assert (await one.admit("k", rpm=None, tpm=100)).admitted
        await one.spend("k", 60)
        assert (await two.admit("k", rpm=None, tpm=100)).admitted, "60 < 100"
        await two.spend("k", 70)
        over = await one.admit("k", rpm=None, tpm=100)
        assert not over.admitted and over.tokens == 130 and 55 < over.wait_s <= 60
        assert over.requests == 2
    finally:
        await one.redis.aclose()
        await two.redis.aclose()


async def test_without_redis_each_replica_limits_on_its_own_and_says_so(prefix: str) -> None:
    down = replica(f"redis://127.0.0.1:{free_port()}/0", prefix)
    errors = REDIS_ERRORS.labels("gateway_limits")
    before = errors._value.get()
    try:
        first = await down.admit("k", rpm=2, tpm=None)
        assert first.admitted and not first.shared
        assert errors._value.get() == before + 1
        down.guard.end_rest()
        assert (await down.admit("k", rpm=2, tpm=None)).admitted
        third = await down.admit("k", rpm=2, tpm=None)
        assert not third.admitted and not third.shared and third.requests == 2
        assert down.guard.failing
    finally:
        await down.redis.aclose()
