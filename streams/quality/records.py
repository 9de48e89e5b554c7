"""The quality loop's records, as pure data and maths (``streams.quality.loop``
runs them): one partition's record of a path, of a model version or of a
router version (``PartStats``, fields ``<path>@<partition>``,
``<path>~<version>@<partition>``, ``router~<version>@<partition>``), how an
event is folded in, how the partitions' records merge into the
``PathStats`` the router reads, and each lane's recent p95 latency."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.errors import blames_path_code
from schemas.messages import AnswerPath, Feedback, Lane, QualityEvent
from schemas.settings import Settings
from streams.rollout.rollback import RouterRecord
from streams.routing.stats import PathStats

__all__ = [
    "ROUTER_FIELD",
    "VERSION_SEP",
    "LaneLatency",
    "PartStats",
    "PendingFeedback",
    "counts_outcome",
    "fold",
    "merge",
    "merge_all",
    "merge_routers",
    "merge_versions",
    "owned_records",
    "read_parts",
    "router_field",
    "version_field",
]

VERSION_SEP = "~"
"""Between path and version in a version record's field: ``heavy~2@3``."""


ROUTER_FIELD = "router"
"""Before the separator in a router version's record: ``router~lr-1@3``."""


def version_field(path: AnswerPath, version: str, partition: int | str) -> str:
    return f"{path.value}{VERSION_SEP}{version}@{partition}"


def router_field(router_version: str, partition: int | str) -> str:
    return f"{ROUTER_FIELD}{VERSION_SEP}{router_version}@{partition}"


class LaneLatency:
    """The most recent result latencies per lane, for their p95: at most
    ``size`` per lane, none older than ``max_age_s``. A lane with no recent
    result has no p95, so the flow controller's latency level falls once its
    traffic stops instead of holding the last busy figure for ever."""

    def __init__(
        self,
        size: int = 200,
        max_age_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._samples: dict[Lane, deque[tuple[float, float]]] = {
            lane: deque(maxlen=size) for lane in Lane
        }
        self._max_age_s = max_age_s
        self._clock = clock

    def add(self, lane: Lane, latency_ms: float) -> None:
        self._samples[lane].append((self._clock(), latency_ms))

    def p95(self) -> dict[Lane, float]:
        out = {}
        oldest = self._clock() - self._max_age_s
        for lane, samples in self._samples.items():
            while samples and samples[0][0] < oldest:
                samples.popleft()
            if samples:
                ordered = sorted(latency for _, latency in samples)
                out[lane] = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return out


class PendingFeedback:
    """Feedback that came before its answer was known (the client was faster
    than the quality loop): kept in arrival order, at most ``limit`` (the
    oldest go first), until it is joined or ``wait_s`` has passed. In memory:
    a restart of the quality loop forgets it."""

    def __init__(self, wait_s: float, limit: int = 10_000) -> None:
        self.wait_s = wait_s
        self.limit = limit
        self._waiting: deque[tuple[float, Feedback]] = deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, verdict: Feedback, now: float) -> list[Feedback]:
        """Keep ``verdict`` (arrived at ``now``); the ones pushed out for room."""
        self._waiting.append((now, verdict))
        pushed = []
        while len(self._waiting) > self.limit:
            pushed.append(self._waiting.popleft()[1])
        return pushed

    def take(self, now: float) -> tuple[list[tuple[float, Feedback]], list[Feedback]]:
        """Everything kept, emptied: ``(still in time, with when each
        arrived; too old)``. Put back with ``keep`` what is still unmatched."""
        waiting, self._waiting = self._waiting, deque()
        due = [(at, v) for at, v in waiting if now - at <= self.wait_s]
        late = [v for at, v in waiting if now - at > self.wait_s]
        return due, late

    def keep(self, arrived: float, verdict: Feedback) -> None:
        """Put back one taken that is still unmatched (its arrival kept)."""
        self._waiting.append((arrived, verdict))


def fold(stats: PathStats | None, event: QualityEvent, settings: Settings) -> PathStats:
    """One event folded into a path's record (a fresh record for a new path)."""
    routing = settings.routing
    if stats is None:
        stats = PathStats(latency_ms=event.latency_ms)
    if event.kind == "feedback" and event.feedback is not None:
        stats.feedback(event.feedback, weight=routing.feedback_weight)
    elif event.kind in ("result", "attempt"):
        stats.observe(event, alpha=routing.ewma_alpha, window=routing.success_window)
    return stats


def counts_outcome(event: QualityEvent) -> bool:
    """Whether ``PathStats.observe`` adds an outcome for ``event``."""
    return event.kind in ("result", "attempt") and blames_path_code(event.error_code)


@dataclass(slots=True)
class PartStats:
    """One partition's record of one path: its ``PathStats``, when each of
    its outcomes happened (``ts_ms``, aligned with ``stats.outcomes``), the
    latency of its recent successes with their times (``samples``), how
    much feedback it holds and its recent verdicts with their times
    (``verdicts``: -1..1 scores)."""

    stats: PathStats
    feedbacks: int = 0
    ts_ms: list[int] = field(default_factory=list)
    samples: list[tuple[int, float]] = field(default_factory=list)
    heavy: list[int] = field(default_factory=list)
    """1 where the heavy path gave the outcome (aligned with ``ts_ms``)."""
    verdicts: list[tuple[int, float]] = field(default_factory=list)
    """The newest feedback scores with their times, at most ``success_window``."""

    def fold(self, event: QualityEvent, settings: Settings) -> None:
        self.stats = fold(self.stats, event, settings)
        if counts_outcome(event):
            self.ts_ms.append(event.ts_ms)
            self.ts_ms = self.ts_ms[-len(self.stats.outcomes) :]
            self.heavy.append(1 if event.path == AnswerPath.HEAVY else 0)
            self.heavy = self.heavy[-len(self.stats.outcomes) :]
            if event.success:
                self.samples.append((event.ts_ms, event.latency_ms))
                del self.samples[: -settings.routing.success_window]
        if event.kind == "feedback":
            self.feedbacks += 1
            if event.feedback is not None:
                self.verdicts.append((event.ts_ms, event.feedback))
                del self.verdicts[: -settings.routing.success_window]

    def since(self, ts_ms: int) -> PartStats:
        """This record with only the outcomes (and latencies) from ``ts_ms`` on."""
        heavy = self._heavy()
        kept = [(t, o) for t, o in zip(self.ts_ms, self.stats.outcomes, strict=True) if t >= ts_ms]
        kept_heavy = [h for t, h in zip(self.ts_ms, heavy, strict=True) if t >= ts_ms]
        stats = PathStats(
            latency_ms=self.stats.latency_ms,
            outcomes=[o for _, o in kept],
            quality=self.stats.quality,
            n=self.stats.n,
            updated_ms=self.stats.updated_ms,
        )
        samples = [s for s in self.samples if s[0] >= ts_ms]
        return PartStats(
            stats, self.feedbacks, [t for t, _ in kept], samples, kept_heavy, self.verdicts
        )

    def _heavy(self) -> list[int]:
        """``heavy`` aligned with ``ts_ms`` (a record written before it was kept: zeros)."""
        if len(self.heavy) == len(self.ts_ms):
            return self.heavy
        return [0] * len(self.ts_ms)

    def to_json(self) -> str:
        return json.dumps(
            {
                **_as_dict(self.stats),
                "feedbacks": self.feedbacks,
                "ts": self.ts_ms,
                "samples": self.samples,
                "heavy": self.heavy,
                "verdicts": self.verdicts,
            }
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> PartStats:
        data = json.loads(raw)
        stats = PathStats.from_json(raw)
        ts = [int(t) for t in data.get("ts", [])]
        if len(ts) != len(stats.outcomes):  # written before times were kept
            ts = [stats.updated_ms] * len(stats.outcomes)
        samples = [(int(t), float(v)) for t, v in data.get("samples", [])]
        heavy = [int(h) for h in data.get("heavy", [])]
        verdicts = [(int(t), float(v)) for t, v in data.get("verdicts", [])]
        return cls(stats, int(data.get("feedbacks", 0)), ts, samples, heavy, verdicts)


def owned_records(table: Iterable[tuple[str, Any]], owned: set[int]) -> dict[str, str]:
    """What a replica writes to ``<prefix>:route:parts`` at each publish:
    the records of its table (``(field, value)`` pairs) whose partition it
    owns now, as JSON. A record of a partition a rebalance took away stays
    in its table (the changelog's) but is the new owner's to write."""
    mine: dict[str, str] = {}
    for name, value in table:
        _, _, partition = str(name).partition("@")
        if value and partition.isdigit() and int(partition) in owned:
            mine[str(name)] = json.dumps(value)
    return mine


def read_parts(
    everyone: Mapping[Any, Any], warn: Callable[[str, Exception], None] | None = None
) -> dict[str, PartStats]:
    """Every replica's records as read back from ``<prefix>:route:parts``
    (fields and values as bytes or str); one that cannot be read is left out
    (and handed to ``warn``)."""
    fields: dict[str, PartStats] = {}
    for name, raw in everyone.items():
        text = name.decode() if isinstance(name, bytes) else str(name)
        try:
            fields[text] = PartStats.from_json(raw)
        except (ValueError, TypeError, KeyError) as exc:
            if warn is not None:
                warn(text, exc)
    return fields


def merge(
    parts: list[PartStats], window: int, alpha: float, feedback_weight: float = 0.5
) -> PathStats:
    """One path's record from its partitions' records, as one record fed
    every event would be: the newest ``window`` outcomes of all of them by
    time, the latency EWMA (``alpha``) replayed over their recent successes
    in time order, the feedback quality replayed (``feedback_weight``) over
    their recent verdicts in time order, counts summed."""
    timed = sorted((t, o) for p in parts for t, o in zip(p.ts_ms, p.stats.outcomes, strict=True))[
        -window:
    ]
    samples = sorted(s for p in parts for s in p.samples)[-window:]
    if samples:
        latency = samples[0][1]
        for _, sample in samples[1:]:
            latency = alpha * sample + (1 - alpha) * latency
    else:  # nothing succeeded lately: what the records say, each as much
        latency = sum(p.stats.latency_ms for p in parts) / len(parts)
    return PathStats(
        latency_ms=latency,
        outcomes=[o for _, o in timed],
        quality=_merged_quality(parts, window, feedback_weight),
        n=sum(p.stats.n for p in parts),
        updated_ms=max((p.stats.updated_ms for p in parts), default=0),
    )


def _merged_quality(parts: list[PartStats], window: int, weight: float) -> float:
    """Feedback quality replayed over every part's verdicts in time order, as
    one record fed them all would have it (so a bad verdict always lowers
    it, whichever partition it lands on). Parts written before verdicts were
    kept: each one's quality weighted by its feedback."""
    if all(len(p.verdicts) >= min(p.feedbacks, window) for p in parts):
        replay = PathStats(latency_ms=0.0)  # quality 1, as a fresh record
        for _, score in sorted(v for p in parts for v in p.verdicts)[-window:]:
            replay.feedback(score, weight=weight)
        return replay.quality
    said = sum(p.feedbacks for p in parts)
    if said:
        return sum(p.feedbacks * p.stats.quality for p in parts) / said
    return min((p.stats.quality for p in parts), default=1.0)


def merge_all(
    fields: dict[str, PartStats], window: int, alpha: float, feedback_weight: float = 0.5
) -> dict[AnswerPath, PathStats]:
    """Every path's merged record from ``<path>@<partition>`` fields."""
    by_path: dict[AnswerPath, list[PartStats]] = {}
    for name, part in fields.items():
        path_name, _, partition = name.partition("@")
        if not partition or not AnswerPath.valid(path_name):
            continue
        by_path.setdefault(AnswerPath(path_name), []).append(part)
    return {path: merge(parts, window, alpha, feedback_weight) for path, parts in by_path.items()}


def merge_versions(
    fields: dict[str, PartStats],
    window: int,
    alpha: float,
    since: Callable[[AnswerPath, str], int] = lambda path, version: 0,
    feedback_weight: float = 0.5,
) -> dict[tuple[AnswerPath, str], PathStats]:
    """Every version's merged record from ``<path>~<version>@<partition>``
    fields, each over its outcomes from ``since(path, version)`` on."""
    by_version: dict[tuple[AnswerPath, str], list[PartStats]] = {}
    for name, part in fields.items():
        head, _, partition = name.rpartition("@")
        path_name, sep, version = head.partition(VERSION_SEP)
        if not partition or not sep or not AnswerPath.valid(path_name):
            continue
        by_version.setdefault((AnswerPath(path_name), version), []).append(part)
    return {
        key: merge([p.since(since(*key)) for p in parts], window, alpha, feedback_weight)
        for key, parts in by_version.items()
    }


def merge_routers(
    fields: dict[str, PartStats],
    window: int,
    alpha: float,
    since: Callable[[str], int] = lambda version: 0,
    feedback_weight: float = 0.5,
) -> dict[str, RouterRecord]:
    """Every router version's merged record from ``router~<version>@<partition>``
    fields, each over its outcomes from ``since(version)`` on, with the share
    of those outcomes the heavy path gave."""
    by_version: dict[str, list[PartStats]] = {}
    for name, part in fields.items():
        head, _, partition = name.rpartition("@")
        kind, sep, version = head.partition(VERSION_SEP)
        if partition and sep and kind == ROUTER_FIELD and version:
            by_version.setdefault(version, []).append(part.since(since(version)))
    out = {}
    for version, parts in by_version.items():
        timed = sorted((t, h) for p in parts for t, h in zip(p.ts_ms, p._heavy(), strict=True))[
            -window:
        ]
        heavy_share = sum(h for _, h in timed) / len(timed) if timed else 0.0
        out[version] = RouterRecord(merge(parts, window, alpha, feedback_weight), heavy_share)
    return out


def _as_dict(stats: PathStats) -> dict[str, Any]:
    return dict(json.loads(stats.to_json()))
