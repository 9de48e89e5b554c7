"""A lane worker with more than one batch in flight, on a real broker and
Redis: a batch answers as soon as it has run, but commits only after the
batch taken before it has committed."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from schemas.messages import InferenceResult, Lane
from schemas.settings import BackendSettings, Settings
from tests.integration.conftest import read_topic
from tests.integration.test_result_store import worker_with_records
from workers.execution import Executor, backend_slots
from workers.lane_worker import LaneWorker


def rules_executor() -> Executor:
    return Executor(Lane.REALTIME, backend_slots(BackendSettings(light="rules", heavy="rules")))


async def committed(worker: LaneWorker, tp: TopicPartition) -> int | None:
    assert worker._consumer is not None
    offset: int | None = await worker._consumer.committed(tp)
    return offset


async def test_a_later_batch_answers_at_once_and_commits_after_the_earlier_one(
    settings: Settings,
) -> None:
    worker, own, routeds, records = await worker_with_records(
        settings, rules_executor(), ["ping", "ping"]
    )
    tp = TopicPartition(records[0].topic, records[0].partition)
    gate = asyncio.Event()

    async def earlier() -> None:
        await gate.wait()  # a batch still running on the model
        await worker.process(records[:1])

    try:
        first = asyncio.create_task(earlier())
        second = asyncio.create_task(worker.process(records[1:], after=first))
        for _ in range(50):
            replies = await read_topic(own, own.replies_topic, timeout_s=0.5)
            if replies:
                break
        ids = [InferenceResult.model_validate_json(r.value).id for r in replies]
        assert ids == [routeds[1].request.id], "the later batch answers without waiting"
        await asyncio.sleep(0.2)
        assert not second.done() and await committed(worker, tp) is None
        gate.set()
        await asyncio.wait_for(second, timeout=10)
        assert first.done() and await committed(worker, tp) == records[1].offset + 1
    finally:
        gate.set()
        await worker.close()


async def test_a_failed_earlier_batch_leaves_the_later_one_uncommitted(
    settings: Settings,
) -> None:
    worker, _, _, records = await worker_with_records(settings, rules_executor(), ["ping"])
    tp = TopicPartition(records[0].topic, records[0].partition)

    async def crashed() -> None:
        raise RuntimeError("the earlier batch's worker task died")

    try:
        first = asyncio.create_task(crashed())
        with pytest.raises(RuntimeError, match="earlier batch"):
            await worker.process(records, after=first)
        assert await committed(worker, tp) is None, "redelivered, not skipped"
    finally:
        await worker.close()
