"""Route statistics merged across two router replicas equal one router's.

The same quality events, over 8 partitions, go (a) to one router that owns
every partition and (b) to two replicas that share them, with a rebalance
half-way that moves a partition from one to the other (its record comes
along through the table's changelog). Each folds its partitions' events in
batches (``fold_batch``, as ``QualityService.fold_events``), publishes the
records of the partitions it owns into one shared hash (``owned_records``,
as ``QualityService.publish`` writes ``<prefix>:route:parts``), and the
hash is read back and merged (``read_parts``, ``merge_all``, as the
publish does before ``RouteBoard.publish``).
"""

from __future__ import annotations

import json
import math
import random

from schemas.errors import ErrorCode
from schemas.messages import AnswerPath, QualityEvent
from schemas.settings import KafkaSettings, Settings
from streams.quality.batch import fold_batch
from streams.quality.records import (
    PartStats,
    fold,
    merge_all,
    merge_routers,
    merge_versions,
    owned_records,
    read_parts,
)
from streams.routing.stats import PathStats

PARTITIONS = 8
SETTINGS = Settings(kafka=KafkaSettings(partitions=PARTITIONS))
"""The default routing settings: a window of 50 outcomes, EWMA alpha 0.2."""


def events(n: int, seed: int) -> list[tuple[QualityEvent, int]]:
    """``n`` events in time order (one per millisecond), each with the
    partition its request id hashes to."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.choice(["result"] * 6 + ["attempt", "feedback", "drift"])
        event = QualityEvent(
            kind=kind,
            id=f"r{i}",
            path=rng.choice([AnswerPath.RULES, AnswerPath.LIGHT, AnswerPath.HEAVY, None]),
            success=rng.random() < 0.85,
            error_code=rng.choice([None, None, None, ErrorCode.BACKEND_UNAVAILABLE]),
            latency_ms=rng.uniform(1, 900),
            ts_ms=1_000_000 + i,
            feedback=rng.uniform(-1, 1) if kind == "feedback" else None,
            version=rng.choice([None, "1", "2"]),
            router_version=rng.choice([None, "rule", "lr-1"]),
        )
        out.append((event, rng.randrange(PARTITIONS)))
    return out


class Replica:
    """A router replica's table (field -> record as JSON data) and the
    partitions it owns."""

    def __init__(self, owned: set[int]) -> None:
        self.owned = set(owned)
        self.table: dict[str, object] = {}

    def fold(self, batch: list[tuple[QualityEvent, int]]) -> None:
        """The events of ``batch`` on partitions it owns: a consumer gets no others."""
        mine = [(e, p) for e, p in batch if p in self.owned]

        def read(name: str) -> PartStats | None:
            current = self.table.get(name)
            return PartStats.from_json(json.dumps(current)) if current else None

        for (name, _), part in fold_batch(mine, read, SETTINGS).items():
            self.table[name] = json.loads(part.to_json())

    def publish(self, parts: dict[str, str]) -> None:
        parts.update(owned_records(list(self.table.items()), self.owned))

    def take(self, partition: int, other: Replica) -> None:
        """A rebalance moves ``partition`` here from ``other``: its records
        come along (the changelog), ``other`` stops owning it."""
        other.owned.discard(partition)
        self.owned.add(partition)
        for name, value in other.table.items():
            if name.endswith(f"@{partition}"):
                self.table[name] = value


def run(replicas: list[Replica], stream: list[tuple[QualityEvent, int]], batch: int) -> dict:
    """Fold ``stream`` in batches on every replica, publishing after each
    batch; half-way, a rebalance when there are two. The shared hash."""
    parts: dict[str, str] = {}
    half = len(stream) // 2
    for start in range(0, len(stream), batch):
        if len(replicas) == 2 and start == half - half % batch:
            replicas[1].take(3, replicas[0])
        for replica in replicas:
            replica.fold(stream[start : start + batch])
            replica.publish(parts)
    return {name.encode(): value.encode() for name, value in parts.items()}  # as Redis hands it


def merged(parts: dict) -> dict[str, dict[object, str]]:
    fields = read_parts(parts)
    routing = SETTINGS.routing
    args = (routing.success_window, routing.ewma_alpha)
    return {
        merge.__name__: {k: v.to_json() for k, v in merge(fields, *args).items()}
        for merge in (merge_all, merge_versions, merge_routers)
    }


def test_two_replicas_merge_to_what_one_router_publishes() -> None:
    stream = events(4_000, seed=32)
    one = merged(run([Replica(set(range(PARTITIONS)))], stream, batch=300))
    two = merged(run([Replica({0, 1, 2, 3}), Replica({4, 5, 6, 7})], stream, batch=300))
    assert one["merge_all"], "no path statistics at all"
    assert two == one


def test_the_merge_is_what_one_record_fed_every_event_would_hold() -> None:
    """Against the loop of old, one record per path fed every event in
    order: the same outcome window, counts and times; latency and feedback
    quality as EWMAs replayed over the newest 50 (what older samples would
    add weighs 0.8^50 and 0.5^50 of it)."""
    stream = events(4_000, seed=33)
    parts = run([Replica({0, 1, 2, 3}), Replica({4, 5, 6, 7})], stream, batch=250)
    got = merge_all(read_parts(parts), SETTINGS.routing.success_window, SETTINGS.routing.ewma_alpha)
    single: dict[AnswerPath, PathStats] = {}
    for event, _ in stream:
        if event.path is not None and event.kind in ("result", "attempt", "feedback"):
            single[event.path] = fold(single.get(event.path), event, SETTINGS)
    assert set(got) == set(single)
    for path, stats in single.items():
        assert got[path].outcomes == stats.outcomes, path
        assert got[path].n == stats.n and got[path].updated_ms == stats.updated_ms, path
        assert math.isclose(got[path].latency_ms, stats.latency_ms, rel_tol=1e-3), path
        assert math.isclose(got[path].quality, stats.quality, rel_tol=1e-3), path


def test_a_replica_writes_only_the_partitions_it_owns() -> None:
    table = [("light@1", {"latency_ms": 1.0}), ("light@5", {"latency_ms": 2.0}), ("x", {})]
    assert set(owned_records(table, {1})) == {"light@1"}
    assert owned_records([("light@1", None)], {1}) == {}
    broken: list[str] = []
    fields = read_parts(
        {b"light@1": b'{"latency_ms": 3}', "heavy@2": b"not json"},
        lambda name, exc: broken.append(name),
    )
    assert set(fields) == {"light@1"} and broken == ["heavy@2"]
