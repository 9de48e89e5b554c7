"""Whether a batch tracker is alive on a Redis, by its heartbeat.

Every tracker (``laneway batch tracker``, a child of ``laneway up``; a
deployment may run several) beats every ``interval_s``: it puts its own
card (host, pid) into one sorted set under the stack's prefix, scored with
the time its beat expires (three beats on), and drops the cards whose time
has passed. ``tracker_alive`` counts the cards not yet expired. A tracker
that stops cleanly takes out its own card only, so its replicas still read
as alive. One key: no command spans slots on a Redis Cluster.
``laneway batch submit --wait`` checks it first, so a job is never written
to a Redis where nothing will count its results (it would wait the job's
whole window for nothing)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from typing import Any

from redis.exceptions import RedisError

__all__ = ["TRACKER_KEY", "tracker_alive", "tracker_beats", "tracker_card", "tracker_gone"]

TRACKER_KEY = "batch-trackers"
"""Under the Redis key prefix: ``<prefix>:batch-trackers``, a sorted set of
the trackers' cards by the time (ms) their beat expires."""

OLD_TRACKER_KEY = "batch-tracker"
"""The one plain key trackers before replicas set (with a TTL): still read,
so a CLI upgraded before its stack's trackers finds them alive."""


def _key(prefix: str) -> str:
    return f"{prefix}:{TRACKER_KEY}"


def tracker_card() -> str:
    """This process's card in the set."""
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname()}, sort_keys=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def tracker_beats(
    redis: Any, prefix: str, interval_s: float, card: str | None = None
) -> None:
    """Announce this process as one of the stack's live trackers every
    ``interval_s`` until cancelled (a Redis error skips one beat)."""
    card = card or tracker_card()
    ttl_ms = max(1, int(3 * interval_s * 1000))
    while True:
        now = _now_ms()
        try:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.zadd(_key(prefix), {card: now + ttl_ms})
                pipe.zremrangebyscore(_key(prefix), "-inf", now)
                pipe.pexpire(_key(prefix), ttl_ms)
                await pipe.execute()
        except (RedisError, OSError):
            pass  # the next beat tries again; a silent tracker reads as gone
        await asyncio.sleep(interval_s)


async def tracker_alive(redis: Any, prefix: str) -> bool:
    """Whether some tracker has beaten within its last three beats. Redis
    errors propagate: the caller says it cannot reach Redis."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zcount(_key(prefix), _now_ms(), "+inf")
        pipe.exists(f"{prefix}:{OLD_TRACKER_KEY}")
        current, old = await pipe.execute()
    return bool(current or old)


async def tracker_gone(redis: Any, prefix: str, card: str | None = None) -> None:
    """Withdraw this tracker's beat on a clean stop (best effort: it expires
    anyway); the other trackers' beats stay."""
    try:
        await redis.zrem(_key(prefix), card or tracker_card())
    except (RedisError, OSError):
        pass
