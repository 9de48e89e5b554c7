"""Flow control: degrade in steps under load, recover in steps after it.

Pressure is the lane backlog the workers report (records waiting on the
lane topics). Levels, each keeping what the one below it does:

    0  normal
    1  heavy -> light for work below the complex class (no code, maths, long prompts)
    2  bulk intake paused: new bulk requests get INF-429 with retry_after_ms
    3  realtime keeps rules / light only: every heavy request there goes light

"light" is the lane's cheapest model path in the registry (``cheapest``;
built-in: ``light``), "heavy" any other model path.
Apart from the levels, a realtime lane with more than
``realtime_max_backlog`` requests waiting refuses new model requests at once
(INF-429 with a short retry time): a realtime answer that comes after its
deadline is no answer, and a queue the worker cannot drain in time only
makes every later answer late too.

Hysteresis: a level is entered when pressure reaches its ``enter`` mark and
left only when pressure has stayed below its lower ``exit`` mark for
``hold_s``, so the system does not flap at a threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from schemas.messages import Lane, Path
from schemas.settings import FlowSettings
from streams.classify.features import Complexity
from streams.classify.policy import Decision

__all__ = ["FlowController", "LaneFull", "Shed", "apply_level", "realtime_full"]


class FlowController:
    def __init__(self, enter: Sequence[int], exit: Sequence[int], hold_s: float) -> None:
        if len(enter) != len(exit) or any(x >= e for e, x in zip(enter, exit, strict=True)):
            raise ValueError(f"each exit mark must be below its enter mark: {enter=} {exit=}")
        self._enter = list(enter)
        self._exit = list(exit)
        self._hold_s = hold_s
        self.level = 0
        self._calm_since: float | None = None

    def update(self, pressure: float, now: float) -> int:
        while self.level < len(self._enter) and pressure >= self._enter[self.level]:
            self.level += 1  # up at once, as far as the pressure says
            self._calm_since = None
        if self.level == 0:
            return 0
        if pressure < self._exit[self.level - 1]:
            if self._calm_since is None:
                self._calm_since = now
            elif now - self._calm_since >= self._hold_s:
                self.level -= 1  # down one step per hold period
                self._calm_since = now
        else:
            self._calm_since = None
        return self.level


@dataclass(frozen=True, slots=True)
class Shed:
    """The request is not taken now: INF-429 with this retry hint."""

    reason: str
    retry_after_ms: int


@dataclass(frozen=True, slots=True)
class LaneFull:
    """A lane whose backlog is at its mark: its new model requests are refused."""

    lane: Lane
    waiting: int
    retry_after_ms: int


def realtime_full(waiting: int, flow: FlowSettings) -> LaneFull | None:
    """The realtime lane, when ``waiting`` is at its ``realtime_max_backlog``."""
    mark = flow.realtime_max_backlog
    if mark is None or waiting < mark:
        return None
    return LaneFull(Lane.REALTIME, waiting, flow.realtime_retry_after_ms)


def apply_level(
    decision: Decision,
    level: int,
    retry_after_ms: int,
    full: LaneFull | None = None,
    cheapest: Path = Path.LIGHT,
) -> Decision | Shed:
    """The policy's decision as the current level allows it. A path changed
    here (to ``cheapest``, the lane's cheapest model path) keeps the chosen
    one in ``requested_path`` (the answer says degraded). ``full``: the
    realtime lane, when it has more waiting than it can answer in time; a
    model request for it is refused with a short retry hint."""
    if full is not None and decision.lane is full.lane and not decision.forced:
        return Shed(
            f"{full.lane} lane full ({full.waiting} requests waiting); retry shortly",
            full.retry_after_ms,
        )
    if level >= 2 and decision.lane is Lane.BULK:
        return Shed(f"bulk intake paused (load level {level})", retry_after_ms)
    if not decision.path.is_model or decision.path == cheapest or decision.forced:
        return decision
    everything = level >= 3 and decision.lane is Lane.REALTIME
    if everything or (level >= 1 and decision.complexity < Complexity.COMPLEX):
        return replace(decision, path=cheapest, requested_path=decision.path)
    return decision
