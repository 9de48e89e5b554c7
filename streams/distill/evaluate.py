"""How a router's decisions compare on labelled rows: pure numpy, shared by
``train`` (its metrics), ``report`` and ``laneway bench --router``.

The quality model is RouteLLM's: a request sent heavy gets a good answer
(the heavy model is the reference), one sent light gets a good answer when
its label says the light answer was good enough. So at a heavy share ``s``
the quality is ``(heavy calls + good light answers) / n``, and the curve
sweeps ``s`` from 0 (all light) to 1 (all heavy) by sending the requests
with the lowest ``p`` (chance light is good enough) heavy first.

Today's rule is what the features and the registry's ``max_complexity``
would do: heavy when the request's complexity class is above what the light
model is capable of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.messages import AnswerPath
from schemas.settings import RoutingSettings
from streams.routing.features import Complexity, RequestFeatures, complexity_of
from streams.routing.registry import ModelRegistry

__all__ = [
    "Curve",
    "Point",
    "agreement",
    "auc",
    "curve",
    "heavy_share_at_quality",
    "point",
    "rule_heavy",
]


def rule_heavy(
    features: Sequence[Mapping[str, Any]], routing: RoutingSettings, registry: ModelRegistry
) -> np.ndarray:
    """Per row, whether today's feature rule sends it heavy."""
    light = registry.for_path(AnswerPath.LIGHT)
    capable = light.capability if light is not None else Complexity.SIMPLE
    return np.array(
        [complexity_of(RequestFeatures(**dict(f)), routing) > capable for f in features],
        dtype=bool,
    )


@dataclass(frozen=True, slots=True)
class Point:
    """One router's decisions on labelled rows."""

    heavy_share: float
    quality: float
    """Share of requests with a good answer (heavy, or light and labelled good)."""
    agreement: float
    """Share of decisions the labels agree with: light where light was good
    enough, heavy where it was not."""

    def as_dict(self) -> dict[str, float]:
        return {
            "heavy_share": round(self.heavy_share, 4),
            "quality": round(self.quality, 4),
            "agreement": round(self.agreement, 4),
        }


def agreement(heavy: np.ndarray, good: np.ndarray) -> float:
    return float(np.mean(heavy != good)) if len(good) else 0.0


def point(heavy: np.ndarray, good: np.ndarray) -> Point:
    if not len(good):
        return Point(0.0, 0.0, 0.0)
    quality = float(np.mean(heavy | good))
    return Point(float(np.mean(heavy)), quality, agreement(heavy, good))


@dataclass(frozen=True, slots=True)
class Curve:
    heavy_share: np.ndarray
    quality: np.ndarray

    def quality_at(self, share: float) -> float:
        return float(np.interp(share, self.heavy_share, self.quality))


def curve(p: np.ndarray, good: np.ndarray) -> Curve:
    """Quality at every heavy share ``k/n``, the ``k`` lowest-``p`` requests heavy."""
    n = len(good)
    if n == 0:
        return Curve(np.array([0.0, 1.0]), np.array([0.0, 0.0]))
    order = np.argsort(p, kind="stable")
    good_sorted = good[order].astype(np.float64)
    # k heavy: the first k rows are heavy (good), the rest are as labelled.
    good_after = np.concatenate([np.cumsum(good_sorted[::-1])[::-1], [0.0]])
    k = np.arange(n + 1)
    return Curve(k / n, (k + good_after) / n)


def heavy_share_at_quality(c: Curve, quality: float) -> float:
    """The smallest heavy share whose quality reaches ``quality`` (1 if none)."""
    reached = np.nonzero(c.quality >= quality - 1e-12)[0]
    return float(c.heavy_share[reached[0]]) if len(reached) else 1.0


def auc(p: np.ndarray, good: np.ndarray) -> float | None:
    """Area under the ROC curve of ``p`` for ``good`` (None with one class)."""
    pos, neg = p[good], p[~good]
    if not len(pos) or not len(neg):
        return None
    # Mann-Whitney: the chance a good row scores above a bad one, ties half.
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))
