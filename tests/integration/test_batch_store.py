"""The batch job store's scripts on real Redis: a result is counted once
however often it arrives, moves follow the status machine, a job only
Kafka producers wrote to is counted from what the tracker sees."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from schemas.jobs import BatchCounts, BatchJob, BatchJobStatus
from schemas.messages import RequestLimits
from streams.jobs.jsonl import parse_jsonl
from streams.jobs.liveness import TRACKER_KEY, tracker_alive, tracker_beats, tracker_gone
from streams.jobs.store import JobStore

S = BatchJobStatus


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[JobStore]:
    redis = aioredis.from_url(redis_url)
    try:
        yield JobStore(redis, f"t-{uuid.uuid4().hex[:8]}", retention_s=60)
    finally:
        await redis.aclose()


def new_job(total: int = 3) -> BatchJob:
    return BatchJob(
        id=f"batch_{uuid.uuid4().hex[:20]}",
        status=S.VALIDATING,
        tenant="acme",
        counts=BatchCounts(total=total, invalid=1),
        created_at_ms=1_000,
        expires_at_ms=10_000,
    )


async def test_a_job_is_created_once_and_moves_by_the_rules(store: JobStore) -> None:
    job = new_job()
    assert await store.create(job)
    assert not await store.create(job.model_copy(update={"tenant": "other"}))
    assert await store.get(job.id) == job
    assert await store.move(job.id, S.COMPLETED, 2_000) is None  # not from validating
    assert await store.move(job.id, S.IN_PROGRESS, 2_000) is S.VALIDATING
    assert await store.move(job.id, S.IN_PROGRESS, 2_000) is None
    assert await store.open_jobs() == [job.id]
    assert await store.move(job.id, S.CANCELLED, 3_000) is S.IN_PROGRESS
    cancelled = await store.get(job.id)
    assert cancelled is not None and cancelled.status is S.CANCELLED
    assert cancelled.finished_at_ms == 3_000
    assert await store.open_jobs() == []
    assert 0 < await store.redis.ttl(store.key(job.id)) <= 60
    assert await store.cancelled([job.id, "batch_other"]) == {job.id}
    assert [j.id for j in await store.list_jobs()] == [job.id]


async def test_a_result_counts_once_however_often_it_arrives(store: JobStore) -> None:
    job = new_job()
    await store.create(job)
    entries: list[Any] = [
        (job.id, "r1", '{"id": "r1"}', True),
        (job.id, "r2", '{"id": "r2"}', False),
        (job.id, "r1", '{"id": "r1", "again": 1}', True),
    ]
    assert await store.record(entries, now_ms=2_000, window_s=60) == 2
    assert await store.record(entries[:2], now_ms=2_000, window_s=60) == 0
    counts = (await store.get(job.id)).counts  # type: ignore[union-attr]
    assert (counts.done, counts.failed, counts.total) == (1, 1, 3)
    assert await store.results(job.id, ["r1", "r2", "r3"]) == ['{"id": "r1"}', '{"id": "r2"}', None]
    assert await store.seen([(job.id, "r1")], now_ms=2_000, window_s=60) == 0  # a file's job


async def test_produced_only_grows(store: JobStore) -> None:
    job = new_job()
    await store.create(job)
    await store.raise_produced(job.id, 5)
    await store.raise_produced(job.id, 2)
    assert (await store.get(job.id)).counts.produced == 5  # type: ignore[union-attr]


async def test_a_kafka_job_is_counted_from_its_requests_and_results(store: JobStore) -> None:
    assert (
        await store.seen([("native", "a"), ("native", "b"), ("native", "a")], now_ms=5, window_s=9)
        == 2
    )
    await store.record(
        [("native", "a", "{}", True), ("native", "c", "{}", False)], now_ms=6, window_s=9
    )
    job = await store.get("native")
    assert job is not None and job.source == "kafka" and job.status is S.IN_PROGRESS
    assert (job.counts.total, job.counts.done, job.counts.failed) == (3, 1, 1)
    assert job.expires_at_ms == 5 + 9_000


async def test_lines_and_invalid_lines_are_kept_in_order(store: JobStore) -> None:
    data = b"\n".join(
        [b'{"custom_id": "a", "body": {"prompt": "x"}}', b"oops"]
        + [b'{"custom_id": "c%d", "body": {"prompt": "x"}}' % i for i in range(1500)]
    )
    parsed = parse_jsonl(data, RequestLimits())
    job = new_job(len(parsed.lines))
    await store.create(job)
    await store.put_lines(job.id, parsed.lines, parsed.errors)
    await store.put_lines(job.id, parsed.lines, parsed.errors)  # a resumed submission
    got = [pair async for chunk in store.lines(job.id) for pair in chunk]
    assert got == [(ln.line, ln.custom_id) for ln in parsed.lines]
    assert await store.invalid(job.id) == [
        {"line": 2, "custom_id": None, "error": parsed.errors[0].message}
    ]


async def test_a_shed_request_of_a_running_job_waits_to_be_sent_again(store: JobStore) -> None:
    job = new_job(total=2)
    await store.create(job)
    await store.move(job.id, S.IN_PROGRESS, 1_500)
    await store.put_pending(job.id, {"r1": '{"id": "r1"}', "r2": '{"id": "r2"}'})
    shed = [(job.id, "r1", '{"429": 1}', 5_000)]
    assert await store.record(shed, now_ms=2_000, window_s=60) == 0
    assert await store.record(shed, now_ms=2_000, window_s=60) == 0  # redelivered: one retry
    counted = await store.get(job.id)
    assert counted is not None and (counted.counts.done, counted.counts.failed) == (0, 0)
    assert await store.due_retries(job.id, 4_999) == []
    assert await store.due_retries(job.id, 5_000) == [("r1", '{"id": "r1"}')]
    assert await store.due_retries(job.id, 9_000) == []  # taken once
    assert await store.record([(job.id, "r1", '{"ok": 1}', True)], now_ms=6_000, window_s=60) == 1
    assert await store.record(shed, now_ms=6_100, window_s=60) == 0  # late: already answered
    assert await store.redis.hkeys(store.key(job.id, "pending")) == [b"r2"]
    # a shed request nobody can send again (not pending) is an error result
    assert await store.record([(job.id, "r9", "{}", 7_000)], now_ms=6_000, window_s=60) == 1
    final = await store.get(job.id)
    assert final is not None and (final.counts.done, final.counts.failed) == (1, 1)


async def test_waiting_on_a_job_nobody_counts_ends_after_its_window(redis_url: str) -> None:
    """No tracker runs: ``--wait`` says so, and gives up once the window
    (and its grace) is over instead of waiting for ever."""
    import io
    import time

    from schemas.settings import RedisSettings, Settings
    from streams.jobs import progress

    prefix = f"t-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis=RedisSettings(url=redis_url, key_prefix=prefix))
    redis = aioredis.from_url(redis_url)
    now_ms = int(time.time() * 1000)
    job = new_job().model_copy(
        update={"created_at_ms": now_ms, "expires_at_ms": now_ms - progress.WINDOW_GRACE_MS + 1500}
    )
    try:
        assert await JobStore(redis, prefix).create(job)
        out = io.StringIO()
        started = time.monotonic()
        seen = await progress.watch(settings, job.id, out, interval_s=0.1, stall_s=0.5)
        assert 1.0 < time.monotonic() - started < 10
    finally:
        await redis.aclose()
    assert seen.id == job.id and not seen.final
    assert "is the job tracker running" in out.getvalue()


async def test_a_tracker_replica_that_stops_leaves_the_others_alive(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    """Two trackers beat; the one that stops cleanly withdraws its own card
    only, so a job can still be submitted; once the last stops, none is."""
    assert not await tracker_alive(redis_client, prefix)
    beating = [
        asyncio.create_task(tracker_beats(redis_client, prefix, 0.2, card=card))
        for card in ("tracker-a", "tracker-b")
    ]
    try:
        await _until(
            lambda: redis_client.zcard(f"{prefix}:{TRACKER_KEY}"), 2, "both trackers' first beats"
        )
        assert await tracker_alive(redis_client, prefix)
        beating[0].cancel()
        await tracker_gone(redis_client, prefix, card="tracker-a")
        assert await tracker_alive(redis_client, prefix), "tracker-b still beats"
    finally:
        beating[1].cancel()
        await asyncio.gather(*beating, return_exceptions=True)
    await tracker_gone(redis_client, prefix, card="tracker-b")
    assert not await tracker_alive(redis_client, prefix)


async def test_a_tracker_that_died_without_a_word_reads_as_gone_after_three_beats(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    beat = asyncio.create_task(tracker_beats(redis_client, prefix, 0.1, card="killed"))
    await _until(lambda: tracker_alive(redis_client, prefix), True, "the tracker's first beat")
    beat.cancel()  # as SIGKILL would: no withdrawal
    await asyncio.gather(beat, return_exceptions=True)
    # its card expires 0.3 s after its last beat
    await _until(lambda: tracker_alive(redis_client, prefix), False, "the silent card to expire")


async def _until(read: Callable[[], Awaitable[object]], want: object, what: str) -> None:
    """Poll ``read`` until it gives ``want``, for at most 5 s."""
    for _ in range(250):
        if await read() == want:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"waited 5 s for {what}")


async def test_a_tracker_from_before_replicas_still_reads_as_alive(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    await redis_client.set(f"{prefix}:batch-tracker", "{}", px=2_000)
    assert await tracker_alive(redis_client, prefix)
