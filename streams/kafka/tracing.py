"""W3C trace context on laneway's records (https://www.w3.org/TR/trace-context/).

A request record may carry a ``traceparent`` header; each process that
handles the request (the classifier, then a lane worker) puts a *child* of
the header it read on every record it produces for that request: the same
trace id and flags, a new span id (the process's own step). A header that is
missing or invalid starts a new trace there; it never fails the request.
Kafka header names are case-sensitive, the W3C ones are not: any spelling
of ``traceparent`` is read, ``traceparent`` is written (as OpenTelemetry's
Kafka instrumentation does). Pure functions, no broker.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from streams.kafka.envelopes import Outbound

__all__ = [
    "TRACEPARENT",
    "TraceParent",
    "Traces",
    "child_header",
    "child_of",
    "child_trace",
    "header",
    "new_trace",
    "parse",
    "read",
    "traced",
]

TRACEPARENT = "traceparent"

_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
SAMPLED = "01"

Traces = Mapping[tuple[str, int, int], tuple[str, bytes]]
"""The ``traceparent`` header to put on what is produced for each consumed
record, by its topic, partition and offset."""


@dataclass(frozen=True, slots=True)
class TraceParent:
    """One ``traceparent`` value: lowercase hex, as on the wire."""

    trace_id: str
    """32 hex digits, not all zero."""
    span_id: str
    """16 hex digits, not all zero: the span of whoever wrote the header."""
    flags: str = SAMPLED
    """2 hex digits; bit 0 is "sampled"."""

    def format(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    @property
    def sampled(self) -> bool:
        """Flag bit 0: the caller may have recorded it; exported spans are these."""
        return int(self.flags, 16) & 1 == 1

    def child(self) -> TraceParent:
        """The same trace and flags, a new span id."""
        return TraceParent(self.trace_id, _span_id(), self.flags)


def parse(value: str | bytes | None) -> TraceParent | None:
    """The header's value, or ``None`` when it is not a valid one.

    Version ``00`` must be exactly 55 characters; a later version (not
    ``ff``) is read by its first four fields when it is that long or longer
    with a ``-`` after them, as the recommendation asks. Hex is lowercase
    only; an all-zero trace or parent id is invalid."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    value = value.strip(" \t")
    match = _FIELDS.match(value)
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if version == "00" and len(value) != 55:
        return None
    if len(value) > 55 and value[55] != "-":
        return None
    return TraceParent(trace_id, span_id, flags)


def read(headers: Iterable[tuple[str, bytes | None]] | None) -> TraceParent | None:
    """The ``traceparent`` of a record's headers, if one is there and valid
    (the first one when there are several)."""
    for name, value in headers or ():
        if name.lower() == TRACEPARENT:
            return parse(value)
    return None


def new_trace() -> TraceParent:
    """The start of a trace, sampled."""
    return TraceParent(_trace_id(), _span_id(), SAMPLED)


def child_of(headers: Iterable[tuple[str, bytes | None]] | None) -> TraceParent:
    """The context for what a process produces from a record with ``headers``:
    a child of its ``traceparent``, or a new trace when it has none (or an
    invalid one)."""
    parent = read(headers)
    return parent.child() if parent is not None else new_trace()


def child_trace(
    headers: Iterable[tuple[str, bytes | None]] | None,
) -> tuple[TraceParent | None, TraceParent]:
    """The ``traceparent`` read from ``headers`` (``None``: missing or
    invalid) and ``child_of`` it: the parent of a process's span, and the
    span itself (``streams.kafka.otlp`` exports it)."""
    parent = read(headers)
    return parent, parent.child() if parent is not None else new_trace()


def header(trace: TraceParent) -> tuple[str, bytes]:
    """``trace`` as the header to put on the records produced."""
    return (TRACEPARENT, trace.format().encode())


def child_header(headers: Iterable[tuple[str, bytes | None]] | None) -> tuple[str, bytes]:
    """``child_of(headers)`` as the header to put on the records produced."""
    return header(child_of(headers))


def traced(records: Sequence[Outbound], header: tuple[str, bytes]) -> list[Outbound]:
    """``records`` with ``header`` as their only ``traceparent``."""
    # Outbound by hand: dataclasses.replace costs a few us a record, and
    # the classifier's hot path traces three records per answer.
    return [
        Outbound(
            r.topic,
            r.key,
            r.value,
            (*(h for h in r.headers if h[0].lower() != TRACEPARENT), header)
            if r.headers
            else (header,),
            r.partition,
        )
        for r in records
    ]


def _trace_id() -> str:
    while (value := secrets.token_hex(16)) == _ZERO_TRACE:
        pass
    return value


def _span_id() -> str:
    while (value := secrets.token_hex(8)) == _ZERO_SPAN:
        pass
    return value
