"""A W3C traceparent from the request record to its reply, through the
real classifier and lane workers: the same trace, each process's own span."""

from __future__ import annotations

import asyncio
import json
import uuid

from aiokafka import AIOKafkaProducer

from schemas.messages import InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings
from streams.kafka.tracing import TraceParent, new_trace, parse, read
from tests.integration.conftest import read_topic


async def send(settings: Settings, body: dict[str, object], trace: TraceParent | None) -> None:
    headers = [] if trace is None else [("traceparent", trace.format().encode())]
    producer = AIOKafkaProducer(acks="all", **settings.kafka.client_options())
    await producer.start()
    try:
        value = json.dumps(body).encode()
        key = str(body["id"]).encode()
        await producer.send_and_wait(settings.topic("requests"), value, key=key, headers=headers)
    finally:
        await producer.stop()


async def trace_of_reply(settings: Settings, topic: str, rid: str) -> TraceParent:
    """The traceparent of the reply to ``rid`` (read until it is there)."""
    for _ in range(120):
        for record in await read_topic(settings, topic):
            if InferenceResult.model_validate_json(record.value).id == rid:
                trace = read(record.headers)
                assert trace is not None, record.headers
                return trace
        await asyncio.sleep(1.0)
    raise AssertionError(f"no reply to {rid} on {topic}")


async def test_a_rule_answer_continues_the_requests_trace(settings: Settings) -> None:
    rid = f"trace-rule-{uuid.uuid4().hex[:8]}"
    sent = new_trace()
    await send(settings, {"id": rid, "prompt": "Hello!", "reply_to": settings.replies_topic}, sent)

    reply = await trace_of_reply(settings, settings.replies_topic, rid)
    assert reply.trace_id == sent.trace_id and reply.flags == sent.flags
    assert reply.span_id != sent.span_id
    result = await trace_of_reply(settings, settings.topic("results"), rid)
    assert result == reply  # one span of the classifier's for the request's records


async def test_a_model_answer_continues_the_trace_through_its_lane(settings: Settings) -> None:
    rid = f"trace-model-{uuid.uuid4().hex[:8]}"
    sent = TraceParent(new_trace().trace_id, new_trace().span_id, "00")  # not sampled: kept
    body = {
        "id": rid,
        "prompt": "What is the capital of France?",
        "lane": "realtime",
        "max_tokens": 4,
        "reply_to": settings.replies_topic,
    }
    await send(settings, body, sent)

    reply = await trace_of_reply(settings, settings.replies_topic, rid)
    assert reply.trace_id == sent.trace_id and reply.flags == "00"
    lane_records = await read_topic(settings, settings.lane_topic(Lane.REALTIME))
    (lane,) = [
        read(r.headers)
        for r in lane_records
        if RoutedRequest.model_validate_json(r.value).request.id == rid
    ]
    assert lane is not None and lane.trace_id == sent.trace_id
    # The classifier's span and the worker's: three different span ids.
    assert len({sent.span_id, lane.span_id, reply.span_id}) == 3


async def test_a_request_without_a_traceparent_gets_one_on_its_reply(settings: Settings) -> None:
    rid = f"trace-none-{uuid.uuid4().hex[:8]}"
    await send(settings, {"id": rid, "prompt": "Hello!", "reply_to": settings.replies_topic}, None)

    reply = await trace_of_reply(settings, settings.replies_topic, rid)
    assert parse(reply.format()) == reply and reply.flags == "01"
