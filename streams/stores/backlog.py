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

__all__ = ["BacklogBoard", "LatencyBoard"]

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


class LatencyBoard:
    """Each lane's recent p95 latency, published by the quality agent and
    read by the classifier's flow controller (stale after ``stale_s``)."""

    def __init__(self, client: aioredis.Redis, prefix: str, stale_s: float = 30.0) -> None:
        self._redis = client
        self._key = f"{prefix}:lane:p95"
        self._stale_ms = int(stale_s * 1000)

    async def report(self, p95: dict[Lane, float]) -> None:
        """Raises on Redis trouble: the publisher counts it."""
        if p95:
            now_ms = int(time.time() * 1000)
            mapping = {lane.value: f"{value:.1f}:{now_ms}" for lane, value in p95.items()}
            await self._redis.hset(self._key, mapping=mapping)  # type: ignore[arg-type]

    async def read(self) -> dict[Lane, float] | None:
        """p95 latency per lane, or ``None`` when Redis cannot say."""
        try:
            entries = await self._redis.hgetall(self._key)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("latency").inc()
            log.debug("lane latency read failed: %s", exc)
            return None
        now_ms = int(time.time() * 1000)
        out = {}
        for field, value in entries.items():
            latency, at_ms = _text(value).split(":")
            name = _text(field)
            if now_ms - int(at_ms) <= self._stale_ms and name in Lane.__members__.values():
                out[Lane(name)] = float(latency)
        return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
