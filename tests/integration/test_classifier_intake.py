"""The classifier's own consumer (``streams.kafka.intake``) on the real
broker and Redis, with real classifier processes: offsets move only after
a record's outputs are acknowledged, a killed classifier's replacement
answers again only what was not committed, and a rebalance to a second
replica (then a graceful stop of the first) answers every request exactly
once.

The classifiers run on topics, Redis keys and a consumer group of their
own (``Classifier`` of ``laneway bench classifier``), on a broker of this
module: no lane workers, rule traffic only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.messages import InferenceResult
from schemas.settings import RedisSettings, Settings
from streams.bench.classifier import Classifier, Replies, phase_requests
from streams.devstack.embedded import EmbeddedBroker
from streams.kafka.topics import create_topics, wait_for_broker

from .conftest import read_topic

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    broker = EmbeddedBroker()
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
async def group(bootstrap: str, redis_url: str) -> AsyncIterator[Settings]:
    """Settings whose topic prefix, Redis prefix and app id are this test's."""
    tag = f"intake-{uuid.uuid4().hex[:8]}"
    base = Settings(redis=RedisSettings(url=redis_url))
    kafka = base.kafka.model_copy(update={"bootstrap": bootstrap, "topic_prefix": tag})
    redis = base.redis.model_copy(update={"key_prefix": tag})
    settings = base.model_copy(update={"kafka": kafka, "redis": redis, "app_id": tag})
    await wait_for_broker(settings)
    await create_topics(settings)
    yield settings


def _classifier(settings: Settings, label: str) -> Classifier:
    return Classifier(settings, label, None, tag=settings.app_id)


async def _produce(settings: Settings, bodies: list[dict[str, object]]) -> None:
    producer = AIOKafkaProducer(acks="all", **settings.kafka.client_options())  # type: ignore[arg-type]
    await producer.start()
    try:
        sent = [
            await producer.send(
                settings.topic("requests"), json.dumps(b).encode(), key=str(b["id"]).encode()
            )
            for b in bodies
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def _replies(settings: Settings) -> list[InferenceResult]:
    records = await read_topic(settings, settings.replies_topic, timeout_s=10)
    return [InferenceResult.model_validate_json(r.value) for r in records]


async def _answered_until(settings: Settings, ids: set[str], timeout_s: float) -> Counter[str]:
    """Replies per id, once every id in ``ids`` has one (or the time is up)."""
    give_up = time.monotonic() + timeout_s
    while True:
        counts = Counter(r.id for r in await _replies(settings))
        if ids <= counts.keys() or time.monotonic() > give_up:
            return counts
        await asyncio.sleep(1.0)


async def _committed(settings: Settings) -> dict[TopicPartition, int]:
    """The group's committed offset per request partition (0 where none)."""
    topic = settings.topic("requests")
    consumer = AIOKafkaConsumer(group_id=settings.app_id, **settings.kafka.client_options())  # type: ignore[arg-type]
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
        return {tp: (await consumer.committed(tp)) or 0 for tp in tps}
    finally:
        await consumer.stop()


async def _request_offsets(settings: Settings) -> dict[str, tuple[TopicPartition, int]]:
    records = await read_topic(settings, settings.topic("requests"), timeout_s=10)
    return {
        json.loads(r.value)["id"]: (TopicPartition(r.topic, r.partition), r.offset) for r in records
    }


async def test_a_killed_classifier_commits_only_what_it_answered_and_is_replaced(
    group: Settings,
) -> None:
    settings = group
    bodies = phase_requests("rules", 4000, settings.app_id)
    ids = {str(b["id"]) for b in bodies}
    first = _classifier(settings, "first")
    await asyncio.to_thread(first.start)
    replies = Replies(settings)
    await replies.start()
    try:
        await _produce(settings, bodies)
        give_up = time.monotonic() + 120
        seen = 0
        while seen < 400 and time.monotonic() < give_up:
            polled = await replies.consumer.getmany(timeout_ms=100)
            seen += sum(len(records) for records in polled.values())
        assert first.proc is not None
        first.proc.kill()  # SIGKILL: no drain, no last commit
        first.proc.wait()
        answered_before = {r.id for r in await _replies(settings)}
        results_before = {
            InferenceResult.model_validate_json(r.value).id
            for r in await read_topic(settings, settings.topic("results"), timeout_s=10)
        }
    finally:
        first.stop()
        await replies.stop()
    committed = await _committed(settings)
    where = await _request_offsets(settings)
    assert set(where) == ids
    assert 0 < len(answered_before) < len(ids), "the kill came after the classifier finished"

    # Every record below a committed offset had its reply and its result out.
    below = {rid for rid, (tp, offset) in where.items() if offset < committed[tp]}
    assert below, f"nothing was committed before the kill: {committed}"
    assert below <= answered_before, sorted(below - answered_before)[:5]
    assert below <= results_before, sorted(below - results_before)[:5]

    second = _classifier(settings, "second")
    await asyncio.to_thread(second.start)
    try:
        counts = await _answered_until(settings, ids, timeout_s=180)
    finally:
        second.stop()
    assert ids <= counts.keys(), f"lost {len(ids - counts.keys())} of {len(ids)}"
    # The replacement started at the commit: only uncommitted records were
    # answered twice (those whose outputs were out before the kill).
    twice = {rid for rid, n in counts.items() if n > 1}
    assert not twice & below, sorted(twice & below)[:5]
    print(
        f"\nkilled after {len(answered_before)} answers, {len(below)} committed; "
        f"the replacement answered {len(twice)} again"
    )


async def test_a_second_replica_and_a_graceful_stop_answer_every_request_exactly_once(
    group: Settings,
) -> None:
    settings = group
    first, second = _classifier(settings, "first"), _classifier(settings, "second")
    await asyncio.to_thread(first.start)
    sent: list[str] = []
    stop = asyncio.Event()

    async def trickle() -> None:
        """About 400 requests a second until told to stop."""
        n = 0
        while not stop.is_set():
            bodies = phase_requests("rules", 20, f"{settings.app_id}-{n}")
            await _produce(settings, bodies)
            sent.extend(str(b["id"]) for b in bodies)
            n += 1
            await asyncio.sleep(0.05)

    producing = asyncio.create_task(trickle())
    try:
        await asyncio.sleep(2)
        await asyncio.to_thread(second.start)  # ready once the rebalance gave it partitions
        await asyncio.sleep(2)
        await asyncio.to_thread(first.stop)  # SIGTERM: drain, commit, leave the group
        assert first.proc is not None and first.proc.returncode == 0, first.tail()
        await asyncio.sleep(2)
        stop.set()
        await producing
        counts = await _answered_until(settings, set(sent), timeout_s=180)
        # Everything answered is committed, by one replica or the other.
        give_up = time.monotonic() + 30
        while True:
            committed = await _committed(settings)
            where = await _request_offsets(settings)
            ends: dict[TopicPartition, int] = {}
            for tp, offset in where.values():
                ends[tp] = max(ends.get(tp, 0), offset + 1)
            if all(committed[tp] == end for tp, end in ends.items()):
                break
            assert time.monotonic() < give_up, f"committed {committed}, ends {ends}"
            await asyncio.sleep(1.0)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await producing
        first.stop()
        second.stop()
    ids = set(sent)
    assert ids <= counts.keys(), f"lost {len(ids - counts.keys())} of {len(ids)}"
    twice = sorted(rid for rid, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} of {len(ids)} answered twice, e.g. {twice[:5]}"
    print(f"\n{len(ids)} requests over a rebalance and a graceful stop, each answered once")
