"""Spans over OTLP/HTTP: what a span says, its protobuf, the queue, the
endpoint settings, and an export to a real (local) HTTP receiver."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from schemas.errors import BackendUnavailable, InvalidRequest
from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings, TracingSettings
from streams.classify.classifier import SourceRecord, classify_record
from streams.devstack.embedded import free_port
from streams.kafka.otlp import SPANS, SpanExporter, export_request, exporter_for, resource
from streams.kafka.spans import (
    UNREADABLE,
    Handled,
    Outcome,
    classified_outcome,
    lane_outcomes,
    process_span,
)
from streams.kafka.tracing import TraceParent, child_trace, header, read
from streams.rules.engine import RuleBook

PARENT = TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")
RESOURCE = {"service.name": "laneway-test", "service.instance.id": "i-1", "service.version": "9"}


def handled(
    own: TraceParent | None = None,
    parent: TraceParent | None = PARENT,
    outcome: Outcome | None = None,
) -> Handled:
    return Handled(
        "laneway.lane.realtime",
        2,
        41,
        parent,
        own or PARENT.child(),
        outcome or Outcome("r-1", "realtime", "light", "ok"),
    )


def attributes(span: Span) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        values[kv.key] = getattr(kv.value, kind)
    return values


def counted(outcome: str) -> float:
    """``laneway_trace_spans_total{outcome}`` now."""
    return SPANS.labels(outcome)._value.get()  # type: ignore[no-any-return]


def test_child_trace_is_the_header_read_and_its_child() -> None:
    parent, own = child_trace([("traceparent", PARENT.format().encode())])
    assert parent == PARENT
    assert own.trace_id == PARENT.trace_id and own.flags == "01" and own.span_id != PARENT.span_id
    assert read([header(own)]) == own
    started, fresh = child_trace([])
    assert started is None and fresh.sampled
    assert not TraceParent(PARENT.trace_id, PARENT.span_id, "00").sampled
    assert TraceParent(PARENT.trace_id, PARENT.span_id, "03").sampled


def test_a_span_follows_the_messaging_conventions() -> None:
    item = handled()
    span = process_span(item, group="laneway.worker.realtime", start_ns=1_000, end_ns=5_000)
    assert span.name == "process laneway.lane.realtime"
    assert (span.trace_id, span.span_id, span.parent_span_id) == (
        PARENT.trace_id,
        item.own.span_id,
        PARENT.span_id,
    )
    assert dict(span.attributes) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "laneway.lane.realtime",
        "messaging.destination.partition.id": "2",
        "messaging.kafka.offset": 41,
        "messaging.consumer.group.name": "laneway.worker.realtime",
        "laneway.request.id": "r-1",
        "laneway.lane": "realtime",
        "laneway.path": "light",
        "laneway.status": "ok",
    }
    assert span.error is None
    started = process_span(handled(parent=None), group="g", start_ns=7, end_ns=3)
    assert started.parent_span_id == "" and started.end_ns == 7  # never ends before it starts


def test_an_error_result_is_an_error_span() -> None:
    result = InferenceResult.failure(
        "r-2", BackendUnavailable("no path"), lane=Lane.MEDIUM, path=AnswerPath("heavy")
    )
    outcome = Outcome.of_result(result)
    assert outcome == Outcome("r-2", "medium", "heavy", "error", "INF-502")
    span = process_span(handled(outcome=outcome), group="g", start_ns=1, end_ns=2)
    assert span.error == "INF-502"
    assert dict(span.attributes)["laneway.error_code"] == "INF-502"


def test_the_protobuf_decodes_back_to_the_spans() -> None:
    ok = process_span(
        handled(), group="g", start_ns=1_700_000_000_000_000_000, end_ns=1_700_000_000_250_000_000
    )
    failed = process_span(
        handled(parent=None, outcome=UNREADABLE), group="g", start_ns=10, end_ns=20
    )
    wire = export_request([ok, failed], RESOURCE).SerializeToString()

    decoded = ExportTraceServiceRequest.FromString(wire)
    (resource_spans,) = decoded.resource_spans
    assert {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes} == RESOURCE
    (scope,) = resource_spans.scope_spans
    assert scope.scope.name == "laneway"
    first, second = scope.spans
    assert first.trace_id.hex() == ok.trace_id and len(first.trace_id) == 16
    assert first.span_id.hex() == ok.span_id and len(first.span_id) == 8
    assert first.parent_span_id.hex() == PARENT.span_id
    assert first.kind == Span.SpanKind.SPAN_KIND_CONSUMER
    assert first.name == "process laneway.lane.realtime"
    assert (first.start_time_unix_nano, first.end_time_unix_nano) == (ok.start_ns, ok.end_ns)
    assert attributes(first) == dict(ok.attributes)
    assert first.status.code == Status.StatusCode.STATUS_CODE_UNSET
    assert second.parent_span_id == b""
    assert second.status.code == Status.StatusCode.STATUS_CODE_ERROR
    assert second.status.message == "INF-400"
    assert attributes(second)["laneway.error_code"] == "INF-400"


def test_only_sampled_traces_are_queued() -> None:
    exporter = SpanExporter("http://127.0.0.1:9/v1/traces", RESOURCE, flush_interval_s=60)
    unsampled = TraceParent(PARENT.trace_id, PARENT.span_id, "00")
    exporter.processed([handled(own=unsampled.child(), parent=unsampled)], group="g", start_ns=1)
    assert exporter.queued == 0
    exporter.processed([handled()], group="g", start_ns=1)
    assert exporter.queued == 1
    exporter.close(timeout_s=0.1)


def test_a_full_queue_drops_and_counts() -> None:
    # A large batch size and interval: nothing is sent while the test fills the queue.
    exporter = SpanExporter(
        "http://127.0.0.1:9/v1/traces",
        RESOURCE,
        queue_size=3,
        flush_interval_s=60,
        max_batch=100,
    )
    dropped = counted("dropped")
    span = process_span(handled(), group="g", start_ns=1, end_ns=2)
    assert [exporter.record(span) for _ in range(5)] == [True, True, True, False, False]
    assert exporter.queued == 3
    assert counted("dropped") == dropped + 2
    exporter._stopping.set()  # the test is done with it: nothing left to send
    exporter._queue.clear()
    exporter.close(timeout_s=0.1)


def test_lane_outcomes_say_what_became_of_each_record() -> None:
    request = InferenceRequest(id="q-1", prompt="hi")
    routed = RoutedRequest(
        request=request,
        lane=Lane.REALTIME,
        path=AnswerPath("light"),
        reply_to="laneway.replies",
        produced_at_ms=1,
        routed_at_ms=1,
    )
    keys = [("t", 0, offset, f"q-{offset}") for offset in range(3)]
    result = InferenceResult(id="q-1", status="ok", lane=Lane.REALTIME, path=AnswerPath("light"))
    outcomes = lane_outcomes(
        [(key, routed) for key in keys], [(keys[0], result)], [keys[1], ("t", 0, 99, "x")]
    )
    assert outcomes[("t", 0, 0)] == Outcome("q-1", "realtime", "light", "ok")
    assert outcomes[("t", 0, 1)] == Outcome("q-1", "realtime", "light", "retry")
    assert outcomes[("t", 0, 2)] == Outcome("q-1", "realtime", "light", "error", "INF-502")
    assert ("t", 0, 99) not in outcomes  # not a readable record of the batch
    refused = Outcome.of_result(InferenceResult.failure("q-9", InvalidRequest("bad")))
    assert refused == Outcome("q-9", None, None, "error", "INF-400")


def test_classifier_outcomes_from_real_classifications() -> None:
    settings = Settings()
    now = 1_700_000_000_000

    def classify(value: bytes) -> Outcome:
        source = SourceRecord(value, b"k", now - 5, "laneway.requests", 0, 7)
        classified = classify_record(source, now_ms=now, settings=settings, rules=RuleBook())
        return classified_outcome(classified)

    routed = classify(b'{"id": "c-1", "prompt": "Explain how tides work.", "lane": "medium"}')
    assert (routed.request_id, routed.lane, routed.status) == ("c-1", "medium", "routed")
    assert routed.path is not None and routed.error_code is None
    ruled = classify(b'{"id": "c-2", "prompt": "Hello!"}')
    assert (ruled.request_id, ruled.path, ruled.status) == ("c-2", "rules", "ok")
    refused = classify(b'{"id": "c-3", "prompt": "hi", "max_tokens": 0}')
    assert (refused.request_id, refused.status, refused.error_code) == ("c-3", "error", "INF-400")
    assert classify(b"not json") == UNREADABLE


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_otel_env")
def test_no_endpoint_no_exporter() -> None:
    settings = Settings()
    assert settings.tracing.traces_url is None
    assert exporter_for(settings.tracing, "classifier") is None


@pytest.mark.usefixtures("no_otel_env")
def test_the_endpoint_is_laneways_own_then_the_otel_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318/")
    assert TracingSettings().traces_url == "http://base:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://full:4318/custom/path")
    assert TracingSettings().traces_url == "http://full:4318/custom/path"  # as it is
    monkeypatch.setenv("LANEWAY_TRACING_OTLP_ENDPOINT", "http://own:4318")
    assert TracingSettings().traces_url == "http://own:4318/v1/traces"
    monkeypatch.setenv("LANEWAY_TRACING_OTLP_ENDPOINT", "http://own:4318/v1/traces")
    assert TracingSettings().traces_url == "http://own:4318/v1/traces"
    monkeypatch.setenv("LANEWAY_TRACING_SERVICE_NAME", "edge")
    exporter = exporter_for(Settings().tracing, "worker-realtime")
    assert exporter is not None and exporter.url == "http://own:4318/v1/traces"
    assert exporter.attributes["service.name"] == "edge-worker-realtime"
    assert exporter.attributes["service.instance.id"]
    exporter.close(timeout_s=0.1)


def test_resource_names_the_process() -> None:
    attrs = resource("laneway-classifier", "abc")
    assert attrs["service.name"] == "laneway-classifier"
    assert attrs["service.instance.id"] == "abc"
    assert attrs["service.version"]
    assert resource("x")["service.instance.id"] != resource("x")["service.instance.id"]


class Receiver:
    """A real OTLP/HTTP receiver on a local port: keeps what was POSTed."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[tuple[str, str, ExportTraceServiceRequest]] = []
        self.status = status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(
                    (
                        self.path,
                        self.headers["Content-Type"],
                        ExportTraceServiceRequest.FromString(body),
                    )
                )
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[Span]:
        return [
            span
            for _, _, request in self.requests
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


def wait_for(check: Any, timeout_s: float = 10.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.02)


def test_spans_are_sent_every_interval(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = SpanExporter(receiver.url, RESOURCE, flush_interval_s=0.1)
    before = counted("exported")
    items = [handled() for _ in range(3)]
    with caplog.at_level(logging.DEBUG):
        exporter.processed(items, group="g", start_ns=time.time_ns())
        wait_for(lambda: counted("exported") == before + 3)
    path, ctype, _ = receiver.requests[0]
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    assert [s.span_id.hex() for s in receiver.spans()] == [h.own.span_id for h in items]
    # A healthy export logs nothing (it happens every second in every process).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    exporter.close()


def test_a_full_batch_is_sent_before_the_interval(receiver: Receiver) -> None:
    exporter = SpanExporter(receiver.url, RESOURCE, flush_interval_s=60, max_batch=4)
    exporter.processed([handled() for _ in range(4)], group="g", start_ns=1)
    wait_for(lambda: len(receiver.spans()) == 4, timeout_s=5)
    exporter.close()


def test_close_flushes_what_is_queued(receiver: Receiver) -> None:
    exporter = SpanExporter(receiver.url, RESOURCE, flush_interval_s=60)
    exporter.processed([handled() for _ in range(5)], group="g", start_ns=1)
    exporter.close(timeout_s=5)
    assert len(receiver.spans()) == 5
    assert not exporter.record(process_span(handled(), group="g", start_ns=1, end_ns=2))


def test_an_unreachable_collector_is_logged_once_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    exporter = SpanExporter(url, RESOURCE, flush_interval_s=0.05, timeout_s=1.0)
    failed = counted("failed")
    with caplog.at_level(logging.DEBUG, logger="streams.kafka.otlp"):
        for _ in range(3):
            exporter.processed([handled()], group="g", start_ns=1)
            wait_for(lambda: exporter.queued == 0)
        wait_for(lambda: counted("failed") == failed + 3)
        exporter.close(timeout_s=1)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "OTLP export" in warnings[0].getMessage()
    assert exporter.failing


def test_a_refusing_collector_counts_failures_then_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Receiver(status=503)
    server.thread.start()
    try:
        exporter = SpanExporter(server.url, RESOURCE, flush_interval_s=60)
        failed = counted("failed")
        with caplog.at_level(logging.INFO, logger="streams.kafka.otlp"):
            exporter.record(process_span(handled(), group="g", start_ns=1, end_ns=2))
            assert exporter.flush() == 0 and exporter.failing
            assert counted("failed") == failed + 1
            server.status = 200
            exporter.record(process_span(handled(), group="g", start_ns=1, end_ns=2))
            assert exporter.flush() == 1 and not exporter.failing
        exporter.close(timeout_s=0.1)
    finally:
        server.server.shutdown()
        server.server.server_close()
    messages = [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name == "streams.kafka.otlp"
    ]
    assert [level for level, _ in messages] == [logging.WARNING, logging.INFO]
    assert "answers again" in messages[1][1]


def test_a_result_span_carries_the_genai_attributes() -> None:
    from schemas.messages import InferenceRequest, Usage
    from streams.kafka.spans import gen_ai_attributes

    result = InferenceResult(
        id="r-9",
        status="ok",
        output="Paris",
        model="llamacpp:smollm2-135m",
        finish_reason="length",
        usage=Usage(prompt_tokens=7, completion_tokens=3),
    )
    request = InferenceRequest(id="r-9", prompt="?", max_tokens=3, stop=["\n"])
    attributes = dict(gen_ai_attributes(result, request))
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.response.id": "r-9",
        "gen_ai.response.model": "llamacpp:smollm2-135m",
        "gen_ai.response.finish_reasons": ("length",),
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.request.max_tokens": 3,
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.stop_sequences": ("\n",),
    }
