"""laneway's trace spans on OpenTelemetry's SDK, exported over OTLP/HTTP
when an endpoint is set.

One ``RecordSpans`` per consuming process: ``start`` opens a CONSUMER span for a
consumed record, a child of the context its headers carry
(``streams.kafka.tracing``) or the root of a new trace; the process puts
``trace_headers(span)`` on everything it produces for the record, then
``finish`` closes the span with what became of the record
(``streams.kafka.spans``). So the span id a record carries is the id of a
span its producer exports. The gateway, an HTTP server, has ``ServerSpans``
instead: a SERVER span per HTTP request, a child of the context of its
``traceparent`` header, whose context the request records carry on.

With ``LANEWAY_TRACING_OTLP_ENDPOINT`` (or the standard ``OTEL_EXPORTER_OTLP_*``
variables, ``TracingSettings``) the process's ``TracerProvider`` has a
``BatchSpanProcessor`` in front of the OTLP/HTTP protobuf exporter. Its
sampler follows the parent: a trace started here or sampled upstream (flag
bit 0) is exported, an unsampled one is carried and never recorded.
Without an endpoint each record still gets a child context of its own (its
span id is the one the records carry), but no SDK span is made and nothing
is recorded.

Fail-open: the processor's queue is bounded (``queue_size``; full, the
oldest spans go), its own thread exports every ``flush_interval_s`` or as
soon as a batch waits, one export (retries of a transient failure
included) takes at most ``export_timeout_s``, and a failed one is counted
and logged once per outage. ``finish`` never waits on the collector. At
shutdown what is queued gets one last flush, bounded by
``export_timeout_s``; what is left then is dropped.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
)
from prometheus_client import Counter

from schemas.settings import TracingSettings
from streams.kafka.spans import (
    Attribute,
    Outcome,
    outcome_attributes,
    record_attributes,
    span_name,
)
from streams.kafka.tracing import Headers, extract, extract_http

__all__ = [
    "MAX_BATCH",
    "SPANS",
    "CountedExporter",
    "Ended",
    "ProcessSpans",
    "RecordSpans",
    "ServerSpans",
    "TracedRecord",
    "provider_for",
    "resource",
    "server_spans_for",
    "spans_for",
]

log = logging.getLogger(__name__)

SPANS = Counter(
    "laneway_trace_spans_total",
    "Trace spans the OTLP exporter was given, by what became of them: exported, "
    "or failed (the collector refused them or could not be reached in time)",
    ["outcome"],
)

MAX_BATCH = 512
"""Spans sent in one export; this many waiting are sent without waiting for the interval."""

_SDK_LOGGERS = (
    "opentelemetry.sdk._shared_internal",  # the batch processor: "Queue full, dropping Span."
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",  # each failed export
)


Attributes = Mapping[str, Attribute]
"""A span's attributes by name."""

Ended = tuple[Span, Outcome]
"""A record's span and what became of the record: ``RecordSpans.finish`` ends it."""


class TracedRecord(Protocol):
    """What a span is started from: a consumed record (aiokafka's, or the
    classifier's ``SourceRecord``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def headers(self) -> Headers: ...


def resource(service_name: str, instance_id: str | None = None) -> Resource:
    """The resource of one process's spans (with the SDK's own attributes
    and any ``OTEL_RESOURCE_ATTRIBUTES``; these three win)."""
    return Resource.create(
        {
            "service.name": service_name,
            "service.instance.id": instance_id or str(uuid.uuid4()),
            "service.version": _version(),
        }
    )


class CountedExporter(SpanExporter):
    """An exporter (the OTLP one) whose exports are counted in ``SPANS``,
    and whose failures are logged once per outage and never raised."""

    def __init__(self, inner: SpanExporter, url: str) -> None:
        self.inner = inner
        self.url = url
        self.failing = False
        """The last export failed: an outage, logged once."""
        self._closed = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
            error = "the collector refused them or did not answer in time"
        except Exception as exc:  # fail-open: never the request path's problem
            result, error = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        if result is SpanExportResult.SUCCESS:
            SPANS.labels("exported").inc(len(spans))
            if self.failing:
                self.failing = False
                log.info("OTLP export to %s answers again", self.url)
            return result
        SPANS.labels("failed").inc(len(spans))
        if not self.failing:
            self.failing = True
            log.warning(
                "OTLP export to %s failed (%s); spans are dropped until it answers",
                self.url,
                error,
            )
        return result

    def shutdown(self) -> None:
        """Close the inner exporter (once): a retry it waits on stops."""
        if not self._closed.is_set():
            self._closed.set()
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class ProcessSpans:
    """What every process's spans share: its provider (one per process),
    its exporter, and a bounded last flush at shutdown."""

    def __init__(
        self,
        provider: TracerProvider,
        *,
        exporter: CountedExporter | None = None,
        close_timeout_s: float = 3.0,
    ) -> None:
        self.provider = provider
        self.exporter = exporter
        """``None``: no endpoint, nothing is exported."""
        self._close_timeout_s = close_timeout_s
        self._tracer = provider.get_tracer("laneway", _version())
        self._closed = False

    @property
    def exporting(self) -> bool:
        return self.exporter is not None

    def _carried(self, parent: Context) -> Span:
        """Without an endpoint nothing is recorded, so no SDK span is made:
        only the context the tracer's sampler would give it (the parent's
        trace, flags and state with a new span id, or a new sampled trace),
        for about half the CPU of an SDK span on the classifier's hot path."""
        ids = self.provider.id_generator
        context = get_current_span(parent).get_span_context()
        if context.is_valid:
            trace_id, flags, state = context.trace_id, context.trace_flags, context.trace_state
        else:
            trace_id, flags, state = ids.generate_trace_id(), TraceFlags(TraceFlags.SAMPLED), None
        return NonRecordingSpan(SpanContext(trace_id, ids.generate_span_id(), False, flags, state))

    def close(self, timeout_s: float | None = None) -> None:
        """Stop, with one last flush of what is queued, for at most
        ``timeout_s`` (default the export timeout): what is left then is
        dropped, and the exporter stops retrying. Once; again is a no-op."""
        if self._closed:
            return
        self._closed = True
        timeout = self._close_timeout_s if timeout_s is None else timeout_s
        stopping = threading.Thread(
            target=self.provider.shutdown, name="laneway-otlp-shutdown", daemon=True
        )
        stopping.start()
        stopping.join(timeout)
        if stopping.is_alive():
            log.warning(
                "OTLP: the last flush took over %.1fs; what it had not sent is lost", timeout
            )
            if self.exporter is not None:
                self.exporter.shutdown()

    async def aclose(self, timeout_s: float | None = None) -> None:
        """``close`` off the event loop."""
        await asyncio.to_thread(self.close, timeout_s)


class RecordSpans(ProcessSpans):
    """One consuming process's spans: one per consumed record it settles
    (see the module docstring)."""

    def __init__(
        self,
        provider: TracerProvider,
        group: str,
        *,
        exporter: CountedExporter | None = None,
        close_timeout_s: float = 3.0,
    ) -> None:
        super().__init__(provider, exporter=exporter, close_timeout_s=close_timeout_s)
        self.group = group
        """The consumer group the records are read by (an attribute of each span)."""

    def start(self, record: TracedRecord, start_ns: int | None = None) -> Span:
        """The span of processing ``record`` from ``start_ns`` (default now):
        a child of its headers' trace context, or a new sampled trace."""
        parent = extract(record.headers)
        if not self.exporting:
            return self._carried(parent)
        return self._tracer.start_span(
            span_name(record.topic),
            parent,
            kind=SpanKind.CONSUMER,
            attributes=record_attributes(record.topic, record.partition, record.offset, self.group),
            start_time=start_ns,
        )

    def finish(self, ended: Iterable[Ended], end_ns: int | None = None) -> None:
        """End each span with what became of its record, at ``end_ns``
        (default now; never before it started). Only a recorded span, with
        an endpoint, is queued for export; this never waits on the collector."""
        if not self.exporting:
            return
        end = time.time_ns() if end_ns is None else end_ns
        for span, outcome in ended:
            if not span.is_recording():  # an unsampled trace
                continue
            span.set_attributes(outcome_attributes(outcome))
            if outcome.status == "error":
                span.set_status(Status(StatusCode.ERROR, outcome.error_code or "error"))
            started = span.start_time if isinstance(span, ReadableSpan) else None
            span.end(end_time=max(end, started or end))


class ServerSpans(ProcessSpans):
    """An HTTP server's spans (the gateway's): one SERVER span per request
    it serves, a child of the context of the request's ``traceparent`` and
    ``tracestate`` headers, or the root of a new sampled trace. What the
    span says is the caller's (``streams.gateway.tracing``)."""

    def start(self, name: str, headers: Mapping[str, str], attributes: Attributes) -> Span:
        """The span of serving a request with ``headers``, from now. Without
        an endpoint, or in an unsampled trace, it records nothing (its
        context is carried all the same)."""
        parent = extract_http(headers)
        if not self.exporting:
            return self._carried(parent)
        return self._tracer.start_span(name, parent, kind=SpanKind.SERVER, attributes=attributes)

    @staticmethod
    def end(span: Span, attributes: Attributes, error: str | None = None) -> None:
        """End ``span`` now with ``attributes``; ``error``: it failed, status
        ERROR with this as its message. Never waits on the collector."""
        if span.is_recording():
            span.set_attributes(attributes)
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
        span.end()


def provider_for(
    settings: TracingSettings, component: str, instance_id: str | None = None
) -> tuple[TracerProvider, CountedExporter | None]:
    """A process's provider (``service.name`` ``<service_name>-<component>``;
    one per process) sampling as the parent does, and with an endpoint
    configured its exporter, behind a bounded ``BatchSpanProcessor``."""
    provider = TracerProvider(
        sampler=ParentBased(ALWAYS_ON),
        resource=resource(f"{settings.service_name}-{component}", instance_id),
        shutdown_on_exit=False,  # closed by its process, within its timeout
    )
    url = settings.traces_url
    if url is None:
        return provider, None
    _quiet_sdk_logs()
    exporter = CountedExporter(
        OTLPSpanExporter(endpoint=url, timeout=settings.export_timeout_s), url
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=settings.queue_size,
            schedule_delay_millis=settings.flush_interval_s * 1000,
            max_export_batch_size=min(MAX_BATCH, settings.queue_size),
            export_timeout_millis=settings.export_timeout_s * 1000,
        )
    )
    return provider, exporter


def spans_for(settings: TracingSettings, component: str, group: str) -> RecordSpans:
    """The spans of a process (``service.name`` ``<service_name>-<component>``)
    reading as consumer ``group``; exported when an endpoint is configured."""
    provider, exporter = provider_for(settings, component)
    return RecordSpans(
        provider, group, exporter=exporter, close_timeout_s=settings.export_timeout_s
    )


def server_spans_for(
    settings: TracingSettings, component: str, instance_id: str | None = None
) -> ServerSpans:
    """The spans of an HTTP server process (``<service_name>-<component>``);
    exported when an endpoint is configured."""
    provider, exporter = provider_for(settings, component, instance_id)
    return ServerSpans(provider, exporter=exporter, close_timeout_s=settings.export_timeout_s)


class _OncePerInterval(logging.Filter):
    """Lets each message of a logger through once per ``interval_s``: the
    SDK logs every failed export, and every span a full queue drops, which
    an outage turns into a flood (``CountedExporter`` says it once)."""

    def __init__(self, interval_s: float = 60.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[tuple[str, object], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                return False
            self._last[key] = now
        return True


_ONCE = _OncePerInterval()


def _quiet_sdk_logs() -> None:
    for name in _SDK_LOGGERS:
        logger = logging.getLogger(name)
        if _ONCE not in logger.filters:
            logger.addFilter(_ONCE)


def _version() -> str:
    try:
        return importlib.metadata.version("laneway")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
