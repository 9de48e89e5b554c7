"""Batch input files, as pure functions: parse and validate a whole JSONL
file, and the ids everything else derives from it.

Two line shapes are accepted (one object per line, blank lines skipped):

- laneway's: ``{"custom_id": "q1", "body": {"prompt": "...", "max_tokens": 32}}``
  (``body`` holds request fields: ``prompt`` or ``messages``, ``max_tokens``,
  ``temperature``, ``stop``, ``seed``, ``metadata``);
- the OpenAI Batch API's: ``{"custom_id": "q1", "method": "POST", "url":
  "/v1/chat/completions", "body": {"model": "...", "messages": [...]}}``
  (``url`` may also be ``/v1/completions`` with a ``prompt``). ``model`` is
  accepted and ignored: laneway's router picks the model.

Every bad line is reported with its 1-based line number; nothing stops at
the first.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from schemas.errors import InvalidRequest
from schemas.messages import RequestLimits, parse_request

__all__ = [
    "BatchLine",
    "LineError",
    "ParsedFile",
    "job_id_for",
    "parse_jsonl",
    "parse_window",
    "request_id",
]

MAX_CUSTOM_ID = 512
OPENAI_URLS = ("/v1/chat/completions", "/v1/completions")
_BODY_FIELDS = frozenset({"prompt", "messages", "max_tokens", "temperature", "stop", "seed"})
_BODY_FIELDS_ALL = _BODY_FIELDS | {"metadata"}
_OPENAI_IGNORED = frozenset({"model", "user", "stream", "n", "logprobs"})
"""OpenAI body fields accepted without effect (``stream`` must be false, ``n`` 1)."""


@dataclass(frozen=True, slots=True)
class BatchLine:
    line: int
    """1-based line number in the file."""
    custom_id: str
    body: dict[str, Any]
    """Request fields, laneway's names (``max_tokens``, ``messages``, ...)."""
    shape: Literal["laneway", "openai"] = "laneway"


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    message: str
    custom_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "custom_id": self.custom_id, "error": self.message}


@dataclass(slots=True)
class ParsedFile:
    content_sha256: str
    lines: list[BatchLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)

    @property
    def format(self) -> Literal["laneway", "openai"]:
        """``openai`` when every valid line had the OpenAI shape."""
        if self.lines and all(line.shape == "openai" for line in self.lines):
            return "openai"
        return "laneway"


def parse_jsonl(data: bytes, limits: RequestLimits, *, max_lines: int = 50_000) -> ParsedFile:
    """Every valid line and every error of ``data``, in file order."""
    parsed = ParsedFile(content_sha256=hashlib.sha256(data).hexdigest())
    seen: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(parsed.lines) + len(parsed.errors) >= max_lines:
            parsed.errors.append(LineError(number, f"the file has more than {max_lines} lines"))
            break
        try:
            line = parse_line(number, raw, limits)
        except _BadLine as bad:
            parsed.errors.append(LineError(number, bad.message, bad.custom_id))
            continue
        first = seen.get(line.custom_id)
        if first is not None:
            parsed.errors.append(
                LineError(
                    number, f"custom_id {line.custom_id!r} repeats line {first}", line.custom_id
                )
            )
            continue
        seen[line.custom_id] = number
        parsed.lines.append(line)
    return parsed


class _BadLine(Exception):
    def __init__(self, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.custom_id = custom_id


def parse_line(number: int, raw: bytes, limits: RequestLimits) -> BatchLine:
    """One line, or ``_BadLine`` saying what to fix."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _BadLine(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _BadLine("a line must be a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _BadLine("custom_id: a non-empty string is required")
    if len(custom_id) > MAX_CUSTOM_ID:
        raise _BadLine(f"custom_id is {len(custom_id)} characters, limit {MAX_CUSTOM_ID}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise _BadLine("body: an object is required", custom_id)
    openai = "method" in obj or "url" in obj
    unknown = set(obj) - (
        {"custom_id", "body", "method", "url"} if openai else {"custom_id", "body"}
    )
    if unknown:
        raise _BadLine(f"unknown field(s): {', '.join(sorted(unknown))}", custom_id)
    try:
        fields = _openai_body(obj, body) if openai else _laneway_body(body)
        _validate(fields, limits)
    except _BadLine as bad:
        raise _BadLine(bad.message, custom_id) from None
    return BatchLine(number, custom_id, fields, "openai" if openai else "laneway")


def _laneway_body(body: dict[str, Any]) -> dict[str, Any]:
    unknown = set(body) - _BODY_FIELDS_ALL
    if unknown:
        raise _BadLine(f"body: unknown field(s): {', '.join(sorted(unknown))}")
    return dict(body)


def _openai_body(obj: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    if obj.get("method", "POST") != "POST":
        raise _BadLine(f"method must be POST, not {obj.get('method')!r}")
    url = obj.get("url")
    if url not in OPENAI_URLS:
        raise _BadLine(f"url must be one of {', '.join(OPENAI_URLS)}, not {url!r}")
    fields = dict(body)
    if "max_completion_tokens" in fields:
        fields["max_tokens"] = fields.pop("max_completion_tokens")
    if fields.get("stream"):
        raise _BadLine("body.stream: a batch request cannot stream")
    if fields.get("n", 1) != 1:
        raise _BadLine("body.n: only 1 answer per request")
    for name in _OPENAI_IGNORED:
        fields.pop(name, None)
    if isinstance(fields.get("stop"), str):
        fields["stop"] = [fields["stop"]]
    if url == "/v1/chat/completions":
        if "prompt" in fields:
            raise _BadLine("body.prompt: /v1/chat/completions takes messages")
        fields["messages"] = _openai_messages(fields.get("messages"))
    elif "messages" in fields:
        raise _BadLine("body.messages: /v1/completions takes a prompt")
    unknown = set(fields) - _BODY_FIELDS_ALL
    if unknown:
        raise _BadLine(f"body: unsupported field(s): {', '.join(sorted(unknown))}")
    return fields


def _openai_messages(messages: Any) -> Any:
    """OpenAI chat messages in laneway's shape: ``developer`` is ``system``,
    a list of text parts is their text."""
    if not isinstance(messages, list):
        return messages  # the request model says what is wrong
    out = []
    for message in messages:
        if not isinstance(message, dict):
            return messages
        content = message.get("content")
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            texts = [t for t in parts if isinstance(t, str)]
            if len(texts) != len(content):
                raise _BadLine("body.messages: only text content parts are supported")
            content = "".join(texts)
        role = "system" if message.get("role") == "developer" else message.get("role")
        extra = set(message) - {"role", "content", "name"}
        if extra:
            raise _BadLine(f"body.messages: unsupported field(s): {', '.join(sorted(extra))}")
        out.append({"role": role, "content": content})
    return out


def _validate(fields: dict[str, Any], limits: RequestLimits) -> None:
    """The request rules the classifier applies, checked before submission."""
    probe = {**fields, "id": "validate"}
    try:
        parse_request(json.dumps(probe).encode(), limits)
    except InvalidRequest as exc:
        raise _BadLine(exc.message.removeprefix("invalid request: ")) from None
    except (TypeError, ValueError) as exc:  # not JSON-serialisable after all
        raise _BadLine(f"body: {exc}") from None


def request_id(job_id: str, custom_id: str) -> str:
    """The request id of a line: the same for every submission of the job,
    so a resumed or repeated produce is recognised as the same request."""
    return f"{job_id}-{hashlib.sha256(custom_id.encode()).hexdigest()[:16]}"


def job_id_for(tenant: str | None, content_sha256: str) -> str:
    """The job of a file under a tenant: the same file submitted again is the same job."""
    digest = hashlib.sha256(f"{tenant or ''}\n{content_sha256}".encode()).hexdigest()
    return f"batch_{digest[:20]}"


_WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: str) -> int:
    """``"24h"``, ``"90m"``, ``"3600"``, ``"2d"`` -> seconds (at least 1)."""
    match = _WINDOW.match(text.lower())
    if match is None:
        raise ValueError(f"window {text!r}: use a number with s, m, h or d, e.g. 24h")
    seconds = int(float(match.group(1)) * _UNIT_S[match.group(2)])
    if seconds < 1:
        raise ValueError(f"window {text!r} is under a second")
    return seconds
