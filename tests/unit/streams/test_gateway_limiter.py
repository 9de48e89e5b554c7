"""The gateway's requests/tokens per minute limiter (a pure class)."""

from __future__ import annotations

import pytest

from streams.gateway.limiter import MinuteLimiter


def test_requests_per_minute_are_admitted_up_to_the_limit_then_wait_for_the_oldest() -> None:
    limiter = MinuteLimiter()
    assert limiter.admit("k", rpm=2, tpm=None, now=0.0) is None
    assert limiter.admit("k", rpm=2, tpm=None, now=10.0) is None
    assert limiter.admit("k", rpm=2, tpm=None, now=20.0) == pytest.approx(40.0)
    assert limiter.used("k", now=20.0) == (2, 0), "a refused request is not counted"
    assert limiter.admit("k", rpm=2, tpm=None, now=60.0) is None, "the first left the window"
    assert limiter.admit("k", rpm=2, tpm=None, now=60.5) == pytest.approx(9.5)


def test_keys_are_counted_apart_and_no_limit_is_no_limit() -> None:
    limiter = MinuteLimiter()
    assert limiter.admit("a", rpm=1, tpm=None, now=0.0) is None
    assert limiter.admit("b", rpm=1, tpm=None, now=0.0) is None
    assert limiter.admit("a", rpm=1, tpm=None, now=1.0) is not None
    for i in range(1000):
        assert limiter.admit("c", rpm=None, tpm=None, now=float(i) / 100) is None


def test_tokens_are_spent_after_the_answer_and_the_next_request_waits() -> None:
    limiter = MinuteLimiter()
    assert limiter.admit("k", rpm=None, tpm=100, now=0.0) is None
    limiter.spend("k", 60, now=1.0)
    assert limiter.admit("k", rpm=None, tpm=100, now=2.0) is None, "60 < 100: admitted"
    limiter.spend("k", 70, now=3.0)  # this answer took the key over its limit
    # 130 tokens: once the first 60 leave the window (at 61 s), 70 < 100 remain.
    assert limiter.admit("k", rpm=None, tpm=100, now=4.0) == pytest.approx(57.0)
    assert limiter.admit("k", rpm=None, tpm=100, now=61.5) is None
    assert limiter.used("k", now=61.5) == (2, 70)


def test_the_longer_of_two_waits_is_returned() -> None:
    limiter = MinuteLimiter()
    assert limiter.admit("k", rpm=1, tpm=10, now=0.0) is None
    limiter.spend("k", 10, now=30.0)
    assert limiter.admit("k", rpm=1, tpm=10, now=31.0) == pytest.approx(59.0)


def test_idle_keys_are_forgotten() -> None:
    limiter = MinuteLimiter()
    limiter.admit("k", rpm=5, tpm=None, now=0.0)
    limiter.spend("k", 3, now=0.0)
    limiter.forget_idle(now=61.0)
    assert limiter._windows == {}
    limiter.spend("k", 0, now=62.0)
    assert limiter.used("k", now=62.0) == (0, 0)
