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
``realtime_max_backlog`` requests waiting, more than its live workers run
at once (``realtime_max_batches`` times their capacity), or whose waiting
requests its workers need more than ``realtime_max_wait_ms`` to take (at
the rate they answered while busy), refuses new model requests that asked
for it at once (INF-429 with a short retry time): a realtime answer that
comes after its deadline is no answer, and a queue the worker cannot
drain in time only makes every later answer late too. A request that the
classifier put on realtime by itself (simple work, no hint, no tight
deadline) goes to medium instead: it was promised no realtime latency.
It goes there sooner, once the lane holds ``realtime_spill_batches`` times
what its workers run at once, so that the room left above that mark is
kept for the requests that asked for realtime.
``streams.classify.gate.RealtimeGate`` keeps that count between the
workers' reports (what this classifier sent the lane since is added), and
judges each realtime worker by its own queue where it can.

Hysteresis: a level is entered when pressure reaches its ``enter`` mark and
left only when pressure has stayed below its lower ``exit`` mark for
``hold_s``, so the system does not flap at a threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from schemas.messages import AnswerPath, Lane
from schemas.settings import FlowSettings
from streams.classify.policy import Decision
from streams.routing.features import Complexity
from streams.stores.backlog import LaneLoad

__all__ = [
    "FlowController",
    "LaneFull",
    "Shed",
    "apply_level",
    "realtime_full",
    "spills",
]


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
    """A lane whose backlog is at its mark: new model requests that the
    classifier put on it by itself go elsewhere (``spills``), and, when
    ``asked_too``, those that asked for it are refused (``apply_level``).
    Without ``asked_too`` the lane keeps its room for those that asked."""

    lane: Lane
    waiting: int
    retry_after_ms: int
    asked_too: bool = True


def realtime_full(
    waiting: int,
    flow: FlowSettings,
    drain_per_s: float | None = None,
    capacity: int | None = None,
) -> LaneFull | None:
    """The realtime lane, when ``waiting`` is at its ``realtime_max_backlog``,
    fills ``realtime_max_batches`` times over the ``capacity`` its live
    workers run at once, or holds, queued behind the round they run
    (all of ``waiting`` when ``capacity`` is not known), records that would
    take ``realtime_max_wait_ms`` or more to reach for workers that answer
    ``drain_per_s`` records a busy second (``None``: not known). Short of
    those marks but at ``realtime_spill_batches`` times the capacity, it is
    full only for the requests the classifier put there by itself
    (``LaneFull.asked_too`` false)."""
    by_count = flow.realtime_max_backlog is not None and waiting >= flow.realtime_max_backlog
    if flow.realtime_max_batches is not None and capacity:
        by_count = by_count or waiting >= flow.realtime_max_batches * capacity
    # A realtime report counts the round running too. With the workers'
    # capacity known, a new request waits behind what is queued after it
    # (the batch mark keeps that round for the requests that ask).
    queued = max(0, waiting - capacity) if capacity else waiting
    wait_ms = LaneLoad(queued, drain_per_s).wait_ms
    by_time = (
        flow.realtime_max_wait_ms is not None
        and wait_ms is not None
        and wait_ms >= flow.realtime_max_wait_ms
    )
    if by_count or by_time:
        return LaneFull(Lane.REALTIME, waiting, flow.realtime_retry_after_ms)
    if flow.realtime_spill_batches is not None and capacity:
        if waiting >= flow.realtime_spill_batches * capacity:
            return LaneFull(Lane.REALTIME, waiting, flow.realtime_retry_after_ms, asked_too=False)
    return None


def spills(decision: Decision, full: LaneFull | None) -> Lane | None:
    """The lane a model request goes to instead of the full one it was put
    on, when the classifier chose that lane by itself and the client did not
    ask for it (``Decision.lane_asked``): medium, whose own paths are then
    chosen. A premium tenant's request shares the room a lane keeps for
    those that asked (``LaneFull.asked_too`` false), and spills past it.
    ``None``: it stays (and a full lane refuses it)."""
    if full is None or decision.lane is not full.lane or not decision.path.is_model:
        return None
    if decision.lane_asked or decision.forced:
        return None
    premium = decision.features is not None and decision.features.tier == "premium"
    if premium and not full.asked_too:
        return None
    return Lane.MEDIUM


def apply_level(
    decision: Decision,
    level: int,
    retry_after_ms: int,
    full: LaneFull | None = None,
    cheapest: AnswerPath = AnswerPath.LIGHT,
) -> Decision | Shed:
    """The policy's decision as the current level allows it. A path changed
    here (to ``cheapest``, the lane's cheapest model path) keeps the chosen
    one in ``requested_path`` (the answer says degraded). ``full``: the
    realtime lane, when it has more waiting than it can answer in time; a
    model request still on it (see ``spills``) is refused with a short
    retry hint, unless the lane keeps room for those that asked for it
    (``LaneFull.asked_too`` false)."""
    if full is not None and full.asked_too and decision.lane is full.lane and not decision.forced:
        return Shed(
            f"{full.lane} lane full ({full.waiting} requests waiting); retry shortly",
            full.retry_after_ms,
        )
    if level >= 2 and decision.lane is Lane.BULK:
        return Shed(f"bulk intake paused (load level {level})", retry_after_ms)
    if not decision.path.is_model or decision.path == cheapest or decision.forced:
        return decision
    if decision.named is not None:  # the client's own choice of model: shed, never moved
        return decision
    everything = level >= 3 and decision.lane is Lane.REALTIME
    if everything or (level >= 1 and decision.complexity < Complexity.COMPLEX):
        return replace(decision, path=cheapest, requested_path=decision.path)
    return decision
