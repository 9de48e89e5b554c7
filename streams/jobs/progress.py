"""Job progress for people: a one-line bar redrawn with a carriage return
(``laneway batch submit --wait``), the status block, and ``cancel``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from schemas.jobs import BatchJob, BatchJobStatus
from schemas.settings import Settings
from streams.jobs.events import Mover
from streams.jobs.store import JobStore

__all__ = ["Rate", "cancel_job", "format_bar", "format_status", "get_job", "list_jobs", "watch"]

BAR_WIDTH = 30


@dataclass(slots=True)
class Rate:
    """Answers per second over the last ``span_s``, for the ETA."""

    span_s: float = 20.0
    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, at_s: float, answered: int) -> float:
        self.samples.append((at_s, answered))
        while len(self.samples) > 2 and at_s - self.samples[0][0] > self.span_s:
            self.samples.pop(0)
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def format_bar(job: BatchJob, rate: float) -> str:
    """``[#####-----]  120/200 done 110 failed 10 pending 80  4.1/s  ETA 20s  in_progress``."""
    c = job.counts
    total = max(c.total, 1)
    done_w = BAR_WIDTH * c.done // total
    fail_w = BAR_WIDTH * c.failed // total
    bar = "#" * done_w + "x" * fail_w + "-" * (BAR_WIDTH - done_w - fail_w)
    answered = c.done + c.failed
    eta = f"{c.pending / rate:.0f}s" if rate > 0 and c.pending else "-"
    return (
        f"[{bar}] {answered}/{c.total} done {c.done} failed {c.failed} pending {c.pending} "
        f"(produced {c.produced})  {rate:.1f}/s  ETA {eta}  {job.status}"
    )


def format_status(job: BatchJob) -> str:
    c = job.counts
    lines = [
        f"job       {job.id}",
        f"status    {job.status}",
        f"tenant    {job.tenant or '-'}",
        f"source    {job.source} ({job.format} lines)",
        f"requests  {c.total} (invalid lines {c.invalid}, produced {c.produced})",
        f"done      {c.done}",
        f"failed    {c.failed}",
        f"pending   {c.pending}",
        f"created   {_when(job.created_at_ms)}",
        f"expires   {_when(job.expires_at_ms)}",
    ]
    if job.finished_at_ms:
        lines.append(f"finished  {_when(job.finished_at_ms)}")
    return "\n".join(lines)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


STALL_S = 120.0
"""Seconds without a new result before ``watch`` asks whether the tracker runs."""
WINDOW_GRACE_MS = 60_000
"""How long past a job's window ``watch`` waits for the tracker to settle it."""


async def watch(
    settings: Settings,
    job_id: str,
    out: IO[str],
    *,
    interval_s: float = 0.5,
    timeout_s: float | None = None,
    stall_s: float = STALL_S,
    clock: Callable[[], float] = time.monotonic,
) -> BatchJob:
    """Redraw the job's bar until it is final (or ``timeout_s``); the job.

    Results are counted by the job tracker (``laneway batch tracker``, part
    of ``laneway up``). When nothing moves for ``stall_s`` the bar says so
    once, naming the tracker; past the job's window (and a minute's grace
    for the tracker to settle it) the wait ends with the job as it stands,
    so a missing tracker never makes ``--wait`` wait for ever."""
    redis = settings.redis.client()
    rate = Rate()
    give_up = None if timeout_s is None else clock() + timeout_s
    moved_at, last, warned = clock(), -1, False
    try:
        store = JobStore(redis, settings.redis.key_prefix)
        while True:
            job = await store.get(job_id)
            if job is None:
                raise KeyError(job_id)
            answered = job.counts.done + job.counts.failed
            if answered != last:
                moved_at, last = clock(), answered
            speed = rate.add(clock(), answered)
            out.write("\r" + format_bar(job, speed) + "\x1b[K")
            if not warned and not job.final and clock() - moved_at > stall_s:
                warned = True
                out.write(
                    f"\nno result counted for {stall_s:.0f} s: is the job tracker running "
                    "(`laneway batch tracker`, part of `laneway up`)?\n"
                )
            out.flush()
            past_window = time.time() * 1000 > job.expires_at_ms + WINDOW_GRACE_MS
            if job.final or past_window or (give_up is not None and clock() > give_up):
                out.write("\n")
                return job
            await asyncio.sleep(interval_s)
    finally:
        await redis.aclose()


async def get_job(settings: Settings, job_id: str) -> BatchJob | None:
    redis = settings.redis.client()
    try:
        return await JobStore(redis, settings.redis.key_prefix).get(job_id)
    finally:
        await redis.aclose()


async def list_jobs(settings: Settings, limit: int = 50) -> list[BatchJob]:
    redis = settings.redis.client()
    try:
        return await JobStore(redis, settings.redis.key_prefix).list_jobs(limit)
    finally:
        await redis.aclose()


async def cancel_job(settings: Settings, job_id: str, producer: object) -> tuple[bool, BatchJob]:
    """Cancel the job if it is not final: ``(cancelled now, job)``. Its
    submitter stops producing at its next chunk; requests already produced
    still run and are counted (what ran)."""
    redis = settings.redis.client()
    try:
        store = JobStore(redis, settings.redis.key_prefix, retention_s=settings.batch.retention_s)
        moved = await Mover(store, producer, settings).move(job_id, BatchJobStatus.CANCELLED)
        job = moved or await store.get(job_id)
        if job is None:
            raise KeyError(job_id)
        return moved is not None, job
    finally:
        await redis.aclose()
