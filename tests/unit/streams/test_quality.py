"""What the quality loop remembers of an answer for the feedback join, and
how it keeps and merges the path statistics of its partitions."""

import json

import pytest

from schemas.messages import AnswerPath, Feedback, QualityEvent
from schemas.settings import KafkaSettings, RoutingSettings, Settings
from streams.quality.loop import Answered
from streams.quality.records import (
    PartStats,
    PendingFeedback,
    counts_outcome,
    fold,
    merge,
    merge_all,
)
from streams.routing.stats import PathStats


def test_an_answer_is_remembered_with_its_cache_entry() -> None:
    answered = Answered(AnswerPath.CACHE, "0f3a")
    assert Answered.from_json(answered.to_json()) == answered
    assert Answered.from_json(Answered(AnswerPath.LIGHT).to_json()) == Answered(AnswerPath.LIGHT)


def test_the_bare_path_kept_before_cache_keys_still_joins() -> None:
    assert Answered.from_json(b"heavy") == Answered(AnswerPath.HEAVY)


def test_unreadable_records_join_nothing() -> None:
    for raw in (b"", b"garbage", b'{"path": "No pe"}', b"[1]", b'{"cache_key": "k"}'):
        assert Answered.from_json(raw) is None


# -- statistics kept per partition, merged per path --------------------------------------


def _event(
    i: int, success: bool = True, latency_ms: float = 100.0, **fields: object
) -> QualityEvent:
    return QualityEvent(
        id=f"r{i}", path=AnswerPath.LIGHT, success=success, latency_ms=latency_ms, ts_ms=i, **fields
    )


SETTINGS = Settings(kafka=KafkaSettings(partitions=4), routing=RoutingSettings(success_window=6))


def _spread(events: list[QualityEvent]) -> list[PartStats]:
    """The events folded as the loop folds them: by partition (round robin)."""
    parts = [PartStats(PathStats(latency_ms=100.0)) for _ in range(4)]
    for i, event in enumerate(events):
        parts[i % 4].fold(event, SETTINGS)
    return parts


def test_merged_partitions_see_the_newest_window_as_one_record_would() -> None:
    events = [_event(i, success=i < 20) for i in range(24)]  # the last four failed
    whole = None
    for event in events:
        whole = fold(whole, event, SETTINGS)
    merged = merge(_spread(events), SETTINGS.routing.success_window, SETTINGS.routing.ewma_alpha)
    assert whole is not None and merged.outcomes == whole.outcomes == [1, 1, 0, 0, 0, 0]
    assert merged.n == whole.n == 24


def test_merged_latency_follows_the_newest_successes_as_one_record_would() -> None:
    settings = Settings(kafka=KafkaSettings(partitions=4))  # the default window, 50
    slow_start = [_event(i, latency_ms=5_000.0 if i < 4 else 200.0) for i in range(30)]
    whole = None
    parts = [PartStats(PathStats(latency_ms=5_000.0)) for _ in range(4)]
    for i, event in enumerate(slow_start):
        whole = fold(whole, event, settings)
        parts[i % 4].fold(event, settings)
    merged = merge(parts, 50, settings.routing.ewma_alpha)
    assert whole is not None and merged.latency_ms == pytest.approx(whole.latency_ms)
    assert merged.latency_ms < 300  # the cold start is forgotten as fast as before


def test_a_partition_that_heard_nothing_lately_does_not_hold_the_path_back() -> None:
    failures = [_event(i, success=False) for i in range(8)]  # every partition saw failures
    recovered = [_event(100 + i) for i in range(6)]  # then successes, all on partition 0
    parts = _spread(failures)
    for event in recovered:
        parts[0].fold(event, SETTINGS)
    assert merge(parts, 6, 0.2).success_rate == 1.0


def test_merged_record_weighs_partitions_by_what_they_saw() -> None:
    busy = PartStats(
        PathStats(latency_ms=100.0, outcomes=[1, 1, 1], n=3, updated_ms=5),
        0,
        [1, 2, 3],
        [(1, 100.0), (2, 100.0), (3, 100.0)],
    )
    failing = PartStats(
        PathStats(latency_ms=400.0, outcomes=[0], quality=0.25, n=1, updated_ms=9), 1, [4]
    )
    quiet = PartStats(PathStats(latency_ms=999.0, quality=1.0, n=0), 0)
    merged = merge([busy, failing, quiet], 50, 0.2)
    assert merged.outcomes == [1, 1, 1, 0] and merged.success_rate == 0.75
    assert merged.latency_ms == 100.0  # only successes move the latency
    assert merged.quality == 0.25  # only one partition heard any feedback
    assert (merged.n, merged.updated_ms) == (4, 9)


def test_feedback_is_counted_and_refused_requests_add_no_outcome() -> None:
    part = PartStats(PathStats(latency_ms=10.0))
    part.fold(_event(1, kind="feedback", feedback=-1.0), SETTINGS)
    part.fold(_event(2, success=False, error_code="INF-429"), SETTINGS)
    part.fold(_event(3), SETTINGS)
    assert part.feedbacks == 1 and part.stats.outcomes == [1] and part.ts_ms == [3]
    assert not counts_outcome(_event(4, kind="drift"))


def test_parts_round_trip_and_unknown_fields_are_left_out() -> None:
    stats = PathStats(latency_ms=12.5, outcomes=[1, 0], n=2, updated_ms=7)
    part = PartStats(stats, feedbacks=3, ts_ms=[5, 7], samples=[(5, 12.5)])
    assert PartStats.from_json(part.to_json()) == part
    older = json.dumps(json.loads(stats.to_json()))  # a record kept before times were
    assert PartStats.from_json(older).ts_ms == [7, 7]
    merged = merge_all({"light@0": part, "light@3": part, "heavy": part, "No pe@1": part}, 50, 0.2)
    assert list(merged) == [AnswerPath.LIGHT] and merged[AnswerPath.LIGHT].outcomes == [1, 1, 0, 0]


def test_merged_feedback_quality_is_one_record_fed_every_verdict() -> None:
    # Verdicts spread over partitions merge as one record fed them all in time
    # order; a bad one lowers the merged quality whichever partition it is on.
    # (Weighting each part's own quality by its feedback did not: a first -1
    # on a fresh partition took that part to 0.5 and raised a merged 0.22.)
    verdicts = [_event(i, kind="feedback", feedback=-1.0) for i in range(1, 4)]
    one = PartStats(PathStats(latency_ms=100.0))
    for v in verdicts:
        one.fold(v, SETTINGS)
    parts = [PartStats(PathStats(latency_ms=100.0)) for _ in range(4)]
    for v in verdicts:
        parts[0].fold(v, SETTINGS)
    before = merge(parts, 6, 0.2).quality
    assert before == pytest.approx(one.stats.quality) == pytest.approx(0.125)
    parts[3].fold(_event(9, kind="feedback", feedback=-1.0), SETTINGS)  # a fresh partition
    after = merge(parts, 6, 0.2).quality
    assert after == pytest.approx(0.0625) and after < before
    parts[2].fold(_event(10, kind="feedback", feedback=1.0), SETTINGS)
    assert merge(parts, 6, 0.2).quality == pytest.approx(0.53125)
    again = [PartStats.from_json(p.to_json()) for p in parts]
    assert merge(again, 6, 0.2).quality == pytest.approx(0.53125)  # verdicts are kept


def test_feedback_that_came_before_its_answer_waits_then_expires() -> None:
    pending = PendingFeedback(wait_s=10.0, limit=3)
    early = [Feedback(request_id=f"r{i}", score=-1.0) for i in range(4)]
    assert pending.add(early[0], now=0.0) == [] and len(pending) == 1
    for verdict in early[1:3]:
        pending.add(verdict, now=5.0)
    assert pending.add(early[3], now=5.0) == [early[0]]  # the oldest makes room
    due, late = pending.take(now=12.0)
    assert [v.request_id for _, v in due] == ["r1", "r2", "r3"] and late == [] and not pending
    pending.keep(*due[0])  # still unknown: back, with its arrival
    due, late = pending.take(now=16.0)
    assert due == [] and [v.request_id for v in late] == ["r1"]
