"""The worker's result store on real Redis/Valkey and a real broker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer, ConsumerRecord

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, RoutedRequest
from schemas.settings import BackendSettings, Settings
from streams.devstack.embedded import free_port
from streams.kafka.topics import create_topics
from streams.ops import REDIS_ERRORS
from tests.integration.conftest import fetch_lane_records, read_topic, routed_now
from workers.execution import Executor, Finished, backend_slots
from workers.lane_worker import LaneWorker
from workers.result_store import ResultStore
from workers.streaming import AnswerStream


def store_for(settings: Settings, prefix: str) -> ResultStore:
    return ResultStore.from_url(settings.redis.url, prefix=prefix, ttl_s=60, timeout_s=0.5)


async def test_results_round_trip_with_a_ttl(settings: Settings) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    store = store_for(settings, prefix)
    result = InferenceResult(id="r1", status="ok", output="hi")
    try:
        await store.put_many([(("lane", 0, 5, "r1"), result)])
        found = await store.get_many(
            [("lane", 0, 5, "r1"), ("lane", 0, 6, "r1"), ("lane", 0, 5, "r2")]
        )
    finally:
        await store.close()
    assert found == {("lane", 0, 5, "r1"): result}
    client = aioredis.from_url(settings.redis.url)
    try:
        assert 0 < await client.ttl(f"{prefix}:done:lane:0:5:r1") <= 60
    finally:
        await client.aclose()


async def test_store_fails_open_without_redis() -> None:
    store = ResultStore.from_url(
        f"redis://127.0.0.1:{free_port()}/0", prefix="x", ttl_s=60, timeout_s=0.2
    )
    before = REDIS_ERRORS.labels("get")._value.get()
    try:
        assert await store.get_many([("lane", 0, 1, "r")]) == {}
        await store.put_many([(("lane", 0, 1, "r"), InferenceResult(id="r", status="ok"))])
    finally:
        await store.close()
    assert REDIS_ERRORS.labels("get")._value.get() == before + 1


async def worker_with_records(
    settings: Settings, executor: Executor, prompts: Sequence[str]
) -> tuple[LaneWorker, Settings, list[RoutedRequest], list[ConsumerRecord]]:
    """A lane worker on topics of its own, and the lane records it fetched:
    one per prompt, all on one partition (one key), in order."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    kafka = settings.kafka.model_copy(update={"topic_prefix": prefix})
    own = settings.model_copy(update={"kafka": kafka, "app_id": prefix})
    await create_topics(own)
    routeds = [
        routed_now(
            InferenceRequest(id=f"{prefix}-{i}", prompt=prompt),
            own.replies_topic,
            path=AnswerPath.RULES,
        )
        for i, prompt in enumerate(prompts, start=1)
    ]
    producer = AIOKafkaProducer(**own.kafka.client_options())
    await producer.start()
    for routed in routeds:
        await producer.send_and_wait(
            own.lane_topic(Lane.REALTIME), routed.model_dump_json().encode(), key=b"one"
        )
    await producer.stop()
    worker = LaneWorker(own, Lane.REALTIME, executor=executor, store=store_for(own, prefix))
    await worker.start()
    records = await fetch_lane_records(worker, len(prompts), tries=20)
    return worker, own, routeds, records


async def worker_with_one_record(
    settings: Settings, executor: Executor
) -> tuple[LaneWorker, Settings, RoutedRequest, list[ConsumerRecord]]:
    """A lane worker on topics of its own, and the one lane record it fetched."""
    worker, own, routeds, records = await worker_with_records(settings, executor, ["ping"])
    return worker, own, routeds[0], records


async def test_redelivered_batch_is_answered_from_the_store(settings: Settings) -> None:
    rules_only = backend_slots(BackendSettings(light="rules", heavy="rules"))
    worker, own, routed, records = await worker_with_one_record(
        settings, Executor(Lane.REALTIME, rules_only)
    )
    try:
        await worker.process(records)
        # The same records again, as after a crash before the commit, on a
        # worker that has no backend at all: only the store can answer.
        worker.runner.executor = Executor(Lane.REALTIME, {})
        await worker.process(records)
    finally:
        await worker.close()

    replies = await read_topic(own, own.replies_topic)
    results = [InferenceResult.model_validate_json(r.value) for r in replies]
    assert [r.id for r in results] == [routed.request.id] * 2
    assert results[0] == results[1]
    assert results[0].status == "ok" and results[0].output == "pong"


class CrashingExecutor(Executor):
    """Processing that kills the worker, as a bug on one record would."""

    async def execute(
        self,
        batch: Sequence[RoutedRequest],
        unwanted: Mapping[int, asyncio.Event] | None = None,
        streams: Mapping[int, AnswerStream] | None = None,
    ) -> list[Finished]:
        if batch:
            raise RuntimeError("segfault-like crash")
        return []


async def test_a_poison_record_goes_to_the_dlq_after_max_attempts(settings: Settings) -> None:
    worker, own, routed, records = await worker_with_one_record(
        settings, CrashingExecutor(Lane.REALTIME, {})
    )
    try:
        for _ in range(own.max_attempts):  # each try crashes, as on every restart
            with pytest.raises(RuntimeError):
                await worker.process(records)
        await worker.process(records)  # the next delivery gives up on it
    finally:
        await worker.close()

    (reply,) = await read_topic(own, own.replies_topic)
    result = InferenceResult.model_validate_json(reply.value)
    assert result.id == routed.request.id and result.error is not None
    assert result.error.code == "INF-502" and "failed 3 times" in result.error.message
    (dead,) = await read_topic(own, own.topic("dlq"))
    assert dead.value == records[0].value
    assert dict(dead.headers)["laneway-source-offset"] == str(records[0].offset).encode()


POISON = "this prompt crashes the worker"


class PoisonExecutor(Executor):
    """Rules answers, except that a batch holding the poison prompt kills the
    worker, as a bug on one record would."""

    async def execute(
        self,
        batch: Sequence[RoutedRequest],
        unwanted: Mapping[int, asyncio.Event] | None = None,
        streams: Mapping[int, AnswerStream] | None = None,
    ) -> list[Finished]:
        if any(routed.request.prompt == POISON for routed in batch):
            raise RuntimeError("segfault-like crash")
        return await super().execute(batch, unwanted, streams)


async def test_a_poison_record_is_dead_lettered_alone_and_its_batch_mates_answered(
    settings: Settings,
) -> None:
    rules_only = backend_slots(BackendSettings(light="rules", heavy="rules"))
    prompts = ["ping"] * 3 + [POISON] + ["ping"] * 4
    worker, own, routeds, records = await worker_with_records(
        settings, PoisonExecutor(Lane.REALTIME, rules_only), prompts
    )
    crashes = 0
    try:
        for _ in range(2 * own.max_attempts):  # each crash: the batch is delivered again
            try:
                await worker.process(records)
                break
            except RuntimeError:
                crashes += 1
    finally:
        await worker.close()

    assert crashes == own.max_attempts  # the poison crashed 3 times: once in its batch, twice alone
    replies = [
        InferenceResult.model_validate_json(r.value)
        for r in await read_topic(own, own.replies_topic)
    ]
    by_id = {result.id: result for result in replies}
    assert len(replies) == len(prompts)  # one terminal result each
    poison_id = routeds[3].request.id
    for routed in routeds:
        result = by_id[routed.request.id]
        if routed.request.id == poison_id:
            assert result.error is not None and result.error.code == "INF-502"
        else:
            assert result.status == "ok" and result.output == "pong", result
    (dead,) = await read_topic(own, own.topic("dlq"))
    assert dead.value == records[3].value
