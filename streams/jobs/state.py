"""A job's status machine, as pure functions.

::

    validating ──► in_progress ──► finalizing ──► completed
        │              │
        ├──► failed    ├──► expired      (the window passed first)
        └──► cancelled └──► cancelled    (laneway batch cancel)

``failed`` is a job that could not run at all (no valid line). A job whose
requests all came back, with errors or not, is ``completed``: each
request's error is in its results line, as in the OpenAI Batch API.
"""

from __future__ import annotations

from schemas.jobs import BatchJob, BatchJobStatus

__all__ = ["TRANSITIONS", "can_move", "due_status"]

S = BatchJobStatus
TRANSITIONS: dict[BatchJobStatus, frozenset[BatchJobStatus]] = {
    S.VALIDATING: frozenset({S.IN_PROGRESS, S.FAILED, S.CANCELLED, S.EXPIRED}),
    S.IN_PROGRESS: frozenset({S.FINALIZING, S.EXPIRED, S.CANCELLED}),
    S.FINALIZING: frozenset({S.COMPLETED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.EXPIRED: frozenset(),
    S.CANCELLED: frozenset(),
}
"""Status -> the statuses it may move to."""


def can_move(current: BatchJobStatus, to: BatchJobStatus) -> bool:
    return to in TRANSITIONS[current]


def due_status(job: BatchJob, now_ms: int) -> BatchJobStatus | None:
    """The status ``job`` should move to now, or ``None``.

    A file's job is finished once every line was produced and answered
    within its window (the tracker settles a job at each result, so one
    whose last answer came in time is completed in time); at the end of the
    window it has expired, with what finished kept. A job that Kafka
    producers alone wrote to has no end but its window: then it is finished
    if nothing is pending, else expired."""
    counts = job.counts
    if job.status is S.FINALIZING:
        return S.COMPLETED
    if job.status is not S.IN_PROGRESS:
        return None
    answered = counts.done + counts.failed >= counts.total
    if now_ms >= job.expires_at_ms:
        return S.FINALIZING if job.source == "kafka" and answered else S.EXPIRED
    if job.source == "file" and counts.produced >= counts.total and answered:
        return S.FINALIZING
    return None
