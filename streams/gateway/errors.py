"""laneway's error codes as an OpenAI client expects them: an HTTP status
and an error object ``{"error": {"message", "type", "param", "code"}}``
whose ``code`` keeps laneway's code (``INF-429``, ...).

    code       status  type
    INF-400    400     invalid_request_error
    INF-429    429     rate_limit_error       (+ Retry-After, retry-after-ms)
    INF-502    502     server_error
    INF-503    503     server_error           (laneway's deadline passed, or cancelled)
    MEM-ERR    503     server_error           (out of memory: capacity, retry later)
    CUDA-ERR   502     server_error           (a GPU failed on the path tried)

The gateway's own refusals: an unknown API key 401 (``invalid_api_key``),
a body too large 413, an unknown route 404, and 504 (``timeout``) when its
own bounded wait for an answer ran out (laneway never answered: a 503 is
laneway saying the deadline passed, a 504 is the gateway giving up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from schemas.errors import ErrorCode
from schemas.messages import ErrorInfo

__all__ = ["GatewayError", "from_error_info", "status_of"]

_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.BACKEND_UNAVAILABLE: 502,
    ErrorCode.DEADLINE_EXCEEDED: 503,
    ErrorCode.OUT_OF_MEMORY: 503,
    ErrorCode.CUDA_FAILURE: 502,
}

_TYPE: dict[int, str] = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def status_of(code: ErrorCode | str) -> int:
    """The HTTP status of a laneway error code (502 for one it does not know)."""
    try:
        return _STATUS[ErrorCode(code)]
    except ValueError:
        return 502


@dataclass
class GatewayError(Exception):
    """An error answer: its HTTP status, message and code, and for 429
    when to try again."""

    status: int
    message: str
    code: str
    param: str | None = None
    retry_after_ms: int | None = None
    extra: dict[str, Any] | None = None
    """laneway's details, under the error object's ``laneway`` (a bad batch
    file's every line); OpenAI clients ignore it."""

    @property
    def type(self) -> str:
        return _TYPE.get(self.status, "server_error")

    def body(self) -> dict[str, Any]:
        """OpenAI's error object (also the ``data`` of an SSE error event)."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if self.extra:
            error["laneway"] = self.extra
        return {"error": error}

    def headers(self) -> dict[str, str]:
        """``Retry-After`` (whole seconds, rounded up) and OpenAI's
        ``retry-after-ms`` when there is a time to wait."""
        if self.retry_after_ms is None:
            return {}
        seconds = max(1, math.ceil(self.retry_after_ms / 1000))
        return {"Retry-After": str(seconds), "retry-after-ms": str(self.retry_after_ms)}

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


def from_error_info(error: ErrorInfo) -> GatewayError:
    """A laneway error result's ``error`` as a gateway error."""
    return GatewayError(
        status=status_of(error.code),
        message=error.message,
        code=str(error.code),
        retry_after_ms=error.retry_after_ms if error.code == ErrorCode.RATE_LIMITED else None,
    )
