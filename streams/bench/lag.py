"""How long the processes that follow the classifier's output take to catch
up with it: ``laneway bench classifier --lag`` asks it of the router (the
quality loop) and the batch tracker after the classifier answered a phase.

A follower has caught up when the counter of what it has done, on its own
/metrics, grew by every record the phase gave it: the router's
``laneway_quality_events_total`` by one quality event per answer, the
tracker's ``laneway_batch_tracker_records_total`` by each request and its
result. That is its consumer group's lag back at zero, read from the
process itself: the embedded Tansu broker's answers to OffsetFetch and
ListOffsets did not add up (two groups' committed offsets came back the
same, and above the end offsets), so the broker's view of a group's lag
is not used. A follower without the counter (a checkout from
before it existed) is not measured.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from streams.devstack.supervisor import metric_total

__all__ = ["Follower", "caught_up", "followers", "pace"]

ROUTER_METRIC = "laneway_quality_events_total"
TRACKER_METRIC = "laneway_batch_tracker_records_total"


@dataclass(frozen=True, slots=True)
class Follower:
    """A process that follows the classifier's output."""

    name: str
    """``router`` or ``tracker``."""
    port: int
    """Its /metrics port."""
    metric: str
    """The counter of the records it has done."""
    per_request: int
    """Records each answered request gives it."""

    def done(self) -> float | None:
        """Its counter now; ``None`` when it does not answer or has none."""
        return metric_total(self.port, self.metric)


def followers(router_port: int, tracker_port: int) -> list[Follower]:
    """The router (one quality event per answer) and the batch tracker (each
    request and its result)."""
    return [
        Follower("router", router_port, ROUTER_METRIC, 1),
        Follower("tracker", tracker_port, TRACKER_METRIC, 2),
    ]


def pace(classifier_s: float, behind_s: float | None) -> float | None:
    """Time until the follower caught up, from the phase's first request,
    over the classifier's own time for the phase (1.0: it kept up)."""
    if behind_s is None or classifier_s <= 0:
        return None
    return (classifier_s + max(0.0, behind_s)) / classifier_s


async def caught_up(
    follower: Follower, at_least: float, timeout_s: float = 60.0, every_s: float = 0.05
) -> float | None:
    """When (``time.perf_counter``) ``follower``'s counter reached
    ``at_least``; ``None`` when it did not within ``timeout_s``."""
    give_up = time.perf_counter() + timeout_s
    while time.perf_counter() < give_up:
        done = await asyncio.to_thread(follower.done)
        if done is not None and done >= at_least:
            return time.perf_counter()  # after the read: never early
        await asyncio.sleep(every_s)
    return None
