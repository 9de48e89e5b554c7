"""The job tracker: counts every batch request's terminal result.

It reads ``<p>.results`` (every terminal result, whoever produced the
request) and ``<p>.requests`` in a consumer group of its own
(``<app_id>-batch-tracker``), and for each record with a ``batch_id``:

- a result is recorded under its job by request id, first one kept, and
  counted ``done`` or ``failed`` in the same script: a redelivered or
  duplicated result changes nothing;
- a request of a job that no ``laneway batch submit`` created (any Kafka
  producer may write requests with a ``batch_id``) is counted into that
  job's total, so its counts add up too.

A request shed by flow control or over its tenant's rate limit (INF-429)
is not a final answer for a running job: it is sent again once its
``retry_after_ms`` has passed (kept meanwhile in the job's ``pending``
requests, which the submitter writes), until its window ends. So a batch
yields to interactive traffic under load and carries on afterwards.

Offsets are committed only after Redis took a poll's writes: a crash or a
Redis error reads them again. Every ``LANEWAY_BATCH_SWEEP_INTERVAL_S`` the
open jobs are settled (completion, expiry), each move published on
``<p>.batch.jobs``. ``laneway up`` runs it as the ``batch-tracker`` child;
elsewhere run ``laneway batch tracker`` (one or more: they share the group).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from prometheus_client import Counter

from schemas.errors import ErrorCode
from schemas.jobs import BatchJob
from schemas.messages import InferenceRequest
from schemas.settings import Settings
from streams.jobs.events import Mover, now_ms
from streams.jobs.liveness import tracker_beats, tracker_gone
from streams.jobs.store import JobStore
from streams.ops import ProcessState, heartbeat

__all__ = ["JobTracker", "parse_records", "serve_tracker"]

log = logging.getLogger(__name__)

POLL_MS = 500
MAX_RECORDS = 1000
DEFAULT_RETRY_MS = 5_000
MAX_RETRY_MS = 60_000

RECORDS = Counter(
    "laneway_batch_tracker_records_total",
    "Records of the requests and results topics the batch tracker has read and recorded",
)


def _batch_fields(value: bytes | None) -> tuple[str, str, dict[str, Any]] | None:
    """``(batch id, id, object)`` of a record that names a batch, cheaply:
    most results have ``"batch_id":null`` and are not decoded at all."""
    if not value or b'"batch_id"' not in value or b'"batch_id":null' in value:
        return None
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    batch_id, request_id = data.get("batch_id"), data.get("id")
    if not isinstance(batch_id, str) or not batch_id or not isinstance(request_id, str):
        return None
    return batch_id, request_id, data


def outcome_of(data: dict[str, Any], now_ms: int) -> bool | int:
    """``True`` for an answer, ``False`` for an error, or, for a request shed
    or over its tenant's limit (INF-429), the epoch ms to send it again."""
    if data.get("status") == "ok":
        return True
    error = data.get("error")
    if isinstance(error, dict) and error.get("code") == ErrorCode.RATE_LIMITED:
        wait = error.get("retry_after_ms")
        wait = wait if isinstance(wait, int) and wait > 0 else DEFAULT_RETRY_MS
        return now_ms + min(wait, MAX_RETRY_MS)
    return False


def parse_records(
    records: Sequence[ConsumerRecord[bytes, bytes]], results_topic: str, now_ms: int = 0
) -> tuple[list[tuple[str, str, str, bool | int]], list[tuple[str, str]]]:
    """Results ``(job, request id, JSON, outcome)`` (``outcome_of``) and
    requests ``(job, request id)`` among ``records``."""
    results: list[tuple[str, str, str, bool | int]] = []
    requests: list[tuple[str, str]] = []
    for record in records:
        found = _batch_fields(record.value)
        if found is None:
            continue
        batch_id, request_id, data = found
        if record.topic == results_topic:
            assert record.value is not None
            results.append((batch_id, request_id, record.value.decode(), outcome_of(data, now_ms)))
        else:
            requests.append((batch_id, request_id))
    return results, requests


class JobTracker:
    def __init__(self, settings: Settings, redis: Any, producer: Any) -> None:
        self.settings = settings
        self.store = JobStore(
            redis, settings.redis.key_prefix, retention_s=settings.batch.retention_s
        )
        self.mover = Mover(self.store, producer, settings)
        self.producer = producer
        self.resent = 0
        self.failing = False
        self.results_topic = settings.topic("results")
        self.requests_topic = settings.topic("requests")
        self.recorded = 0

    async def handle(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> None:
        """Record one poll's records and settle the jobs they touched."""
        now = now_ms()
        results, requests = parse_records(records, self.results_topic, now)
        window_s = self.settings.batch.window_s
        await self.store.seen(requests, now_ms=now, window_s=window_s)
        self.recorded += await self.store.record(results, now_ms=now, window_s=window_s)
        for job_id in sorted({r[0] for r in results}):
            await self.mover.settle(job_id)

    async def sweep(self) -> None:
        """Settle the open jobs, and send their shed requests that are due again."""
        for job_id in await self.store.open_jobs():
            job = await self.mover.settle(job_id)
            if job is not None and job.source == "file" and not job.final:
                await self.resend(job)

    async def resend(self, job: BatchJob) -> int:
        """Produce the job's due retries again, each with the rest of the
        window as its deadline; how many."""
        now = now_ms()
        due = await self.store.due_retries(job.id, now)
        sends = []
        for _, raw in due:
            request = InferenceRequest.model_validate_json(raw).model_copy(
                update={"deadline_ms": max(1, job.expires_at_ms - now)}
            )
            sends.append(
                await self.producer.send(
                    self.requests_topic,
                    request.model_dump_json().encode(),
                    key=request.partition_key(),
                )
            )
        await asyncio.gather(*sends)
        self.resent += len(sends)
        if sends:
            log.info("batch job %s: %d shed requests sent again", job.id, len(sends))
        return len(sends)

    async def run(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()
        while not stop.is_set():
            polled = await consumer.getmany(timeout_ms=POLL_MS, max_records=MAX_RECORDS)
            records = [r for batch in polled.values() for r in batch]
            try:
                if records:
                    await self.handle(records)
                    await consumer.commit()
                    RECORDS.inc(len(records))
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + self.settings.batch.sweep_interval_s
                    await self.sweep()
            except Exception as exc:  # Redis or broker trouble: read the records again
                self._failed(exc, len(records))
                for tp, batch in polled.items():
                    if batch:
                        consumer.seek(tp, batch[0].offset)
                await asyncio.sleep(1.0)
            else:
                if self.failing:
                    self.failing = False
                    log.info("batch tracker: recording again")

    def _failed(self, exc: Exception, n: int) -> None:
        """Logged once per outage (with its cause), not once a second."""
        if self.failing:
            log.debug("batch tracker: still failing: %s", exc)
            return
        self.failing = True
        log.warning(
            "batch tracker: could not record %d records (%s: %s); reading them again until "
            "it works",
            n,
            type(exc).__name__,
            exc,
            exc_info=True,
        )


async def serve_tracker(settings: Settings, state: ProcessState) -> None:
    """The tracker process, until SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    beats = asyncio.create_task(heartbeat(state))
    options = settings.kafka.client_options()
    consumer = AIOKafkaConsumer(
        settings.topic("results"),
        settings.topic("requests"),
        group_id=f"{settings.app_id}-batch-tracker",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.kafka.fetch_max_wait_ms,
        **options,
    )
    producer = AIOKafkaProducer(
        acks="all", enable_idempotence=settings.kafka.enable_idempotence, **options
    )
    redis = settings.redis.client()
    beacon: asyncio.Task[None] | None = None
    try:
        await producer.start()
        await consumer.start()
        beacon = asyncio.create_task(
            tracker_beats(redis, settings.redis.key_prefix, settings.worker_heartbeat_s)
        )
        state.ready, state.detail = True, "tracking batch jobs"
        log.info("batch tracker up: %s, %s", settings.topic("results"), settings.topic("requests"))
        await JobTracker(settings, redis, producer).run(consumer, stop)
    finally:
        state.ready = False
        beats.cancel()
        if beacon is not None:
            beacon.cancel()
            await tracker_gone(redis, settings.redis.key_prefix)
        await consumer.stop()
        await producer.stop()
        await redis.aclose()
