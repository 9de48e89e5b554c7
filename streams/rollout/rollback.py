"""Automatic rollback: when a canary is worse than its path's active
version, as a pure function of their records.

A canary with traffic is drained to share 0 when, over at least
``LANEWAY_ROLLOUT_MIN_EVENTS`` outcomes of its own since its share was last
set, any of these holds:

- its success rate is below the active version's by more than
  ``success_margin`` (an active version with no outcomes yet counts as
  fully successful);
- its latency (EWMA of successes) is above the active version's by more
  than ``latency_margin`` (a ratio: 0.5 = 50% slower), when both have one;
- its feedback quality (0..1) is below the active version's by more than
  ``feedback_margin``.

``decide`` says why in words, which become the ``rollback`` quality
event's ``reason`` and the log line.

A canary *router* version (``streams.rollout.routers``) is judged the same
way on the records of the requests it routed (``decide_router``), with one
more signal, cost: it is also drained when the share of its requests that
went heavy is above the active router's by more than ``router_heavy_margin``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas.settings import RolloutSettings
from streams.routing.stats import PathStats

if TYPE_CHECKING:
    from streams.rollout.routers import RouterVersion

__all__ = ["RouterRecord", "decide", "decide_router", "routers_to_drain"]


@dataclass(frozen=True, slots=True)
class RouterRecord:
    """What the requests one router version routed did."""

    stats: PathStats
    heavy_share: float
    """Share of its outcomes that the heavy path gave."""

    def to_json(self) -> str:
        data = json.loads(self.stats.to_json())
        data["heavy_share"] = self.heavy_share
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> RouterRecord:
        return cls(PathStats.from_json(raw), float(json.loads(raw).get("heavy_share", 0.0)))


def decide(
    canary: PathStats | None, active: PathStats | None, rules: RolloutSettings
) -> str | None:
    """Why ``canary`` must be rolled back, or ``None`` while it may stay."""
    if canary is None or len(canary.outcomes) < rules.min_events:
        return None
    n = len(canary.outcomes)
    base_success = active.success_rate if active is not None and active.outcomes else 1.0
    if canary.success_rate < base_success - rules.success_margin:
        return (
            f"success rate {canary.success_rate:.0%} over {n} events, "
            f"active {base_success:.0%} (margin {rules.success_margin:.0%})"
        )
    if (
        active is not None
        and active.outcomes
        and any(canary.outcomes)
        and any(active.outcomes)
        and canary.latency_ms > active.latency_ms * (1 + rules.latency_margin)
    ):
        return (
            f"latency {canary.latency_ms:.0f} ms over {n} events, "
            f"active {active.latency_ms:.0f} ms (margin +{rules.latency_margin:.0%})"
        )
    base_quality = active.quality if active is not None else 1.0
    if canary.quality < base_quality - rules.feedback_margin:
        return (
            f"feedback quality {canary.quality:.2f} over {n} events, "
            f"active {base_quality:.2f} (margin {rules.feedback_margin:.2f})"
        )
    return None


def decide_router(
    canary: RouterRecord | None, active: RouterRecord | None, rules: RolloutSettings
) -> str | None:
    """Why the canary router version must be rolled back, or ``None``."""
    if canary is None:
        return None
    reason = decide(canary.stats, active.stats if active is not None else None, rules)
    if reason is not None or len(canary.stats.outcomes) < rules.min_events:
        return reason
    if active is None or not active.stats.outcomes:
        return None
    if canary.heavy_share > active.heavy_share + rules.router_heavy_margin:
        return (
            f"heavy share {canary.heavy_share:.0%} over {len(canary.stats.outcomes)} events, "
            f"active {active.heavy_share:.0%} (margin +{rules.router_heavy_margin:.0%})"
        )
    return None


def routers_to_drain(
    versions: Sequence[RouterVersion],
    records: Mapping[str, RouterRecord],
    rules: RolloutSettings,
) -> list[tuple[str, str]]:
    """``(version, reason)`` for every canary router with traffic that is
    worse than the active router version (``decide_router``)."""
    active = next((v for v in versions if v.state == "active"), None)
    if active is None:
        return []
    out = []
    for entry in versions:
        if entry.state != "canary" or not entry.traffic_share:
            continue
        reason = decide_router(records.get(entry.version), records.get(active.version), rules)
        if reason is not None:
            out.append((entry.version, reason))
    return out
