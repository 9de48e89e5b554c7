"""Which requests their clients cancelled (``workers.cancels.Cancels``)."""

from __future__ import annotations

import asyncio

from workers.cancels import Cancels


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_cancel_is_remembered_for_its_window() -> None:
    clock = Clock()
    cancels = Cancels(window_s=10, clock=clock)
    cancels.add("a")
    clock.now = 9.9
    assert cancels.cancelled("a") and not cancels.cancelled("b")
    clock.now = 10.1
    assert not cancels.cancelled("a")


async def test_a_watched_request_hears_its_cancel_and_one_cancelled_before_at_once() -> None:
    cancels = Cancels(window_s=60)
    running, other = asyncio.Event(), asyncio.Event()
    cancels.watch("a", running)
    cancels.watch("b", other)
    cancels.add("a")
    assert running.is_set() and not other.is_set()
    cancels.unwatch("b", other)
    cancels.add("b")
    assert not other.is_set(), "no longer watched"
    late = asyncio.Event()
    cancels.watch("a", late)
    assert late.is_set()
