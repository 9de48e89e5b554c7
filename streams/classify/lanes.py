"""Where a request goes, decided once, in one line of steps:

    features -> lane -> path      ``policy.decide``
    flow                          the realtime lane's room (``full``), a spill
                                  to medium (``flow.spills``, its paths chosen
                                  again), the load level (``flow.apply_level``)
    gate                          the realtime partition with room (``place``)

``decide_route`` runs the steps and returns a ``Routing`` that keeps what
each one decided, so that the record built from it is built once
(``classifier.route``) and nothing rewrites it afterwards. It does no I/O:
``full`` reads the realtime gate, and ``place`` is the gate's one write
(it counts a request sent to the partition it names).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

from schemas.messages import AnswerPath, InferenceRequest, Lane
from schemas.settings import Settings
from streams.classify.flow import LaneFull, Shed, apply_level, spills
from streams.classify.policy import Decision, Found, decide
from streams.classify.router import SmartRouter
from streams.routing.registry import ModelRegistry, NamedModel
from streams.routing.stats import PathStats

__all__ = ["Routing", "decide_route"]


@dataclass(frozen=True, slots=True)
class Routing:
    """What was decided for one request, a step at a time."""

    chosen: Decision
    """Features, lane and path as the policy chose them (a cache hit or a
    rule's answer ends here)."""
    taken: Decision | Shed
    """After flow control: the decision acted on, or the refusal."""
    lane_full: LaneFull | None = None
    """The realtime lane as the gate judged it for ``chosen``'s path."""
    spilled: Decision | None = None
    """The decision on the lane ``chosen`` spilled to (its paths chosen again)."""
    partition: int | None = None
    """The realtime partition the gate picked (``None``: the key's)."""

    @property
    def answered(self) -> bool:
        """The classifier answers it itself (cache or rules)."""
        return self.chosen.hit is not None or self.chosen.rule is not None

    @property
    def decision(self) -> Decision:
        """The last decision made: ``taken`` unless shed, then the one shed."""
        if isinstance(self.taken, Decision):
            return self.taken
        return self.spilled or self.chosen


def decide_route(
    request: InferenceRequest,
    found: Found,
    *,
    settings: Settings,
    router: SmartRouter,
    registry: ModelRegistry,
    stats: Mapping[AnswerPath, PathStats],
    serving: Mapping[Lane, Collection[AnswerPath]] | None = None,
    named: NamedModel | None = None,
    configured: Collection[Lane] = (),
    level: int = 0,
    full: Callable[[AnswerPath], LaneFull | None] | None = None,
    place: Callable[[AnswerPath], int | None] | None = None,
) -> Routing:
    """``router``: the one that chooses paths (a roll-out's learned version
    may stand in); ``registry``: whose cheapest model path a lane degrades
    to; ``full``: asked with the path of a model request put on the
    realtime lane, that lane when it is too full for it; ``place``: asked
    with the path of a request routed to the realtime lane, the partition
    to write it to. See ``classifier.route`` for the rest."""

    def choose(lane: Lane | None = None) -> Decision:
        return decide(
            request,
            found,
            settings.routing,
            router,
            stats,
            serving,
            lane,
            named=named,
            configured=configured,
        )

    chosen = choose()
    if chosen.hit is not None or chosen.rule is not None:
        return Routing(chosen, chosen)
    lane_full = None
    if full is not None and chosen.lane is Lane.REALTIME and chosen.path.is_model:
        lane_full = full(chosen.path)
    spilled = None
    spill = spills(chosen, lane_full)
    if spill is not None:  # the lane's own paths compete, as on any request sent there
        spilled = replace(choose(spill), spilled_from=chosen.lane)
    decision = spilled or chosen
    taken = apply_level(
        decision,
        level,
        settings.flow.shed_retry_after_ms,
        lane_full,
        registry.cheapest(decision.lane),
    )
    partition = None
    if place is not None and isinstance(taken, Decision) and taken.lane is Lane.REALTIME:
        partition = place(taken.path)
    return Routing(chosen, taken, lane_full, spilled, partition)
