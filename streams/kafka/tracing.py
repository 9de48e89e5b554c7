"""W3C trace context on laneway's Kafka records (https://www.w3.org/TR/trace-context/).

A request record may carry ``traceparent`` and ``tracestate`` headers; each
process that handles the request (the classifier, then a lane worker)
starts a span of its own for the record (``streams.kafka.otlp``) and puts
that span's context on every record it produces for the request: the same
trace id, flags and ``tracestate``, its own span id. A header that is
missing or invalid starts a new trace there; it never fails the request.

Reading and writing the headers is OpenTelemetry's
``TraceContextTextMapPropagator``; this module only lets it read Kafka's
header list (names are case-sensitive there, the W3C ones are not: any
spelling is read, lowercase is written, as OpenTelemetry's Kafka
instrumentation does) and puts what it writes on laneway's records.

The gateway reads the same headers off an HTTP request (``extract_http``)
and puts its own span's context on the request record it produces.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Span,
    SpanContext,
    get_current_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from streams.kafka.envelopes import Outbound

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "Headers",
    "TraceHeaders",
    "Traces",
    "extract",
    "extract_http",
    "read",
    "trace_headers",
    "traced",
]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_NAMES = frozenset((TRACEPARENT, TRACESTATE))

Headers = Iterable[tuple[str, bytes | None]] | None
"""A consumed record's headers, as aiokafka gives them."""

TraceHeaders = tuple[tuple[str, bytes], ...]
"""The trace context headers to put on a produced record: ``traceparent``,
and ``tracestate`` when the trace has one."""

Traces = Mapping[tuple[str, int, int], TraceHeaders]
"""The trace headers to put on what is produced for each consumed record,
by its topic, partition and offset."""

PROPAGATOR = TraceContextTextMapPropagator()


class _KafkaHeaders(Getter[Sequence[tuple[str, bytes | None]]]):
    """Reads a Kafka header list for the propagator: names in any case, values
    as ASCII (a value that is not is as good as missing)."""

    def get(self, carrier: Sequence[tuple[str, bytes | None]], key: str) -> list[str] | None:
        values = []
        for name, value in carrier:
            if value is not None and name.lower() == key:
                try:
                    values.append(value.decode("ascii"))
                except UnicodeDecodeError:
                    continue
        return values or None

    def keys(self, carrier: Sequence[tuple[str, bytes | None]]) -> list[str]:
        return [name for name, _ in carrier]


_GETTER = _KafkaHeaders()


def extract(headers: Headers) -> Context:
    """The context a record's headers carry, to start its span in: empty
    when there is no valid ``traceparent`` (the span then starts a trace)."""
    if not headers:  # what the propagator gives an empty carrier, without asking it
        return Context()
    return PROPAGATOR.extract(list(headers), getter=_GETTER)


def extract_http(headers: Mapping[str, str]) -> Context:
    """The context an HTTP request's ``traceparent`` and ``tracestate``
    carry (``headers`` as aiohttp gives them: names in any case): empty
    when there is no valid ``traceparent``."""
    return PROPAGATOR.extract(headers)


def read(headers: Headers) -> SpanContext | None:
    """The valid trace context of a record's headers, if there is one."""
    context = get_current_span(extract(headers)).get_span_context()
    return context if context.is_valid else None


def trace_headers(span: Span) -> TraceHeaders:
    """``span``'s context as the headers to put on the records produced:
    what ``PROPAGATOR.inject`` writes (``traceparent``, and ``tracestate``
    when the trace has state), written out here without the context object
    and the carrier ``inject`` needs, once per request on the classifier's
    hot path."""
    context = span.get_span_context()
    if context == INVALID_SPAN_CONTEXT:
        return ()
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    if context.trace_state:
        state = context.trace_state.to_header()
        return ((TRACEPARENT, parent.encode("ascii")), (TRACESTATE, state.encode("ascii")))
    return ((TRACEPARENT, parent.encode("ascii")),)


def traced(records: Sequence[Outbound], headers: TraceHeaders) -> list[Outbound]:
    """``records`` with ``headers`` as their only trace context headers."""
    # Outbound by hand: dataclasses.replace costs a few us a record, and
    # the classifier's hot path traces three records per answer.
    return [
        Outbound(
            r.topic,
            r.key,
            r.value,
            (*(h for h in r.headers if h[0].lower() not in _NAMES), *headers)
            if r.headers
            else headers,
            r.partition,
        )
        for r in records
    ]
