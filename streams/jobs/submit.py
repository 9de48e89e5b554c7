"""Submit a batch file: validate it whole, create (or find) its job, and
produce its lines to the request topic on the bulk lane, resumably.

The job id comes from the tenant and the file's SHA-256, and each request
id from the job id and the line's ``custom_id``, so submitting the same file
again finds the same job, and resumes it where its ``produced`` count says
(a killed submitter re-produces at most one chunk; the tracker records a
request id once, so nothing is answered or counted twice). Production is
bounded by ``LANEWAY_BATCH_SUBMIT_RPS`` (at most half the tenant's rate
limit) and by ``LANEWAY_BATCH_MAX_INFLIGHT`` requests produced but not yet
answered, so the bulk lane stays short and a cancel stops what has not
started. Each request's deadline is the rest of the job's window. Each
chunk is written to the job's ``pending`` requests before it is produced,
so the tracker can send a request shed with INF-429 again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.jobs import BatchCounts, BatchJob, BatchJobStatus
from schemas.messages import InferenceRequest, Lane
from schemas.settings import Settings
from streams.jobs.events import Mover, now_ms
from streams.jobs.jsonl import BatchLine, ParsedFile, job_id_for, parse_jsonl, request_id
from streams.jobs.store import JobStore

__all__ = ["InvalidBatchFile", "reply_topic", "submit_file", "submit_rate"]

log = logging.getLogger(__name__)

INFLIGHT_POLL_S = 0.2


class InvalidBatchFile(Exception):
    """The file has bad lines and ``skip_invalid`` was not given."""

    def __init__(self, parsed: ParsedFile) -> None:
        super().__init__(f"{len(parsed.errors)} invalid line(s); nothing was submitted")
        self.parsed = parsed


def submit_rate(settings: Settings, tenant: str | None) -> float:
    """Requests per second: the batch setting, at most half the tenant's limit."""
    rate = settings.batch.submit_rps
    if settings.ratelimit.enabled:
        rate = min(rate, settings.ratelimit.limit_for(tenant).rps / 2)
    return rate


def reply_topic(settings: Settings, tenant: str | None) -> str:
    """Where the workers send a batch's replies (nobody needs to read them:
    the tracker reads ``<p>.results``): the tenant's own topic where tenants
    may only use theirs."""
    if settings.limits.tenant_reply_topics and tenant:
        return f"{settings.replies_topic}.{tenant}.batch"
    return f"{settings.replies_topic}.batch"


@contextlib.asynccontextmanager
async def _producer(settings: Settings, given: Any) -> AsyncIterator[Any]:
    if given is not None:
        yield given
        return
    producer = AIOKafkaProducer(
        acks="all",
        enable_idempotence=settings.kafka.enable_idempotence,
        linger_ms=5,
        **settings.kafka.client_options(),
    )
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def submit_file(
    settings: Settings,
    data: bytes,
    *,
    tenant: str | None = None,
    window_s: int | None = None,
    skip_invalid: bool = False,
    producer: Any = None,
    on_progress: Callable[[BatchJob], None] | None = None,
    job_id: str | None = None,
) -> BatchJob:
    """Submit ``data`` (a JSONL file's bytes); the job as it is once every
    line is produced, or once it stopped (cancelled, expired). ``job_id``:
    the job's id, when the caller keeps one of its own (the gateway: one
    job per batch created, the same file twice is two jobs); unset, it
    comes from the tenant and the file, so the same file is the same job."""
    # A thread: 50,000 lines take seconds to check, and the caller's loop may
    # serve others meanwhile (the gateway submits batches in its own process).
    parsed = await asyncio.to_thread(
        parse_jsonl, data, settings.request_limits(), max_lines=settings.batch.max_lines
    )
    if parsed.errors and not skip_invalid:
        raise InvalidBatchFile(parsed)
    job_id = job_id or job_id_for(tenant, parsed.content_sha256)
    created_ms = now_ms()
    window_ms = (window_s or settings.batch.window_s) * 1000
    redis = settings.redis.client()
    try:
        store = JobStore(redis, settings.redis.key_prefix, retention_s=settings.batch.retention_s)
        async with _producer(settings, producer) as kafka:
            mover = Mover(store, kafka, settings)
            fresh = BatchJob(
                id=job_id,
                status=BatchJobStatus.VALIDATING,
                tenant=tenant,
                format=parsed.format,
                content_sha256=parsed.content_sha256,
                counts=BatchCounts(total=len(parsed.lines), invalid=len(parsed.errors)),
                created_at_ms=created_ms,
                expires_at_ms=created_ms + window_ms,
            )
            if await store.create(fresh):
                await mover.publish(fresh, None)
            else:
                log.info("batch job %s exists: resuming it", job_id)
            job = await store.get(job_id)
            assert job is not None
            if job.status is BatchJobStatus.VALIDATING:
                await store.put_lines(job_id, parsed.lines, parsed.errors)
                to = BatchJobStatus.IN_PROGRESS if parsed.lines else BatchJobStatus.FAILED
                job = await mover.move(job_id, to) or await store.get(job_id)
            assert job is not None
            if job.status is BatchJobStatus.IN_PROGRESS and job.counts.produced < len(parsed.lines):
                await _ensure_topic(settings, reply_topic(settings, tenant))
                await _produce(settings, store, kafka, job, parsed.lines, on_progress)
            return await mover.settle(job_id) or job
    finally:
        await redis.aclose()


async def _produce(
    settings: Settings,
    store: JobStore,
    producer: Any,
    job: BatchJob,
    lines: list[BatchLine],
    on_progress: Callable[[BatchJob], None] | None,
) -> None:
    loop = asyncio.get_running_loop()
    rate = submit_rate(settings, job.tenant)
    chunk = max(1, min(64, int(rate / 4)))  # about four produces a second
    bound = settings.batch.max_inflight
    topic = settings.topic("requests")
    replies = reply_topic(settings, job.tenant)
    cursor = job.counts.produced
    next_at = loop.time()
    while cursor < len(lines):
        current = await store.get(job.id)
        if current is None or current.status is not BatchJobStatus.IN_PROGRESS:
            log.info("batch job %s is %s: submission stops", job.id, current and current.status)
            return
        if now_ms() >= current.expires_at_ms:
            return
        n = min(chunk, len(lines) - cursor)
        if bound:
            answered = current.counts.done + current.counts.failed
            room = bound - (cursor - answered)
            if room <= 0:
                await asyncio.sleep(INFLIGHT_POLL_S)
                continue
            n = min(n, room)
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        next_at = max(next_at, loop.time()) + n / rate
        deadline_ms = max(1, current.expires_at_ms - now_ms())
        chunk_requests = [
            InferenceRequest(
                id=request_id(job.id, line.custom_id),
                tenant=job.tenant,
                batch_id=job.id,
                lane=Lane.BULK,
                reply_to=replies,
                deadline_ms=deadline_ms,
                **line.body,
            )
            for line in lines[cursor : cursor + n]
        ]
        values = {r.id: r.model_dump_json() for r in chunk_requests}
        await store.put_pending(job.id, values)  # so that a shed one can be sent again
        sends = [
            await producer.send(topic, values[r.id].encode(), key=r.partition_key())
            for r in chunk_requests
        ]
        await asyncio.gather(*sends)
        cursor += n
        await store.raise_produced(job.id, cursor)
        if on_progress is not None:
            on_progress(current.model_copy(update={"counts": _produced(current, cursor)}))


def _produced(job: BatchJob, produced: int) -> BatchCounts:
    return job.counts.model_copy(update={"produced": max(produced, job.counts.produced)})


async def _ensure_topic(settings: Settings, topic: str) -> None:
    admin = AIOKafkaAdminClient(**settings.kafka.client_options())
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [
                        NewTopic(
                            topic,
                            num_partitions=settings.kafka.partitions,
                            replication_factor=settings.kafka.replication_factor,
                        )
                    ]
                )
    finally:
        await admin.close()
