"""The classifier's decision for an accepted request, as a pure function of
the request, what the lookups found and the route statistics.

Paths, fastest first: a cached answer, then a rule's answer; otherwise
the request's features give its complexity class and lane, and the smart
router picks the eligible model path with the best live record. With
``force_path`` set every request goes to that one model path (the
single-path baseline of ``laneway bench``).

A request that names its model (``InferenceRequest.model``, resolved by
the registry: ``named``) gets that model's answer: the cache still answers
it (its entries are kept apart per named model, ``streams.cache.keys``),
no rule does (a rule's answer is not that model's), and it goes down the
named path on the nearest lane whose workers serve it, whatever the router
would have chosen.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.messages import AnswerPath, InferenceRequest, Lane
from schemas.settings import RoutingSettings
from streams.cache.response import CacheHit
from streams.classify.router import SmartRouter
from streams.routing.features import (
    Complexity,
    RequestFeatures,
    TextTraits,
    asks_realtime,
    complexity_of,
    estimate_tokens,
    extract_features,
    lane_for,
)
from streams.routing.registry import NamedModel
from streams.routing.stats import PathStats
from streams.rules.engine import RuleAnswer

__all__ = ["Decision", "Found", "decide", "estimate_tokens", "lane_serving"]


@dataclass(frozen=True, slots=True)
class Found:
    """What the classifier's lookups (cache, rules, session) found for a request."""

    hit: CacheHit | None = None
    rule: RuleAnswer | None = None
    intent: str | None = None
    history_turns: int = 0
    embedding: Any = None
    """The request's MiniLM embedding (``numpy`` row), when the lookups made
    one for the learned router; ``None`` otherwise."""
    traits: TextTraits | None = None
    """The asked text's ``text_traits``, if the lookups worked them out."""


@dataclass(frozen=True, slots=True)
class Decision:
    lane: Lane
    path: AnswerPath
    complexity: Complexity = Complexity.SIMPLE
    features: RequestFeatures | None = None
    hit: CacheHit | None = None
    rule: RuleAnswer | None = None
    model: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    explored: bool = False
    requested_path: AnswerPath | None = None
    """Set when flow control moved the request off the path the router chose."""
    forced: bool = False
    """``force_path`` chose the path: flow control may shed, never move it."""
    spilled_from: Lane | None = None
    """The full lane the request was put on first (``flow.spills``)."""
    lane_asked: bool = False
    """The client asked for this lane (its ``lane`` hint, or a deadline
    within ``realtime_max_deadline_ms``), so a full lane refuses it; a lane
    the classifier chose by itself spills to medium instead."""
    named: NamedModel | None = None
    """The model the request named, whose path this is: flow control never
    moves it to another path (it may shed it)."""


def decide(
    request: InferenceRequest,
    found: Found,
    routing: RoutingSettings,
    router: SmartRouter,
    stats: Mapping[AnswerPath, PathStats],
    serving: Mapping[Lane, Collection[AnswerPath]] | None = None,
    lane: Lane | None = None,
    *,
    named: NamedModel | None = None,
    configured: Collection[Lane] = (),
) -> Decision:
    """``serving``: per lane, the paths live workers serve (the worker
    board); ``None`` when it is not known, and then any path may be chosen.
    ``lane``: the lane to choose a path for instead of the one the
    request's features give (a request spilled off a full lane).
    ``named``: the model the request named; ``configured``: the lanes whose
    workers load its path as configured (``registry.lanes_serving``), for
    when the worker board does not say."""
    features = extract_features(
        request,
        routing,
        intent=found.intent,
        history_turns=found.history_turns,
        traits=found.traits,
    )
    complexity = complexity_of(features, routing)
    lane = lane or lane_for(request, features, complexity, routing)
    if routing.force_path is not None:
        path = AnswerPath(routing.force_path)
        model = _model_of(router, path)
        return Decision(lane, path, complexity, features, model=model, forced=True)
    answered_lane = request.lane or Lane.REALTIME  # answered at once, in the classifier
    if found.hit is not None:
        return Decision(answered_lane, AnswerPath.CACHE, complexity, features, hit=found.hit)
    if named is not None:  # that model's answer: no rule's, no other path's
        return Decision(
            lane_serving(lane, named.path, serving, configured),
            named.path,
            complexity,
            features,
            model=named.name,
            lane_asked=request.lane is not None or asks_realtime(features, routing),
            named=named,
        )
    if found.rule is not None:
        return Decision(answered_lane, AnswerPath.RULES, complexity, features, rule=found.rule)
    served = None if serving is None else serving.get(lane, frozenset())
    choice = router.choose(
        complexity, lane, stats, served, features=features, embedding=found.embedding
    )
    return Decision(
        lane,
        choice.path,
        complexity,
        features,
        model=choice.model,
        scores=choice.scores,
        explored=choice.explored,
        lane_asked=request.lane is not None or asks_realtime(features, routing),
    )


_NEAREST = {
    Lane.REALTIME: (Lane.REALTIME, Lane.MEDIUM, Lane.BULK),
    Lane.MEDIUM: (Lane.MEDIUM, Lane.REALTIME, Lane.BULK),
    Lane.BULK: (Lane.BULK, Lane.MEDIUM, Lane.REALTIME),
}


def lane_serving(
    lane: Lane,
    path: AnswerPath,
    serving: Mapping[Lane, Collection[AnswerPath]] | None,
    configured: Collection[Lane],
) -> Lane:
    """``lane`` if its workers serve ``path``, else the nearest lane that
    does: first by the live workers (``serving``), then as ``configured``;
    ``lane`` itself when none is known to (a worker there falls back)."""
    order = _NEAREST[lane]
    if serving is not None:
        for candidate in order:
            if path in serving.get(candidate, ()):
                return candidate
    return next((candidate for candidate in order if candidate in configured), lane)


def _model_of(router: SmartRouter, path: AnswerPath) -> str | None:
    entry = router.registry.for_path(path)
    return entry.name if entry else None
