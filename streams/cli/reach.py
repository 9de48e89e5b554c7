"""Before a command waits on a stack: is the part it waits on alive on the
Redis it reached? A batch job needs a live tracker to be counted; a question
needs a live lane worker. Both are read by heartbeat (the tracker's beat in
``streams.jobs.liveness``, the worker board in
``streams.stores.workerboard``), bounded by ``REACH_TIMEOUT_S``."""

from __future__ import annotations

import asyncio

from redis.exceptions import RedisError

from schemas.settings import Settings
from streams.devstack.supervisor import without_password
from streams.jobs.liveness import tracker_alive
from streams.stores.workerboard import WorkerBoard

__all__ = ["NOT_ALIVE", "REACH_TIMEOUT_S", "missing_tracker", "missing_workers"]

REACH_TIMEOUT_S = 5.0
"""The longest wait for Redis to answer a liveness read."""

NOT_ALIVE = 3
"""The exit status of a command that found nothing alive to wait on."""

_HINT = (
    "start the stack with `laneway up`, or point this command at the stack's Redis "
    "(LANEWAY_REDIS_URL, or the current-stack file `laneway up` writes; `laneway status` "
    "shows what it found)"
)


async def missing_tracker(settings: Settings) -> str | None:
    """Why a batch job submitted with ``settings`` would never be counted,
    or ``None`` when a tracker is alive on its Redis."""
    where = without_password(settings.redis.url)
    redis = settings.redis.client()
    try:
        alive = await asyncio.wait_for(
            tracker_alive(redis, settings.redis.key_prefix), REACH_TIMEOUT_S
        )
    except (RedisError, OSError, TimeoutError) as exc:
        return f"cannot reach Redis at {where}: {exc}; {_HINT}"
    finally:
        await redis.aclose()
    if alive:
        return None
    return f"no batch tracker is alive on the Redis at {where}; {_HINT}"


async def missing_workers(settings: Settings) -> str | None:
    """Why a question asked with ``settings`` would get no answer from a
    model, or ``None`` when a lane worker is alive on its Redis (or Redis
    cannot say: the question is asked anyway)."""
    where = without_password(settings.redis.url)
    redis = settings.redis.client()
    board = WorkerBoard(redis, settings.redis.key_prefix, stale_s=3 * settings.worker_heartbeat_s)
    try:
        cards = await asyncio.wait_for(board.live(), REACH_TIMEOUT_S)
    except TimeoutError:
        cards = None
    finally:
        await redis.aclose()
    if cards is None or cards:
        return None
    return f"no lane worker is alive on the Redis at {where}; {_HINT}"
