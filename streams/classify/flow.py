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
``RealtimeGate`` keeps that count between the workers' reports: what this
classifier sent the lane since is added.

Hysteresis: a level is entered when pressure reaches its ``enter`` mark and
left only when pressure has stayed below its lower ``exit`` mark for
``hold_s``, so the system does not flap at a threshold.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from schemas.messages import Lane, Path
from schemas.settings import FlowSettings
from streams.classify.features import Complexity
from streams.classify.policy import Decision
from streams.stores.backlog import LaneLoad

__all__ = [
    "FlowController",
    "LaneFull",
    "RealtimeGate",
    "Shed",
    "apply_level",
    "realtime_full",
    "spills",
]


def _now_ms() -> int:
    return int(time.time() * 1000)


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


class RealtimeGate:
    """Whether the realtime lane takes another model request. The workers'
    last report says how many records waited and how fast they drain; a
    worker reports once a ``flow.interval_s``, so between reports the gate
    carries the count forward as a queue would: plus
    the model requests this classifier has sent the lane since the report
    was written, less what the workers drained at their rate meanwhile.
    Without a report younger than ``stale_ms`` (none yet, flow control off,
    Redis unreachable) it says nothing is full: it fails open."""

    def __init__(
        self, flow: FlowSettings, clock_ms: Callable[[], int] = _now_ms, stale_ms: int = 30_000
    ) -> None:
        self._flow = flow
        self._clock_ms = clock_ms
        self._stale_ms = stale_ms
        self._waiting = 0
        self._drain_per_s: float | None = None
        self._at_ms: int | None = None
        self._capacity: int | None = None
        """What the lane's live workers run at once (``None``: not known)."""
        self._sent: deque[tuple[int, int]] = deque()
        """(epoch ms, how many) of the sends the last report may not count."""

    def reported(self, waiting: int, drain_per_s: float | None, at_ms: int | None) -> None:
        """The workers' latest report, written at ``at_ms`` (``None``: now):
        it counts what was sent before then."""
        self._waiting, self._drain_per_s = waiting, drain_per_s
        self._at_ms = self._clock_ms() if at_ms is None else at_ms
        while self._sent and self._sent[0][0] <= self._at_ms:
            self._sent.popleft()

    def serving(self, capacity: int | None) -> None:
        """What the lane's live workers run at once, from their heartbeat
        cards (``None``: the board cannot say)."""
        self._capacity = capacity

    def sent(self, n: int = 1) -> None:
        """``n`` more model requests routed to the realtime lane now."""
        if n:
            now = self._clock_ms()
            self._sent.append((now, n))
            while self._sent[0][0] < now - self._stale_ms:  # no report came: forget
                self._sent.popleft()

    def full(self) -> LaneFull | None:
        """The lane, when it takes no more model requests now."""
        if self._at_ms is None or self._clock_ms() - self._at_ms > self._stale_ms:
            return None
        return realtime_full(self.waiting(), self._flow, self._drain_per_s, self._capacity)

    def waiting(self) -> int:
        """The records the lane has waiting now, as far as the gate can tell."""
        sent = sum(n for _, n in self._sent)
        elapsed_s = max(0, self._clock_ms() - (self._at_ms or 0)) / 1000
        drained = (self._drain_per_s or 0.0) * elapsed_s
        return max(0, round(self._waiting + sent - drained))


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
    cheapest: Path = Path.LIGHT,
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
    everything = level >= 3 and decision.lane is Lane.REALTIME
    if everything or (level >= 1 and decision.complexity < Complexity.COMPLEX):
        return replace(decision, path=cheapest, requested_path=decision.path)
    return decision
