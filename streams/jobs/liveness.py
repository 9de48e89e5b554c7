"""Whether a batch tracker is alive on a Redis, by its heartbeat.

The tracker (``laneway batch tracker``, a child of ``laneway up``) sets a
key under the stack's prefix every ``interval_s``, expiring after three
beats; ``tracker_alive`` reads it. ``laneway batch submit --wait`` checks it
first, so a job is never written to a Redis where nothing will count its
results (it would wait the job's whole window for nothing)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

from redis.exceptions import RedisError

__all__ = ["TRACKER_KEY", "tracker_alive", "tracker_beats", "tracker_gone"]

TRACKER_KEY = "batch-tracker"
"""Under the Redis key prefix: ``<prefix>:batch-tracker``."""


def _key(prefix: str) -> str:
    return f"{prefix}:{TRACKER_KEY}"


async def tracker_beats(redis: Any, prefix: str, interval_s: float) -> None:
    """Announce this process as the stack's live tracker every
    ``interval_s`` until cancelled (a Redis error skips one beat)."""
    card = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    ttl_ms = max(1, int(3 * interval_s * 1000))
    while True:
        try:
            await redis.set(_key(prefix), card, px=ttl_ms)
        except (RedisError, OSError):
            pass  # the next beat tries again; a silent tracker reads as gone
        await asyncio.sleep(interval_s)


async def tracker_alive(redis: Any, prefix: str) -> bool:
    """Whether a tracker has beaten within its last three beats. Redis
    errors propagate: the caller says it cannot reach Redis."""
    return bool(await redis.exists(_key(prefix)))


async def tracker_gone(redis: Any, prefix: str) -> None:
    """Withdraw the beat on a clean stop (best effort: it expires anyway)."""
    try:
        await redis.delete(_key(prefix))
    except (RedisError, OSError):
        pass
