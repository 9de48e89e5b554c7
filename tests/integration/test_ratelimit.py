"""Token buckets on real Redis/Valkey, and INF-429 through the real stack."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aioredis

from schemas.settings import RateLimitSettings, Settings, TenantLimit
from streams.client import LanewayClient
from streams.devstack.embedded import free_port
from streams.ops import REDIS_ERRORS
from streams.stores.ratelimit import RateLimiter


def limiter(url: str, **limits: object) -> RateLimiter:
    return RateLimiter(
        aioredis.from_url(url, socket_timeout=0.3, socket_connect_timeout=0.3),
        RateLimitSettings(**limits),  # type: ignore[arg-type]
        prefix=f"t{uuid.uuid4().hex[:8]}",
    )


async def test_burst_then_refusal_then_refill(settings: Settings) -> None:
    rl = limiter(settings.redis.url, tenants={"acme": TenantLimit(rps=0.5, burst=3)})
    try:
        verdicts = [await rl.check("acme") for _ in range(4)]
        assert [v.allowed for v in verdicts] == [True, True, True, False]
        assert 1000 < verdicts[3].retry_after_ms <= 2000  # one token every 2 s
        assert (await rl.check("other")).allowed  # the default limit, its own bucket
        await asyncio.sleep((verdicts[3].retry_after_ms + 20) / 1000)
        assert (await rl.check("acme")).allowed
    finally:
        await rl.close()


async def test_concurrent_checks_never_over_admit(settings: Settings) -> None:
    rl = limiter(settings.redis.url, default=TenantLimit(rps=0.01, burst=10))
    try:
        verdicts = await asyncio.gather(*(rl.check("x") for _ in range(50)))
    finally:
        await rl.close()
    assert sum(v.allowed for v in verdicts) == 10


async def test_redis_down_follows_the_fail_policy() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    before = REDIS_ERRORS.labels("ratelimit")._value.get()
    open_rl, closed_rl = limiter(dead), limiter(dead, fail_open=False)
    try:
        assert (await open_rl.check("a")).allowed
        shut = await closed_rl.check("a")
        assert not shut.allowed and shut.degraded and shut.retry_after_ms > 0
    finally:
        await open_rl.close()
        await closed_rl.close()
    assert REDIS_ERRORS.labels("ratelimit")._value.get() == before + 2


async def test_a_dead_redis_is_not_asked_for_every_record() -> None:
    rl = limiter(f"redis://127.0.0.1:{free_port()}/0")
    before = REDIS_ERRORS.labels("ratelimit")._value.get()
    try:
        verdicts = [await rl.check("a") for _ in range(20)]
    finally:
        await rl.close()
    assert all(v.allowed and v.degraded for v in verdicts)
    assert REDIS_ERRORS.labels("ratelimit")._value.get() == before + 1


async def test_tenant_over_quota_gets_inf_429_and_others_do_not(
    client: LanewayClient,
) -> None:
    # conftest gives tenant "tiny" a burst of 2 and one token per 10 s.
    tiny = await asyncio.gather(
        *(client.ask("ping", tenant="tiny", timeout_s=60) for _ in range(4))
    )
    others = await asyncio.gather(
        *(client.ask("ping", tenant="roomy", timeout_s=60) for _ in range(4))
    )
    codes = sorted(r.error.code if r.error else "ok" for r in tiny)
    assert codes == ["INF-429", "INF-429", "ok", "ok"]
    refused = [r for r in tiny if r.error]
    assert all(r.error and r.error.retry_after_ms and r.error.retry_after_ms > 0 for r in refused)
    assert all(r.status == "ok" for r in others)
