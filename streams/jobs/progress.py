"""Job progress for people: ``laneway batch submit --wait``'s progress (a
``rich.progress`` bar on a terminal, plain lines when the output is a pipe
or a file), the status block, and ``cancel``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from schemas.jobs import BatchJob, BatchJobStatus
from schemas.settings import Settings
from streams.jobs.events import Mover
from streams.jobs.store import JobStore

__all__ = [
    "JobView",
    "LineJobView",
    "Rate",
    "RichJobView",
    "cancel_job",
    "format_bar",
    "format_status",
    "get_job",
    "job_view",
    "list_jobs",
    "watch",
]

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


class JobView(Protocol):
    """Where ``watch`` shows a job as it moves."""

    def show(self, job: BatchJob, rate: float) -> None: ...

    def note(self, text: str) -> None: ...

    def close(self) -> None: ...


class RichJobView:
    """A ``rich.progress`` bar: answered of total, rate, ETA, counts."""

    def __init__(self, out: IO[str]) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TextColumn("{task.fields[rate]:.1f}/s"),
            TimeRemainingColumn(),
            console=Console(file=out),
            transient=False,
        )
        self._task = self._progress.add_task("job", total=None, counts="", rate=0.0)
        self._progress.start()

    def show(self, job: BatchJob, rate: float) -> None:
        c = job.counts
        counts = f"done {c.done} failed {c.failed} pending {c.pending} (produced {c.produced})"
        self._progress.update(
            self._task,
            description=f"{job.id} {job.status}",
            total=max(c.total, 1),
            completed=c.done + c.failed,
            counts=counts,
            rate=rate,
        )

    def note(self, text: str) -> None:
        self._progress.console.print(text)

    def close(self) -> None:
        self._progress.stop()


class LineJobView:
    """One plain line each time the job moves (for a pipe or a log file:
    no escape codes, no carriage returns)."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._last: tuple[int, int, int, str] | None = None

    def show(self, job: BatchJob, rate: float) -> None:
        c = job.counts
        key = (c.produced, c.done, c.failed, str(job.status))
        if key != self._last:
            self._last = key
            print(format_bar(job, rate), file=self._out, flush=True)

    def note(self, text: str) -> None:
        print(text, file=self._out, flush=True)

    def close(self) -> None:
        self._out.flush()


def job_view(out: IO[str]) -> JobView:
    """A rich bar on a terminal, plain lines otherwise."""
    return RichJobView(out) if out.isatty() else LineJobView(out)


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
    """Show the job's progress on ``out`` until it is final (or
    ``timeout_s``); the job.

    Results are counted by the job tracker (``laneway batch tracker``, part
    of ``laneway up``). When nothing moves for ``stall_s`` the view says so
    once, naming the tracker; past the job's window (and a minute's grace
    for the tracker to settle it) the wait ends with the job as it stands,
    so a missing tracker never makes ``--wait`` wait for ever."""
    redis = settings.redis.client()
    rate = Rate()
    give_up = None if timeout_s is None else clock() + timeout_s
    moved_at, last, warned = clock(), -1, False
    view = job_view(out)
    try:
        store = JobStore(redis, settings.redis.key_prefix)
        while True:
            job = await store.get(job_id)
            if job is None:
                raise KeyError(job_id)
            answered = job.counts.done + job.counts.failed
            if answered != last:
                moved_at, last = clock(), answered
            view.show(job, rate.add(clock(), answered))
            if not warned and not job.final and clock() - moved_at > stall_s:
                warned = True
                view.note(
                    f"no result counted for {stall_s:.0f} s: is the job tracker running "
                    "(`laneway batch tracker`, part of `laneway up`)?"
                )
            past_window = time.time() * 1000 > job.expires_at_ms + WINDOW_GRACE_MS
            if job.final or past_window or (give_up is not None and clock() > give_up):
                return job
            await asyncio.sleep(interval_s)
    finally:
        view.close()
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
