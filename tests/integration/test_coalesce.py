"""Identical requests run once, in one batch and across the batches a worker
has in flight, on a real broker and Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence

from aiokafka import ConsumerRecord

from schemas.errors import BackendUnavailable
from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, RoutedRequest
from schemas.settings import BackendSettings, Settings
from streams.kafka.topics import create_topics
from tests.integration.conftest import (
    fetch_lane_records,
    produce_to_lane,
    read_topic,
    routed_now,
)
from workers.execution import Executor, Finished, backend_slots
from workers.lane_worker import LaneWorker
from workers.result_store import ResultStore
from workers.streaming import AnswerStream


class CountingExecutor(Executor):
    """The real executor, counting the requests it runs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.ran: list[str] = []

    async def execute(
        self,
        batch: Sequence[RoutedRequest],
        unwanted: Mapping[int, asyncio.Event] | None = None,
        streams: Mapping[int, AnswerStream] | None = None,
    ) -> list[Finished]:
        self.ran += [routed.request.id for routed in batch]
        return await super().execute(batch, unwanted, streams)


async def fetched_by_a_worker(
    settings: Settings, requests: list[InferenceRequest], executor: Executor
) -> tuple[Settings, LaneWorker, list[ConsumerRecord]]:
    """Put ``requests`` on a realtime lane of topics of their own; a started
    worker on it with ``executor``, the records it fetched, and the settings
    that name the topics. The caller closes the worker."""
    prefix = f"co{uuid.uuid4().hex[:8]}"
    kafka = settings.kafka.model_copy(update={"topic_prefix": prefix})
    own = settings.model_copy(update={"kafka": kafka, "app_id": prefix})
    await create_topics(own)
    for request in requests:
        await produce_to_lane(own, routed_now(request, own.replies_topic))
    store = ResultStore.from_url(own.redis.url, prefix=prefix, ttl_s=60, timeout_s=0.5)
    worker = LaneWorker(own, Lane.REALTIME, executor=executor, store=store)
    await worker.start()
    return own, worker, await fetch_lane_records(worker, len(requests))


async def results_by_id(own: Settings) -> dict[str, InferenceResult]:
    replies = await read_topic(own, own.replies_topic)
    results = [InferenceResult.model_validate_json(r.value) for r in replies]
    return {r.id: r for r in results}


async def one_batch(
    settings: Settings, requests: list[InferenceRequest], backend: BackendSettings
) -> tuple[CountingExecutor, dict[str, InferenceResult]]:
    """Have a worker process ``requests`` as one batch; their results by id."""
    executor = CountingExecutor(Lane.REALTIME, backend_slots(backend))
    own, worker, records = await fetched_by_a_worker(settings, requests, executor)
    try:
        await worker.process(records)
    finally:
        await worker.close()
    return executor, await results_by_id(own)


def ask(rid: str, prompt: str = "ping", **fields: object) -> InferenceRequest:
    return InferenceRequest.model_validate({"id": rid, "prompt": prompt, **fields})


async def test_identical_requests_in_a_batch_run_once(settings: Settings) -> None:
    requests = [
        ask("a1"),
        ask("a2", "PING"),  # the same question to the cache
        ask("a3"),
        ask("long", max_tokens=400),  # another budget class: its own answer
        ask("sampled", temperature=0.7),  # never shared
        ask("private", metadata={"cache": "no-store"}),
    ]
    rules = BackendSettings(light="rules", heavy="rules")
    executor, results = await one_batch(settings, requests, rules)
    # Records come in partition order: any of the three may lead.
    twins = {"a1", "a2", "a3"}
    (leader,) = twins & set(executor.ran)
    assert sorted(set(executor.ran) - twins) == ["long", "private", "sampled"]
    assert len(executor.ran) == 4
    assert set(results) == {r.id for r in requests}
    assert all(r.status == "ok" and r.output == "pong" for r in results.values())
    assert results[leader].path == AnswerPath.LIGHT and results[leader].model
    for shared in twins - {leader}:
        assert results[shared].path == AnswerPath.CACHE
        assert results[shared].model == f"cache:batch:{results[leader].model}"


async def test_a_failed_leader_hands_nothing_on(settings: Settings) -> None:
    # No backend at all: the leader fails (INF-502); its twin runs on its own
    # and fails for itself, each with its own result.
    nothing = BackendSettings(
        light="openai", heavy="openai", openai_base_url="http://127.0.0.1:9/v1"
    )
    executor, results = await one_batch(
        settings.model_copy(update={"max_attempts": 1}), [ask("b1"), ask("b2")], nothing
    )
    assert sorted(executor.ran) == ["b1", "b2"]
    for result in results.values():
        assert result.error is not None
        assert result.error.code == BackendUnavailable.code


class HeldExecutor(CountingExecutor):
    """The real executor, counting the requests it starts and holding every
    batch until ``release`` is set: a decode that takes its time."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()

    async def execute(
        self,
        batch: Sequence[RoutedRequest],
        unwanted: Mapping[int, asyncio.Event] | None = None,
        streams: Mapping[int, AnswerStream] | None = None,
    ) -> list[Finished]:
        self.ran += [routed.request.id for routed in batch]
        await self.release.wait()
        return await Executor.execute(self, batch, unwanted, streams)


async def until_started(executor: CountingExecutor) -> None:
    """Until ``executor`` has started a request (at most 5 s)."""
    for _ in range(100):
        if executor.ran:
            return
        await asyncio.sleep(0.05)


async def two_batches_in_flight(
    settings: Settings, backend: BackendSettings
) -> tuple[list[str], HeldExecutor, dict[str, InferenceResult]]:
    """Asks "ping" then "PING" (one question to the cache), each in a batch
    of its own on one worker, the second started while the first is
    decoding. Returns what had started while the first was held, the
    executor and the results by id."""
    executor = HeldExecutor(Lane.REALTIME, backend_slots(backend))
    requests = [ask("first"), ask("second", "PING")]
    own, worker, records = await fetched_by_a_worker(settings, requests, executor)
    try:
        by_id = {RoutedRequest.model_validate_json(r.value).request.id: r for r in records}
        first = asyncio.create_task(worker.process([by_id["first"]]))
        await until_started(executor)
        second = asyncio.create_task(worker.process([by_id["second"]], after=first))
        await asyncio.sleep(0.5)  # time enough to start decoding, were it to
        started = list(executor.ran)
        executor.release.set()
        await asyncio.gather(first, second)
    finally:
        await worker.close()
    return started, executor, await results_by_id(own)


async def test_a_request_an_earlier_batch_is_decoding_waits_for_its_answer(
    settings: Settings,
) -> None:
    rules = BackendSettings(light="rules", heavy="rules")
    started, executor, results = await two_batches_in_flight(settings, rules)
    assert started == ["first"], "the second batch waits; it decodes nothing"
    assert executor.ran == ["first"]
    assert results["first"].output == results["second"].output == "pong"
    assert results["second"].path == AnswerPath.CACHE
    assert results["second"].model == f"cache:batch:{results['first'].model}"


async def test_a_failed_decode_in_flight_hands_nothing_on(settings: Settings) -> None:
    nothing = BackendSettings(
        light="openai", heavy="openai", openai_base_url="http://127.0.0.1:9/v1"
    )
    started, executor, results = await two_batches_in_flight(
        settings.model_copy(update={"max_attempts": 1}), nothing
    )
    assert started == ["first"]
    assert executor.ran == ["first", "second"], "the second runs its own once the first failed"
    for result in results.values():
        assert result.error is not None and result.error.code == BackendUnavailable.code
