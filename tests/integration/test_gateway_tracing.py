"""One trace from an HTTP client to the model: OpenAI's SDK sends a W3C
``traceparent`` to the gateway (``GatewayServer`` in the test's process,
exporting to the session's OTLP receiver), whose SERVER span is its child
and the parent of the classifier's span, whose child is the lane
worker's; JSON and SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import openai
import pytest
from openai import AsyncOpenAI
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.trace import NonRecordingSpan

from schemas.settings import Settings
from streams.gateway.server import GatewayServer
from streams.kafka.tracing import trace_headers
from tests.integration.conftest import OtlpReceiver
from tests.integration.test_tracing import assert_consumer_span, new_trace, spans_of

NO_CACHE = {"X-Laneway-Cache": "bypass"}
Started = Callable[[], AbstractAsyncContextManager[GatewayServer]]


@pytest.fixture
def gateway(settings: Settings, otlp: OtlpReceiver) -> Started:
    """Start a gateway on the session stack that exports its spans to the
    stack's OTLP receiver, as the stack's processes do."""

    @asynccontextmanager
    async def start() -> AsyncIterator[GatewayServer]:
        options = settings.gateway.model_copy(update={"port": 0, "deadline_grace_s": 60.0})
        tracing = settings.tracing.model_copy(update={"otlp_endpoint": otlp.endpoint})
        update = {"gateway": options, "tracing": tracing}
        async with GatewayServer(settings.model_copy(update=update)) as server:
            yield server

    return start


def sdk(server: GatewayServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key="anything", max_retries=0, timeout=120)


def http_headers(**state: str) -> dict[str, str]:
    """A new sampled trace's ``traceparent`` (and ``tracestate``), as an
    instrumented HTTP client sends them."""
    trace = new_trace(state=state.get("state"))
    return {k: v.decode() for k, v in trace_headers(NonRecordingSpan(trace))}


def attributes(span: Span) -> dict[str, object]:
    """A span's attributes, an array as a tuple."""
    values: dict[str, object] = {}
    for kv in span.attributes:
        value = getattr(kv.value, str(kv.value.WhichOneof("value")))
        if kv.value.HasField("array_value"):
            value = tuple(getattr(v, str(v.WhichOneof("value"))) for v in value.values)
        values[kv.key] = value
    return values


def by_service(spans: list[tuple[str, Span]]) -> dict[str, Span]:
    found = dict(spans)
    assert len(found) == len(spans), [name for name, _ in spans]  # one span per process
    return found


def assert_gateway_span(span: Span, model: str) -> dict[str, object]:
    """The gateway's SERVER span of a chat completion (GenAI and HTTP
    server conventions); returns its attributes."""
    assert span.kind == Span.SpanKind.SPAN_KIND_SERVER
    assert span.name == f"chat {model}"
    assert 0 < span.start_time_unix_nano <= span.end_time_unix_nano
    attrs = attributes(span)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "laneway"
    assert attrs["gen_ai.request.model"] == model
    assert attrs["http.request.method"] == "POST"
    assert attrs["http.route"] == "/v1/chat/completions"
    assert attrs["url.path"] == "/v1/chat/completions"
    assert attrs["server.address"] == "127.0.0.1" and isinstance(attrs["server.port"], int)
    assert str(attrs["user_agent.original"]).startswith("AsyncOpenAI/Python")
    return attrs


async def test_a_chat_completion_is_one_trace_from_the_http_client_to_the_model(
    gateway: Started, otlp: OtlpReceiver, settings: Settings
) -> None:
    sent = http_headers(state="client=c1")
    async with gateway() as server:
        raw = await sdk(server).chat.completions.with_raw_response.create(
            model="light",
            messages=[{"role": "user", "content": "In one word, what colour is the sky?"}],
            max_tokens=4,
            extra_headers={**sent, **NO_CACHE},
        )
    answer = raw.parse()
    request_id = raw.headers["x-laneway-request-id"]
    assert "traceparent" not in raw.headers  # the response carries none (docs/gateway.md)
    trace_id, client_span = sent["traceparent"].split("-")[1:3]

    spans = by_service(await spans_of(otlp, trace_id, 3))
    gw, classifier = spans.pop("laneway-gateway"), spans.pop("laneway-classifier")
    ((worker_service, worker),) = spans.items()
    lane = str(attributes(classifier)["laneway.lane"])
    assert worker_service == f"laneway-worker-{lane}"
    # The HTTP client's span -> the gateway's -> the classifier's -> the worker's.
    assert gw.parent_span_id.hex() == client_span
    assert classifier.parent_span_id == gw.span_id
    assert worker.parent_span_id == classifier.span_id
    assert gw.trace_state == classifier.trace_state == worker.trace_state == "client=c1"
    assert gw.start_time_unix_nano <= classifier.start_time_unix_nano

    attrs = assert_gateway_span(gw, "light")
    assert answer.usage is not None
    assert attrs["gen_ai.response.id"] == answer.id == f"chatcmpl-{request_id}"
    assert attrs["gen_ai.response.model"] == answer.model
    assert attrs["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens > 0
    assert attrs["gen_ai.response.finish_reasons"] == (answer.choices[0].finish_reason,)
    assert attrs["gen_ai.request.max_tokens"] == 4
    assert attrs["http.response.status_code"] == 200
    assert attrs["laneway.request.id"] == request_id
    assert (attrs["laneway.lane"], attrs["laneway.path"]) == (lane, "light")
    assert attrs["laneway.status"] == "ok" and "laneway.error_code" not in attrs
    assert gw.status.code == Status.StatusCode.STATUS_CODE_UNSET
    routed = assert_consumer_span(classifier, settings.topic("requests"), settings.app_id)
    assert routed["laneway.request.id"] == request_id


async def test_a_stream_without_a_traceparent_starts_the_trace_at_the_gateway(
    gateway: Started, otlp: OtlpReceiver
) -> None:
    async with gateway() as server:
        stream = await sdk(server).chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": "Describe the sea in one sentence."}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=NO_CACHE,
        )
        request_id = stream.headers["x-laneway-request-id"]
        chunks = [chunk async for chunk in stream.parse()]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0

    # The gateway's close flushed its spans: its span of the stream is there.
    (gw,) = [
        s
        for name, s in list(otlp.spans)
        if name == "laneway-gateway" and attributes(s).get("laneway.request.id") == request_id
    ]
    assert gw.parent_span_id == b""  # the root: the client sent no traceparent
    spans = by_service(await spans_of(otlp, gw.trace_id.hex(), 3))
    assert spans["laneway-classifier"].parent_span_id == gw.span_id
    lane = str(attributes(spans["laneway-classifier"])["laneway.lane"])
    assert spans[f"laneway-worker-{lane}"].parent_span_id == spans["laneway-classifier"].span_id

    attrs = assert_gateway_span(gw, "auto")
    assert attrs["gen_ai.response.id"] == chunks[0].id == f"chatcmpl-{request_id}"
    assert attrs["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert attrs["gen_ai.response.model"] == chunks[0].model
    assert (attrs["http.response.status_code"], attrs["laneway.status"]) == (200, "ok")
    assert attrs["laneway.lane"] == lane


async def test_a_refused_request_has_an_error_code_and_no_error_status(
    gateway: Started, otlp: OtlpReceiver
) -> None:
    sent = http_headers()
    async with gateway() as server:
        with pytest.raises(openai.BadRequestError, match="gpt-4o"):
            await sdk(server).chat.completions.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": "Hi"}],
                extra_headers=sent,
            )
    trace_id, client_span = sent["traceparent"].split("-")[1:3]
    # The classifier refused it (a model it does not know): its span, the gateway's child.
    spans = by_service(await spans_of(otlp, trace_id, 2))
    gw, classifier = spans["laneway-gateway"], spans["laneway-classifier"]
    assert gw.parent_span_id.hex() == client_span and classifier.parent_span_id == gw.span_id
    assert attributes(classifier)["laneway.error_code"] == "INF-400"
    assert classifier.status.code == Status.StatusCode.STATUS_CODE_ERROR  # laneway's own view
    attrs = assert_gateway_span(gw, "gpt-4o")
    assert attrs["http.response.status_code"] == 400
    assert attrs["laneway.error_code"] == attrs["error.type"] == "INF-400"
    assert attrs["laneway.status"] == "error"
    assert gw.status.code == Status.StatusCode.STATUS_CODE_UNSET  # a 4xx is the client's
