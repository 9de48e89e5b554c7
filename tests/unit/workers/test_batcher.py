import asyncio
from collections.abc import Sequence

import pytest

from schemas.errors import BackendUnavailable, LanewayError, OutOfMemory
from workers.backends.base import map_backend_exception
from workers.batcher import collect_batch, run_batch


class Source:
    """Items arrive on a queue; fetch(timeout, n) takes what is there."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.calls = 0

    async def fetch(self, timeout_s: float, max_items: int) -> list[int]:
        self.calls += 1
        items: list[int] = []
        try:
            items.append(await asyncio.wait_for(self.queue.get(), timeout_s))
        except TimeoutError:
            return items
        while len(items) < max_items and not self.queue.empty():
            items.append(self.queue.get_nowait())
        return items


async def test_size_bound() -> None:
    source = Source()
    for i in range(10):
        source.queue.put_nowait(i)
    batch = await collect_batch(source.fetch, max_size=4, max_wait_s=5, idle_timeout_s=1)
    assert batch == [0, 1, 2, 3]
    assert source.queue.qsize() == 6


async def test_time_bound_closes_a_partial_batch() -> None:
    source = Source()
    source.queue.put_nowait(1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    batch = await collect_batch(source.fetch, max_size=8, max_wait_s=0.05, idle_timeout_s=1)
    assert batch == [1]
    assert 0.04 <= loop.time() - started < 1


async def test_items_arriving_within_the_wait_join_the_batch() -> None:
    source = Source()
    source.queue.put_nowait(1)

    async def late() -> None:
        await asyncio.sleep(0.02)
        source.queue.put_nowait(2)

    task = asyncio.create_task(late())
    batch = await collect_batch(source.fetch, max_size=8, max_wait_s=0.5, idle_timeout_s=1)
    await task
    assert batch[:2] == [1, 2]


async def test_idle_returns_empty() -> None:
    source = Source()
    assert await collect_batch(source.fetch, max_size=8, max_wait_s=1, idle_timeout_s=0.01) == []
    assert source.calls == 1


async def test_run_batch_spreads_an_error_to_every_item() -> None:
    async def boom(items: Sequence[int]) -> list[int | LanewayError]:
        raise MemoryError("no room")

    outcomes = await run_batch(boom, [1, 2, 3], map_backend_exception)
    assert len(outcomes) == 3
    assert all(isinstance(o, OutOfMemory) for o in outcomes)


async def test_run_batch_checks_the_result_count() -> None:
    async def short(items: Sequence[int]) -> list[int | LanewayError]:
        return [1]

    outcomes = await run_batch(short, [1, 2], map_backend_exception)
    assert all(isinstance(o, BackendUnavailable) for o in outcomes)
    assert "1 results for a batch of 2" in outcomes[0].message  # type: ignore[union-attr]


async def test_run_batch_keeps_per_item_outcomes() -> None:
    async def mixed(items: Sequence[int]) -> list[int | LanewayError]:
        return [i * 2 if i % 2 else BackendUnavailable("odd") for i in items]

    outcomes = await run_batch(mixed, [1, 2, 3], map_backend_exception)
    assert outcomes[0] == 2 and isinstance(outcomes[1], BackendUnavailable) and outcomes[2] == 6
    assert await run_batch(mixed, [], map_backend_exception) == []


async def test_run_batch_lets_cancellation_through() -> None:
    async def slow(items: Sequence[int]) -> list[int | LanewayError]:
        await asyncio.sleep(10)
        return []

    task = asyncio.create_task(run_batch(slow, [1], map_backend_exception))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
