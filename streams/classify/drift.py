"""Feature drift: is today's traffic still the traffic the router was tuned on?

The first ``DriftSettings.baseline_size`` observations form the baseline and
are then frozen; afterwards the last ``DriftSettings.window`` observations are
compared against it with the population stability index,

    PSI = sum over bins of (actual - expected) * ln(actual / expected)

over bin proportions. Rules of thumb: below 0.1 stable, 0.1-0.25 a moderate
shift, above 0.25 a major one.

Bins are fixed when the baseline freezes, so observing is a bisect or a dict
lookup and two counter updates per feature, and scoring only sums over bins:
cheap enough to observe every request in the classifier. Memory is bounded:
the raw baseline is dropped once binned, the window keeps one small tuple of
bin indices per observation, categorical features keep at most
``MAX_CATEGORIES`` categories.

- numeric features (int or float in the whole baseline): bins cut at the
  baseline's quantiles (``numeric_bins``); values seen below or above the
  baseline fall into the outer bins.
- categorical features (str, bool, or mixed): one bin per baseline category,
  and one "other" bin for everything unseen.
- missing values (``None``, an absent key, NaN, a string where a number was
  expected) get a bin of their own: features going missing is drift too.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from prometheus_client import Gauge

from schemas.settings import DriftSettings

__all__ = [
    "DRIFT_PSI",
    "DriftMonitor",
    "Value",
    "numeric_bins",
    "psi",
]

Value = float | int | bool | str | None

DRIFT_PSI = Gauge(
    "laneway_drift_psi", "Population stability index of a feature against its baseline", ["feature"]
)

EPSILON = 1e-4
"""Stands in for an empty bin's proportion: ln(0) is undefined, and a bin
empty on one side is exactly the shift PSI should report, strongly but
finitely."""

MAX_CATEGORIES = 32
"""Categories a categorical feature keeps, the most frequent of the baseline;
the rest share the "other" bin. Bounds memory and the scoring noise of a
feature like tenant with many rare values."""

MAX_FEATURES = 64
"""Features the monitor follows (the first, by name, seen in the baseline)."""


def psi(expected: Sequence[float], actual: Sequence[float]) -> float:
    """Population stability index between two binnings of one feature.

    Accepts proportions or counts (each side is normalised), bin for bin.
    Empty bins count as ``EPSILON``.
    """
    if len(expected) != len(actual):
        raise ValueError(f"bins differ: {len(expected)} expected, {len(actual)} actual")
    e_total, a_total = sum(expected), sum(actual)
    if e_total <= 0 or a_total <= 0:
        raise ValueError(f"empty distribution: totals {e_total} expected, {a_total} actual")
    score = 0.0
    for e, a in zip(expected, actual, strict=True):
        pe = max(e / e_total, EPSILON)
        pa = max(a / a_total, EPSILON)
        score += (pa - pe) * math.log(pa / pe)
    return score


def numeric_bins(values: Sequence[float], n: int = 10) -> list[float]:
    """Bin edges for ``bisect_right``: the baseline's ``n``-quantiles.

    A single value that holds at least one bin's share of the baseline (a
    default ``max_tokens`` most clients send, a boolean-like 0/1) gets a bin
    of its own, ``[v, next float after v)``: otherwise "everyone sends 128"
    and "everyone sends 4096" could share a bin and the shift would be
    invisible. NaN and infinities are ignored (they cannot be interpolated).
    """
    clean = sorted(v for v in values if math.isfinite(v))
    if not clean:
        return []
    cuts = statistics.quantiles(clean, n=n, method="inclusive") if len(clean) > 1 else [clean[0]]
    edges = set(cuts)
    share = len(clean) / n
    for value, count in Counter(clean).items():
        if count >= share:
            edges.update((value, math.nextafter(value, math.inf)))
    return sorted(edges)


class _Binner(Protocol):
    size: int

    def index(self, value: Value) -> int: ...


class _Numeric:
    """Quantile bins, then one bin for missing or non-numeric values."""

    def __init__(self, baseline: Sequence[float]) -> None:
        self.edges = numeric_bins(baseline)
        self.missing = len(self.edges) + 1
        self.size = len(self.edges) + 2

    def index(self, value: Value) -> int:
        if value is None or isinstance(value, (str, bool)) or value != value:  # NaN
            return self.missing
        return bisect_right(self.edges, value)


class _Categorical:
    """One bin per baseline category (``None`` included), then "other"."""

    def __init__(self, baseline: Sequence[Value]) -> None:
        top = Counter(baseline).most_common(MAX_CATEGORIES)
        self.bins: dict[Value, int] = {value: i for i, (value, _) in enumerate(top)}
        self.other = len(self.bins)
        self.size = len(self.bins) + 1

    def index(self, value: Value) -> int:
        return self.bins.get(value, self.other)


def _is_number(value: Value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _binner(values: Sequence[Value]) -> _Binner:
    present = [v for v in values if v is not None]
    if present and all(_is_number(v) for v in present):
        return _Numeric([float(v) for v in present if isinstance(v, (int, float))])
    return _Categorical(values)


class DriftMonitor:
    """Baseline, then a sliding window; PSI per feature on demand.

    Not thread-safe: observe and score from one event loop.
    """

    def __init__(self, settings: DriftSettings) -> None:
        self._settings = settings
        self._baseline_rows: list[dict[str, Value]] | None = []
        self._names: tuple[str, ...] = ()
        self._binners: list[_Binner] = []
        self._indexers: list[tuple[str, Callable[[Value], int]]] = []
        """Per feature followed, its name and its binner's ``index``."""
        self._expected: list[list[int]] = []
        self._counts: list[list[int]] = []
        self._window: deque[tuple[int, ...]] = deque()
        # Sampling noise alone gives PSI about (bins - 1) * (1/baseline + 1/window)
        # on unchanged traffic: 0.11 for 10 bins, 500 baseline, 100 window, too
        # near the 0.2 threshold. Half the baseline (0.05) keeps false alarms
        # rare; a smaller window must be full.
        self.min_window = min(settings.window, max(10, settings.baseline_size // 2))

    @property
    def baseline_ready(self) -> bool:
        return self._baseline_rows is None

    @property
    def window_size(self) -> int:
        return len(self._window)

    @property
    def features(self) -> tuple[str, ...]:
        """The features followed: those the baseline saw, fixed when it froze.
        A feature first seen later has no baseline to compare with."""
        return self._names

    def observe(self, features: Mapping[str, Value]) -> None:
        """Record one request's features (absent ones count as missing)."""
        if not self._settings.enabled:
            return
        rows = self._baseline_rows
        if rows is not None:
            rows.append(dict(features))
            if len(rows) >= self._settings.baseline_size:
                self._freeze(rows)
            return
        # Once per request on the classifier's hot path: bound methods and
        # plain loops, no generator.
        get = features.get
        bins = tuple([index(get(name)) for name, index in self._indexers])
        window = self._window
        counts = self._counts
        if len(window) >= self._settings.window:
            old = window.popleft()
            for n, column in enumerate(counts):
                column[old[n]] -= 1
        window.append(bins)
        for n, column in enumerate(counts):
            column[bins[n]] += 1

    def _freeze(self, rows: list[dict[str, Value]]) -> None:
        """Fix the bins and the expected counts; drop the raw baseline."""
        names = sorted({name for row in rows for name in row})[:MAX_FEATURES]
        self._names = tuple(names)
        for name in names:
            column = [row.get(name) for row in rows]
            binner = _binner(column)
            expected = [0] * binner.size
            for value in column:
                expected[binner.index(value)] += 1
            self._binners.append(binner)
            self._expected.append(expected)
            self._counts.append([0] * binner.size)
            self._indexers.append((name, binner.index))
        self._baseline_rows = None

    def scores(self) -> dict[str, float]:
        """PSI per feature; empty until the baseline is frozen and the window
        holds ``min_window`` observations."""
        if not self.baseline_ready or len(self._window) < self.min_window:
            return {}
        return {
            name: psi(expected, counts)
            for name, expected, counts in zip(
                self._names, self._expected, self._counts, strict=True
            )
        }

    def drifted(self, scores: Mapping[str, float] | None = None) -> dict[str, float]:
        """The features whose PSI is above ``DriftSettings.threshold``."""
        scores = self.scores() if scores is None else scores
        return {name: s for name, s in scores.items() if s > self._settings.threshold}

    def publish(self) -> dict[str, float]:
        """Set the ``laneway_drift_psi`` gauge per feature; return the drifted
        ones, for the caller to report as quality events."""
        scores = self.scores()
        for name, score in scores.items():
            DRIFT_PSI.labels(name).set(score)
        return self.drifted(scores)
