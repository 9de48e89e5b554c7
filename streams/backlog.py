"""The lane backlog board in Redis: each worker reports how many records
wait on its partitions; the classifier sums them into the pressure its flow
controller reads. Reports older than ``stale_s`` (a dead worker's) are
ignored. Redis trouble is logged and counted, never raised."""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.messages import Lane
from streams.ops import REDIS_ERRORS

__all__ = ["BacklogBoard"]

log = logging.getLogger(__name__)


class BacklogBoard:
    def __init__(self, client: aioredis.Redis, prefix: str, stale_s: float = 30.0) -> None:
        self._redis = client
        self._key = f"{prefix}:backlog"
        self._stale_ms = int(stale_s * 1000)

    async def report(self, lane: Lane, worker_id: str, waiting: int) -> None:
        value = f"{waiting}:{int(time.time() * 1000)}"
        try:
            await self._redis.hset(self._key, f"{lane}:{worker_id}", value)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("backlog").inc()
            log.debug("backlog report failed: %s", exc)

    async def read(self) -> dict[Lane, int] | None:
        """Records waiting per lane, or ``None`` when Redis cannot say."""
        try:
            entries = await self._redis.hgetall(self._key)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("backlog").inc()
            log.debug("backlog read failed: %s", exc)
            return None
        now_ms = int(time.time() * 1000)
        totals = dict.fromkeys(Lane, 0)
        for field, value in entries.items():
            lane_name = _text(field).split(":", 1)[0]
            waiting, at_ms = (int(x) for x in _text(value).split(":"))
            if now_ms - at_ms <= self._stale_ms and lane_name in Lane.__members__.values():
                totals[Lane(lane_name)] += waiting
        return totals


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
