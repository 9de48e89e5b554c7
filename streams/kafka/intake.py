"""A topic read in batches by a plain aiokafka consumer, offsets committed by hand.

``Intake`` is the classifier's way in (``streams.classify.app`` says why it
is not a faust agent). It knows nothing of what the records mean:

- ``batches()`` yields the records of each ``getmany`` (what the fetcher
  holds, up to ``max_records``; when it holds nothing, what comes within
  ``wait_s``) as a ``Taken``, until ``stop()``.
- ``done(taken)`` says that every output of those records is acknowledged,
  so their offsets may move. A background task commits what is done, one
  commit at a time and as soon as the one before it returned: at most one
  commit round trip per batch, none while idle. A record's offset is never
  committed before ``done`` was called for its batch and every batch taken
  before it on its partition (marks only move forward, and the caller calls
  ``done`` in the order it took the batches).
- A rebalance (``on_partitions_revoked``) waits, at most ``settle_s``, until
  every batch taken so far is done, commits them, and starts a new epoch.
  A batch taken in an older epoch that is done only later (the wait gave
  up: its outputs were stuck) commits nothing: its partitions may belong to
  another member now, which reads them again from the last commit
  (at-least-once; clients drop the duplicate results by id). aiokafka
  refuses commits for partitions not assigned and for an older generation
  as well.
- ``stop()``: waits (at most ``settle_s``) for the batches taken, commits
  them and leaves the group, so another member takes the partitions at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from schemas.settings import Settings

__all__ = ["Intake", "Taken"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Taken:
    """The records of one ``take``, and where each partition now stands."""

    records: list[ConsumerRecord]
    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    """Per partition, the offset after its last record here."""
    epoch: int = 0


class Intake(ConsumerRebalanceListener):
    """One consumer of ``topic`` in ``group_id``, committing by hand."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        group_id: str,
        *,
        max_records: int,
        wait_s: float,
        settle_s: float = 10.0,
        on_assigned: Callable[[set[TopicPartition]], None] = lambda partitions: None,
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.group_id = group_id
        self.max_records = max_records
        self.wait_ms = max(1, int(wait_s * 1000))
        self.settle_s = settle_s
        self._on_assigned = on_assigned
        self._consumer: AIOKafkaConsumer | None = None
        self._epoch = 0
        self._open = 0
        """Batches taken and not yet done."""
        self._settled = asyncio.Event()
        self._settled.set()
        self._marks: dict[TopicPartition, int] = {}
        """Per partition, the offset up to which every record is done."""
        self._committed: dict[TopicPartition, int] = {}
        self._moved = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._committer: asyncio.Task[None] | None = None
        self._fetch: asyncio.Task[dict[TopicPartition, list[ConsumerRecord]]] | None = None
        self._stopping = False
        self.assigned: set[TopicPartition] = set()

    async def start(self) -> None:
        kafka = self.settings.kafka
        self._consumer = AIOKafkaConsumer(
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=kafka.fetch_max_wait_ms,
            max_poll_records=self.max_records,
            # A restarted member's partitions come back within ~20 s, not the
            # ~110 s of faust's 60 s defaults (the dead member's session expires).
            session_timeout_ms=10_000,
            heartbeat_interval_ms=3_000,
            rebalance_timeout_ms=int(max(10.0, self.settle_s + 5.0) * 1000),
            **kafka.client_options(),
        )
        self._consumer.subscribe([self.topic], listener=self)
        await self._consumer.start()
        self._committer = asyncio.get_running_loop().create_task(self._commit_loop())

    async def batches(self) -> AsyncIterator[Taken]:
        """Every batch taken, until ``stop``. Waits through a rebalance."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self._fetch = loop.create_task(consumer.getmany(timeout_ms=self.wait_ms))
            try:
                polled = await self._fetch
            except asyncio.CancelledError:
                if self._stopping:
                    return
                raise
            finally:
                self._fetch = None
            taken = Taken([], {}, self._epoch)
            for tp, records in polled.items():
                if records:
                    taken.records.extend(records)
                    taken.next_offsets[tp] = records[-1].offset + 1
            if taken.records:
                self._open += 1
                self._settled.clear()
                yield taken

    def done(self, taken: Taken) -> None:
        """Every output of ``taken`` is acknowledged: its offsets may move."""
        if not taken.records:
            return
        if taken.epoch != self._epoch:
            self._open = max(0, self._open - 1)  # (0 after ``abandon``)
        else:
            for tp, offset in taken.next_offsets.items():
                if offset > self._marks.get(tp, -1):
                    self._marks[tp] = offset
            self._moved.set()
            self._open -= 1
        if self._open == 0:
            self._settled.set()

    def abandon(self) -> None:
        """The caller will call ``done`` for none of the batches still open
        (it failed): they commit nothing, and nothing waits for them."""
        self._epoch += 1
        self._open = 0
        self._settled.set()

    async def settle(self) -> bool:
        """Until every batch taken is done (at most ``settle_s``); False if not."""
        try:
            await asyncio.wait_for(self._settled.wait(), self.settle_s)
        except TimeoutError:
            return False
        return True

    # -- rebalances ------------------------------------------------------------

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        started = time.monotonic()
        settled = await self.settle()
        if not settled:
            log.warning(
                "%d batches not acknowledged %.0f s into a rebalance; their records "
                "will be read again by the partitions' next owner",
                self._open,
                self.settle_s,
            )
        await self.commit()
        self._epoch += 1  # what is still open now commits nothing
        for tp in revoked:
            self._marks.pop(tp, None)
            self._committed.pop(tp, None)
        log.info("released %d partitions in %.2f s", len(revoked), time.monotonic() - started)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assigned = set(assigned)
        self._on_assigned(self.assigned)

    # -- commits ------------------------------------------------------------------

    async def commit(self) -> None:
        """Commit every mark that moved, for the partitions still assigned."""
        consumer = self._consumer
        if consumer is None:
            return
        async with self._commit_lock:
            assigned = consumer.assignment()
            offsets = {
                tp: offset
                for tp, offset in self._marks.items()
                if tp in assigned and self._committed.get(tp) != offset
            }
            if not offsets:
                return
            try:
                await consumer.commit(offsets)
            except (CommitFailedError, IllegalStateError) as exc:
                # The group moved on: these partitions may be another member's.
                log.warning("commit after a rebalance refused, records will repeat: %s", exc)
                for tp in offsets:
                    self._marks.pop(tp, None)
            except KafkaError as exc:
                log.warning("commit failed, tried again at the next batch: %s", exc)
            else:
                self._committed.update(offsets)

    async def _commit_loop(self) -> None:
        while True:
            await self._moved.wait()
            self._moved.clear()
            try:
                await self.commit()
            except Exception:  # never let the committer die: the next batch tries again
                log.exception("commit failed")

    async def stop(self) -> None:
        """Stop taking; wait for the batches taken, commit them, leave the group."""
        self._stopping = True
        if self._fetch is not None:
            self._fetch.cancel()
        consumer = self._consumer
        if consumer is None:
            return
        try:
            if not await self.settle():
                log.warning("stopping with %d batches not acknowledged", self._open)
            await self.commit()
        finally:
            if self._committer is not None:
                self._committer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._committer
            self._consumer = None
            await consumer.stop()
