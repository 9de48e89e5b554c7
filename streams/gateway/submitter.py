"""Batch submission in the gateway process, in the background.

``POST /v1/batches`` keeps the batch's record, puts its id in the
``submitting`` set and answers at once (``validating``); a task of the
replica then submits the input file as the key's tenant, with laneway's
resumable submitter (``streams.jobs.submit``) under the batch's id as the
job id. The task belongs to the replica, not to the HTTP request: a client
that goes away changes nothing.

- At most ``LANEWAY_GATEWAY_BATCH_SUBMITTERS`` submissions run at once per
  replica; the rest wait their turn.
- A submission holds a lease in Redis (``LANEWAY_GATEWAY_BATCH_LEASE_S``,
  renewed at a third of it), so one replica alone produces a batch's lines.
- Every third of a lease each replica sweeps the ``submitting`` set and
  takes each batch nobody holds: after a restart (or the death of the
  replica that held it) the submission resumes by the job id where the
  job's ``produced`` count says, nothing answered twice.
- A submission that fails (Redis or the broker away) is tried again at the
  next sweep, ``MAX_ATTEMPTS`` times; then the batch is ``failed`` with the
  reason in its ``errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from schemas.settings import Settings
from streams.client import LanewayClient
from streams.gateway import metrics
from streams.gateway.batch_store import BatchStore
from streams.gateway.files import FileStore
from streams.jobs.submit import InvalidBatchFile

__all__ = ["MAX_ATTEMPTS", "BatchSubmitter"]

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5


class BatchSubmitter:
    def __init__(
        self,
        settings: Settings,
        client: LanewayClient,
        batches: BatchStore,
        files: FileStore,
        replica: str,
    ) -> None:
        self.settings = settings
        self.client = client
        self.batches = batches
        self.files = files
        self.replica = replica
        self.lease_s = settings.gateway.batch_lease_s
        self._slots = asyncio.Semaphore(settings.gateway.batch_submitters)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._attempts: dict[str, int] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def running(self) -> frozenset[str]:
        """Batches this replica is submitting or has queued."""
        return frozenset(self._tasks)

    def start(self) -> None:
        """Sweep now (resume what a restart left) and every third of a lease."""
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="batch-sweeper")

    def submit(self, batch_id: str) -> None:
        """Submit the batch in the background (once per replica)."""
        if batch_id in self._tasks:
            return
        task = asyncio.create_task(self._run(batch_id), name=f"submit-{batch_id}")
        self._tasks[batch_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(batch_id, None))

    async def sweep(self) -> int:
        """Take every batch in ``submitting`` that no replica holds; how many."""
        taken = 0
        for batch_id in await self.batches.submitting():
            if batch_id in self._tasks or await self.batches.leased(batch_id):
                continue
            log.info("batch %s: resuming its submission", batch_id)
            self.submit(batch_id)
            taken += 1
        return taken

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as exc:
                log.warning("batch sweep failed (%s: %s); trying again", type(exc).__name__, exc)
            await asyncio.sleep(self.lease_s / 3)

    async def _renew(self, batch_id: str) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.batches.take_lease(batch_id, self.replica, self.lease_s)
            except Exception as exc:
                log.warning("batch %s: could not renew its lease: %s", batch_id, exc)

    async def _run(self, batch_id: str) -> None:
        async with self._slots:
            if not await self.batches.take_lease(batch_id, self.replica, self.lease_s):
                return  # another replica submits it
            renew = asyncio.create_task(self._renew(batch_id))
            try:
                await self._submit(batch_id)
            except asyncio.CancelledError:
                metrics.BATCH_SUBMISSIONS.labels("interrupted").inc()
                raise
            finally:
                renew.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renew
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.batches.release_lease(batch_id, self.replica))

    async def _submit(self, batch_id: str) -> None:
        record = await self.batches.get(batch_id)
        if record is None:  # expired meanwhile
            await self.batches.submitted(batch_id)
            return
        data = await self.files.content(record.tenant, record.input_file_id)
        if data is None:
            await self._fail(batch_id, f"the input file {record.input_file_id} no longer exists")
            return
        try:
            job = await self.client.submit_batch(
                data,
                settings=self.settings,
                tenant=record.tenant or None,
                window_s=record.window_s,
                job_id=batch_id,
            )
        except InvalidBatchFile as exc:
            await self._fail(batch_id, f"the input file is not valid: {exc}")
            return
        except Exception as exc:
            attempts = self._attempts.get(batch_id, 0) + 1
            self._attempts[batch_id] = attempts
            log.warning(
                "batch %s: submission failed (attempt %d of %d, %s: %s)",
                batch_id,
                attempts,
                MAX_ATTEMPTS,
                type(exc).__name__,
                exc,
            )
            if attempts >= MAX_ATTEMPTS:
                await self._fail(batch_id, f"submission failed {attempts} times: {exc}")
            else:
                metrics.BATCH_SUBMISSIONS.labels("failed").inc()
            return
        self._attempts.pop(batch_id, None)
        await self.batches.submitted(batch_id)
        metrics.BATCH_SUBMISSIONS.labels(
            "cancelled" if job.status.value == "cancelled" else "submitted"
        ).inc()
        log.info("batch %s: submitted (%s, %d produced)", batch_id, job.status, job.counts.produced)

    async def _fail(self, batch_id: str, why: str) -> None:
        log.warning("batch %s: failed: %s", batch_id, why)
        await self.batches.set_fields(batch_id, error=why)
        await self.batches.submitted(batch_id)
        metrics.BATCH_SUBMISSIONS.labels("failed").inc()

    async def close(self) -> None:
        """Stop sweeping and interrupt the submissions (another replica, or
        this one restarted, resumes them)."""
        tasks: list[Any] = list(self._tasks.values())
        if self._sweeper is not None:
            tasks.append(self._sweeper)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
