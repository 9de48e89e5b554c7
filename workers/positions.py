"""Where a lane worker stands on each partition it holds: what its backlog
report counts as waiting.

A record waits from the moment it is on the partition until the worker takes
it: the count per partition runs from the offset after the last record
handed to the worker (or, before it took any, from where its group
committed) to the partition's end. A rebalance forgets what the worker knew
of the partitions it lost or got anew, so a new owner counts from the
committed offset, not from where the last owner stood.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from schemas.messages import Lane

__all__ = ["ForgetOnRebalance", "LanePositions", "reported_backlog"]


def reported_backlog(lane: Lane, waiting: int, running: int) -> int:
    """What a worker reports as waiting: the records not yet taken; on the
    realtime lane also those of the batch it is running, which a new
    request waits behind too (without them the realtime gate let requests
    in at its mark that then waited the mark plus a batch). Medium and bulk
    leave them out: their load levels count the queue, and bulk keeps 64
    records in flight."""
    return waiting + running if lane is Lane.REALTIME else waiting


class LanePositions:
    """Per partition, the next record a worker has not taken yet and where
    its group's commit stands."""

    def __init__(self) -> None:
        self._next_offset: dict[TopicPartition, int] = {}
        """The offset after the last record handed to the worker."""
        self._committed: dict[TopicPartition, int] = {}
        """Read once per assignment, then kept by the worker's own commits."""

    @property
    def fetched(self) -> set[TopicPartition]:
        """The partitions the worker has taken records from since it got them."""
        return set(self._next_offset)

    @property
    def known(self) -> set[TopicPartition]:
        """The partitions it holds any position for."""
        return set(self._next_offset) | set(self._committed)

    def taken(self, polled: Mapping[TopicPartition, Sequence[ConsumerRecord]]) -> None:
        """Records handed to the worker (a fetch's, by partition)."""
        for tp, batch in polled.items():
            if batch:
                self._next_offset[tp] = batch[-1].offset + 1

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        """The worker's group committed ``offsets``."""
        self._committed.update(offsets)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop what the worker knew of partitions it lost or got anew (a
        stale next offset under-counted the backlog)."""
        for tp in partitions:
            self._next_offset.pop(tp, None)
            self._committed.pop(tp, None)

    async def waiting(self, consumer: AIOKafkaConsumer) -> int:
        """Records on the consumer's partitions that the worker has not taken."""
        assignment = list(consumer.assignment())
        if not assignment:
            return 0
        waiting = 0
        ends = await consumer.end_offsets(assignment)
        for tp, listed in ends.items():
            # Tansu's listed end counts one record of the partition's last
            # batch; the high-water mark of the last fetch counts them all.
            # Either may be behind: take the larger.
            end = max(listed, consumer.highwater(tp) or 0)
            # Not position(): it also moves past records aiokafka prefetched
            # into its buffer, which still wait for this worker.
            start = self._next_offset.get(tp)
            if start is None:
                start = await self._committed_offset(consumer, tp)
            waiting += max(0, end - start)
        return waiting

    async def _committed_offset(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
        """The group's offset on ``tp`` (the log start when it has none),
        asked of the broker once per assignment, not on every report."""
        cached = self._committed.get(tp)
        if cached is not None:
            return cached
        committed = await consumer.committed(tp)
        if committed is None:
            committed = (await consumer.beginning_offsets([tp]))[tp]
        self._committed[tp] = committed
        return committed


class ForgetOnRebalance(ConsumerRebalanceListener):
    """Keeps a worker's positions to the partitions it owns."""

    def __init__(self, positions: LanePositions) -> None:
        self._positions = positions

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self._positions.forget(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._positions.forget(assigned)
