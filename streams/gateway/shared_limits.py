"""Requests and tokens per minute per API key, counted in Redis so that
every gateway replica spends one budget: two replicas behind a load
balancer admit a key's ``rpm`` between them, not ``rpm`` each.

Per key, over a sliding window of the last 60 seconds (Redis's own clock,
``TIME``, so replicas with skewed clocks agree)::

    <r>:gateway:limit:<key id>:req      sorted set: one member per admitted request
    <r>:gateway:limit:<key id>:tok      sorted set: one member per answer, "<tokens>:<uid>"
    <r>:gateway:limit:<key id>:toksum   the sum of the tokens in ``tok``

Admitting checks and counts in one script, so two replicas never both
take the last request of a minute. Tokens are counted once an answer
tells them (``spend``), as in ``streams.gateway.limiter``.

Redis down: the rule of every laneway store (``streams.stores.failopen``):
the gateway goes on, the failure counted in ``laneway_redis_errors_total``
and logged once per outage. Meanwhile each replica counts on its own
(``MinuteLimiter``: the tokens of every answer, and the requests it
admitted while Redis was away): a key gets up to its limit per replica
until Redis answers again, never no limit at all.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from streams.gateway.limiter import WINDOW_S, MinuteLimiter
from streams.stores.failopen import FailOpen
from streams.stores.keyspace import own_slot

__all__ = ["LimitVerdict", "SharedLimiter"]

log = logging.getLogger(__name__)

# KEYS: req, tok, toksum. ARGV: rpm (0: none), tpm (0: none), member, window ms.
# Returns {admitted (0/1), wait ms, requests in window, tokens in window}.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[4])
local start = now - window
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', start)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', start)
local sum = tonumber(redis.call('GET', KEYS[3]) or '0')
for _, m in ipairs(gone) do
  sum = sum - tonumber(string.match(m, '^(%d+):'))
end
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', start)
  if sum < 0 then sum = 0 end
  redis.call('SET', KEYS[3], sum, 'PX', window + 1000)
end
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local count = redis.call('ZCARD', KEYS[1])
local wait = 0
if rpm > 0 and count >= rpm then
  local leaving = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')
  wait = math.max(wait, tonumber(leaving[2]) + window - now)
end
if tpm > 0 and sum >= tpm then
  local remaining = sum
  local held = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #held, 2 do
    remaining = remaining - tonumber(string.match(held[i], '^(%d+):'))
    if remaining < tpm then
      wait = math.max(wait, tonumber(held[i + 1]) + window - now)
      break
    end
  end
end
if wait > 0 then return {0, math.max(1, wait), count, sum} end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], window + 1000)
return {1, 0, count + 1, sum}
"""

# KEYS: tok, toksum. ARGV: tokens, uid, window ms.
_SPEND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1] .. ':' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + 1000)
redis.call('INCRBY', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]) + 1000)
return 1
"""


@dataclass(frozen=True, slots=True)
class LimitVerdict:
    """Whether a request was admitted; if not, how long to wait, and what
    the key used of its limits in the last minute."""

    admitted: bool
    wait_s: float = 0.0
    requests: int = 0
    tokens: int = 0
    shared: bool = True
    """``False``: Redis could not be asked; this replica's own count decided."""


class SharedLimiter:
    """Per-key minute windows in Redis, this replica's own as the fallback."""

    def __init__(
        self,
        redis: Any,
        key_prefix: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.key_prefix = key_prefix
        self.local = MinuteLimiter()
        self._clock = clock
        self._admit = redis.register_script(_ADMIT)
        self._spend = redis.register_script(_SPEND)
        self.guard = FailOpen("gateway limits", log=log, label="gateway_limits")

    def _keys(self, key_id: str) -> list[str]:
        # One key's windows in one slot: the scripts take them together.
        base = own_slot(f"{self.key_prefix}:gateway:limit", key_id)
        return [f"{base}:req", f"{base}:tok", f"{base}:toksum"]

    async def admit(self, key_id: str, *, rpm: int | None, tpm: int | None) -> LimitVerdict:
        """Count a request of ``key_id`` if its limits allow (``None``: no limit)."""
        if rpm is None and tpm is None:
            return LimitVerdict(True)
        if not self.guard.resting():
            req, tok, toksum = self._keys(key_id)
            try:
                admitted, wait_ms, requests, tokens = await self._admit(
                    keys=[req, tok, toksum],
                    args=[rpm or 0, tpm or 0, uuid.uuid4().hex, int(WINDOW_S * 1000)],
                )
            except RedisError as exc:
                self.guard.failed("admit", exc)
            else:
                self.guard.answered()
                return LimitVerdict(bool(admitted), int(wait_ms) / 1000, int(requests), int(tokens))
        now = self._clock()
        local_wait = self.local.admit(key_id, rpm=rpm, tpm=tpm, now=now)
        requests, tokens = self.local.used(key_id, now=now)
        if local_wait is None:
            return LimitVerdict(True, 0.0, requests, tokens, shared=False)
        return LimitVerdict(False, local_wait, requests, tokens, shared=False)

    async def spend(self, key_id: str, tokens: int) -> None:
        """Count the ``tokens`` of an answer to ``key_id``."""
        if tokens <= 0:
            return
        self.local.spend(key_id, tokens, now=self._clock())
        if self.guard.resting():
            return
        _, tok, toksum = self._keys(key_id)
        try:
            await self._spend(
                keys=[tok, toksum], args=[tokens, uuid.uuid4().hex, int(WINDOW_S * 1000)]
            )
        except RedisError as exc:
            self.guard.failed("spend", exc)
        else:
            self.guard.answered()
