"""What the gateway's span of a chat completion says: one SERVER span per
``POST /v1/chat/completions`` (JSON or SSE), started and exported by
``streams.kafka.otlp.ServerSpans``, a child of the request's
``traceparent``. Its context goes on the request record the gateway
produces, so the classifier's and the workers' spans are its children.

Named as OpenTelemetry's GenAI conventions name an inference span (``chat
{gen_ai.request.model}``; ``chat`` until the body names a model), with
their ``gen_ai.*`` attributes, the HTTP server conventions' (``http.*``,
``url.*``, ``server.*``) and laneway's own (``laneway.request.id``,
``.tenant``, ``.lane``, ``.path``, ``.status``, ``.error_code``).

Status, as the HTTP server conventions have it: ERROR for a 5xx, for a
stream that failed after its first byte (a 200 already sent) and for a
request whose client went away; a 4xx is the client's and leaves it
unset. Every error answer has ``laneway.error_code`` and ``error.type``
(laneway's error code, or the gateway's own: ``timeout``, ...); a client
that went away, ``client_closed`` (``laneway.status`` ``cancelled``).

The functions that take a span set nothing on a span that records
nothing (no endpoint, an unsampled trace), so they cost nothing there.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from opentelemetry.trace import Span

from schemas.messages import InferenceRequest, InferenceResult
from streams.chunks import StreamDelta
from streams.gateway.errors import GatewayError
from streams.kafka.spans import Attribute, gen_ai_attributes, gen_ai_request_attributes

__all__ = [
    "ANSWER_ERROR",
    "CHAT_ROUTE",
    "CLIENT_CLOSED",
    "PROVIDER",
    "SPAN",
    "answered",
    "asked",
    "ended_attributes",
    "failed_attributes",
    "http_attributes",
    "named",
    "span_name",
    "streaming",
]

CHAT_ROUTE = "/v1/chat/completions"
"""The route whose requests have a span."""
OPERATION = "chat"
CLIENT_CLOSED = "client_closed"
"""The error code of a request whose client went away before its answer ended."""
PROVIDER = "laneway"
"""``gen_ai.provider.name``: the service that answers (laneway picks the model)."""

SPAN = web.RequestKey("laneway_span", Span)
"""A traced request's span (the gateway's middleware puts it there)."""
ANSWER_ERROR = web.ResponseKey("laneway_error", GatewayError)
"""The error an answer carries: an error response's, or the one a stream
ended with after its first byte."""


def span_name(model: str | None) -> str:
    """``chat <model>``; ``chat`` while the model is not known."""
    return f"{OPERATION} {model}" if model else OPERATION


def http_attributes(request: web.BaseRequest) -> dict[str, Attribute]:
    """What the span knows when the request comes in: the HTTP server
    conventions' attributes and the GenAI operation."""
    url = request.url
    attributes: dict[str, Attribute] = {
        "http.request.method": request.method,
        "http.route": CHAT_ROUTE,
        "url.path": request.path,
        "url.scheme": request.scheme,
        "network.protocol.version": f"{request.version.major}.{request.version.minor}",
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": PROVIDER,
    }
    if url.host:
        attributes["server.address"] = url.host
    if url.port is not None:
        attributes["server.port"] = url.port
    if request.remote:
        attributes["client.address"] = request.remote
    agent = request.headers.get("User-Agent")
    if agent:
        attributes["user_agent.original"] = agent
    return attributes


def named(span: Span, model: str) -> None:
    """The body names ``model`` (``auto``: laneway's router chooses)."""
    if span.is_recording():
        span.update_name(span_name(model))
        span.set_attribute("gen_ai.request.model", model)


def asked(span: Span, request: InferenceRequest, tenant: str | None) -> None:
    """The request the body became: its id, tenant and what it asks of the model."""
    if span.is_recording():
        span.set_attribute("laneway.request.id", request.id)
        if tenant:
            span.set_attribute("laneway.tenant", tenant)
        span.set_attributes(dict(gen_ai_request_attributes(request)))


def streaming(span: Span, first: StreamDelta) -> None:
    """A stream's first piece: the lane, path and model it comes from."""
    if span.is_recording():
        if first.lane is not None:
            span.set_attribute("laneway.lane", first.lane.value)
        if first.path is not None:
            span.set_attribute("laneway.path", first.path.value)
        if first.model is not None:
            span.set_attribute("gen_ai.response.model", first.model)


def answered(span: Span, result: InferenceResult) -> None:
    """laneway's answer: the model, usage, finish reason, lane and path;
    its id is the completion's (``chatcmpl-<request id>``), as the client sees it."""
    if span.is_recording():
        attributes: dict[str, Any] = dict(gen_ai_attributes(result))
        attributes["gen_ai.response.id"] = f"chatcmpl-{result.id}"
        if result.lane is not None:
            attributes["laneway.lane"] = result.lane.value
        if result.path is not None:
            attributes["laneway.path"] = result.path.value
        span.set_attributes(attributes)


def ended_attributes(
    status: int, error: GatewayError | None
) -> tuple[dict[str, Attribute], str | None]:
    """The attributes of an answer with HTTP ``status`` (and ``error``,
    if it is one or a stream ended with one), and the span's ERROR
    message, ``None`` when the span did not fail (see the module docstring)."""
    attributes: dict[str, Attribute] = {"http.response.status_code": status}
    if error is None and status < 400:
        attributes["laneway.status"] = "ok"
        return attributes, None
    code = error.code if error is not None else str(status)
    attributes.update(_failure(code))
    failed = status >= 500 or status < 400  # a 5xx, or a stream that failed after its 200
    return attributes, code if failed else None


def failed_attributes(exc: BaseException) -> tuple[dict[str, Attribute], str]:
    """The attributes of a request that ended with ``exc`` and no answer
    (``CancelledError``: its client went away, or the gateway stopped while
    it waited), and the span's ERROR message. Another exception (none
    should get past the gateway's error middleware) is named by its
    qualified name, as the HTTP conventions' ``error.type`` has it."""
    if isinstance(exc, asyncio.CancelledError):
        return _failure(CLIENT_CLOSED), CLIENT_CLOSED
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return {"laneway.status": "error", "error.type": kind}, str(exc) or kind


def _failure(code: str) -> dict[str, Attribute]:
    status = "cancelled" if code == CLIENT_CLOSED else "error"
    return {"laneway.status": status, "laneway.error_code": code, "error.type": code}
