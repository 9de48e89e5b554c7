"""Per-tenant rate limits: a token bucket per tenant in Redis, updated by
one Lua script so concurrent classifier replicas share it atomically. The
clock is Redis's own (``TIME``), so replicas with skewed clocks agree.

Over the limit, a request gets ``INF-429`` with ``retry_after_ms``: the time
until the bucket holds a token again. Redis unreachable: the configured
policy (fail-open by default), counted in ``laneway_redis_errors_total``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.settings import RateLimitSettings
from streams.stores.failopen import FailOpen
from streams.stores.rounds import Round

__all__ = ["QueuedChecks", "RateLimiter", "Verdict"]

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


# The same bucket for a whole batch. KEYS: one bucket per tenant (on a
# cluster, those of one slot). ARGV: per key, tokens per second, burst and
# the number of requests of that tenant in the batch. Returns per key
# {admitted, retry_after_ms}: the first ``admitted`` requests (in batch
# order) take a token each, as that many calls of the script above would;
# the rest wait ``retry_after_ms``.
_TOKEN_BUCKETS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[3 * i - 2]) / 1000
  local burst = tonumber(ARGV[3 * i - 1])
  local asked = tonumber(ARGV[3 * i])
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1]) or burst
  local ts = tonumber(state[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
  local admitted = math.min(asked, math.floor(tokens))
  tokens = tokens - admitted
  local retry_after = 0
  if admitted < asked then
    retry_after = math.ceil((1 - tokens) / rate)
  end
  redis.call('HSET', key, 'tokens', tostring(tokens), 'ts', now)
  redis.call('PEXPIRE', key, math.ceil(burst / rate) + 1000)
  out[#out + 1] = admitted
  out[#out + 1] = retry_after
end
return out
"""


@dataclass(frozen=True, slots=True)
class QueuedChecks:
    """The script calls ``RateLimiter.queue`` put in a round."""

    indexes: tuple[int, ...]
    """Where each call's reply is in the round's replies."""
    order: tuple[str | None, ...]
    """The tenants, in the order of the calls' concatenated replies."""


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
        self._batch_script = client.register_script(_TOKEN_BUCKETS)
        self._failopen = FailOpen(
            f"rate limiter (fail_open={settings.fail_open})", log=log, label="ratelimit"
        )

    async def check(self, tenant: str | None) -> Verdict:
        if not self._settings.enabled:
            return Verdict(allowed=True)
        limit = self._settings.limit_for(tenant)
        key = f"{self._prefix}:ratelimit:{tenant or '-'}"
        if self._failopen.resting():
            return self._degraded()
        try:
            allowed, retry_after_ms = await self._script(
                keys=[key], args=[limit.rps, limit.burst, 1]
            )
        except (RedisError, OSError) as exc:
            self._failopen.failed("check", exc)
            return self._degraded()
        self._failopen.answered()
        return Verdict(allowed=bool(allowed), retry_after_ms=int(retry_after_ms))

    # -- batched: one script call for every tenant of a batch ----------------

    def queue(self, round_: Round, tenants: Sequence[str | None]) -> QueuedChecks | list[Verdict]:
        """Queue the checks of a batch's requests (one tenant each, in batch
        order) into ``round_``: one script call for all its tenants on one
        Redis, one per cluster slot on a cluster (a script's keys must
        share a slot; the buckets spread over the nodes). What to ``judge``
        the replies by, or the verdicts at once when Redis is not to be
        asked (limits off, or resting after a failure)."""
        if not self._settings.enabled:
            return [Verdict(allowed=True)] * len(tenants)
        if self._failopen.resting():
            return [self._degraded()] * len(tenants)
        asked: dict[str | None, int] = {}
        for tenant in tenants:
            asked[tenant] = asked.get(tenant, 0) + 1
        groups: dict[int, list[tuple[str | None, str, int]]] = {}
        for tenant, count in asked.items():
            key = f"{self._prefix}:ratelimit:{tenant or '-'}"
            groups.setdefault(round_.group_of(key), []).append((tenant, key, count))
        indexes, order = [], []
        for group in groups.values():
            keys, args = [], []
            for tenant, key, count in group:
                limit = self._settings.limit_for(tenant)
                keys.append(key)
                args += [limit.rps, limit.burst, count]
                order.append(tenant)
            indexes.append(round_.script(self._batch_script, keys, args))
        return QueuedChecks(tuple(indexes), tuple(order))

    def judge(
        self, queued: QueuedChecks, replies: Sequence[object], tenants: Sequence[str | None]
    ) -> list[Verdict]:
        """Each request's verdict from the round's ``replies`` to what
        ``queue`` queued."""
        answers = [replies[i] for i in queued.indexes]
        for reply in answers:
            if isinstance(reply, RedisError | OSError):
                return [self.failed(reply)] * len(tenants)
        try:
            flat: Any = [value for reply in answers for value in cast(Any, reply)]
            granted = {
                tenant: (int(flat[2 * i]), int(flat[2 * i + 1]))
                for i, tenant in enumerate(queued.order)
            }
        except (TypeError, ValueError, IndexError) as exc:
            log.warning("rate limit script answered %r: %s", answers, exc)
            return [self._degraded()] * len(tenants)
        self._failopen.answered()
        verdicts = []
        for tenant in tenants:
            admitted, retry_after_ms = granted[tenant]
            if admitted > 0:
                granted[tenant] = (admitted - 1, retry_after_ms)
                verdicts.append(Verdict(allowed=True))
            else:
                verdicts.append(Verdict(allowed=False, retry_after_ms=retry_after_ms))
        return verdicts

    def failed(self, exc: BaseException) -> Verdict:
        """The round trip the checks were queued in failed as a whole."""
        self._failopen.failed("check", exc)
        return self._degraded()

    def _degraded(self) -> Verdict:
        return Verdict(allowed=self._settings.fail_open, retry_after_ms=1000, degraded=True)

    async def close(self) -> None:
        await self._redis.aclose()
