"""The lane backlog board in Redis: each worker reports how many records
wait on its partitions, and how fast it answers them while busy (its
``DrainRate``); the classifier sums them per lane into the pressure its flow
controller reads and the realtime lane's expected wait. Reports older than
``stale_s`` (a dead worker's) are ignored. Redis trouble is logged and
counted, never raised."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.messages import Lane
from streams.ops import REDIS_ERRORS

__all__ = ["BacklogBoard", "DrainRate", "LaneLoad", "LatencyBoard", "WorkerLoad", "lane_loads"]

log = logging.getLogger(__name__)


class DrainRate:
    """How many records a worker answers a second *while busy*: the records
    of the batches that finished in the last ``window_s``, over the time at
    least one batch ran (batches in flight together count once). An idle
    spell does not lower it, so the first burst after one is judged by what
    the worker can do, not by how little it was asked."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._batches: deque[tuple[float, float, int]] = deque()

    def add(self, started: float, ended: float, records: int) -> None:
        """A batch of ``records`` ran from ``started`` to ``ended`` (monotonic s)."""
        self._batches.append((started, ended, records))

    def per_s(self, now: float) -> float | None:
        """Records a busy second, ``None`` when no batch ended lately."""
        since = now - self.window_s
        while self._batches and self._batches[0][1] < since:
            self._batches.popleft()
        if not self._batches:
            return None
        busy, reach = 0.0, float("-inf")  # whole batches: their records and their time
        for start, end, _ in sorted(self._batches):
            start = max(start, reach)
            if end > start:
                busy += end - start
                reach = end
        records = sum(n for _, _, n in self._batches)
        return records / max(busy, 0.05)


@dataclass(frozen=True, slots=True)
class LaneLoad:
    """A lane's live workers, summed: records waiting, and records answered
    a busy second (``None``: no worker reported one)."""

    waiting: int
    drain_per_s: float | None = None
    at_ms: int | None = None
    """When the oldest of the reports summed was written (epoch ms)."""

    @property
    def wait_ms(self) -> float | None:
        """How long a new record would wait before a worker took it."""
        if self.drain_per_s is None or self.drain_per_s <= 0:
            return None
        return self.waiting / self.drain_per_s * 1000


class BacklogBoard:
    def __init__(self, client: aioredis.Redis, prefix: str, stale_s: float = 30.0) -> None:
        self._redis = client
        self._key = f"{prefix}:backlog"
        self._stale_ms = int(stale_s * 1000)

    async def report(
        self,
        lane: Lane,
        worker_id: str,
        waiting: int,
        drain_per_s: float | None = None,
        at_ms: int | None = None,
    ) -> None:
        """``waiting:at_ms`` (``:drain_per_s`` when known; readers before it
        read the first two fields). ``at_ms``: when ``waiting`` was counted
        (``None``: now); what the classifier sent after it, it adds."""
        at_ms = int(time.time() * 1000) if at_ms is None else at_ms
        value = f"{waiting}:{at_ms}"
        if drain_per_s is not None:
            value += f":{drain_per_s:.3f}"
        try:
            await self._redis.hset(self._key, f"{lane}:{worker_id}", value)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("backlog").inc()
            log.debug("backlog report failed: %s", exc)

    async def read(self) -> dict[Lane, int] | None:
        """Records waiting per lane, or ``None`` when Redis cannot say."""
        loads = await self.read_loads()
        return None if loads is None else {lane: load.waiting for lane, load in loads.items()}

    async def read_loads(self) -> dict[Lane, LaneLoad] | None:
        """Per lane, records waiting and drained a busy second (``None``:
        Redis cannot say)."""
        reports = await self.read_reports()
        return None if reports is None else lane_loads(reports)

    async def read_reports(self) -> list[WorkerLoad] | None:
        """Each live worker's own report (``None``: Redis cannot say)."""
        try:
            entries = await self._redis.hgetall(self._key)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("backlog").inc()
            log.debug("backlog read failed: %s", exc)
            return None
        now_ms = int(time.time() * 1000)
        out = []
        for field, value in entries.items():
            lane_name, _, worker_id = _text(field).partition(":")
            parts = _text(value).split(":")
            at_ms = int(parts[1])
            if now_ms - at_ms > self._stale_ms or lane_name not in Lane.__members__.values():
                continue
            drain = float(parts[2]) if len(parts) > 2 else None
            out.append(
                WorkerLoad(Lane(lane_name), worker_id, LaneLoad(int(parts[0]), drain, at_ms))
            )
        return out


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's report: its lane and what waits on its partitions."""

    lane: Lane
    worker_id: str
    load: LaneLoad


def lane_loads(reports: Sequence[WorkerLoad]) -> dict[Lane, LaneLoad]:
    """The reports summed per lane (``at_ms``: the oldest summed)."""
    waiting = dict.fromkeys(Lane, 0)
    drain: dict[Lane, float] = {}
    oldest: dict[Lane, int] = {}
    for report in reports:
        lane, load = report.lane, report.load
        waiting[lane] += load.waiting
        if load.at_ms is not None:
            oldest[lane] = min(oldest.get(lane, load.at_ms), load.at_ms)
        if load.drain_per_s is not None:
            drain[lane] = drain.get(lane, 0.0) + load.drain_per_s
    return {lane: LaneLoad(waiting[lane], drain.get(lane), oldest.get(lane)) for lane in Lane}


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
