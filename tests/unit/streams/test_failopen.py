"""The one fail-open rule the Redis helpers share."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, Counter

from streams.stores.failopen import FailOpen


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_failure_rests_redis_and_an_outage_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    errors = Counter("t_errors", "test", ["op"], registry=CollectorRegistry())
    log = logging.getLogger("test.failopen")
    guard = FailOpen("thing", log=log, errors=errors, rest_s=1.0, clock=clock)
    assert not guard.resting()
    with caplog.at_level(logging.INFO, logger="test.failopen"):
        guard.failed("read", ConnectionError("refused"))
        assert guard.resting()
        clock.now += 0.99
        assert guard.resting()
        clock.now += 0.02
        assert not guard.resting()
        guard.failed("write", ConnectionError("refused"))  # same outage: counted, not logged
        guard.answered()
        guard.answered()  # recovery is logged once
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert warnings == [
        "thing: Redis failed during read (ConnectionError: refused); "
        "going on without it until it answers again"
    ]
    assert infos == ["thing: Redis answers again"]
    with caplog.at_level(logging.WARNING, logger="test.failopen"):
        caplog.clear()
        guard.failed("read", ConnectionError("refused"))  # a new outage is warned of again
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert errors.labels("read")._value.get() == 2
    assert errors.labels("write")._value.get() == 1


def test_a_fixed_label_counts_every_op_under_it() -> None:
    errors = Counter("t_fixed", "test", ["op"], registry=CollectorRegistry())
    guard = FailOpen("cache", log=logging.getLogger("t"), errors=errors, label="cache")
    guard.failed("lookup", OSError("x"))
    guard.failed("store", OSError("x"))
    assert errors.labels("cache")._value.get() == 2
    guard.end_rest()
    assert not guard.resting()
