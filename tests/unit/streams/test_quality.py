"""What the quality loop remembers of an answer for the feedback join."""

from schemas.messages import Path, QualityEvent
from schemas.settings import KafkaSettings, RoutingSettings, Settings
from streams.classify.router import PathStats
from streams.quality.loop import (
    Answered,
    PartStats,
    fold,
    merge,
    merge_all,
    partition_window,
)


def test_an_answer_is_remembered_with_its_cache_entry() -> None:
    answered = Answered(Path.CACHE, "0f3a")
    assert Answered.from_json(answered.to_json()) == answered
    assert Answered.from_json(Answered(Path.LIGHT).to_json()) == Answered(Path.LIGHT)


def test_the_bare_path_kept_before_cache_keys_still_joins() -> None:
    assert Answered.from_json(b"heavy") == Answered(Path.HEAVY)


def test_unreadable_records_join_nothing() -> None:
    for raw in (b"", b"garbage", b'{"path": "nope"}', b"[1]", b'{"cache_key": "k"}'):
        assert Answered.from_json(raw) is None


# -- statistics kept per partition, merged per path --------------------------------------


def _event(
    i: int, success: bool = True, latency_ms: float = 100.0, **fields: object
) -> QualityEvent:
    return QualityEvent(
        id=f"r{i}", path=Path.LIGHT, success=success, latency_ms=latency_ms, ts_ms=i, **fields
    )


def test_each_partition_keeps_its_share_of_the_success_window() -> None:
    settings = Settings(
        kafka=KafkaSettings(partitions=4), routing=RoutingSettings(success_window=50)
    )
    window = partition_window(settings)
    assert window == 13
    stats = None
    for i in range(40):
        stats = fold(stats, _event(i, success=i >= 30), settings, window=window)
    assert stats is not None and len(stats.outcomes) == 13 and sum(stats.outcomes) == 10


def test_merged_record_weighs_partitions_by_what_they_saw() -> None:
    busy = PartStats(PathStats(latency_ms=100.0, outcomes=[1, 1, 1], n=3, updated_ms=5), 0)
    failing = PartStats(
        PathStats(latency_ms=400.0, outcomes=[0], quality=0.25, n=1, updated_ms=9), feedbacks=1
    )
    quiet = PartStats(PathStats(latency_ms=999.0, quality=1.0, n=0), 0)
    merged = merge([busy, failing, quiet])
    assert merged.outcomes == [1, 1, 1, 0] and merged.success_rate == 0.75
    assert merged.latency_ms == (3 * 100.0 + 1 * 400.0) / 4
    assert merged.quality == 0.25  # only one partition heard any feedback
    assert (merged.n, merged.updated_ms) == (4, 9)


def test_parts_round_trip_and_unknown_fields_are_left_out() -> None:
    part = PartStats(PathStats(latency_ms=12.5, outcomes=[1, 0], n=2, updated_ms=7), feedbacks=3)
    assert PartStats.from_json(part.to_json()) == part
    merged = merge_all({"light@0": part, "light@3": part, "heavy": part, "nope@1": part})
    assert list(merged) == [Path.LIGHT] and merged[Path.LIGHT].outcomes == [1, 0, 1, 0]


def test_one_partition_merged_alone_is_that_partition() -> None:
    stats = PathStats(latency_ms=80.0, outcomes=[1, 0, 1], quality=0.9, n=3, updated_ms=4)
    assert merge([PartStats(stats, feedbacks=2)]) == stats
