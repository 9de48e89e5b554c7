"""The smart router: per request, the eligible model path with the best
live record of latency, cost and success.

    score = w_lat * latency_norm + w_cost * cost_norm + w_fail * (1 - success_rate)

lowest wins, among the eligible paths whose success rate is at least
``min_success_rate`` (the weights alone let a cheap path that always
fails keep its traffic). ``latency_norm`` and ``cost_norm`` divide by the largest value
among the eligible paths, so the score compares paths on one request, not
against a fixed scale. ``success_rate`` is the windowed success rate times
the path's feedback quality. Statistics
(``streams.routing.stats.PathStats``) come from the quality loop
(``streams.quality.loop``) through Redis; a path never measured uses its
registry figures. A small exploration rate sends a request to
another eligible path now and then, so a path that recovered wins its
traffic back.

A learned router (``LANEWAY_ROUTING_LEARNED_ROUTER``, an artifact of
``laneway distill train``) is one more signal: for the requests it judges
it adds ``w_learned * (logit(threshold) - logit(p))`` to the light path's
score, positive when light is predicted not good enough (see
``SmartRouter.choose``). Without an artifact routing is as before.
"""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from schemas.messages import AnswerPath, Lane
from schemas.settings import RoutingSettings
from streams.routing.features import Complexity, RequestFeatures
from streams.routing.learned import LearnedRouter
from streams.routing.registry import ModelEntry, ModelRegistry
from streams.routing.stats import PathStats

__all__ = ["Choice", "RouteBoard", "SmartRouter", "score_paths"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Choice:
    path: AnswerPath
    model: str
    scores: dict[str, float]
    explored: bool = False
    learned_p: float | None = None
    """The learned router's chance that light is good enough, when it judged."""


def score_paths(
    candidates: Sequence[ModelEntry],
    stats: Mapping[AnswerPath, PathStats],
    routing: RoutingSettings,
) -> dict[AnswerPath, float]:
    """Each candidate's score (lower is better)."""
    views = []
    for entry in candidates:
        live = stats.get(entry.model_path)
        latency = live.latency_ms if live and live.outcomes else entry.expected_latency_ms
        success = (live.success_rate * live.quality) if live else 1.0
        views.append((entry.model_path, latency, entry.cost_per_1k_tokens, success))
    top_latency = max(v[1] for v in views) or 1.0
    top_cost = max(v[2] for v in views) or 1.0
    return {
        path: routing.w_lat * (latency / top_latency)
        + routing.w_cost * (cost / top_cost)
        + routing.w_fail * (1.0 - success)
        for path, latency, cost, success in views
    }


class SmartRouter:
    def __init__(
        self,
        registry: ModelRegistry,
        routing: RoutingSettings,
        rng: random.Random | None = None,
        learned: LearnedRouter | None = None,
    ) -> None:
        """``learned``: a learned router (``streams.distill``); by default the
        artifact ``routing.learned_router`` names, loaded now (a bad file is
        an ``ArtifactError`` at start, not a surprise later), or none."""
        self.registry = registry
        self.routing = routing
        self._rng = rng or random.Random()
        if learned is None and routing.learned_router is not None:
            learned = LearnedRouter.from_file(routing.learned_router)
            log.info("learned router %s loaded from %s", learned.version, learned.source)
        self.learned = learned
        self._quiet: tuple[RoutingSettings, RoutingSettings] | None = None

    def with_learned(self, learned: LearnedRouter | None, *, explore: bool = True) -> SmartRouter:
        """This router (same registry, settings and random source) with
        ``learned`` as its learned router (``None``: the rule alone), for the
        router version a request is assigned (``streams.rollout.routers``).
        ``explore=False``: never explores (a shadow router's decision)."""
        twin = copy.copy(self)
        twin.learned = learned
        if not explore:
            if self._quiet is None or self._quiet[0] is not self.routing:
                self._quiet = (self.routing, self.routing.model_copy(update={"exploration": 0.0}))
            twin.routing = self._quiet[1]
        return twin

    def choose(
        self,
        complexity: Complexity,
        lane: Lane,
        stats: Mapping[AnswerPath, PathStats],
        served: Collection[AnswerPath] | None = None,
        *,
        features: RequestFeatures | None = None,
        embedding: np.ndarray | None = None,
    ) -> Choice:
        """``served``: the paths live workers on ``lane`` serve (``None``:
        not known, every path counts as served). No path leaves for a lane
        where no live worker serves it; when none of the eligible paths is
        served there, the lane's served paths compete instead.

        With a learned router and the request's ``features`` (and its MiniLM
        ``embedding``, when at hand), a request up to ``learned_max_complexity``
        is judged by it: every model serving the lane competes, and the light
        path's score gains ``w_learned * (logit(threshold) - logit(p))``,
        ``p`` the predicted chance its answer is good enough."""
        learned = self._learned_term(complexity, features, embedding)
        if learned is not None:
            complexity = Complexity.SIMPLE  # the learned term stands in for capability
        candidates = self.registry.eligible(complexity, lane)
        if served is not None:
            live = [m for m in candidates if m.model_path in served] or [
                m for m in self.registry.active_models if m.model_path in served
            ]
            candidates = live or candidates
        scores = score_paths(candidates, stats, self.routing)
        if learned is not None and AnswerPath.LIGHT in scores:
            scores[AnswerPath.LIGHT] += learned[1]
        healthy = [m for m in candidates if self._healthy(stats.get(m.model_path))]
        best = min(healthy or candidates, key=lambda m: (scores[m.model_path], -m.capability))
        others = [m for m in candidates if m is not best]
        explored = bool(others) and self._rng.random() < self.routing.exploration
        if explored:
            best = self._rng.choice(others)
        return Choice(
            best.model_path,
            best.name,
            {p.value: round(s, 4) for p, s in scores.items()},
            explored,
            learned_p=None if learned is None else round(learned[0], 4),
        )

    def _learned_term(
        self,
        complexity: Complexity,
        features: RequestFeatures | None,
        embedding: np.ndarray | None,
    ) -> tuple[float, float] | None:
        """``(p, term added to the light path's score)``, or ``None`` when the
        learned router does not judge this request."""
        if self.learned is None or features is None or self.routing.w_learned == 0:
            return None
        if complexity > Complexity.named(self.routing.learned_max_complexity):
            return None
        p, margin = self.learned.margin(features, embedding)
        return p, -self.routing.w_learned * margin

    def _healthy(self, stats: PathStats | None) -> bool:
        return stats is None or stats.success_rate >= self.routing.min_success_rate


class RouteBoard:
    """Route statistics shared through Redis: the quality agent publishes
    them, every classifier re-reads them each ``weights_refresh_s``."""

    def __init__(self, redis: object, key_prefix: str) -> None:
        self._redis = redis
        self.key = f"{key_prefix}:route:stats"
        self.snapshot: dict[AnswerPath, PathStats] = {}
        self.read_at = 0.0

    async def publish(self, stats: Mapping[AnswerPath, PathStats]) -> None:
        if stats:
            mapping = {path.value: s.to_json() for path, s in stats.items()}
            await self._redis.hset(self.key, mapping=mapping)  # type: ignore[attr-defined]

    async def refresh(self) -> dict[AnswerPath, PathStats]:
        """Re-read the statistics; on a Redis error keep the last snapshot."""
        try:
            raw = await self._redis.hgetall(self.key)  # type: ignore[attr-defined]
        except Exception as exc:
            log.warning("route statistics not refreshed: %s", exc)
            return self.snapshot
        snapshot = {}
        for name, value in raw.items():
            try:
                snapshot[AnswerPath(name.decode())] = PathStats.from_json(value)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("route statistics for %r unreadable: %s", name, exc)
        self.snapshot = snapshot
        self.read_at = time.monotonic()
        return snapshot
