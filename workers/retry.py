"""Retries with backoff through a retry topic, never a sleep in the worker.

A lane record whose request no backend could serve (INF-502: every path's
circuit open, a model that failed to load, a server that is down) is not
answered at once while it has attempts and deadline left. The worker parks
it on its lane's retry topic (``laneway.retry.<lane>``) with two headers,
``laneway-attempt`` (the attempt its next processing will be, 1-based) and
``laneway-not-before-ms`` (epoch ms), commits the lane offset and goes on
with the next batch: one failing request never holds up a partition.

A ``RetryRelay`` runs beside each lane worker (consumer group
``<app_id>.retry.<lane>``). It reads the retry topic in order and puts each
record back on the lane topic once it is due (``acks=all``, then commit).
When the head of a partition is not due yet it seeks back to it, pauses the
partition and schedules its resume for when it is due; the relay's loop
keeps polling the other partitions in the meantime.

    lane topic --worker: INF-502, attempts and time left--> retry topic
        ^                                                     |
        +------------ relay: when not-before has passed ------+

Order is kept per partition, so a record parked with a short backoff can
wait behind one parked with a longer backoff: at most
``retry_max_backoff_ms`` longer than its own delay. The last attempt's
failure is the client's INF-502 result, and the record goes to the DLQ with
the error headers. A deadline that passes while a record is parked is
answered INF-503 by the worker that picks it up again, as for any record.

Delivery stays at-least-once: a relay that dies after producing a record
but before committing it puts it back twice; both copies are answered and
the client SDK drops the duplicate.

The decisions (``backoff_ms``, ``plan_retry``, ``due_prefix``) and the
header codec are pure functions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from prometheus_client import Counter

from schemas.errors import ErrorCode
from schemas.messages import InferenceResult, Lane
from schemas.settings import Settings
from streams.kafka.envelopes import Outbound
from streams.kafka.topics import retry_topic

__all__ = [
    "ATTEMPT_HEADER",
    "NOT_BEFORE_HEADER",
    "Exhausted",
    "OutOfTime",
    "Park",
    "RetryMark",
    "RetryRelay",
    "backoff_ms",
    "due_at",
    "due_prefix",
    "is_retryable",
    "mark_headers",
    "plan_retry",
    "read_mark",
    "retry_record",
]

log = logging.getLogger(__name__)

ATTEMPT_HEADER = "laneway-attempt"
NOT_BEFORE_HEADER = "laneway-not-before-ms"

RETRY_CODES = frozenset({ErrorCode.BACKEND_UNAVAILABLE})
"""Failures worth another attempt later: the backend, not the request, was
at fault. A deadline (INF-503) cannot be given back; MEM-ERR has already
been retried in smaller batches; INF-400 will never pass."""

RELAYED = Counter(
    "laneway_retry_relayed_total", "Parked records put back on their lane topic", ["lane"]
)


@dataclass(frozen=True, slots=True)
class RetryMark:
    """What a lane or retry record's headers say about its retries."""

    attempt: int = 1
    """The attempt its next processing is (1 for a record never retried)."""
    not_before_ms: int = 0
    """Epoch ms before which the relay leaves it parked."""


def read_mark(headers: Sequence[tuple[str, bytes]] | None) -> RetryMark:
    """The retry mark in a record's headers. Missing or unreadable values
    read as a first attempt that is due now: a mangled header must never
    park a record for ever, nor stop it from being processed."""
    found = dict(headers or ())
    return RetryMark(
        attempt=max(1, _int(found.get(ATTEMPT_HEADER), 1)),
        not_before_ms=max(0, _int(found.get(NOT_BEFORE_HEADER), 0)),
    )


def _int(raw: bytes | None, default: int) -> int:
    if raw is None:
        return default
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return default


def mark_headers(mark: RetryMark) -> tuple[tuple[str, bytes], ...]:
    return (
        (ATTEMPT_HEADER, str(mark.attempt).encode()),
        (NOT_BEFORE_HEADER, str(mark.not_before_ms).encode()),
    )


def backoff_ms(failed_attempt: int, base_ms: int, max_ms: int) -> int:
    """Delay after attempt ``failed_attempt`` (1-based) failed: ``base_ms``
    doubled per earlier attempt, never more than ``max_ms``."""
    if failed_attempt < 1:
        raise ValueError(f"attempts count from 1, not {failed_attempt}")
    # The exponent is bounded before the power so that a large attempt
    # number (from a header) cannot build a huge integer.
    return min(max_ms, base_ms * 2 ** min(failed_attempt - 1, 62))


@dataclass(frozen=True, slots=True)
class Park:
    """Put the record on the retry topic until ``mark.not_before_ms``."""

    mark: RetryMark


@dataclass(frozen=True, slots=True)
class Exhausted:
    """The last attempt failed: INF-502 to the client, the record to the DLQ."""

    attempts: int


@dataclass(frozen=True, slots=True)
class OutOfTime:
    """The backoff would end at or after the deadline: INF-502 now, which
    tells the client more than an INF-503 later would."""

    attempts: int


def plan_retry(
    failed_attempt: int,
    *,
    now_ms: int,
    deadline_at_ms: int | None,
    max_attempts: int,
    base_ms: int,
    max_backoff_ms: int,
) -> Park | Exhausted | OutOfTime:
    """What to do with a request whose attempt ``failed_attempt`` failed for
    its backend's sake."""
    if failed_attempt >= max_attempts:
        return Exhausted(failed_attempt)
    not_before = now_ms + backoff_ms(failed_attempt, base_ms, max_backoff_ms)
    if deadline_at_ms is not None and not_before >= deadline_at_ms:
        return OutOfTime(failed_attempt)
    return Park(RetryMark(attempt=failed_attempt + 1, not_before_ms=not_before))


def is_retryable(result: InferenceResult) -> bool:
    """A failure the retry topic may still turn into an answer."""
    return result.error is not None and result.error.code in RETRY_CODES


def due_at(mark: RetryMark, produced_at_ms: int, max_backoff_ms: int) -> int:
    """When a parked record is due: its not-before time, but never later than
    the longest backoff after it was parked, so a wrong clock or a foreign
    header cannot hold a partition for ever."""
    return min(mark.not_before_ms, produced_at_ms + max_backoff_ms)


def due_prefix(not_before_ms: Sequence[int], now_ms: int) -> int:
    """How many records, from the head of a partition, are due at ``now_ms``.
    The relay forwards those and waits for the next one: order is kept."""
    for i, due_at in enumerate(not_before_ms):
        if due_at > now_ms:
            return i
    return len(not_before_ms)


def retry_record(
    record: ConsumerRecord, mark: RetryMark, result: InferenceResult, settings: Settings, lane: Lane
) -> Outbound:
    """A failed lane record, parked: its original key and bytes, the retry
    mark, and the failure that parked it (for whoever reads the topic)."""
    error = result.error
    headers = mark_headers(mark)
    if error is not None:
        headers += (
            ("laneway-error-code", str(error.code).encode()),
            ("laneway-error", error.message.encode()[:1000]),
        )
    return Outbound(retry_topic(settings, lane), record.key, record.value or b"", headers)


def _now_ms() -> int:
    return int(time.time() * 1000)


class RetryRelay(ConsumerRebalanceListener):
    """Puts parked records back on the lane topic when they are due (see the
    module docstring). Owns its consumer; shares the worker's producer."""

    def __init__(
        self,
        settings: Settings,
        lane: Lane,
        producer: AIOKafkaProducer,
        *,
        clock_ms: Callable[[], int] = _now_ms,
        poll_ms: int = 500,
    ) -> None:
        self.lane = lane
        self.topic = retry_topic(settings, lane)
        self.lane_topic = settings.lane_topic(lane)
        self._producer = producer
        self._clock_ms = clock_ms
        self._max_backoff_ms = settings.retry_max_backoff_ms
        self._poll_ms = poll_ms
        self._consumer = AIOKafkaConsumer(
            group_id=f"{settings.app_id}.retry.{lane}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_interval_ms=600_000,
            fetch_max_wait_ms=settings.kafka.fetch_max_wait_ms,
            **settings.kafka.client_options(),
        )
        self._resumes: dict[TopicPartition, asyncio.TimerHandle] = {}
        """A scheduled resume per paused partition."""

    async def start(self) -> None:
        self._consumer.subscribe([self.topic], listener=self)
        await self._consumer.start()

    async def run(self, stopping: asyncio.Event) -> None:
        """Relay until ``stopping`` is set. A broker error is logged and the
        loop goes on (the records stay uncommitted and come again)."""
        while not stopping.is_set():
            try:
                await self.relay_once()
            except (KafkaError, OSError) as exc:
                log.warning("%s retry relay: %s; trying again", self.lane, exc)
                await asyncio.sleep(1.0)

    async def relay_once(self) -> int:
        """One poll: forward what is due, park the rest. Returns how many
        records went back to the lane topic."""
        polled = await self._consumer.getmany(timeout_ms=self._poll_ms, max_records=100)
        forwarded = 0
        for tp, records in polled.items():
            forwarded += await self._relay_partition(tp, records)
        return forwarded

    async def _relay_partition(self, tp: TopicPartition, records: list[ConsumerRecord]) -> int:
        now = self._clock_ms()
        due_times = [
            due_at(read_mark(r.headers), r.timestamp, self._max_backoff_ms) for r in records
        ]
        n_due = due_prefix(due_times, now)
        due = records[:n_due]
        if due:
            try:
                acks = [
                    await self._producer.send(
                        self.lane_topic, value=r.value, key=r.key, headers=list(r.headers)
                    )
                    for r in due
                ]
                await asyncio.gather(*acks)
            except BaseException:
                # Not committed: read them again rather than skip past them
                # (unless the partition has moved on to another relay).
                if tp in self._consumer.assignment():
                    self._consumer.seek(tp, due[0].offset)
                raise
            try:
                await self._consumer.commit({tp: due[-1].offset + 1})
            except (CommitFailedError, IllegalStateError) as exc:
                log.warning("%s retry relay: commit failed, records will repeat: %s", tp, exc)
            RELAYED.labels(self.lane).inc(len(due))
            log.info("%s retry relay: %d parked records back on %s", tp, len(due), self.lane_topic)
        if n_due < len(records) and tp in self._consumer.assignment():
            head = records[n_due]
            wait_ms = due_times[n_due] - now
            self._consumer.seek(tp, head.offset)  # drops what was fetched after it
            self._consumer.pause(tp)
            loop = asyncio.get_running_loop()
            self._resumes[tp] = loop.call_later(wait_ms / 1000, self._resume, tp)
        return len(due)

    def _resume(self, tp: TopicPartition) -> None:
        self._resumes.pop(tp, None)
        if tp in self._consumer.assignment():
            self._consumer.resume(tp)

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        for tp in revoked:
            handle = self._resumes.pop(tp, None)
            if handle is not None:
                handle.cancel()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Nothing to do: a new assignment starts unpaused at the committed
        offset, so a parked head is read and paused again."""

    async def close(self) -> None:
        for handle in self._resumes.values():
            handle.cancel()
        self._resumes.clear()
        await self._consumer.stop()
