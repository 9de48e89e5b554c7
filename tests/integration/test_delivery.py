"""A record the broker will never take, produced through ``deliver`` with a
plain aiokafka producer at default settings to the real broker: it is
diverted, not retried forever, and its client hears why."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaProducer

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane
from schemas.settings import Settings
from streams.kafka.batches import BatchSend, partition_of
from streams.kafka.envelopes import Outbound, deliver
from streams.kafka.topics import create_topics

from .conftest import read_topic, routed_now


async def test_a_lane_record_too_large_for_the_broker_reaches_the_dlq_and_its_client(
    settings: Settings,
) -> None:
    rid = f"huge-{uuid.uuid4().hex[:8]}"
    reply_to = f"{settings.replies_topic}.{rid}"
    # Longer than the producer's max_request_size (1 MiB by default): refused before it leaves.
    routed = routed_now(
        InferenceRequest(id=rid, prompt="x" * 1_200_000, batch_id=rid),
        reply_to,
        path=AnswerPath.HEAVY,
        lane=Lane.BULK,
    )
    lane = settings.lane_topic(Lane.BULK)
    record = Outbound(lane, rid.encode(), routed.model_dump_json().encode())
    producer = AIOKafkaProducer(**settings.kafka.client_options())
    await producer.start()
    try:

        async def send(out: Outbound) -> asyncio.Future[object]:
            return await producer.send(out.topic, out.value, key=out.key, headers=list(out.headers))

        await asyncio.wait_for(deliver([record], send, settings), timeout=30)
    finally:
        await producer.stop()

    (reply,) = [r for r in await read_topic(settings, reply_to) if r.key == rid.encode()]
    result = InferenceResult.model_validate_json(reply.value)
    assert result.status == "error" and result.error is not None
    assert result.error.code == "INF-400" and "more than the broker takes" in result.error.message
    assert result.batch_id == rid and result.lane == Lane.BULK
    results = [
        r for r in await read_topic(settings, settings.topic("results")) if r.key == rid.encode()
    ]
    assert len(results) == 1
    (dlq,) = [r for r in await read_topic(settings, settings.topic("dlq")) if r.key == rid.encode()]
    headers = dict(dlq.headers)
    assert headers["laneway-error-code"] == b"INF-400"
    assert headers["laneway-source-topic"] == lane.encode()
    assert dlq.value == b"" and b"MessageSizeTooLarge" in headers["laneway-dlq-value-dropped"]


async def test_a_record_steered_to_a_partition_is_written_there(settings: Settings) -> None:
    """The classifier names the partition of a realtime request (the worker
    with room); one the topic lacks falls back to the key's, as without."""
    tag = f"steer-{uuid.uuid4().hex[:8]}"
    own = settings.model_copy(  # topics of its own: no worker of the stack reads them
        update={"kafka": settings.kafka.model_copy(update={"topic_prefix": tag})}
    )
    await create_topics(own)
    lane = own.lane_topic(Lane.REALTIME)
    steered = [Outbound(lane, f"{tag}-{i}".encode(), b"v", partition=2) for i in range(6)]
    astray = Outbound(lane, f"{tag}-x".encode(), b"v", partition=99)
    plain = Outbound(lane, f"{tag}-y".encode(), b"v")
    producer = AIOKafkaProducer(**own.kafka.client_options())
    await producer.start()
    try:

        async def started() -> AIOKafkaProducer:
            return producer

        await asyncio.wait_for(deliver([*steered, astray, plain], BatchSend(started), own), 30)
    finally:
        await producer.stop()

    written = {
        r.key: r.partition
        for r in await read_topic(own, lane)
        if r.key is not None and r.key.startswith(tag.encode())
    }
    assert [written[r.key] for r in steered if r.key] == [2] * 6
    everything = list(range(own.kafka.partitions))
    for record in (astray, plain):
        assert written[record.key] == partition_of(record.key, everything, everything, {})
