"""``laneway worker --lane L``: one lane worker with its Redis-backed parts
(result store, backlog board, worker board, response cache writes, decode
marks, session turns), run until SIGTERM/SIGINT. Its batch size is the one
kept for its models on this CPU, where one is (``workers.tune``)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from schemas.messages import Lane
from schemas.settings import Settings
from streams.cache.response import ResponseCache
from streams.ops import ProcessState, heartbeat
from streams.routing.registry import load_registry
from streams.stores.backlog import BacklogBoard
from streams.stores.sessions import SessionStore
from streams.stores.workerboard import WorkerBoard
from workers.answered import Remember
from workers.cancels import CancelWatch
from workers.claims import DecodeClaims
from workers.lane_worker import LaneWorker
from workers.result_store import ResultStore
from workers.streaming import StreamAttempts
from workers.tune import tuned_for_lane

__all__ = ["serve_lane"]

log = logging.getLogger(__name__)


async def serve_lane(settings: Settings, lane: Lane, state: ProcessState, drain_s: float) -> None:
    """Run a worker until SIGTERM/SIGINT. The batch in flight then gets
    ``drain_s`` to finish and commit; past that it is abandoned uncommitted
    and will be delivered again to the next worker."""
    niceness = settings.lane(lane).nice
    if niceness:
        os.nice(niceness)  # the model threads inherit it
        log.info("%s worker runs at CPU priority nice %d", lane, niceness)
    # The batch size measured on this machine (workers.tune), where one is
    # kept; one measured at start runs at the priority the worker runs at.
    registry = load_registry(settings.routing.models_file, settings.backend)
    settings, registry = await tuned_for_lane(settings, lane, registry)
    redis = settings.redis.client()  # one connection pool for store and board
    store = ResultStore(redis, prefix=settings.redis.key_prefix, ttl_s=settings.redis.result_ttl_s)
    board = BacklogBoard(redis, settings.redis.key_prefix)
    workers = WorkerBoard(redis, settings.redis.key_prefix, stale_s=3 * settings.worker_heartbeat_s)
    cache = (
        ResponseCache(redis, settings.cache, key_prefix=settings.redis.key_prefix, embedder=None)
        if settings.cache_in_use
        else None
    )
    sessions = (
        SessionStore(redis, settings.session, key_prefix=settings.redis.key_prefix)
        if settings.session.enabled
        else None
    )
    claims = (
        DecodeClaims(
            redis, prefix=settings.redis.key_prefix, ttl_s=settings.cache.claim_ttl_s, lane=lane
        )
        if cache is not None and settings.cache.claim_ttl_s > 0
        else None
    )
    attempts = StreamAttempts(
        redis, prefix=settings.redis.key_prefix, ttl_s=settings.stream.attempt_ttl_s
    )
    worker = LaneWorker(
        settings,
        lane,
        state,
        attempts=attempts,
        cancels=CancelWatch(settings),
        store=store,
        board=board,
        on_answered=Remember(sessions),
        cache=cache,
        workers=workers,
        claims=claims,
        registry=registry,
    )
    # Beats start once the models are loaded: vLLM builds its engine on the
    # event loop's thread, and until the first beat /healthz counts the
    # process as starting, not stalled.
    await worker.start()
    beats = asyncio.create_task(heartbeat(state))
    loop = asyncio.get_running_loop()
    runner = asyncio.ensure_future(worker.run())

    def on_signal() -> None:
        log.info("%s worker stopping; draining the batch in flight (%.0fs)", lane, drain_s)
        worker.stop()
        loop.call_later(drain_s, runner.cancel)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await runner
    except asyncio.CancelledError:
        log.warning(
            "%s worker: batch not finished within %.0fs; it will be redelivered", lane, drain_s
        )
    finally:
        beats.cancel()
        await worker.close()
