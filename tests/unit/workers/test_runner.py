"""The batch runner's watch on the answers it decodes ends with the decode,
even when the Redis client swallows the cancel (redis/redis-py#2028)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis

from schemas.messages import AnswerPath, InferenceRequest, Lane, RoutedRequest
from schemas.settings import BackendSettings, CacheSettings, Settings
from streams.cache.response import ResponseCache
from workers.claims import DecodeClaims
from workers.execution import Executor, Finished, backend_slots
from workers.runner import WATCH_S, BatchRunner
from workers.streaming import AnswerStream


class SwallowingCache(ResponseCache):
    """``present`` as redis-py's client can answer it when a cancel lands
    mid-command: the cancel is lost and the call returns (nothing found)."""

    async def present(self, keys: Sequence[str]) -> set[str]:
        try:
            await asyncio.sleep(WATCH_S)
        except asyncio.CancelledError:
            pass
        return set()


class SlowExecutor(Executor):
    """The real executor on the rules backend, taking long enough that the
    watcher is inside ``present`` when the decode ends."""

    async def execute(
        self,
        batch: Sequence[RoutedRequest],
        unwanted: Mapping[int, asyncio.Event] | None = None,
        streams: Mapping[int, AnswerStream] | None = None,
    ) -> list[Finished]:
        await asyncio.sleep(WATCH_S * 1.5)
        return await super().execute(batch, unwanted, streams)


async def test_the_watch_ends_with_the_decode_when_a_cancel_is_swallowed() -> None:
    settings = Settings()
    client = aioredis.Redis(host="127.0.0.1", port=9)  # never reached
    cache = SwallowingCache(client, CacheSettings(), key_prefix="t", embedder=None)
    claims = DecodeClaims(client, prefix="t", ttl_s=60, lane=Lane.MEDIUM)
    executor = SlowExecutor(Lane.MEDIUM, backend_slots(BackendSettings(light="rules")))
    runner = BatchRunner(settings, Lane.MEDIUM, executor, cache, claims)
    now = int(time.time() * 1000)
    routed = RoutedRequest(
        request=InferenceRequest(id="a", prompt="ping"),
        lane=Lane.MEDIUM,
        path=AnswerPath.LIGHT,
        reply_to="replies",
        produced_at_ms=now,
        routed_at_ms=now,
    )
    finished = await asyncio.wait_for(runner._decode([routed], ["key"]), timeout=5)
    assert [item.result.status for item in finished] == ["ok"]
    await asyncio.sleep(WATCH_S * 3)
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert left == [], "no watcher left polling"
