"""A request's optional stop strings and seed: checked at the edge, and
handed to the backend as they came."""

from __future__ import annotations

import json
import time

import pytest

from schemas.errors import InvalidRequest
from schemas.messages import AnswerPath, Lane, RequestLimits, RoutedRequest, parse_request
from workers.execution import Executor

LIMITS = RequestLimits()


def raw(**fields: object) -> bytes:
    return json.dumps({"id": "r", "prompt": "hi", **fields}).encode()


def test_stop_and_seed_are_optional_and_kept() -> None:
    plain = parse_request(raw(), LIMITS)
    assert plain.stop is None and plain.seed is None
    request = parse_request(raw(stop=["\n\n", "END"], seed=42, temperature=0.7), LIMITS)
    assert request.stop == ["\n\n", "END"] and request.seed == 42
    assert parse_request(raw(stop="END"), LIMITS).stop == ["END"]  # OpenAI's one string


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop.0"),
        ({"stop": ["x" * 65]}, "stop.0"),
        ({"stop": ""}, "stop.0"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_stop_or_seed_is_refused_with_where(fields: dict[str, object], where: str) -> None:
    with pytest.raises(InvalidRequest, match=rf"{where}:"):
        parse_request(raw(**fields), LIMITS)


def test_the_executor_hands_stop_and_seed_to_the_backend() -> None:
    request = parse_request(raw(stop=["END"], seed=7), LIMITS)
    now = int(time.time() * 1000)
    routed = RoutedRequest(
        request=request,
        lane=Lane.BULK,
        path=AnswerPath.LIGHT,
        reply_to="laneway.replies",
        produced_at_ms=now,
        routed_at_ms=now,
    )
    item = Executor(Lane.BULK, {})._input(routed, now)
    assert list(item.stop or ()) == ["END"] and item.seed == 7
    assert item.top_p is None


def test_the_executor_hands_top_p_to_the_backend() -> None:
    request = parse_request(raw(top_p=0.25, temperature=0.8), LIMITS)
    now = int(time.time() * 1000)
    routed = RoutedRequest(
        request=request,
        lane=Lane.BULK,
        path=AnswerPath.LIGHT,
        reply_to="laneway.replies",
        produced_at_ms=now,
        routed_at_ms=now,
    )
    assert Executor(Lane.BULK, {})._input(routed, now).top_p == 0.25
