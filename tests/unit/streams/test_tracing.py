"""W3C trace context on Kafka headers: what is read (traceparent and
tracestate, through OpenTelemetry's propagator), each process's child of
it, and the headers on produced records."""

from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    TraceState,
    format_span_id,
    format_trace_id,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from schemas.settings import TracingSettings
from streams.kafka.envelopes import Outbound
from streams.kafka.otlp import RecordSpans, spans_for
from streams.kafka.tracing import TRACEPARENT, TRACESTATE, read, trace_headers, traced

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"


def untraced() -> RecordSpans:
    """A process's spans with no OTLP endpoint: started, carried, never exported."""
    settings = TracingSettings().model_copy(
        update={"otlp_endpoint": None, "otel_traces_endpoint": None, "otel_endpoint": None}
    )
    spans = spans_for(settings, "test", "group")
    assert not spans.exporting
    return spans


@dataclasses.dataclass(frozen=True)
class Record:
    headers: tuple[tuple[str, bytes], ...] = ()
    topic: str = "laneway.requests"
    partition: int = 0
    offset: int = 7


def ids(value: str | bytes) -> tuple[str, str, int] | None:
    """(trace id, span id, flags) of a ``traceparent`` value; ``None``: invalid."""
    raw = value if isinstance(value, bytes) else value.encode()
    context = read([(TRACEPARENT, raw)])
    if context is None:
        return None
    return format_trace_id(context.trace_id), format_span_id(context.span_id), context.trace_flags


def test_reads_a_valid_header() -> None:
    assert ids(VALID) == (TRACE_ID, SPAN_ID, 1)
    assert ids(VALID.encode()) == ids(VALID)


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"garbage",
        VALID.upper().encode(),  # hex is lowercase on the wire
        b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
        b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        (VALID + "-extra").encode(),  # version 00 is exactly 55 characters
        VALID[:-1].encode(),
        b"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",  # fields misplaced
        b"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        b"\xff\xfe",
    ],
)
def test_rejects_invalid_headers(value: bytes) -> None:
    assert ids(value) is None


def test_a_later_version_is_read_by_its_first_fields() -> None:
    later = "cc" + VALID[2:]
    assert ids(later + "-what-comes-next") == ids(VALID)
    assert ids(later + "x") is None  # more must follow a dash


def test_read_finds_the_headers_in_any_spelling() -> None:
    headers = [("laneway-attempt", b"2"), ("TraceParent", VALID.encode()), ("TraceState", b"a=1")]
    context = read(headers)
    assert context is not None and format_trace_id(context.trace_id) == TRACE_ID
    assert context.trace_state.to_header() == "a=1"
    assert read(None) is None
    assert read([("laneway-attempt", b"2"), (TRACEPARENT, None)]) is None


def test_a_span_is_a_child_with_the_same_trace_flags_and_tracestate() -> None:
    spans = untraced()
    unsampled = VALID[:-2] + "00"
    parent = Record(((TRACEPARENT, unsampled.encode()), (TRACESTATE, b"vendor=v1,other=o2")))
    headers = dict(trace_headers(spans.start(parent)))
    child = read(list(headers.items()))
    assert child is not None
    assert format_trace_id(child.trace_id) == TRACE_ID and child.trace_flags == 0
    assert format_span_id(child.span_id) != SPAN_ID
    assert headers[TRACESTATE] == b"vendor=v1,other=o2"  # carried, not dropped
    # Each record a span of its own.
    again = read(trace_headers(spans.start(parent)))
    assert again is not None and again.span_id != child.span_id
    spans.close()


def test_no_or_an_invalid_header_starts_a_new_sampled_trace() -> None:
    spans = untraced()
    started = []
    for headers in ((), ((TRACEPARENT, b"nonsense"),), ((TRACESTATE, b"a=1"),)):
        out = dict(trace_headers(spans.start(Record(headers))))
        assert TRACESTATE not in out  # a tracestate without a valid traceparent is dropped
        context = read(list(out.items()))
        assert context is not None and context.trace_flags.sampled
        started.append(context.trace_id)
    assert len(set(started)) == 3
    spans.close()


def test_traced_replaces_any_trace_headers_and_keeps_other_headers() -> None:
    trace = ((TRACEPARENT, VALID.encode()), (TRACESTATE, b"a=1"))
    records = [
        Outbound("t", b"k", b"v"),
        Outbound(
            "t",
            b"k",
            b"v",
            (("laneway-attempt", b"2"), ("traceparent", b"old"), ("TraceState", b"old=1")),
            3,
        ),
    ]
    out = traced(records, trace)
    assert out[0].headers == trace
    assert out[1].headers == (("laneway-attempt", b"2"), *trace)
    assert [(r.topic, r.key, r.value) for r in out] == [("t", b"k", b"v")] * 2
    assert [r.partition for r in out] == [None, 3]
    # traced builds each Outbound field by field: a new field must be added there
    assert [f.name for f in dataclasses.fields(Outbound)] == [
        "topic",
        "key",
        "value",
        "headers",
        "partition",
    ]


@pytest.mark.parametrize(
    "context",
    [
        SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(1)),
        SpanContext(1, 2, True, TraceFlags(0)),  # unsampled, ids that need their zeros
        SpanContext(
            (1 << 128) - 1,
            (1 << 64) - 1,
            False,
            TraceFlags(1),
            TraceState([("vendor", "a=1"), ("other", "b")]),
        ),
        INVALID_SPAN_CONTEXT,
    ],
)
def test_trace_headers_are_what_the_w3c_propagator_injects(context: SpanContext) -> None:
    carrier: dict[str, str] = {}
    span = NonRecordingSpan(context)
    TraceContextTextMapPropagator().inject(carrier, set_span_in_context(span))
    assert trace_headers(span) == tuple((k, v.encode("ascii")) for k, v in carrier.items())
