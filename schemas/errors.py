"""laneway's one error tree. Every error knows its wire code, whether the
client may retry, and whether the offending record belongs on the DLQ.

    LanewayError
    ├── InvalidRequest        INF-400   fix the request; record goes to the DLQ   (not the path's)
    ├── RateLimited           INF-429   retry after ``retry_after_ms``            (not the path's)
    ├── BackendUnavailable    INF-502   model failed to load / backend unreachable
    ├── DeadlineExceeded      INF-503   deadline passed or inference timed out
    ├── OutOfMemory           MEM-ERR   out of memory, even after splitting the batch
    └── CudaFailure           CUDA-ERR  GPU driver / CUDA failure

"Not the path's": the error says nothing about the path that would have
answered (``blames_path`` false), so the router's statistics, the quality
loop and the distillation labels leave it out (``blames_path_code``).

Foreign exceptions are translated at the boundary by their type, with a
map each backend declares (``workers.backends.base.map_backend_exception``),
and raised ``from`` the foreign one.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "BackendUnavailable",
    "CudaFailure",
    "DeadlineExceeded",
    "ErrorCode",
    "InvalidRequest",
    "LanewayError",
    "OutOfMemory",
    "RateLimited",
    "blames_path_code",
]


class ErrorCode(StrEnum):
    INVALID_REQUEST = "INF-400"
    RATE_LIMITED = "INF-429"
    BACKEND_UNAVAILABLE = "INF-502"
    DEADLINE_EXCEEDED = "INF-503"
    OUT_OF_MEMORY = "MEM-ERR"
    CUDA_FAILURE = "CUDA-ERR"


class LanewayError(Exception):
    """Base of every error laneway reports to a client."""

    code: ErrorCode = ErrorCode.BACKEND_UNAVAILABLE
    retryable: bool = True
    to_dlq: bool = False
    blames_path: bool = True
    """Whether the path that answered (or would have) caused it; a request
    refused before any path saw it (invalid, shed, over quota) does not."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}: {self.message!r})"


class InvalidRequest(LanewayError):
    code = ErrorCode.INVALID_REQUEST
    retryable = False
    to_dlq = True
    blames_path = False


class RateLimited(LanewayError):
    code = ErrorCode.RATE_LIMITED
    blames_path = False

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class BackendUnavailable(LanewayError):
    code = ErrorCode.BACKEND_UNAVAILABLE


class DeadlineExceeded(LanewayError):
    code = ErrorCode.DEADLINE_EXCEEDED


class OutOfMemory(LanewayError):
    code = ErrorCode.OUT_OF_MEMORY


class CudaFailure(LanewayError):
    code = ErrorCode.CUDA_FAILURE


_ERRORS_BY_CODE: dict[str, type[LanewayError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        RateLimited,
        BackendUnavailable,
        DeadlineExceeded,
        OutOfMemory,
        CudaFailure,
    )
}


def blames_path_code(code: str | None) -> bool:
    """``blames_path`` of the error whose wire code is ``code`` (a result's
    or event's ``error_code``); ``None`` (no error) and a code laneway does
    not know count against the path."""
    if code is None:
        return True
    cls = _ERRORS_BY_CODE.get(code)
    return True if cls is None else cls.blames_path
