"""OpenAI's chat completion body <-> laneway's request and result. Pure
functions: no HTTP, no Kafka.

``to_request`` is the one place an OpenAI body becomes a laneway request:

- ``messages``: ``system``/``user``/``assistant`` as they are, ``developer``
  as ``system``; a content of text parts joined by newlines. Tool calls,
  tool results and non-text parts are refused (400).
- ``model``: ``auto`` (or none) leaves the choice to laneway's router, so
  no field; any other name is passed on as ``model``.
- ``max_tokens``, ``temperature``, ``seed``, ``stream``, ``stream_options``
  as they are; ``stop`` as a list (a string becomes a list of one).
- ``top_p``, ``user``, ``n`` and ``max_completion_tokens``: passed on only
  when the client sent them. (The wire takes them once the change that adds
  them lands; until then laneway refuses such a request with INF-400.)
- ``n`` above 1 is refused here: a laneway result holds one answer.
- laneway's own knobs come from headers (``Knobs``); the tenant from the
  API key, never from the body.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, describe_errors
from streams.gateway.errors import GatewayError

__all__ = [
    "AUTO_MODEL",
    "Knobs",
    "chunk",
    "completion",
    "finish_reason",
    "knobs_from_headers",
    "laneway_headers",
    "parse_request",
    "to_request",
    "usage_of",
]

AUTO_MODEL = "auto"
"""The model name that lets laneway's router choose the path."""

_PASSED = ("max_tokens", "temperature", "seed")
"""Passed on as they are when set (``null`` is the same as absent)."""
_PASSED_WHEN_SENT = ("top_p", "user", "n", "max_completion_tokens")
"""Passed on only when the client sent them (the wire takes them after the
change that adds them)."""
_IGNORED = frozenset(
    {
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "parallel_tool_calls",
        "store",
        "metadata",
        "service_tier",
        "reasoning_effort",
        "top_logprobs",
        "prediction",
        "modalities",
    }
)
"""Accepted and without effect (documented in docs/gateway.md)."""
_REFUSED = ("tools", "tool_choice", "functions", "function_call", "audio", "web_search_options")
"""Refused when set: laneway cannot honour them."""
_KNOWN = frozenset(
    {"messages", "model", "stop", "stream", "stream_options", "logprobs", "response_format"}
    | set(_PASSED)
    | set(_PASSED_WHEN_SENT)
    | _IGNORED
    | set(_REFUSED)
)


def _bad(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, "INF-400", param=param)


@dataclass(frozen=True, slots=True)
class Knobs:
    """laneway's own request fields, from ``X-Laneway-*`` headers."""

    lane: Lane | None = None
    deadline_ms: int | None = None
    session_id: str | None = None
    cache: str | None = None
    """The response cache's directives, as on the wire (``metadata.cache``):
    ``bypass`` (skip the lookup), ``no-store`` (keep the answer out), or both,
    comma-separated."""


def knobs_from_headers(headers: Mapping[str, str]) -> Knobs:
    """``X-Laneway-Lane``, ``-Deadline-Ms``, ``-Session`` and ``-Cache``."""
    lane = headers.get("X-Laneway-Lane")
    deadline = headers.get("X-Laneway-Deadline-Ms")
    session = headers.get("X-Laneway-Session")
    cache = headers.get("X-Laneway-Cache")
    if lane is not None and lane not in {item.value for item in Lane}:
        raise _bad(f"X-Laneway-Lane must be one of realtime, medium, bulk, not {lane!r}")
    deadline_ms = None
    if deadline is not None:
        if not deadline.isdigit() or int(deadline) < 1:
            raise _bad("X-Laneway-Deadline-Ms must be a whole number of milliseconds above 0")
        deadline_ms = int(deadline)
    if cache is not None and not {part.strip() for part in cache.split(",")} <= {
        "bypass",
        "no-store",
    }:
        raise _bad(f"X-Laneway-Cache must be bypass, no-store or both, not {cache!r}")
    if session is not None and not session:
        raise _bad("X-Laneway-Session must not be empty")
    return Knobs(
        lane=Lane(lane) if lane else None,
        deadline_ms=deadline_ms,
        session_id=session,
        cache=cache,
    )


def _content(message: Mapping[str, Any], i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise _bad(
                    f"messages[{i}].content: only text parts are supported, not {kind!r}",
                    f"messages[{i}].content",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"messages[{i}].content: a text part needs a string 'text'")
            texts.append(text)
        return "\n".join(texts)
    raise _bad(
        f"messages[{i}].content must be a string or a list of text parts",
        f"messages[{i}].content",
    )


def _messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _bad("'messages' is required: a list of messages", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _bad(f"messages[{i}] must be an object", f"messages[{i}]")
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise _bad(
                f"messages[{i}].role {role!r} is not supported "
                "(system, developer, user, assistant; no tool messages)",
                f"messages[{i}].role",
            )
        if message.get("tool_calls"):
            raise _bad(f"messages[{i}]: tool calls are not supported", f"messages[{i}].tool_calls")
        out.append({"role": role, "content": _content(message, i)})
    return out


def to_request(
    body: Mapping[str, Any],
    *,
    request_id: str,
    tenant: str | None,
    reply_to: str,
    knobs: Knobs = Knobs(),
) -> dict[str, Any]:
    """The laneway request (as JSON fields) for an OpenAI chat completion
    body; ``GatewayError`` (400) for what cannot be translated. See the
    module docstring for each field."""
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _bad(f"unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    for name in _REFUSED:
        if body.get(name):
            raise _bad(f"{name!r} is not supported by laneway", name)
    if body.get("logprobs"):
        raise _bad("'logprobs' is not supported by laneway", "logprobs")
    response_format = body.get("response_format")
    if response_format is not None and (
        not isinstance(response_format, Mapping) or response_format.get("type") != "text"
    ):
        raise _bad("only response_format {'type': 'text'} is supported", "response_format")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad(f"n={n!r}: laneway answers one choice per request (n=1)", "n")

    request: dict[str, Any] = {"id": request_id, "reply_to": reply_to}
    request["messages"] = _messages(body)
    model = body.get("model")
    if model is not None and model != AUTO_MODEL:
        request["model"] = model
    for name in _PASSED:
        if body.get(name) is not None:
            request[name] = body[name]
    for name in _PASSED_WHEN_SENT:
        if name in body:
            request[name] = body[name]
    stop = body.get("stop")
    if stop is not None:
        request["stop"] = [stop] if isinstance(stop, str) else stop
    if body.get("stream"):
        request["stream"] = True
    if body.get("stream_options") is not None:
        request["stream_options"] = body["stream_options"]
    if tenant is not None:
        request["tenant"] = tenant
    if knobs.lane is not None:
        request["lane"] = knobs.lane.value
    if knobs.deadline_ms is not None:
        request["deadline_ms"] = knobs.deadline_ms
    if knobs.session_id is not None:
        request["session_id"] = knobs.session_id
    if knobs.cache is not None:
        request["metadata"] = {"cache": knobs.cache}
    return request


def parse_request(fields: Mapping[str, Any]) -> InferenceRequest:
    """The request, checked as the classifier checks it: an INF-400 here
    is the one laneway would answer, without the trip."""
    try:
        return InferenceRequest.model_validate(fields)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"] if exc.errors() else ()
        param = ".".join(str(p) for p in loc) or None
        raise _bad(f"invalid request: {describe_errors(exc)}", param) from exc


def finish_reason(reason: str | None) -> str:
    """OpenAI's finish_reason of a laneway one (``stop`` or ``length``)."""
    return "length" if reason == "length" else "stop"


def usage_of(result: InferenceResult) -> dict[str, int]:
    usage = result.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def completion(result: InferenceResult, *, created: int, model: str) -> dict[str, Any]:
    """A ``chat.completion`` object of an ``ok`` result. ``model``: the
    result's model, else the one asked for."""
    return {
        "id": f"chatcmpl-{result.id}",
        "object": "chat.completion",
        "created": created,
        "model": result.model or model,
        "system_fingerprint": result.version,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.output or ""},
                "logprobs": None,
                "finish_reason": finish_reason(result.finish_reason),
            }
        ],
        "usage": usage_of(result),
    }


def chunk(
    request_id: str,
    *,
    created: int,
    model: str,
    delta: Mapping[str, str] | None = None,
    finish: str | None = None,
    usage: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk``: one choice with ``delta`` (and
    ``finish_reason``), or, with ``usage``, OpenAI's usage chunk (no choices)."""
    out: dict[str, Any] = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
    }
    if usage is not None:
        out["choices"] = []
        out["usage"] = dict(usage)
    else:
        out["choices"] = [
            {"index": 0, "delta": dict(delta or {}), "logprobs": None, "finish_reason": finish}
        ]
    return out


def laneway_headers(
    *,
    request_id: str,
    lane: Lane | None,
    path: AnswerPath | None,
    model: str | None,
    version: str | None = None,
) -> dict[str, str]:
    """``X-Laneway-*`` response headers: where the answer came from."""
    headers = {"X-Laneway-Request-Id": request_id}
    if lane is not None:
        headers["X-Laneway-Lane"] = lane.value
    if path is not None:
        headers["X-Laneway-Path"] = path.value
        headers["X-Laneway-Cache-Hit"] = "true" if path == AnswerPath.CACHE else "false"
    if model is not None:
        headers["X-Laneway-Model"] = model
        if model.startswith("rules:"):
            headers["X-Laneway-Rule"] = model.removeprefix("rules:")
    if version is not None:
        headers["X-Laneway-Version"] = version
    return headers
