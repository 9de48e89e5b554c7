"""The retry topic's decisions and header codec, without a broker."""

import pytest
from aiokafka import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st

from schemas.errors import BackendUnavailable, DeadlineExceeded, LanewayError, OutOfMemory
from schemas.messages import InferenceResult, Lane
from schemas.settings import Settings
from streams.kafka.topics import retry_topic, topic_specs
from workers.retry import (
    ATTEMPT_HEADER,
    NOT_BEFORE_HEADER,
    Exhausted,
    OutOfTime,
    Park,
    RetryMark,
    backoff_ms,
    due_at,
    due_prefix,
    is_retryable,
    mark_headers,
    plan_retry,
    read_mark,
    retry_record,
)

NOW = 1_700_000_000_000


def plan(attempt: int, deadline_at_ms: int | None = None) -> Park | Exhausted | OutOfTime:
    return plan_retry(
        attempt,
        now_ms=NOW,
        deadline_at_ms=deadline_at_ms,
        max_attempts=3,
        base_ms=500,
        max_backoff_ms=10_000,
    )


def test_backoff_doubles_per_attempt_up_to_the_cap() -> None:
    assert [backoff_ms(a, 500, 10_000) for a in range(1, 8)] == [
        500,
        1_000,
        2_000,
        4_000,
        8_000,
        10_000,
        10_000,
    ]
    assert backoff_ms(10**9, 500, 10_000) == 10_000  # a huge attempt number stays cheap
    assert backoff_ms(3, 0, 10_000) == 0
    with pytest.raises(ValueError, match="count from 1"):
        backoff_ms(0, 500, 10_000)


def test_a_failed_attempt_is_parked_until_its_backoff_has_passed() -> None:
    assert plan(1) == Park(RetryMark(attempt=2, not_before_ms=NOW + 500))
    assert plan(2) == Park(RetryMark(attempt=3, not_before_ms=NOW + 1_000))


def test_the_last_attempt_gives_up() -> None:
    assert plan(3) == Exhausted(3)
    assert plan(7) == Exhausted(7)  # a header past the limit never loops


def test_no_retry_that_would_end_after_the_deadline() -> None:
    assert plan(1, deadline_at_ms=NOW + 501) == Park(RetryMark(2, NOW + 500))
    assert plan(1, deadline_at_ms=NOW + 500) == OutOfTime(1)
    assert plan(2, deadline_at_ms=NOW + 999) == OutOfTime(2)
    assert plan(1, deadline_at_ms=NOW - 1) == OutOfTime(1)


def test_one_attempt_allowed_means_no_retry() -> None:
    decision = plan_retry(
        1, now_ms=NOW, deadline_at_ms=None, max_attempts=1, base_ms=500, max_backoff_ms=1_000
    )
    assert decision == Exhausted(1)


@given(st.integers(min_value=1, max_value=10**6), st.integers(min_value=0, max_value=2**62))
def test_mark_headers_round_trip(attempt: int, not_before_ms: int) -> None:
    mark = RetryMark(attempt, not_before_ms)
    assert read_mark(list(mark_headers(mark))) == mark


@given(st.lists(st.tuples(st.sampled_from([ATTEMPT_HEADER, NOT_BEFORE_HEADER, "x"]), st.binary())))
def test_any_header_bytes_read_as_a_valid_mark(headers: list[tuple[str, bytes]]) -> None:
    mark = read_mark(headers)
    assert mark.attempt >= 1 and mark.not_before_ms >= 0


def test_missing_or_garbled_headers_mean_a_first_attempt_due_now() -> None:
    assert read_mark(None) == RetryMark(1, 0)
    assert read_mark([]) == RetryMark(1, 0)
    assert read_mark([(ATTEMPT_HEADER, b"two"), (NOT_BEFORE_HEADER, b"\xff")]) == RetryMark(1, 0)
    assert read_mark([(ATTEMPT_HEADER, b"-4"), (NOT_BEFORE_HEADER, b"-9")]) == RetryMark(1, 0)


def test_the_relay_forwards_the_due_head_of_a_partition_and_keeps_order() -> None:
    assert due_prefix([], NOW) == 0
    assert due_prefix([NOW - 5, NOW, NOW + 1, NOW - 10], NOW) == 2  # the last waits its turn
    assert due_prefix([NOW + 1, NOW - 10], NOW) == 0
    assert due_prefix([0, 0, 0], NOW) == 3


def test_a_record_is_never_held_longer_than_the_longest_backoff() -> None:
    far = RetryMark(2, NOW + 10**9)
    assert due_at(far, produced_at_ms=NOW, max_backoff_ms=10_000) == NOW + 10_000
    assert due_at(RetryMark(2, NOW + 500), produced_at_ms=NOW, max_backoff_ms=10_000) == NOW + 500


def test_only_backend_failures_are_retried() -> None:
    def failed(error: LanewayError) -> InferenceResult:
        return InferenceResult.failure("r", error)

    assert is_retryable(failed(BackendUnavailable("no path can serve light")))
    assert not is_retryable(failed(DeadlineExceeded("too late")))
    assert not is_retryable(failed(OutOfMemory("even alone")))
    assert not is_retryable(InferenceResult(id="r", status="ok", output="hi"))


def test_a_parked_record_keeps_key_and_bytes_and_says_why() -> None:
    settings = Settings()
    record = ConsumerRecord(
        topic="laneway.lane.bulk",
        partition=2,
        offset=41,
        timestamp=NOW,
        timestamp_type=0,
        key=b"req-1",
        value=b'{"the": "routed request"}',
        checksum=None,
        serialized_key_size=5,
        serialized_value_size=25,
        headers=((ATTEMPT_HEADER, b"1"),),
    )
    result = InferenceResult.failure("req-1", BackendUnavailable("heavy circuit open"))
    out = retry_record(record, RetryMark(2, NOW + 500), result, settings, Lane.BULK)
    assert out.topic == "laneway.retry.bulk" == retry_topic(settings, Lane.BULK)
    assert (out.key, out.value) == (record.key, record.value)
    headers = dict(out.headers)
    assert read_mark(out.headers) == RetryMark(2, NOW + 500)
    assert headers["laneway-error-code"] == b"INF-502"
    assert headers["laneway-error"] == b"heavy circuit open"


def test_the_registry_creates_a_retry_topic_per_lane() -> None:
    settings = Settings()
    specs = {spec.name: spec.partitions for spec in topic_specs(settings)}
    for lane in Lane:
        assert specs[f"laneway.retry.{lane}"] == settings.kafka.partitions
