"""Requests and tokens per minute per API key, counted over a sliding
window of the last 60 seconds. Pure: the caller passes the time.

A request is counted when it is admitted. Its tokens (the result's
``total_tokens``) are known only once it is answered, so they are counted
then: a key under its token limit may start a request that takes it over,
and the next one waits until enough tokens have left the window.

    limiter = MinuteLimiter()
    wait_s = limiter.admit("key-1", rpm=60, tpm=10_000, now=clock())
    if wait_s is None:  # admitted
        ...
        limiter.spend("key-1", result.usage.total_tokens, now=clock())
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["WINDOW_S", "MinuteLimiter"]

WINDOW_S = 60.0


@dataclass
class _Window:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    token_sum: int = 0

    def expire(self, now: float) -> None:
        start = now - WINDOW_S
        while self.requests and self.requests[0] <= start:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= start:
            self.token_sum -= self.tokens.popleft()[1]


class MinuteLimiter:
    """Sliding one-minute windows, one per key (see the module docstring)."""

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}

    def admit(self, key: str, *, rpm: int | None, tpm: int | None, now: float) -> float | None:
        """Count a request of ``key`` and return ``None``, or return how many
        seconds until it would be admitted (and count nothing). ``None``
        limits are no limit."""
        window = self._windows.setdefault(key, _Window())
        window.expire(now)
        waits: list[float] = []
        if rpm is not None and len(window.requests) >= rpm:
            # the oldest requests must leave until one fewer than rpm remain
            leaving = window.requests[len(window.requests) - rpm]
            waits.append(leaving + WINDOW_S - now)
        if tpm is not None and window.token_sum >= tpm:
            remaining = window.token_sum
            for at, tokens in window.tokens:
                remaining -= tokens
                if remaining < tpm:
                    waits.append(at + WINDOW_S - now)
                    break
        if waits:
            return max(waits)
        window.requests.append(now)
        return None

    def spend(self, key: str, tokens: int, *, now: float) -> None:
        """Count ``tokens`` of an answer to ``key`` (its ``total_tokens``)."""
        if tokens <= 0:
            return
        window = self._windows.setdefault(key, _Window())
        window.expire(now)
        window.tokens.append((now, tokens))
        window.token_sum += tokens

    def used(self, key: str, *, now: float) -> tuple[int, int]:
        """``(requests, tokens)`` of ``key`` in the window ending ``now``."""
        window = self._windows.get(key)
        if window is None:
            return 0, 0
        window.expire(now)
        return len(window.requests), window.token_sum

    def forget_idle(self, now: float) -> None:
        """Drop the windows of keys with nothing in the last minute."""
        for key, window in list(self._windows.items()):
            window.expire(now)
            if not window.requests and not window.tokens:
                del self._windows[key]
