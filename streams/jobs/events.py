"""Job status changes on ``<p>.batch.jobs``, and the moves that publish them."""

from __future__ import annotations

import logging
import time
from typing import Any

from schemas.jobs import BatchJob, BatchJobEvent, BatchJobStatus
from schemas.settings import Settings
from streams.jobs.state import due_status
from streams.jobs.store import JobStore

__all__ = ["Mover", "now_ms"]

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


class Mover:
    """Moves jobs in the store and publishes each move that happened (a
    move another process made first is not published twice)."""

    def __init__(self, store: JobStore, producer: Any, settings: Settings) -> None:
        self.store = store
        self.producer = producer
        self.topic = settings.topic("batch.jobs")

    async def publish(self, job: BatchJob, previous: BatchJobStatus | None) -> None:
        event = BatchJobEvent(job=job, previous=previous, at_ms=now_ms())
        await self.producer.send_and_wait(
            self.topic, event.model_dump_json().encode(), key=job.id.encode()
        )

    async def move(self, job_id: str, to: BatchJobStatus) -> BatchJob | None:
        """The job after the move, or ``None`` if it did not move."""
        previous = await self.store.move(job_id, to, now_ms())
        if previous is None:
            return None
        job = await self.store.get(job_id)
        if job is not None:
            log.info("batch job %s: %s -> %s", job_id, previous, to)
            await self.publish(job, previous)
        return job

    async def settle(self, job_id: str) -> BatchJob | None:
        """Make every move that is due for the job now (completion, expiry);
        the job as it then is."""
        job = await self.store.get(job_id)
        while job is not None:
            to = due_status(job, now_ms())
            if to is None:
                return job
            moved = await self.move(job_id, to)
            if moved is None:  # another process moved it first
                return await self.store.get(job_id)
            job = moved
        return None
