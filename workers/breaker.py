"""A circuit breaker per backend.

    closed ──(``failures`` failed batches within ``window_s``)──► open
    open ──(``cooldown_s`` passed)──► half-open: one probe batch is let through
    half-open ──probe succeeds──► closed      half-open ──probe fails──► open
    any state ──``trip()`` (a CUDA error)──► open

While a path's breaker is open the executor sends its requests down the
next eligible path instead of waiting on a backend that keeps failing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Literal

__all__ = ["CircuitBreaker"]

State = Literal["closed", "open", "half-open"]


class CircuitBreaker:
    def __init__(
        self,
        *,
        failures: int,
        window_s: float,
        cooldown_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = failures
        self._window_s = window_s
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._failures: deque[float] = deque()
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> State:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self._cooldown_s:
            return "half-open"
        return "open"

    def allow(self) -> bool:
        """May a batch go to this backend now? In half-open, only one probe."""
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self._probing:
            self._probing = True
            return True
        return False

    def trip(self) -> None:
        """Open now, whatever the count: the backend is known to be broken
        (a CUDA error). The half-open probe after the cooldown still applies."""
        self._opened_at = self._clock()
        self._probing = False
        self._failures.clear()

    def record(self, ok: bool) -> None:
        now = self._clock()
        if self._opened_at is not None:  # the probe's verdict
            self._probing = False
            if ok:
                self._opened_at = None
                self._failures.clear()
            else:
                self._opened_at = now
            return
        if ok:
            return
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self._window_s:
            self._failures.popleft()
        if len(self._failures) >= self._threshold:
            self._opened_at = now
            self._failures.clear()
