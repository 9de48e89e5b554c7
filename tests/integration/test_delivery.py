"""A record the broker will never take, produced through ``deliver`` with a
plain aiokafka producer at default settings to the real broker: it is
diverted, not retried forever, and its client hears why."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaProducer

from schemas.messages import InferenceRequest, InferenceResult, Lane, Path
from schemas.settings import Settings
from streams.kafka.envelopes import Outbound, deliver

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
        path=Path.HEAVY,
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
