"""What ``streams.kafka.intake`` lets commit, without a broker: the offsets
of done batches only, never a batch taken before a rebalance gave up on it."""

from __future__ import annotations

import asyncio

from aiokafka import ConsumerRecord, TopicPartition

from schemas.settings import Settings
from streams.kafka.intake import Intake, Taken

TP0 = TopicPartition("requests", 0)
TP1 = TopicPartition("requests", 1)


def _intake() -> Intake:
    return Intake(Settings(), "requests", "group", max_records=10, wait_s=0.01, settle_s=0.05)


def _taken(intake: Intake, *offsets: tuple[TopicPartition, int]) -> Taken:
    """A batch as ``batches()`` hands it over (and counts it open)."""
    records = [
        ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, None, b"{}", None, 0, 2, [])
        for tp, offset in offsets
    ]
    taken = Taken(records, {}, intake._epoch)
    for tp, offset in offsets:
        taken.next_offsets[tp] = max(taken.next_offsets.get(tp, 0), offset + 1)
    intake._open += 1
    intake._settled.clear()
    return taken


async def test_done_batches_mark_their_next_offsets_and_marks_only_move_forward() -> None:
    intake = _intake()
    first = _taken(intake, (TP0, 0), (TP0, 1), (TP1, 7))
    second = _taken(intake, (TP0, 2))
    assert not await intake.settle()  # two batches open
    intake.done(first)
    assert intake._marks == {TP0: 2, TP1: 8}
    intake.done(second)
    assert intake._marks == {TP0: 3, TP1: 8}
    assert await intake.settle()
    stale = Taken(first.records, dict(first.next_offsets), intake._epoch)
    intake._open += 1
    intake.done(stale)  # a repeat of old offsets moves nothing back
    assert intake._marks == {TP0: 3, TP1: 8}


async def test_a_batch_taken_before_a_rebalance_gave_up_on_it_commits_nothing() -> None:
    intake = _intake()
    stuck = _taken(intake, (TP0, 5))
    await intake.on_partitions_revoked({TP0, TP1})  # waits settle_s, then gives up
    assert intake._marks == {}
    intake.done(stuck)  # its outputs went out late: the next owner reads it again
    assert intake._marks == {}
    assert await intake.settle()
    fresh = _taken(intake, (TP1, 3))
    intake.done(fresh)
    assert intake._marks == {TP1: 4}


async def test_a_rebalance_waits_for_the_batch_in_flight_and_keeps_its_offsets() -> None:
    intake = _intake()
    intake.settle_s = 5.0
    in_flight = _taken(intake, (TP0, 9))

    async def finish() -> None:
        await asyncio.sleep(0.05)
        intake.done(in_flight)

    finishing = asyncio.create_task(finish())
    marks_seen: dict[TopicPartition, int] = {}

    async def commit() -> None:  # the commit the revocation makes, before it lets go
        marks_seen.update(intake._marks)

    intake.commit = commit  # type: ignore[method-assign]
    await intake.on_partitions_revoked({TP0})
    await finishing
    assert marks_seen == {TP0: 10}
    assert intake._marks == {}  # the partition is gone: its mark with it


async def test_abandoned_batches_are_waited_for_by_nobody_and_commit_nothing() -> None:
    intake = _intake()
    failed = _taken(intake, (TP0, 1))
    intake.abandon()
    assert await intake.settle()
    intake.done(failed)
    assert intake._marks == {}
