"""The gateway's HTTP routes (aiohttp):

- ``POST /v1/chat/completions``: a ``chat.completion``, or with
  ``stream: true`` server-sent ``chat.completion.chunk`` events ending in
  ``data: [DONE]`` (an error event instead when the stream fails mid-way);
- ``GET /v1/models`` and ``GET /v1/models/{id}``: ``auto`` and the model
  registry's paths, each with its versions and their live roll-out state;
- ``POST /v1/feedback``: a verdict on an answer, onto ``<p>.feedback``;
- the Batch API (``/v1/files``, ``/v1/batches``): ``streams.gateway.batches``.

Every request names its API key (``Authorization: Bearer``), which names
its tenant and limits (counted in Redis, shared by every replica:
``streams.gateway.shared_limits``); the gateway sets the request's
``tenant``. One ``LanewayClient`` carries every request, on the gateway's
own reply topic. A client that goes away cancels its request (the decode
stops).

Each chat completion is a SERVER span (``streams.gateway.tracing``), a
child of the request's ``traceparent``; the request record carries the
span's context, so laneway's spans of the request are its children.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span

from schemas.messages import InferenceRequest, InferenceResult
from schemas.settings import GatewaySettings
from streams.chunks import StreamDelta
from streams.client import LanewayClient
from streams.gateway import metrics, tracing
from streams.gateway.batches import BatchApi
from streams.gateway.bodies import json_object
from streams.gateway.errors import GatewayError, from_error_info
from streams.gateway.feedback import parse_feedback
from streams.gateway.keys import ApiKey, KeyRing
from streams.gateway.shared_limits import SharedLimiter
from streams.gateway.sse import ChunkEvents
from streams.gateway.tracing import ANSWER_ERROR, CHAT_ROUTE, SPAN
from streams.gateway.translate import (
    AUTO_MODEL,
    Knobs,
    completion,
    knobs_from_headers,
    laneway_headers,
    parse_request,
    to_request,
)
from streams.kafka.otlp import ServerSpans
from streams.kafka.tracing import TraceHeaders, trace_headers
from streams.rollout.board import RolloutBoard
from streams.routing.registry import ModelRegistry

__all__ = ["Gateway"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gateway:
    """The routes, over one started ``LanewayClient``."""

    def __init__(
        self,
        settings: GatewaySettings,
        client: LanewayClient,
        keys: KeyRing,
        registry: ModelRegistry,
        limiter: SharedLimiter,
        *,
        board: RolloutBoard | None = None,
        board_refresh_s: float = 2.0,
        batches: BatchApi | None = None,
        default_tenant: str | None = None,
        spans: ServerSpans | None = None,
    ) -> None:
        """``board``: the live roll-out state shown by ``/v1/models`` (read
        at most every ``board_refresh_s``; ``None``: the registry file's).
        ``spans``: the process's (``None``: carried, never exported)."""
        self.settings = settings
        self.client = client
        self.keys = keys
        self.registry = registry
        self.default_tenant = default_tenant
        self.limiter = limiter
        self.board = board
        self.board_refresh_s = board_refresh_s
        self.batches = batches
        self.spans = spans if spans is not None else ServerSpans(TracerProvider())
        self._board_read = float("-inf")

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._traced, self._errors], client_max_size=self.settings.max_body_bytes
        )
        app.router.add_post(CHAT_ROUTE, self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_post("/v1/feedback", self.feedback)
        if self.batches is not None:
            self.batches.add_routes(app.router, self._tenant_of)
        return app

    # -- middleware ----------------------------------------------------------

    @web.middleware
    async def _traced(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A chat completion's span, from the request coming in to its
        answer's end (a stream's last event), around ``_errors``: it sees
        the status the client gets."""
        resource = request.match_info.route.resource
        if resource is None or resource.canonical != CHAT_ROUTE:
            return await handler(request)
        attributes = tracing.http_attributes(request) if self.spans.exporting else {}
        span = self.spans.start(tracing.span_name(None), request.headers, attributes)
        request[SPAN] = span
        try:
            response = await handler(request)
        except BaseException as exc:  # the client went away: cancelled
            self.spans.end(span, *tracing.failed_attributes(exc))
            raise
        self.spans.end(span, *tracing.ended_attributes(response.status, response.get(ANSWER_ERROR)))
        return response

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Errors as OpenAI's error object; request counts and latency."""
        begun = time.perf_counter()
        resource = request.match_info.route.resource
        endpoint = resource.canonical if resource is not None else "other"
        try:
            response = await handler(request)
        except GatewayError as exc:
            response = _error_response(exc)
        except web.HTTPException as exc:
            code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
            response = _error_response(
                GatewayError(exc.status, exc.reason, code.get(exc.status, str(exc.status)))
            )
        except asyncio.CancelledError:  # the client went away (its request is cancelled)
            metrics.REQUESTS.labels(endpoint, "499").inc()
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            response = _error_response(
                GatewayError(500, "the gateway failed; see its log", "internal_error")
            )
        status = str(response.status)
        metrics.REQUESTS.labels(endpoint, status).inc()
        metrics.REQUEST_SECONDS.labels(endpoint, status).observe(time.perf_counter() - begun)
        return response

    # -- keys and limits -------------------------------------------------------

    def _key(self, request: web.Request) -> ApiKey | None:
        """The caller's key; ``None`` while no keys are configured (any
        key is accepted). 401 for a key the gateway does not know."""
        presented = _bearer(request.headers.get("Authorization"))
        found = self.keys.lookup(presented)
        if found is not None or self.keys.open:
            return found
        raise GatewayError(
            401,
            "Incorrect API key provided." if presented else "No API key provided.",
            "invalid_api_key",
        )

    def _tenant_of(self, request: web.Request) -> str:
        """The caller's tenant (401 for an unknown key): what scopes its
        files and batches. ``""`` for an open gateway without a default."""
        key = self._key(request)
        return key.tenant if key is not None else (self.default_tenant or "")

    async def _admit(self, key: ApiKey | None) -> None:
        if key is None:
            return
        verdict = await self.limiter.admit(key.id, rpm=key.rpm, tpm=key.tpm)
        if not verdict.admitted:
            raise GatewayError(
                429,
                f"tenant {key.tenant!r} is over its limit (key {key.id}: {verdict.requests}/"
                f"{key.rpm} requests and {verdict.tokens}/{key.tpm} tokens in the last minute); "
                f"try again in {verdict.wait_s:.1f}s",
                "INF-429",
                retry_after_ms=max(1, round(verdict.wait_s * 1000)),
            )

    async def _spend(self, key: ApiKey | None, result: InferenceResult) -> None:
        tenant = key.tenant if key is not None else (self.default_tenant or "")
        metrics.TOKENS.labels(tenant).inc(result.usage.total_tokens)
        if key is not None:
            await self.limiter.spend(key.id, result.usage.total_tokens)

    def _wait_s(self, knobs: Knobs) -> float:
        """How long to wait for an answer: the deadline and a grace, never
        more than the gateway's own bound."""
        bound = self.settings.timeout_s
        if knobs.deadline_ms is not None:
            return min(bound, knobs.deadline_ms / 1000 + self.settings.deadline_grace_s)
        return bound

    # -- routes -----------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        self._key(request)
        return web.json_response({"object": "list", "data": await self._model_list()})

    async def model(self, request: web.Request) -> web.Response:
        self._key(request)
        name = request.match_info["model"]
        for entry in await self._model_list():
            if entry["id"] == name:
                return web.json_response(entry)
        raise GatewayError(404, f"The model {name!r} does not exist", "model_not_found", "model")

    async def _live_registry(self) -> ModelRegistry:
        """The registry with the live roll-out state laid over it, read
        again at most every ``board_refresh_s`` (the board fails open: the
        last state read, else the file's)."""
        if self.board is None:
            return self.registry
        now = time.monotonic()
        if now - self._board_read >= self.board_refresh_s:
            self._board_read = now
            await self.board.refresh()
        return self.board.current.registry

    async def _model_list(self) -> list[dict[str, Any]]:
        registry = await self._live_registry()
        data: list[dict[str, Any]] = [
            {
                "id": AUTO_MODEL,
                "object": "model",
                "created": 0,
                "owned_by": "laneway",
                "laneway": {"router": "laneway's router picks the path per request"},
            }
        ]
        for path in registry.model_paths:
            versions = [
                {
                    "version": m.version,
                    "name": m.name,
                    "backend": m.backend,
                    "state": m.state,
                    "traffic_share": m.traffic_share,
                    "since_ms": self.board.since_ms(path, m.version) if self.board else 0,
                }
                for m in registry.versions(path)
            ]
            data.append(
                {
                    "id": path.value,
                    "object": "model",
                    "created": 0,
                    "owned_by": "laneway",
                    "laneway": {"path": path.value, "versions": versions},
                }
            )
        return data

    async def feedback(self, request: web.Request) -> web.Response:
        """A verdict on an answer, onto ``<p>.feedback`` (the quality loop
        reads it): ``{"id": <completion id or request id>, "score": -1..1}``
        or ``"thumbs": "up"|"down"``, and an optional ``comment``."""
        self._key(request)
        body = await json_object(request)
        verdict = parse_feedback(body)
        await self.client.feedback(verdict.request_id, verdict.score, verdict.comment)
        metrics.FEEDBACK.inc()
        return web.json_response({"object": "feedback", **verdict.model_dump(mode="json")})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        received = time.perf_counter()
        span = request[SPAN]
        key = self._key(request)
        body = await json_object(request)
        model = str(body.get("model") or AUTO_MODEL)
        tracing.named(span, model)
        knobs = knobs_from_headers(request.headers)
        request_id = f"gw-{uuid.uuid4().hex}"
        tenant = key.tenant if key is not None else self.default_tenant
        fields = to_request(
            body, request_id=request_id, tenant=tenant, reply_to=self.client.reply_to, knobs=knobs
        )
        parsed = parse_request(fields)
        tracing.asked(span, parsed, tenant)
        await self._admit(key)
        trace = trace_headers(span)  # laneway's spans of the request are the span's children
        if parsed.stream:
            return await self._stream(request, parsed, key, knobs, model, received, trace)
        return await self._complete(parsed, key, knobs, model, span, trace)

    async def _complete(
        self,
        parsed: InferenceRequest,
        key: ApiKey | None,
        knobs: Knobs,
        asked: str,
        span: Span,
        trace: TraceHeaders,
    ) -> web.Response:
        wait_s = self._wait_s(knobs)
        future = await self.client.submit(parsed, headers=trace)
        try:
            result = await asyncio.wait_for(future, wait_s)
        except TimeoutError:
            await self._give_up(parsed.id)
            raise GatewayError(
                504,
                f"no answer to request {parsed.id} within {wait_s:.0f}s "
                f"(waited for its result on {self.client.reply_to})",
                "timeout",
            ) from None
        except asyncio.CancelledError:  # the client went away
            await asyncio.shield(self._give_up(parsed.id))
            raise
        tracing.answered(span, result)
        await self._spend(key, result)
        headers = laneway_headers(
            request_id=parsed.id,
            lane=result.lane,
            path=result.path,
            model=result.model,
            version=result.version,
        )
        if result.status == "error" or result.error is not None:
            assert result.error is not None
            error = from_error_info(result.error)
            return _error_response(error, headers)
        return web.json_response(
            completion(result, created=int(time.time()), model=asked), headers=headers
        )

    async def _give_up(self, request_id: str) -> None:
        """Stop waiting for a request and cancel it (its decode stops)."""
        self.client.forget(request_id)
        try:
            await self.client.cancel(request_id)
        except Exception as exc:
            log.warning("could not cancel %s: %s", request_id, exc)

    async def _stream(
        self,
        request: web.Request,
        parsed: InferenceRequest,
        key: ApiKey | None,
        knobs: Knobs,
        asked: str,
        received: float,
        trace: TraceHeaders,
    ) -> web.StreamResponse:
        wait_s = self._wait_s(knobs)
        span = request[SPAN]
        fields = parsed.model_dump(exclude_unset=True, exclude={"messages", "stream"})
        messages = [m.model_dump() for m in parsed.messages or ()]
        deltas = self.client.stream(messages=messages, timeout_s=wait_s, headers=trace, **fields)
        include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
        async with contextlib.aclosing(deltas):  # leaving early cancels the request
            try:
                first = await anext(deltas)
            except TimeoutError:
                raise GatewayError(
                    504,
                    f"no part of the answer to request {parsed.id} within {wait_s:.0f}s "
                    f"(waited on {self.client.reply_to})",
                    "timeout",
                ) from None
            tracing.streaming(span, first)
            if first.result is not None:
                tracing.answered(span, first.result)
                await self._spend(key, first.result)
                if first.result.error is not None:  # nothing sent yet: a plain error
                    return _error_response(
                        from_error_info(first.result.error), _delta_headers(parsed.id, first)
                    )
            response = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-cache",
                    **_delta_headers(parsed.id, first),
                }
            )
            await response.prepare(request)
            metrics.TIME_TO_FIRST_BYTE.labels("/v1/chat/completions").observe(
                time.perf_counter() - received
            )
            events = ChunkEvents(
                parsed.id,
                model=first.model or asked,
                created=int(time.time()),
                include_usage=include_usage,
            )
            try:
                await _write(response, events.start())
                delta = first
                while True:
                    await _write(response, events.delta(delta))
                    if delta.result is not None and delta is not first:
                        tracing.answered(span, delta.result)
                        await self._spend(key, delta.result)
                    if events.ended:
                        break
                    try:
                        delta = await anext(deltas)
                    except TimeoutError:
                        message = f"the answer to {parsed.id} did not end within {wait_s:.0f}s"
                        await _write(response, events.fail(GatewayError(504, message, "timeout")))
                        break
            except ConnectionResetError:
                log.info("the client of %s went away; cancelling it", parsed.id)
                gone = GatewayError(499, "the client went away", tracing.CLIENT_CLOSED)
                response[ANSWER_ERROR] = gone
            if events.error is not None:
                log.info("stream %s ended with an error: %s", parsed.id, events.error)
                response[ANSWER_ERROR] = events.error
            return response


async def _write(response: web.StreamResponse, events: list[str]) -> None:
    for data in events:
        await response.write(f"data: {data}\n\n".encode())


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _delta_headers(request_id: str, delta: StreamDelta) -> dict[str, str]:
    version = delta.result.version if delta.result is not None else None
    return laneway_headers(
        request_id=request_id, lane=delta.lane, path=delta.path, model=delta.model, version=version
    )


def _error_response(error: GatewayError, headers: Mapping[str, str] | None = None) -> web.Response:
    response = web.json_response(
        error.body(), status=error.status, headers={**(headers or {}), **error.headers()}
    )
    response[ANSWER_ERROR] = error  # for the span (``_traced``)
    return response
