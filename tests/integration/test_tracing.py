"""A W3C traceparent (and tracestate) from the request record to its reply,
through the real classifier and lane workers: the same trace, each
process's own span, exported over OTLP/HTTP to the session's receiver
(``conftest.OtlpReceiver``) when sampled."""

from __future__ import annotations

import asyncio
import json
import uuid

from aiokafka import AIOKafkaProducer
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    TraceState,
    format_span_id,
    format_trace_id,
)

from schemas.messages import InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings
from streams.kafka.tracing import TRACESTATE, read, trace_headers
from tests.integration.conftest import OtlpReceiver, read_topic

IDS = RandomIdGenerator()


def new_trace(*, sampled: bool = True, state: str | None = None) -> SpanContext:
    """A client's trace context: new ids, sampled or not, with ``state`` as its tracestate."""
    return SpanContext(
        IDS.generate_trace_id(),
        IDS.generate_span_id(),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
        trace_state=TraceState.from_header([state]) if state else None,
    )


def hex_trace(trace: SpanContext) -> str:
    return format_trace_id(trace.trace_id)


def hex_span(trace: SpanContext) -> str:
    return format_span_id(trace.span_id)


def ids(trace: SpanContext) -> tuple[int, int, int]:
    return (trace.trace_id, trace.span_id, trace.trace_flags)


async def send(settings: Settings, body: dict[str, object], trace: SpanContext | None) -> None:
    headers = [] if trace is None else list(trace_headers(NonRecordingSpan(trace)))
    producer = AIOKafkaProducer(acks="all", **settings.kafka.client_options())
    await producer.start()
    try:
        value = json.dumps(body).encode()
        key = str(body["id"]).encode()
        await producer.send_and_wait(settings.topic("requests"), value, key=key, headers=headers)
    finally:
        await producer.stop()


async def trace_of_reply(settings: Settings, topic: str, rid: str) -> SpanContext:
    """The trace context of the reply to ``rid`` (read until it is there)."""
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
    assert reply.trace_id == sent.trace_id and reply.trace_flags == sent.trace_flags
    assert reply.span_id != sent.span_id
    result = await trace_of_reply(settings, settings.topic("results"), rid)
    assert ids(result) == ids(reply)  # one span of the classifier's for the request's records


async def test_a_model_answer_continues_the_trace_through_its_lane(
    settings: Settings, otlp: OtlpReceiver
) -> None:
    rid = f"trace-model-{uuid.uuid4().hex[:8]}"
    sent = new_trace(sampled=False)  # not sampled: kept
    body = {
        "id": rid,
        "prompt": "What is the capital of France?",
        "lane": "realtime",
        "max_tokens": 4,
        "reply_to": settings.replies_topic,
        "metadata": {"cache": "bypass"},  # an earlier test's answer may be cached
    }
    await send(settings, body, sent)

    reply = await trace_of_reply(settings, settings.replies_topic, rid)
    assert reply.trace_id == sent.trace_id and not reply.trace_flags.sampled
    lane_records = await read_topic(settings, settings.lane_topic(Lane.REALTIME))
    (lane,) = [
        read(r.headers)
        for r in lane_records
        if RoutedRequest.model_validate_json(r.value).request.id == rid
    ]
    assert lane is not None and lane.trace_id == sent.trace_id
    # The classifier's span and the worker's: three different span ids.
    assert len({sent.span_id, lane.span_id, reply.span_id}) == 3
    # Not sampled: carried, never exported (the exporters flush every second).
    await asyncio.sleep(5.0)
    assert otlp.of_trace(hex_trace(sent)) == []


async def test_a_request_without_a_traceparent_gets_one_on_its_reply(
    settings: Settings, otlp: OtlpReceiver
) -> None:
    rid = f"trace-none-{uuid.uuid4().hex[:8]}"
    await send(settings, {"id": rid, "prompt": "Hello!", "reply_to": settings.replies_topic}, None)

    reply = await trace_of_reply(settings, settings.replies_topic, rid)
    assert reply.is_valid and reply.trace_flags.sampled
    # The classifier started the trace: its span is the root.
    ((_, span),) = await spans_of(otlp, hex_trace(reply), 1)
    assert span.span_id.hex() == hex_span(reply) and span.parent_span_id == b""


async def spans_of(otlp: OtlpReceiver, trace_id: str, count: int) -> list[tuple[str, Span]]:
    """The spans of ``trace_id`` the receiver got, once there are ``count``
    (then a moment more, so that one too many would show)."""
    for _ in range(120):
        if len(otlp.of_trace(trace_id)) >= count:
            await asyncio.sleep(2.0)
            return otlp.of_trace(trace_id)
        await asyncio.sleep(1.0)
    raise AssertionError(f"{len(otlp.of_trace(trace_id))} spans of {trace_id}, not {count}")


def attributes(span: Span) -> dict[str, object]:
    return {kv.key: getattr(kv.value, str(kv.value.WhichOneof("value"))) for kv in span.attributes}


def assert_consumer_span(span: Span, topic: str, group: str) -> dict[str, object]:
    """A CONSUMER span of processing one record of ``topic`` (OpenTelemetry's
    messaging conventions); returns its attributes."""
    assert span.kind == Span.SpanKind.SPAN_KIND_CONSUMER
    assert span.name == f"process {topic}"
    assert 0 < span.start_time_unix_nano <= span.end_time_unix_nano
    attrs = attributes(span)
    assert attrs["messaging.system"] == "kafka"
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.destination.name"] == topic
    assert attrs["messaging.consumer.group.name"] == group
    assert isinstance(attrs["messaging.kafka.offset"], int)
    assert str(attrs["messaging.destination.partition.id"]).isdigit()
    return attrs


async def test_a_sampled_model_answer_exports_a_span_per_process(
    settings: Settings, otlp: OtlpReceiver
) -> None:
    rid = f"trace-otlp-{uuid.uuid4().hex[:8]}"
    sent = new_trace(state="client=c1,vendor=v9")  # the client's tracestate goes all the way
    body = {
        "id": rid,
        "prompt": f"In one word, what colour is a ripe banana? ({rid})",
        "lane": "realtime",
        "max_tokens": 4,
        "reply_to": settings.replies_topic,
    }
    await send(settings, body, sent)

    reply = await trace_of_reply(settings, settings.replies_topic, rid)
    lane_records = [
        r
        for r in await read_topic(settings, settings.lane_topic(Lane.REALTIME))
        if RoutedRequest.model_validate_json(r.value).request.id == rid
    ]
    (lane,) = [read(r.headers) for r in lane_records]
    assert lane is not None
    # The tracestate, on the lane record (the classifier's) and on the reply (the worker's).
    assert [v for r in lane_records for k, v in r.headers if k == TRACESTATE] == [
        b"client=c1,vendor=v9"
    ]
    assert lane.trace_state.to_header() == reply.trace_state.to_header() == "client=c1,vendor=v9"
    result = await trace_of_reply(settings, settings.topic("results"), rid)
    assert ids(result) == ids(reply) and result.trace_state.to_header() == "client=c1,vendor=v9"

    spans = await spans_of(otlp, hex_trace(sent), 2)
    assert sorted(name for name, _ in spans) == ["laneway-classifier", "laneway-worker-realtime"]
    by_service = dict(spans)
    classifier, worker = by_service["laneway-classifier"], by_service["laneway-worker-realtime"]
    # The classifier's span is the lane record's parent; the worker's, the reply's.
    assert classifier.parent_span_id.hex() == hex_span(sent)
    assert classifier.span_id.hex() == hex_span(lane)
    assert worker.parent_span_id.hex() == hex_span(lane)
    assert worker.span_id.hex() == hex_span(reply)
    assert classifier.trace_state == worker.trace_state == "client=c1,vendor=v9"
    requests = settings.topic("requests")
    attrs = assert_consumer_span(classifier, requests, settings.app_id)
    assert attrs["laneway.request.id"] == rid
    assert (attrs["laneway.status"], attrs["laneway.lane"]) == ("routed", "realtime")
    assert classifier.status.code == Status.StatusCode.STATUS_CODE_UNSET
    lane_topic = settings.lane_topic(Lane.REALTIME)
    attrs = assert_consumer_span(worker, lane_topic, f"{settings.app_id}.worker.realtime")
    assert attrs["laneway.request.id"] == rid
    assert (attrs["laneway.status"], attrs["laneway.lane"]) == ("ok", "realtime")
    assert attrs["laneway.path"] == "light" and "laneway.error_code" not in attrs
    assert worker.start_time_unix_nano >= classifier.start_time_unix_nano


async def test_a_sampled_rule_answer_exports_one_classifier_span(
    settings: Settings, otlp: OtlpReceiver
) -> None:
    rid = f"trace-otlp-rule-{uuid.uuid4().hex[:8]}"
    sent = new_trace()
    await send(settings, {"id": rid, "prompt": "Hello!", "reply_to": settings.replies_topic}, sent)

    reply = await trace_of_reply(settings, settings.replies_topic, rid)
    ((service, span),) = await spans_of(otlp, hex_trace(sent), 1)
    assert service == "laneway-classifier"
    assert span.parent_span_id.hex() == hex_span(sent)
    assert span.span_id.hex() == hex_span(reply)
    attrs = assert_consumer_span(span, settings.topic("requests"), settings.app_id)
    assert attrs["laneway.request.id"] == rid
    assert (attrs["laneway.status"], attrs["laneway.path"]) == ("ok", "rules")
