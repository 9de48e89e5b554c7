"""Spans on OpenTelemetry's SDK, exported over OTLP/HTTP: what a span says,
which spans are exported, the endpoint settings, and exports to a real
(local) HTTP receiver, healthy, refusing, unreachable or hanging."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
from streams.kafka.otlp import SPANS, RecordSpans, resource, spans_for
from streams.kafka.spans import UNREADABLE, Outcome, classified_outcome, lane_outcomes
from streams.kafka.tracing import TRACEPARENT, TRACESTATE, read, trace_headers
from streams.rules.engine import RuleBook

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE_ID}-{PARENT_ID}-01".encode()
UNSAMPLED = f"00-{TRACE_ID}-{PARENT_ID}-00".encode()
OK = Outcome("r-1", "realtime", "light", "ok")


@dataclass(frozen=True)
class Record:
    """A consumed lane record, as far as a span reads it."""

    headers: tuple[tuple[str, bytes], ...] = ((TRACEPARENT, SAMPLED),)
    topic: str = "laneway.lane.realtime"
    partition: int = 2
    offset: int = 41


def tracing(url: str | None, **options: Any) -> TracingSettings:
    """Settings with ``url`` as the only endpoint (the environment's OTEL ones ignored)."""
    endpoints = {"otlp_endpoint": url, "otel_traces_endpoint": None, "otel_endpoint": None}
    return TracingSettings().model_copy(update={**endpoints, **options})


def attributes(span: Span) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        if kind == "array_value":
            value = tuple(getattr(v, v.WhichOneof("value")) for v in value.values)
        values[kv.key] = value
    return values


def counted(outcome: str) -> float:
    """``laneway_trace_spans_total{outcome}`` now."""
    return SPANS.labels(outcome)._value.get()  # type: ignore[no-any-return]


class Receiver:
    """A real OTLP/HTTP receiver on a local port: keeps what was POSTed,
    answers ``status``; while ``hold`` is set it answers nothing."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[tuple[str, str, ExportTraceServiceRequest]] = []
        self.status = status
        self.hold = threading.Event()
        self.held = threading.Event()
        """Set once an export is being held."""
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.hold.is_set():
                    receiver.held.set()
                    receiver.release.wait(30)  # a collector that hangs
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
        self.server.daemon_threads = True
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

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.thread.start()
    yield server
    server.close()


def wait_for(check: Any, timeout_s: float = 10.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.02)


def span_id(span: Any) -> str:
    """The span id a record produced for ``span`` carries."""
    context = read(trace_headers(span))
    assert context is not None
    return f"{context.span_id:016x}"


def test_a_span_follows_the_messaging_conventions(receiver: Receiver) -> None:
    spans = spans_for(tracing(receiver.url, service_name="edge"), "worker-realtime", "laneway.w")
    span = spans.start(Record(), start_ns=1_700_000_000_000_000_000)
    own = span_id(span)
    spans.finish([(span, OK)], end_ns=1_700_000_000_250_000_000)
    spans.close(timeout_s=5)

    (request,) = [request for _, _, request in receiver.requests]
    (resource_spans,) = request.resource_spans
    process = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert process["service.name"] == "edge-worker-realtime"
    assert process["service.instance.id"] and process["service.version"]
    (scope,) = resource_spans.scope_spans
    assert scope.scope.name == "laneway"
    (exported,) = scope.spans
    assert exported.name == "process laneway.lane.realtime"
    assert exported.kind == Span.SpanKind.SPAN_KIND_CONSUMER
    assert exported.trace_id.hex() == TRACE_ID and len(exported.trace_id) == 16
    assert exported.span_id.hex() == own and len(exported.span_id) == 8
    assert exported.parent_span_id.hex() == PARENT_ID
    assert (exported.start_time_unix_nano, exported.end_time_unix_nano) == (
        1_700_000_000_000_000_000,
        1_700_000_000_250_000_000,
    )
    assert attributes(exported) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "laneway.lane.realtime",
        "messaging.destination.partition.id": "2",
        "messaging.kafka.offset": 41,
        "messaging.consumer.group.name": "laneway.w",
        "laneway.request.id": "r-1",
        "laneway.lane": "realtime",
        "laneway.path": "light",
        "laneway.status": "ok",
    }
    assert exported.status.code == Status.StatusCode.STATUS_CODE_UNSET


def test_an_error_span_a_root_span_and_a_tracestate(receiver: Receiver) -> None:
    result = InferenceResult.failure(
        "r-2", BackendUnavailable("no path"), lane=Lane.MEDIUM, path=AnswerPath("heavy")
    )
    outcome = Outcome.of_result(result)
    assert outcome == Outcome("r-2", "medium", "heavy", "error", "INF-502")
    spans = spans_for(tracing(receiver.url), "worker-medium", "g")
    failed = spans.start(Record(((TRACEPARENT, SAMPLED), (TRACESTATE, b"vendor=v1"))))
    root = spans.start(Record(headers=()), start_ns=time.time_ns() + 10**9)
    spans.finish([(failed, outcome), (root, UNREADABLE)])  # root: never ends before it starts
    spans.close(timeout_s=5)

    by_id = {s.span_id.hex(): s for s in receiver.spans()}
    first, second = by_id[span_id(failed)], by_id[span_id(root)]
    assert first.status.code == Status.StatusCode.STATUS_CODE_ERROR
    assert first.status.message == "INF-502"
    assert attributes(first)["laneway.error_code"] == "INF-502"
    assert attributes(first)["error.type"] == "INF-502"
    assert first.trace_state == "vendor=v1"  # the client's tracestate, on the span too
    assert second.parent_span_id == b"" and second.trace_id.hex() != TRACE_ID
    assert second.status.message == "INF-400"
    assert second.end_time_unix_nano == second.start_time_unix_nano


def test_only_sampled_traces_are_exported(receiver: Receiver) -> None:
    spans = spans_for(tracing(receiver.url), "classifier", "g")
    unsampled = spans.start(Record(((TRACEPARENT, UNSAMPLED),)))
    sampled = spans.start(Record())
    assert not unsampled.is_recording()
    spans.finish([(unsampled, OK), (sampled, OK)])
    spans.close(timeout_s=5)
    assert [s.span_id.hex() for s in receiver.spans()] == [span_id(sampled)]


def test_spans_are_sent_every_interval_and_a_healthy_export_logs_nothing(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    spans = spans_for(tracing(receiver.url, flush_interval_s=0.1), "classifier", "g")
    before = counted("exported")
    started = [spans.start(Record()) for _ in range(3)]
    with caplog.at_level(logging.DEBUG):
        spans.finish((span, OK) for span in started)
        wait_for(lambda: counted("exported") == before + 3)
    path, ctype, _ = receiver.requests[0]
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    assert sorted(s.span_id.hex() for s in receiver.spans()) == sorted(map(span_id, started))
    # A healthy export logs nothing (it happens every second in every process).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    spans.close()


def test_a_full_batch_is_sent_before_the_interval(receiver: Receiver) -> None:
    # The batch is the queue's size when that is below 512.
    spans = spans_for(tracing(receiver.url, flush_interval_s=60, queue_size=4), "classifier", "g")
    spans.finish((spans.start(Record()), OK) for _ in range(4))
    wait_for(lambda: len(receiver.spans()) == 4, timeout_s=5)
    spans.close()


def test_close_flushes_what_is_queued(receiver: Receiver) -> None:
    spans = spans_for(tracing(receiver.url, flush_interval_s=60), "classifier", "g")
    spans.finish((spans.start(Record()), OK) for _ in range(5))
    assert receiver.spans() == []
    spans.close(timeout_s=5)
    assert len(receiver.spans()) == 5


def test_an_unreachable_collector_is_logged_once_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    spans = spans_for(tracing(url, flush_interval_s=0.05, export_timeout_s=0.5), "classifier", "g")
    assert spans.exporter is not None
    failed = counted("failed")
    with caplog.at_level(logging.DEBUG, logger="streams.kafka.otlp"):
        for i in range(3):
            spans.finish([(spans.start(Record()), OK)])
            wait_for(lambda i=i: counted("failed") == failed + i + 1)
        spans.close(timeout_s=1)
    warnings = [r for r in caplog.records if r.name == "streams.kafka.otlp"]
    assert len(warnings) == 1 and "OTLP export" in warnings[0].getMessage()
    assert warnings[0].levelno == logging.WARNING
    assert spans.exporter.failing


def test_a_hanging_collector_never_blocks_a_request_and_shutdown_is_bounded(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.hold.set()  # takes the export, never answers
    spans = spans_for(
        tracing(receiver.url, flush_interval_s=0.05, queue_size=8, export_timeout_s=30),
        "classifier",
        "g",
    )
    spans.finish([(spans.start(Record()), OK)])
    wait_for(receiver.held.is_set)  # the export is in flight, stuck on the collector
    taken = time.monotonic()
    with caplog.at_level(logging.WARNING):
        for _ in range(20):  # twenty batches' worth: the queue fills, the oldest go
            spans.finish((spans.start(Record()), OK) for _ in range(50))
        finishing = time.monotonic() - taken
        taken = time.monotonic()
        spans.close(timeout_s=0.5)
        closing = time.monotonic() - taken
    assert finishing < 1.0, f"finishing 1,000 spans took {finishing:.2f}s"
    assert closing < 2.0, f"close took {closing:.2f}s"
    # The SDK's warning for each span a full queue drops, said once.
    assert len([r for r in caplog.records if "Queue full" in r.getMessage()]) == 1
    assert any("last flush took over" in r.getMessage() for r in caplog.records)


def test_a_refusing_collector_counts_failures_then_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Receiver(status=400)  # not a transient status: no retry
    server.thread.start()
    try:
        spans = spans_for(tracing(server.url, flush_interval_s=60), "classifier", "g")
        assert spans.exporter is not None
        failed, exported = counted("failed"), counted("exported")
        with caplog.at_level(logging.INFO, logger="streams.kafka.otlp"):
            spans.finish([(spans.start(Record()), OK)])
            spans.provider.force_flush()
            assert spans.exporter.failing and counted("failed") == failed + 1
            server.status = 200
            spans.finish([(spans.start(Record()), OK)])
            spans.provider.force_flush()
            assert not spans.exporter.failing and counted("exported") == exported + 1
        spans.close(timeout_s=1)
    finally:
        server.close()
    messages = [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name == "streams.kafka.otlp"
    ]
    assert [level for level, _ in messages] == [logging.WARNING, logging.INFO]
    assert "answers again" in messages[1][1]


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
def test_no_endpoint_nothing_is_exported() -> None:
    settings = Settings()
    assert settings.tracing.traces_url is None
    spans = spans_for(settings.tracing, "classifier", "g")
    assert not spans.exporting and spans.exporter is None
    span = spans.start(Record())
    assert read(trace_headers(span)) is not None  # the trace is carried all the same
    spans.finish([(span, OK)])
    spans.close()


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
    spans: RecordSpans = spans_for(Settings().tracing, "worker-realtime", "g")
    assert spans.exporter is not None and spans.exporter.url == "http://own:4318/v1/traces"
    process = spans.provider.resource.attributes
    assert process["service.name"] == "edge-worker-realtime"
    assert process["service.instance.id"]
    spans.close(timeout_s=0.1)


def test_resource_names_the_process() -> None:
    attrs = resource("laneway-classifier", "abc").attributes
    assert attrs["service.name"] == "laneway-classifier"
    assert attrs["service.instance.id"] == "abc"
    assert attrs["service.version"]
    assert attrs["telemetry.sdk.name"] == "opentelemetry"
    first, second = resource("x").attributes, resource("x").attributes
    assert first["service.instance.id"] != second["service.instance.id"]


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
