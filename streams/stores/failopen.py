"""The one fail-open rule every Redis-backed helper follows.

Redis holds what makes answers cheaper or better (cache entries, session
history, rate-limit buckets, rule lookups), never what an answer needs. So
when it fails, the helper goes on without it: the failure is counted, logged
once per outage, and Redis is left alone for ``rest_s`` so that a dead Redis
costs one socket timeout a second, not one per request. The first answer
after an outage is logged too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prometheus_client import Counter

from streams.ops import REDIS_ERRORS

REST_S = 1.0
"""After a failure Redis is not asked again for this long."""


class FailOpen:
    """Whether a helper may ask Redis now, and what a failure does."""

    def __init__(
        self,
        what: str,
        *,
        log: logging.Logger,
        errors: Counter = REDIS_ERRORS,
        label: str | None = None,
        rest_s: float = REST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._log = log
        self._errors = errors
        self._label = label
        self._rest_s = rest_s
        self._clock = clock
        self._rest_until = 0.0
        self.failing = False

    def resting(self) -> bool:
        """True while Redis is being left alone after a failure."""
        return self._clock() < self._rest_until

    def failed(self, op: str, exc: BaseException) -> None:
        """Count the failure of ``op``, rest, and log it if it starts an outage."""
        self._errors.labels(self._label or op).inc()
        self._rest_until = self._clock() + self._rest_s
        if self.failing:
            self._log.debug("%s: Redis still failing during %s: %s", self._what, op, exc)
            return
        self.failing = True
        self._log.warning(
            "%s: Redis failed during %s (%s: %s); going on without it until it answers again",
            self._what,
            op,
            type(exc).__name__,
            exc,
        )

    def answered(self) -> None:
        """Redis answered: an outage, if there was one, is over."""
        if self.failing:
            self.failing = False
            self._log.info("%s: Redis answers again", self._what)

    def end_rest(self) -> None:
        """Ask Redis at the next call (tests, and callers that know it is back)."""
        self._rest_until = 0.0
