"""A batch of quality events folded at once gives the records, and the
merged route statistics, that folding them one by one gave."""

import json
import random

from schemas.errors import ErrorCode
from schemas.messages import AnswerPath, QualityEvent
from schemas.settings import KafkaSettings, RoutingSettings, Settings
from streams.quality.batch import count_events, fold_batch, record_fields
from streams.quality.records import PartStats, merge_all, merge_routers, merge_versions
from streams.routing.stats import PathStats

SETTINGS = Settings(kafka=KafkaSettings(partitions=4), routing=RoutingSettings(success_window=8))
PATHS = [AnswerPath.RULES, AnswerPath.LIGHT, AnswerPath.HEAVY, None]
CODES = [None, None, ErrorCode.RATE_LIMITED, ErrorCode.BACKEND_UNAVAILABLE]


def _events(n: int, seed: int) -> list[tuple[QualityEvent, int]]:
    """``n`` events of every kind, paths, versions and router versions,
    each with the partition it was read from."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.choice(["result", "result", "result", "attempt", "feedback", "drift"])
        path = rng.choice(PATHS)
        event = QualityEvent(
            kind=kind,
            id=f"r{i}",
            path=path,
            success=rng.random() < 0.8,
            error_code=rng.choice(
                [None, None, ErrorCode.RATE_LIMITED, ErrorCode.BACKEND_UNAVAILABLE]
            ),
            latency_ms=rng.uniform(1, 500),
            ts_ms=1_000 + i,
            feedback=rng.uniform(-1, 1) if kind == "feedback" else None,
            version=rng.choice([None, "1", "2"]),
            router_version=rng.choice([None, "rule", "lr-1"]),
        )
        out.append((event, rng.randrange(4)))
    return out


def _one_by_one(
    events: list[tuple[QualityEvent, int]], table: dict[str, object]
) -> dict[str, object]:
    """The loop's fold before batches: per event, each record read from the
    table (JSON) and written back."""
    for event, partition in events:
        if event.path is None or event.kind in ("drift", "rollback"):
            continue
        for key in record_fields(event, event.path, partition):
            current = table.get(key)
            if current:
                part = PartStats.from_json(json.dumps(current))
            else:
                part = PartStats(PathStats(latency_ms=event.latency_ms))
            part.fold(event, SETTINGS)
            table[key] = json.loads(part.to_json())
    return table


def _in_batches(
    events: list[tuple[QualityEvent, int]], table: dict[str, object], size: int
) -> tuple[dict[str, object], int]:
    """The batch fold, as the loop runs it; also how many table writes."""
    writes = 0

    def read(name: str) -> PartStats | None:
        current = table.get(name)
        return PartStats.from_json(json.dumps(current)) if current else None

    for start in range(0, len(events), size):
        for (name, partition), part in fold_batch(
            events[start : start + size], read, SETTINGS
        ).items():
            assert name.endswith(f"@{partition}")
            table[name] = json.loads(part.to_json())
            writes += 1
    return table, writes


def test_a_batch_fold_gives_the_records_the_per_event_fold_gave() -> None:
    events = _events(3000, seed=7)
    expected = _one_by_one(events, {})
    for size in (1, 7, 500, 3000):
        got, writes = _in_batches(events, {}, size)
        assert got == expected
        assert writes <= len(expected) * -(-len(events) // size)  # once per batch at most


def test_merged_route_statistics_equal_the_per_event_fold() -> None:
    events = _events(2000, seed=11)
    expected = {k: PartStats.from_json(json.dumps(v)) for k, v in _one_by_one(events, {}).items()}
    got = {
        k: PartStats.from_json(json.dumps(v)) for k, v in _in_batches(events, {}, 250)[0].items()
    }
    routing = SETTINGS.routing
    for merged in (merge_all, merge_versions, merge_routers):
        args = (routing.success_window, routing.ewma_alpha)
        assert {k: v.to_json() for k, v in merged(got, *args).items()} == {
            k: v.to_json() for k, v in merged(expected, *args).items()
        }


def test_each_record_is_written_once_per_batch() -> None:
    events = _events(1000, seed=3)
    records = fold_batch(events, lambda name: None, SETTINGS)
    touched = {
        (name, p)
        for e, p in events
        if e.path is not None and e.kind != "drift"
        for name in record_fields(e, e.path, p)
    }
    assert set(records) == touched


def test_a_batch_continues_the_records_already_in_the_table() -> None:
    events = _events(400, seed=5)
    first, rest = events[:150], events[150:]
    table = _one_by_one(first, {})
    got, _ = _in_batches(rest, dict(table), 400)
    assert got == _one_by_one(rest, table)


def test_events_are_counted_by_kind_and_path() -> None:
    events = [e for e, _ in _events(500, seed=2)]
    counts = count_events(events)
    assert sum(counts.values()) == 500
    assert counts[("drift", "none")] == sum(
        1 for e in events if e.kind == "drift" and e.path is None
    )
    assert counts[("result", str(AnswerPath.LIGHT))] == sum(
        1 for e in events if e.kind == "result" and e.path == AnswerPath.LIGHT
    )
