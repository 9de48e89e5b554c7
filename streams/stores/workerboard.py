"""Which lane workers are alive and what they serve, through Redis.

Each lane worker announces itself every ``heartbeat_s``: its lane, and for
each model path (and registry version) whose backend is loaded, the backend,
model, version and device, and how many requests it runs at once. The classifier reads the board and
routes a request only down a path that a live worker on its lane serves
(``streams.classify.router``). An announcement older than ``stale_s`` is a
dead worker's and is ignored; a worker that stops cleanly withdraws its own.

Redis trouble is counted and logged once per outage (``FailOpen``); a
reader that cannot see the board gets ``None`` and routes as if every path
were served, so a Redis outage never stops routing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.messages import AnswerPath, Lane
from streams.stores.failopen import FailOpen

__all__ = [
    "PathCard",
    "Serving",
    "Versions",
    "WorkerBoard",
    "WorkerCard",
    "lane_capacity",
    "served_paths",
    "served_versions",
]

log = logging.getLogger(__name__)

Serving = Mapping[Lane, frozenset[AnswerPath]]
"""Per lane, the paths some live worker serves."""

Versions = Mapping[Lane, frozenset[tuple[AnswerPath, str]]]
"""Per lane, the (path, version) pairs some live worker serves."""


@dataclass(frozen=True, slots=True)
class PathCard:
    path: AnswerPath
    backend: str
    model: str
    device: str
    """``cpu``, ``cuda`` or ``remote`` (an OpenAI-compatible server)."""
    version: str | None = None
    """The registry version loaded (absent on cards of older workers)."""


@dataclass(frozen=True, slots=True)
class WorkerCard:
    """One worker's announcement."""

    worker_id: str
    lane: Lane
    paths: tuple[PathCard, ...]
    capacity: int
    """Requests the worker runs at once (batch size times batches in flight)."""
    at_ms: int = 0
    partitions: tuple[int, ...] | None = None
    """The lane topic's partitions the worker holds now (``None``: not
    said, on cards of older workers); the classifier steers realtime
    requests to a worker with room by them."""

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerCard:
        data = json.loads(raw)
        paths = tuple(
            PathCard(AnswerPath(p["path"]), p["backend"], p["model"], p["device"], p.get("version"))
            for p in data["paths"]
        )
        partitions = data.get("partitions")
        return cls(
            data["worker_id"],
            Lane(data["lane"]),
            paths,
            int(data["capacity"]),
            data["at_ms"],
            None if partitions is None else tuple(int(p) for p in partitions),
        )


def served_paths(cards: Sequence[WorkerCard]) -> dict[Lane, frozenset[AnswerPath]]:
    """Per lane, the paths its live workers serve (lanes with none are absent)."""
    serving: dict[Lane, set[AnswerPath]] = {}
    for card in cards:
        serving.setdefault(card.lane, set()).update(p.path for p in card.paths)
    return {lane: frozenset(paths) for lane, paths in serving.items()}


def lane_capacity(cards: Sequence[WorkerCard]) -> dict[Lane, int]:
    """Per lane, the requests its live workers run at once, counting only
    workers that serve a model path (lanes with none are absent)."""
    capacity: dict[Lane, int] = {}
    for card in cards:
        if card.paths:
            capacity[card.lane] = capacity.get(card.lane, 0) + card.capacity
    return capacity


def served_versions(cards: Sequence[WorkerCard]) -> dict[Lane, frozenset[tuple[AnswerPath, str]]]:
    """Per lane, the (path, version) pairs its live workers serve."""
    serving: dict[Lane, set[tuple[AnswerPath, str]]] = {}
    for card in cards:
        serving.setdefault(card.lane, set()).update(
            (p.path, p.version) for p in card.paths if p.version is not None
        )
    return {lane: frozenset(pairs) for lane, pairs in serving.items()}


class WorkerBoard:
    def __init__(self, client: aioredis.Redis, prefix: str, stale_s: float = 6.0) -> None:
        self._redis = client
        self.key = f"{prefix}:workers"
        self._stale_ms = int(stale_s * 1000)
        self._failopen = FailOpen("worker board", log=log, label="workers")

    async def announce(self, card: WorkerCard) -> None:
        stamped = replace(card, at_ms=int(time.time() * 1000))
        try:
            await self._redis.hset(self.key, card.worker_id, stamped.to_json())
        except (RedisError, OSError) as exc:
            self._failopen.failed("announce", exc)
            return
        self._failopen.answered()

    async def withdraw(self, worker_id: str) -> None:
        try:
            await self._redis.hdel(self.key, worker_id)
        except (RedisError, OSError) as exc:
            self._failopen.failed("withdraw", exc)

    async def live(self) -> list[WorkerCard] | None:
        """The live workers' cards, or ``None`` when Redis cannot say. Stale
        cards (workers that died) are removed as they are seen."""
        try:
            entries = await self._redis.hgetall(self.key)
        except (RedisError, OSError) as exc:
            self._failopen.failed("read", exc)
            return None
        self._failopen.answered()
        now_ms = int(time.time() * 1000)
        cards, stale = [], []
        for field, value in entries.items():
            try:
                card = WorkerCard.from_json(value)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("worker card %r unreadable: %s", field, exc)
                stale.append(field)
                continue
            if now_ms - card.at_ms > self._stale_ms:
                stale.append(field)
            else:
                cards.append(card)
        if stale:
            try:
                await self._redis.hdel(self.key, *stale)
            except (RedisError, OSError) as exc:
                self._failopen.failed("prune", exc)
        return cards
