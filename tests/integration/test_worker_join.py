"""A lane worker joins its lane's consumer group only once its models have
answered: a replica restarted beside a running one does not take half the
partitions and hold them unread while it loads (``laneway bench chaos``
found a restarted medium worker holding its share ~30 s). On a broker of
its own, with rules backends (no model to load) and a second worker whose
warm-up is held open as a long model load would."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from schemas.messages import Lane
from schemas.settings import BackendSettings, KafkaSettings, Settings
from streams.devstack.embedded import EmbeddedBroker
from streams.kafka.topics import create_topics, wait_for_broker
from workers.execution import Executor, backend_slots
from workers.lane_worker import LaneWorker

RULES = BackendSettings(light="rules", heavy="rules")


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


class SlowToLoad(LaneWorker):
    """A worker whose warm-up (the model load) lasts until ``loaded`` is set."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, Lane.BULK, executor=Executor(Lane.BULK, backend_slots(RULES)))
        self.loading = asyncio.Event()
        self.loaded = asyncio.Event()

    async def _warm_up(self) -> None:
        self.loading.set()
        await asyncio.wait_for(self.loaded.wait(), 60)
        await super()._warm_up()


async def assignment_after(worker: LaneWorker, polls: int) -> set[int]:
    """The partitions ``worker`` holds after ``polls`` fetches of 0.1 s (a
    rebalance is seen only by a consumer that polls)."""
    for _ in range(polls):
        await worker._fetch(0.1, 10)
    assert worker._consumer is not None
    return {tp.partition for tp in worker._consumer.assignment()}


async def test_a_worker_joins_its_group_once_its_models_answered(broker: EmbeddedBroker) -> None:
    prefix = f"join{uuid.uuid4().hex[:8]}"
    settings = Settings(
        kafka=KafkaSettings(bootstrap=broker.bootstrap, topic_prefix=prefix, partitions=4),
        app_id=prefix,
    )
    await wait_for_broker(settings)
    await create_topics(settings)
    first = LaneWorker(settings, Lane.BULK, executor=Executor(Lane.BULK, backend_slots(RULES)))
    second = SlowToLoad(settings)
    starting: asyncio.Task[None] | None = None
    try:
        await first.start()
        every = set(range(4))
        for _ in range(100):  # bounded: 100 polls of 0.1 s for the first assignment
            if await assignment_after(first, 1) == every:
                break
        assert await assignment_after(first, 1) == every
        starting = asyncio.create_task(second.start())
        await asyncio.wait_for(second.loading.wait(), 30)
        # Loading: not in the group, so the first worker keeps every partition.
        assert second._consumer is None, "joined the group before its models answered"
        assert await assignment_after(first, 40) == every
        second.loaded.set()
        await asyncio.wait_for(starting, 60)
        assert second._consumer is not None
        kept: set[int] = every
        for _ in range(150):  # bounded: the rebalance the join starts, both polling
            kept = await assignment_after(first, 1)
            await assignment_after(second, 1)
            if kept < every:
                break
        assert kept and kept < every, "the group did not rebalance after the join"
    finally:
        if starting is not None and not starting.done():
            second.loaded.set()
            await asyncio.wait_for(starting, 60)
        await second.close()
        await first.close()
