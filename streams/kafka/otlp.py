"""laneway's trace spans, exported over OTLP/HTTP when an endpoint is set.

Each process that handles a request puts a child of the consumed record's
``traceparent`` on everything it produces for it (``streams.kafka.tracing``).
That child is this process's span: with ``LANEWAY_TRACING_OTLP_ENDPOINT``
(or the standard ``OTEL_EXPORTER_OTLP_*`` variables, ``TracingSettings``)
it is also recorded (``streams.kafka.spans``: one per consumed record, as
OpenTelemetry's messaging conventions name and describe it) and exported.
Only sampled traces (flag bit 0) are recorded; the header itself is
carried either way.

The exporter (``SpanExporter``) is fail-open: spans wait in a bounded queue
(full: the newest are dropped and counted) and a thread of its own sends
them, as a protobuf ``ExportTraceServiceRequest``, every
``flush_interval_s`` or as soon as ``MAX_BATCH`` wait. A collector that
fails is logged once per outage; its spans are counted and lost, never
retried beyond the next flush, and request processing never waits on it.
At shutdown what is queued gets one last flush, bounded by
``export_timeout_s``. Without an endpoint there is no exporter at all
(``exporter_for`` returns ``None``) and nothing is recorded.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.metadata
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client import Counter

from schemas.settings import TracingSettings
from streams.kafka.spans import Attribute, FinishedSpan, Handled, process_span

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

__all__ = ["MAX_BATCH", "SPANS", "SpanExporter", "export_request", "exporter_for", "resource"]

log = logging.getLogger(__name__)

SPANS = Counter(
    "laneway_trace_spans_total",
    "Trace spans given to the OTLP exporter, by what became of them: exported, "
    "dropped (the queue was full) or failed (the collector refused them or could not be reached)",
    ["outcome"],
)

MAX_BATCH = 512
"""Spans sent in one export; this many waiting are sent without waiting for the interval."""

CONTENT_TYPE = "application/x-protobuf"


def resource(service_name: str, instance_id: str | None = None) -> dict[str, str]:
    """The resource attributes of one process's spans."""
    try:
        version = importlib.metadata.version("laneway")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "service.name": service_name,
        "service.instance.id": instance_id or str(uuid.uuid4()),
        "service.version": version,
    }


def export_request(
    spans: Sequence[FinishedSpan], attributes: Mapping[str, str]
) -> ExportTraceServiceRequest:
    """``spans`` of one process (resource ``attributes``) as OTLP's protobuf message."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

    pb_spans = [
        Span(
            trace_id=bytes.fromhex(s.trace_id),
            span_id=bytes.fromhex(s.span_id),
            parent_span_id=bytes.fromhex(s.parent_span_id),
            name=s.name,
            kind=Span.SpanKind.SPAN_KIND_CONSUMER,
            start_time_unix_nano=s.start_ns,
            end_time_unix_nano=s.end_ns,
            attributes=[_key_value(k, v) for k, v in s.attributes],
            status=Status(code=Status.StatusCode.STATUS_CODE_ERROR, message=s.error)
            if s.error is not None
            else None,
        )
        for s in spans
    ]
    scope = InstrumentationScope(name="laneway", version=attributes.get("service.version", ""))
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[_key_value(k, v) for k, v in attributes.items()]),
                scope_spans=[ScopeSpans(scope=scope, spans=pb_spans)],
            )
        ]
    )


class SpanExporter:
    """Queues one process's finished spans and sends them to ``url`` from a
    daemon thread of its own (started with the first span)."""

    def __init__(
        self,
        url: str,
        attributes: Mapping[str, str],
        *,
        queue_size: int = 2048,
        flush_interval_s: float = 1.0,
        timeout_s: float = 3.0,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.url = url
        self.attributes = dict(attributes)
        self._queue_size = queue_size
        self._interval_s = flush_interval_s
        self._timeout_s = timeout_s
        self._max_batch = max_batch
        self._queue: collections.deque[FinishedSpan] = collections.deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_flush_by = 0.0
        """``time.monotonic`` by which the last flush (``close``) gives up."""
        self._transport: httpx.HTTPTransport | None = None
        """Its connection pool. Requests go to the transport itself: an
        ``httpx.Client`` logs each one at INFO, once a second per process."""
        self.failing = False
        """The last export failed: an outage, logged once."""

    def processed(
        self, handled: Iterable[Handled], *, group: str, start_ns: int, end_ns: int | None = None
    ) -> None:
        """Record a span for each sampled one of ``handled`` (read by consumer
        ``group`` from ``start_ns`` to ``end_ns``, default now)."""
        end = time.time_ns() if end_ns is None else end_ns
        for item in handled:
            if item.own.sampled:
                self.record(process_span(item, group=group, start_ns=start_ns, end_ns=end))

    def record(self, span: FinishedSpan) -> bool:
        """Queue ``span``; ``False`` (dropped, counted) when the queue is full
        or the exporter closed."""
        if self._stopping.is_set() or len(self._queue) >= self._queue_size:
            SPANS.labels("dropped").inc()
            return False
        self._queue.append(span)
        if self._thread is None:
            self._start()
        if len(self._queue) >= self._max_batch:
            self._wake.set()
        return True

    @property
    def queued(self) -> int:
        return len(self._queue)

    def flush(self, deadline: float | None = None) -> int:
        """Send what is queued now, ``MAX_BATCH`` at a time, until the queue
        is empty, an export fails, or ``deadline`` (``time.monotonic``)
        passes; returns the spans exported. Called from the exporter's
        thread (and by tests)."""
        exported = 0
        while self._queue and (deadline is None or time.monotonic() < deadline):
            batch = [self._queue.popleft() for _ in range(min(self._max_batch, len(self._queue)))]
            if not self._post(batch):
                break
            exported += len(batch)
        return exported

    def close(self, timeout_s: float | None = None) -> None:
        """Stop taking spans, flush what is queued (within ``timeout_s``,
        default the export timeout) and stop the thread. What is left then
        is counted as dropped."""
        timeout = self._timeout_s if timeout_s is None else timeout_s
        self._last_flush_by = time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=timeout + 0.5)
        elif self._queue:
            self.flush(self._last_flush_by)
        left = len(self._queue)
        if left and (thread is None or not thread.is_alive()):
            self._queue.clear()
            SPANS.labels("dropped").inc(left)
        self._close_transport()

    async def aclose(self, timeout_s: float | None = None) -> None:
        """``close`` off the event loop."""
        await asyncio.to_thread(self.close, timeout_s)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="laneway-otlp", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stopping.is_set():
                break
            self.flush()
        self.flush(self._last_flush_by)  # the last flush, bounded by close()

    def _post(self, batch: list[FinishedSpan]) -> bool:
        try:
            status = self._send(export_request(batch, self.attributes).SerializeToString())
            if not 200 <= status < 300:
                raise RuntimeError(f"the collector answered HTTP {status}")
        except Exception as exc:  # fail-open: never the request path's problem
            SPANS.labels("failed").inc(len(batch))
            if self.failing:
                log.debug("OTLP export to %s still failing: %s", self.url, exc)
            else:
                self.failing = True
                log.warning(
                    "OTLP export to %s failed (%s: %s); spans are dropped until it answers",
                    self.url,
                    type(exc).__name__,
                    exc,
                )
            return False
        SPANS.labels("exported").inc(len(batch))
        if self.failing:
            self.failing = False
            log.info("OTLP export to %s answers again", self.url)
        return True

    def _send(self, body: bytes) -> int:
        """POST one export; its HTTP status."""
        if self._transport is None:
            self._transport = httpx.HTTPTransport()
        request = httpx.Request(
            "POST",
            self.url,
            content=body,
            headers={"Content-Type": CONTENT_TYPE},
            extensions={"timeout": httpx.Timeout(self._timeout_s).as_dict()},
        )
        response = self._transport.handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return response.status_code

    def _close_transport(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None and (self._thread is None or not self._thread.is_alive()):
            transport.close()


def exporter_for(settings: TracingSettings, component: str) -> SpanExporter | None:
    """The exporter of a process (``service.name`` ``<service_name>-<component>``),
    or ``None`` when no endpoint is configured: then nothing is recorded."""
    url = settings.traces_url
    if url is None:
        return None
    return SpanExporter(
        url,
        resource(f"{settings.service_name}-{component}"),
        queue_size=settings.queue_size,
        flush_interval_s=settings.flush_interval_s,
        timeout_s=settings.export_timeout_s,
    )


def _key_value(key: str, value: Attribute) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    return KeyValue(key=key, value=_any_value(value))


def _any_value(value: Attribute) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, tuple):
        return AnyValue(array_value=ArrayValue(values=[_any_value(v) for v in value]))
    return AnyValue(string_value=value)
