"""Which version of a path answers a request: a pure function of the
request and the effective registry, stable per conversation.

``assignment_key`` is the request's session, else its tenant, else its id:
every turn of a conversation (and, without sessions, every request of a
tenant) hashes to the same point ``unit(key, path)`` in [0, 1). The path's
canaries that a live worker serves take consecutive slices of [0, 1) as wide
as their shares, in version order; the active version takes the rest. So a
key changes version only when a share moves across its point: raising a
canary from 5% to 10% keeps the first 5% where they were, and a rollback
sends them all back to the active version.

Shadow versions are sampled the same way, per request id, each at its own
point (``unit(id, "shadow:<path>:<version>")``) and share, and their copies go
to the lowest-priority lane where a live worker serves them (bulk, else
medium; never realtime). ``RolloutView`` bundles what the classifier needs
for one batch: the effective registry and the versions live workers serve.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas.messages import AnswerPath, InferenceRequest, Lane
from streams.routing.registry import ModelEntry, ModelRegistry

if TYPE_CHECKING:
    from streams.rollout.routers import RouterView

__all__ = [
    "SHADOW_LANES",
    "RolloutView",
    "assignment_key",
    "pick_shadows",
    "pick_version",
    "unit",
]

SHADOW_LANES = (Lane.BULK, Lane.MEDIUM)
"""Where shadow copies may ride, lowest priority first: never realtime."""


def unit(key: str, salt: str) -> float:
    """A uniform point in [0, 1) for ``key``, independent per ``salt``."""
    digest = hashlib.sha256(f"{salt}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assignment_key(request: InferenceRequest) -> str:
    """What keeps a conversation on one version: session, tenant, id."""
    if request.session_id:
        return f"session:{request.session_id}"
    if request.tenant:
        return f"tenant:{request.tenant}"
    return f"id:{request.id}"


def pick_version(
    versions: Sequence[ModelEntry], key: str, served: Collection[str] | None = None
) -> str | None:
    """The version of one path (``versions``: all of that path's, with live
    states) that answers ``key``. Canaries compete only when ``served`` (the
    versions live workers serve on the request's lane; ``None``: not known)
    lists them. ``None`` when the path has no active version."""
    active = next((m for m in versions if m.state == "active"), None)
    if active is None:
        return None
    canaries = sorted(
        (
            m
            for m in versions
            if m.state == "canary"
            and m.traffic_share > 0
            and (served is None or m.version in served)
        ),
        key=lambda m: m.version,
    )
    if not canaries:
        return active.version
    point = unit(key, active.path)
    edge = 0.0
    for entry in canaries:
        edge = min(1.0, edge + entry.traffic_share)
        if point < edge:
            return entry.version
    return active.version


def pick_shadows(versions: Sequence[ModelEntry], key: str) -> list[str]:
    """The shadow versions of one path that get a copy of ``key``'s request."""
    return [
        m.version
        for m in versions
        if m.state == "shadow" and unit(key, f"shadow:{m.path}:{m.version}") < m.traffic_share
    ]


@dataclass(frozen=True, slots=True)
class RolloutView:
    """The roll-out as one classifier replica last read it."""

    registry: ModelRegistry
    """The registry file with the live states laid over it."""
    served: Mapping[Lane, frozenset[tuple[AnswerPath, str]]] | None = None
    """Per lane, the (path, version) pairs live workers serve (``None``: not known)."""
    routers: RouterView | None = None
    """The router versions (``None``: no router version is named; the
    SmartRouter's own learned router, if any, decides)."""

    def version_for(self, request: InferenceRequest, path: AnswerPath, lane: Lane) -> str | None:
        """The version of ``path`` that answers ``request`` on ``lane``."""
        if not path.is_model:
            return None
        served = None
        if self.served is not None:
            served = {v for p, v in self.served.get(lane, frozenset()) if p == path}
        return pick_version(self.registry.versions(path), assignment_key(request), served)

    def shadows_for(self, request: InferenceRequest, path: AnswerPath) -> list[tuple[str, Lane]]:
        """The shadow versions of ``path`` that get a copy of ``request``,
        each with the lane it rides; a shadow no live worker serves gets none."""
        if not path.is_model:
            return []
        out = []
        # Sampled per request, not per conversation: a share of the traffic.
        for version in pick_shadows(self.registry.versions(path), f"id:{request.id}"):
            lane = self._shadow_lane(path, version)
            if lane is not None:
                out.append((version, lane))
        return out

    def _shadow_lane(self, path: AnswerPath, version: str) -> Lane | None:
        if self.served is None:
            return SHADOW_LANES[0]
        for lane in SHADOW_LANES:
            if (path, version) in self.served.get(lane, frozenset()):
                return lane
        return None
