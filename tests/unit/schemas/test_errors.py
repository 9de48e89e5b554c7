"""The error tree: whether an error blames the path is the error class's own."""

import pytest

from schemas.errors import (
    BackendUnavailable,
    CudaFailure,
    DeadlineExceeded,
    ErrorCode,
    InvalidRequest,
    LanewayError,
    OutOfMemory,
    RateLimited,
    blames_path_code,
)


@pytest.mark.parametrize(
    ("error", "blames"),
    [
        (InvalidRequest, False),
        (RateLimited, False),
        (BackendUnavailable, True),
        (DeadlineExceeded, True),
        (OutOfMemory, True),
        (CudaFailure, True),
    ],
)
def test_blames_path_is_the_classs_and_read_by_code(
    error: type[LanewayError], blames: bool
) -> None:
    assert error.blames_path is blames
    assert blames_path_code(error.code) is blames


def test_every_code_has_one_error_and_an_unknown_code_counts() -> None:
    assert {code.value for code in ErrorCode} == {e.code for e in LanewayError.__subclasses__()}
    assert blames_path_code(None) and blames_path_code("NOT-A-CODE")
