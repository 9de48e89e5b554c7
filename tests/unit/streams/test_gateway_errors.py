"""laneway's error codes as HTTP statuses and OpenAI error objects."""

from __future__ import annotations

import pytest

from schemas.errors import ErrorCode
from schemas.messages import ErrorInfo
from streams.gateway.errors import GatewayError, from_error_info, status_of


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("INF-400", 400),
        ("INF-429", 429),
        ("INF-502", 502),
        ("INF-503", 503),
        ("MEM-ERR", 503),
        ("CUDA-ERR", 502),
        ("XYZ-999", 502),
    ],
)
def test_each_code_has_its_status(code: str, status: int) -> None:
    assert status_of(code) == status


def test_every_laneway_code_is_mapped() -> None:
    assert {status_of(code) for code in ErrorCode} <= {400, 429, 502, 503}


def test_an_error_result_becomes_openais_error_object_keeping_laneways_code() -> None:
    error = from_error_info(
        ErrorInfo(code=ErrorCode.INVALID_REQUEST, message="messages: too short", retryable=False)
    )
    assert error.status == 400
    assert error.body() == {
        "error": {
            "message": "messages: too short",
            "type": "invalid_request_error",
            "param": None,
            "code": "INF-400",
        }
    }
    assert error.headers() == {}


def test_a_rate_limit_says_when_to_try_again() -> None:
    error = from_error_info(
        ErrorInfo(
            code=ErrorCode.RATE_LIMITED, message="slow down", retryable=True, retry_after_ms=1500
        )
    )
    assert (error.status, error.type, error.code) == (429, "rate_limit_error", "INF-429")
    assert error.headers() == {"Retry-After": "2", "retry-after-ms": "1500"}
    assert GatewayError(429, "x", "INF-429", retry_after_ms=10).headers()["Retry-After"] == "1"


def test_server_side_failures_are_server_errors() -> None:
    error = from_error_info(
        ErrorInfo(code=ErrorCode.DEADLINE_EXCEEDED, message="deadline passed", retryable=True)
    )
    assert (error.status, error.type, error.code) == (503, "server_error", "INF-503")
    assert GatewayError(401, "no", "invalid_api_key").type == "invalid_request_error"
    assert "504 timeout" in str(GatewayError(504, "waited", "timeout"))
