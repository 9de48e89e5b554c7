"""What a lane worker reports to the backlog board, and the positions it
counts from."""

from __future__ import annotations

from aiokafka import ConsumerRecord, TopicPartition

from schemas.messages import Lane
from workers.positions import LanePositions, reported_backlog

A, B = TopicPartition("lane", 0), TopicPartition("lane", 1)


def record(tp: TopicPartition, offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, None, b"{}", None, 0, 2, [])


def test_realtime_counts_the_batch_it_runs_and_the_others_only_their_queue() -> None:
    assert reported_backlog(Lane.REALTIME, waiting=5, running=4) == 9
    assert reported_backlog(Lane.MEDIUM, waiting=5, running=16) == 5
    assert reported_backlog(Lane.BULK, waiting=0, running=64) == 0


def test_a_fetch_moves_each_partition_past_its_last_record_and_a_rebalance_forgets() -> None:
    positions = LanePositions()
    positions.taken({A: [record(A, 3), record(A, 4)], B: []})
    assert positions.fetched == {A}, "an empty batch says nothing of its partition"
    positions.committed({B: 7})
    assert positions.known == {A, B}
    positions.forget([A])
    assert positions.fetched == set() and positions.known == {B}
    positions.forget([B])
    assert positions.known == set()
