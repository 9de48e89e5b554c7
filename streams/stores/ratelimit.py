"""Per-tenant rate limits: a token bucket per tenant in Redis, updated by
one Lua script so concurrent classifier replicas share it atomically. The
clock is Redis's own (``TIME``), so replicas with skewed clocks agree.

Over the limit, a request gets ``INF-429`` with ``retry_after_ms``: the time
until the bucket holds a token again. Redis unreachable: the configured
policy (fail-open by default), counted in ``laneway_redis_errors_total``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.settings import RateLimitSettings
from streams.stores.failopen import FailOpen

__all__ = ["RateLimiter", "Verdict"]

log = logging.getLogger(__name__)

# KEYS[1]: the tenant's bucket. ARGV: tokens per second, burst, cost.
# Returns {allowed (0/1), retry_after_ms}.
_TOKEN_BUCKET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1]) / 1000
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local allowed = 0
local retry_after = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry_after = math.ceil((cost - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 1000)
return {allowed, retry_after}
"""


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    retry_after_ms: int = 0
    degraded: bool = False
    """True when Redis could not be asked and the fail policy decided."""


class RateLimiter:
    def __init__(self, client: aioredis.Redis, settings: RateLimitSettings, prefix: str) -> None:
        self._redis = client
        self._settings = settings
        self._prefix = prefix
        self._script = client.register_script(_TOKEN_BUCKET)
        self._failopen = FailOpen(
            f"rate limiter (fail_open={settings.fail_open})", log=log, label="ratelimit"
        )

    async def check(self, tenant: str | None) -> Verdict:
        if not self._settings.enabled:
            return Verdict(allowed=True)
        limit = self._settings.limit_for(tenant)
        key = f"{self._prefix}:ratelimit:{tenant or '-'}"
        if self._failopen.resting():
            return Verdict(allowed=self._settings.fail_open, retry_after_ms=1000, degraded=True)
        try:
            allowed, retry_after_ms = await self._script(
                keys=[key], args=[limit.rps, limit.burst, 1]
            )
        except (RedisError, OSError) as exc:
            self._failopen.failed("check", exc)
            return Verdict(allowed=self._settings.fail_open, retry_after_ms=1000, degraded=True)
        self._failopen.answered()
        return Verdict(allowed=bool(allowed), retry_after_ms=int(retry_after_ms))

    async def close(self) -> None:
        await self._redis.aclose()
