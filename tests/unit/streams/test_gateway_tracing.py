"""The gateway's span of a chat completion: a SERVER span continuing the
HTTP request's W3C trace context (``ServerSpans``), what it says of the
request and its answer (``streams.gateway.tracing``), exported to a real
(local) OTLP/HTTP receiver."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator

import pytest
from multidict import CIMultiDict
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, Usage
from streams.chunks import StreamDelta
from streams.gateway import tracing
from streams.gateway.errors import GatewayError
from streams.kafka.otlp import ServerSpans, server_spans_for
from streams.kafka.tracing import read, trace_headers
from tests.unit.streams.test_otlp import PARENT_ID, TRACE_ID, Receiver, attributes, span_id
from tests.unit.streams.test_otlp import tracing as tracing_settings

HEADERS = CIMultiDict(
    {"TraceParent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "client=c1"}
)  # any spelling, as HTTP has it


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.thread.start()
    yield server
    server.close()


def exported(receiver: Receiver, spans: ServerSpans) -> list[tuple[str, Span]]:
    """``(service.name, span)`` of everything exported, once ``spans`` is closed."""
    spans.close(timeout_s=5)
    return [
        (_service(rs.resource.attributes), span)
        for _, _, request in receiver.requests
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


def _service(resource: Iterable[KeyValue]) -> str:
    return next(kv.value.string_value for kv in resource if kv.key == "service.name")


def test_a_chat_completion_is_a_server_span_in_the_callers_trace(receiver: Receiver) -> None:
    spans = server_spans_for(tracing_settings(receiver.url), "gateway", "gateway-host-1")
    span = spans.start(tracing.span_name(None), HEADERS, {"http.request.method": "POST"})
    tracing.named(span, "auto")
    request = InferenceRequest(
        id="gw-1", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, top_p=0.5, seed=3
    )
    tracing.asked(span, request, "acme")
    tracing.answered(
        span,
        InferenceResult(
            id="gw-1",
            status="ok",
            output="Hello",
            model="llamacpp:smollm2-135m",
            lane=Lane.REALTIME,
            path=AnswerPath.LIGHT,
            finish_reason="length",
            usage=Usage(prompt_tokens=5, completion_tokens=8),
        ),
    )
    carried = read(trace_headers(span))  # what the request record carries
    spans.end(span, *tracing.ended_attributes(200, None))

    ((service, got),) = exported(receiver, spans)
    assert service == "laneway-gateway"
    process = receiver.requests[0][2].resource_spans[0].resource.attributes
    assert {kv.key: kv.value.string_value for kv in process}["service.instance.id"] == (
        "gateway-host-1"
    )
    assert got.name == "chat auto" and got.kind == Span.SpanKind.SPAN_KIND_SERVER
    assert got.trace_id.hex() == TRACE_ID and got.parent_span_id.hex() == PARENT_ID
    assert got.trace_state == "client=c1"
    assert carried is not None and f"{carried.span_id:016x}" == got.span_id.hex()
    assert carried.trace_state.to_header() == "client=c1"
    assert got.status.code == Status.StatusCode.STATUS_CODE_UNSET
    assert attributes(got) == {
        "http.request.method": "POST",
        "http.response.status_code": 200,
        "gen_ai.request.model": "auto",
        "gen_ai.request.max_tokens": 8,
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.top_p": 0.5,
        "gen_ai.request.seed": 3,
        "gen_ai.operation.name": "chat",
        "gen_ai.response.id": "chatcmpl-gw-1",
        "gen_ai.response.model": "llamacpp:smollm2-135m",
        "gen_ai.response.finish_reasons": ("length",),
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 8,
        "laneway.request.id": "gw-1",
        "laneway.tenant": "acme",
        "laneway.lane": "realtime",
        "laneway.path": "light",
        "laneway.status": "ok",
    }


def test_without_a_traceparent_the_span_starts_a_trace(receiver: Receiver) -> None:
    spans = server_spans_for(tracing_settings(receiver.url), "gateway")
    span = spans.start("chat", CIMultiDict({"traceparent": "garbage"}), {})
    tracing.streaming(span, StreamDelta("Hel", lane=Lane.MEDIUM, path=AnswerPath.HEAVY, model="m"))
    error = GatewayError(504, "no answer in time", "timeout")
    spans.end(span, *tracing.ended_attributes(504, error))

    ((_, got),) = exported(receiver, spans)
    assert got.parent_span_id == b"" and got.trace_id.hex() != TRACE_ID
    assert got.span_id.hex() == span_id(span)
    assert got.name == "chat"  # the body named no model
    assert got.status.code == Status.StatusCode.STATUS_CODE_ERROR
    assert got.status.message == "timeout"
    assert attributes(got) == {
        "http.response.status_code": 504,
        "laneway.lane": "medium",
        "laneway.path": "heavy",
        "gen_ai.response.model": "m",
        "laneway.status": "error",
        "laneway.error_code": "timeout",
        "error.type": "timeout",
    }


def test_an_unsampled_trace_is_carried_and_not_exported(receiver: Receiver) -> None:
    spans = server_spans_for(tracing_settings(receiver.url), "gateway")
    span = spans.start("chat", CIMultiDict({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"}), {})
    assert not span.is_recording()
    tracing.named(span, "light")  # nothing to set: no error either
    carried = read(trace_headers(span))
    assert carried is not None and f"{carried.trace_id:032x}" == TRACE_ID
    assert not carried.trace_flags.sampled and f"{carried.span_id:016x}" != PARENT_ID
    spans.end(span, *tracing.ended_attributes(200, None))
    assert exported(receiver, spans) == []


def test_no_endpoint_the_context_is_carried_and_nothing_recorded() -> None:
    spans = server_spans_for(tracing_settings(None), "gateway")
    assert not spans.exporting and spans.exporter is None
    span = spans.start("chat", HEADERS, {})
    carried = read(trace_headers(span))
    assert carried is not None and f"{carried.trace_id:032x}" == TRACE_ID
    assert f"{carried.span_id:016x}" != PARENT_ID  # a span id of its own, as records carry
    assert not span.is_recording()
    spans.end(span, {"laneway.status": "ok"})
    spans.close()
    spans.close()  # twice is harmless


def test_what_an_answer_says_of_the_span() -> None:
    ok, error = tracing.ended_attributes(200, None)
    assert (ok, error) == ({"http.response.status_code": 200, "laneway.status": "ok"}, None)

    # A 4xx is the client's: error attributes, no ERROR status.
    limited = GatewayError(429, "over its limit", "INF-429", retry_after_ms=500)
    attrs, error = tracing.ended_attributes(429, limited)
    assert error is None
    assert attrs["laneway.error_code"] == attrs["error.type"] == "INF-429"
    assert attrs["laneway.status"] == "error"
    # laneway's 503, and a bare 5xx without a gateway error: ERROR.
    late = GatewayError(503, "the deadline passed", "INF-503")
    assert tracing.ended_attributes(503, late)[1] == "INF-503"
    attrs, error = tracing.ended_attributes(500, None)
    assert (attrs["error.type"], error) == ("500", "500")
    # A stream that failed after its 200 was sent: ERROR.
    restarted = GatewayError(502, "the answer restarted", "answer_restarted")
    attrs, error = tracing.ended_attributes(200, restarted)
    assert attrs["http.response.status_code"] == 200 and error == "answer_restarted"
    # A client gone mid-stream, or before its answer: cancelled, ERROR.
    gone = GatewayError(499, "the client went away", tracing.CLIENT_CLOSED)
    attrs, error = tracing.ended_attributes(200, gone)
    assert (attrs["laneway.status"], error) == ("cancelled", "client_closed")
    assert tracing.failed_attributes(asyncio.CancelledError()) == (
        {
            "laneway.status": "cancelled",
            "laneway.error_code": "client_closed",
            "error.type": "client_closed",
        },
        "client_closed",
    )
    attrs, error = tracing.failed_attributes(RuntimeError("boom"))
    assert (attrs["error.type"], error) == ("builtins.RuntimeError", "boom")
    assert tracing.span_name("heavy") == "chat heavy" and tracing.span_name(None) == "chat"
