"""``streams.bench.lag``: a follower has caught up when the counter on its
own /metrics reached what the phase gave it (a real HTTP /metrics here)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from streams.bench.lag import TRACKER_METRIC, Follower, caught_up, followers
from streams.devstack.embedded import free_port


@pytest.fixture
def served() -> Iterator[tuple[int, Counter]]:
    registry = CollectorRegistry()
    counter = Counter(TRACKER_METRIC.removesuffix("_total"), "records done", registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield port, counter
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_caught_up_when_the_counter_reaches_what_was_given(
    served: tuple[int, Counter],
) -> None:
    port, counter = served
    tracker = followers(free_port(), port)[1]
    assert tracker.per_request == 2 and tracker.done() == 0.0

    async def work() -> None:
        for _ in range(4):
            await asyncio.sleep(0.1)
            counter.inc(50)

    started = time.perf_counter()
    worker = asyncio.create_task(work())
    caught = await caught_up(tracker, 200, timeout_s=10)
    await worker
    assert caught is not None and caught - started >= 0.4


async def test_a_follower_that_never_catches_up_or_has_no_counter_is_none(
    served: tuple[int, Counter],
) -> None:
    port, counter = served
    counter.inc(3)
    assert await caught_up(followers(free_port(), port)[1], 4, timeout_s=0.3) is None
    nobody = Follower("router", free_port(), "laneway_quality_events_total", 1)
    assert nobody.done() is None
    assert await caught_up(nobody, 0, timeout_s=0.3) is None
