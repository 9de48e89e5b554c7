"""What ``laneway top`` shows, computed from the processes' Prometheus
metrics and the Redis boards: pure functions, no I/O.

A ``Scrape`` is every process's ``/metrics`` read at one moment, summed
(counters and histograms) or maxed (gauges: a lane's backlog is reported by
the classifier, a breaker by each worker). ``snapshot(older, newer, ...)``
turns two scrapes into rates over the time between them, and latency
percentiles of the results in between (or, without an older scrape, since
the processes started).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from schemas.messages import AnswerPath, Lane
from streams.routing.stats import PathStats
from streams.stores.workerboard import WorkerCard

__all__ = ["LaneRow", "PathRow", "Scrape", "Snapshot", "quantile", "snapshot"]

Labels = frozenset[tuple[str, str]]

_MAXED = {"laneway_lane_backlog", "laneway_flow_level", "laneway_backend_breaker_state"}
"""Gauges several processes report the same thing in: the largest counts."""

_LATENCY = "laneway_result_latency_seconds"

BREAKER = {0: "closed", 1: "half-open", 2: "open"}


@dataclass(frozen=True, slots=True)
class Scrape:
    at_s: float
    samples: Mapping[tuple[str, Labels], float]
    sources: int = 0
    """How many processes answered."""

    @classmethod
    def parse(cls, texts: Iterable[str], at_s: float) -> Scrape:
        samples: dict[tuple[str, Labels], float] = {}
        sources = 0
        for text in texts:
            sources += 1
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if not sample.name.startswith("laneway_"):
                        continue
                    key = (sample.name, frozenset(sample.labels.items()))
                    if family.name in _MAXED:
                        samples[key] = max(samples.get(key, -math.inf), sample.value)
                    else:
                        samples[key] = samples.get(key, 0.0) + sample.value
        return cls(at_s, samples, sources)

    def total(self, name: str, **match: str) -> float:
        """The sum of ``name``'s samples whose labels include ``match``."""
        wanted = set(match.items())
        return sum(v for (n, labels), v in self.samples.items() if n == name and wanted <= labels)

    def values(self, name: str, label: str, **match: str) -> dict[str, float]:
        """``name``'s samples by the value of ``label`` (summed over the rest)."""
        wanted = set(match.items())
        out: dict[str, float] = {}
        for (n, labels), value in self.samples.items():
            if n != name or not wanted <= labels:
                continue
            key = dict(labels).get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + value
        return out

    def largest(self, name: str, **match: str) -> float | None:
        wanted = set(match.items())
        found = [v for (n, labels), v in self.samples.items() if n == name and wanted <= labels]
        return max(found) if found else None

    def buckets(self, name: str, **match: str) -> list[tuple[float, float]]:
        """A histogram's cumulative ``(upper bound, count)`` pairs, summed."""
        by_bound = self.values(f"{name}_bucket", "le", **match)
        return sorted((float(le), count) for le, count in by_bound.items())


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a cumulative histogram, interpolated inside its
    bucket (as Prometheus's ``histogram_quantile``); ``None`` when empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # past the last finite bucket: its bound is all we know
            inside = count - lower_count
            share = (rank - lower_count) / inside if inside > 0 else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def _minus(
    newer: Sequence[tuple[float, float]], older: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    before = dict(older)
    return [(bound, count - before.get(bound, 0.0)) for bound, count in newer]


@dataclass(frozen=True, slots=True)
class LaneRow:
    lane: Lane
    workers: int
    backlog: int | None
    in_flight: int | None
    batch_mean: float | None
    p50_ms: float | None
    p95_ms: float | None
    per_s: float | None
    results: int


@dataclass(frozen=True, slots=True)
class PathRow:
    path: AnswerPath
    share: float | None
    """This path's part of the terminal results since the processes started."""
    success: float | None
    quality: float | None
    latency_ms: float | None
    n: int
    breaker: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    lanes: list[LaneRow]
    paths: list[PathRow]
    cache_hit_ratio: float | None
    flow_level: int | None
    workers_alive: int | None
    """``None``: the worker board could not be read."""
    classifier_per_s: float | None
    sources: int
    window_s: float | None
    notes: list[str] = field(default_factory=list)
    latency_since_start: bool = False
    """Percentiles and batch sizes cover everything since the processes
    started, not the window (``laneway top --once``)."""


def snapshot(
    older: Scrape | None,
    newer: Scrape,
    *,
    workers: Sequence[WorkerCard] | None,
    stats: Mapping[AnswerPath, PathStats],
    backlog: Mapping[Lane, int] | None = None,
) -> Snapshot:
    """The view between two scrapes (rates need ``older``)."""
    window = newer.at_s - older.at_s if older is not None and newer.at_s > older.at_s else None

    def rate(name: str, **match: str) -> float | None:
        if older is None or window is None:
            return None
        return max(0.0, newer.total(name, **match) - older.total(name, **match)) / window

    lanes = []
    for lane in Lane:
        latency = newer.buckets("laneway_result_latency_seconds", lane=lane.value)
        if older is not None:
            recent = _minus(
                latency, older.buckets("laneway_result_latency_seconds", lane=lane.value)
            )
            if recent and recent[-1][1] > 0:
                latency = recent
        sizes = _difference(older, newer, "laneway_batch_size", lane=lane.value)
        p50, p95 = quantile(0.5, latency), quantile(0.95, latency)
        waiting = newer.largest("laneway_lane_backlog", lane=lane.value)
        if waiting is None and backlog is not None:
            waiting = backlog.get(lane)
        in_flight = newer.largest("laneway_lane_in_flight", lane=lane.value)
        lanes.append(
            LaneRow(
                lane=lane,
                workers=sum(1 for card in workers or () if card.lane == lane),
                backlog=None if waiting is None else int(waiting),
                in_flight=None
                if in_flight is None
                else int(newer.total("laneway_lane_in_flight", lane=lane.value)),
                batch_mean=sizes,
                p50_ms=None if p50 is None else p50 * 1000,
                p95_ms=None if p95 is None else p95 * 1000,
                per_s=rate("laneway_results_total", lane=lane.value),
                results=int(newer.total("laneway_results_total", lane=lane.value)),
            )
        )

    routed = newer.values("laneway_results_total", "path")
    answered = sum(routed.values())
    paths = []
    for path in _paths_shown(stats, routed, workers):
        live = stats.get(path)
        states = [
            v
            for (n, labels), v in newer.samples.items()
            if n == "laneway_backend_breaker_state" and ("path", path.value) in labels
        ]
        paths.append(
            PathRow(
                path=path,
                share=routed.get(path.value, 0.0) / answered if answered else None,
                success=live.success_rate if live and live.outcomes else None,
                quality=live.quality if live else None,
                latency_ms=live.latency_ms if live and live.outcomes else None,
                n=live.n if live else 0,
                breaker=BREAKER.get(int(max(states)), "?") if states else "-",
            )
        )

    lookups = newer.values("laneway_cache_lookups_total", "result")
    hits = lookups.get("exact", 0.0) + lookups.get("semantic", 0.0)
    asked = hits + lookups.get("miss", 0.0)
    level = newer.largest("laneway_flow_level")
    notes = []
    if newer.sources == 0:
        notes.append("no process answered on its /metrics address")
    if workers is None:
        notes.append("the worker board in Redis could not be read")
    return Snapshot(
        lanes=lanes,
        paths=paths,
        cache_hit_ratio=hits / asked if asked else None,
        flow_level=None if level is None else int(level),
        workers_alive=None if workers is None else len(workers),
        classifier_per_s=rate("laneway_records_total", component="classifier"),
        sources=newer.sources,
        window_s=window,
        notes=notes,
    )


def _difference(older: Scrape | None, newer: Scrape, name: str, **match: str) -> float | None:
    """A histogram's mean over the window (or since start, without ``older``)."""
    total = newer.total(f"{name}_sum", **match)
    count = newer.total(f"{name}_count", **match)
    if older is not None:
        d_total = total - older.total(f"{name}_sum", **match)
        d_count = count - older.total(f"{name}_count", **match)
        if d_count > 0:
            return d_total / d_count
    return total / count if count else None


def _paths_shown(
    stats: Mapping[AnswerPath, PathStats],
    routed: Mapping[str, float],
    workers: Sequence[WorkerCard] | None,
) -> list[AnswerPath]:
    """Cache, rules and the built-in model paths, then every other path the
    statistics, the results or the workers name (a registry's own paths)."""
    named = {*stats, *(n for n in routed if AnswerPath.valid(n))}
    named |= {p.path for card in workers or () for p in card.paths}
    first = [AnswerPath.CACHE, AnswerPath.RULES, AnswerPath.LIGHT, AnswerPath.HEAVY]
    return first + sorted(AnswerPath(n) for n in named if n not in first)
