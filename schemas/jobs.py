"""Offline batch jobs on the wire: the job as ``laneway batch status --json``
prints it, and the event published on ``<p>.batch.jobs`` at each change of
its status (see CONTRACT.md, "Offline batch jobs")."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from schemas.messages import WireModel

__all__ = ["BatchCounts", "BatchJob", "BatchJobEvent", "BatchJobStatus"]


class BatchJobStatus(StrEnum):
    """``validating -> in_progress -> finalizing -> completed``; ``failed``
    (nothing could run), ``expired`` (the window passed), ``cancelled``."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class BatchCounts(WireModel):
    total: int = Field(default=0, ge=0)
    """Requests of the job: the file's valid lines, or (a job only Kafka
    producers wrote to) the requests with its ``batch_id`` seen so far."""
    invalid: int = Field(default=0, ge=0)
    """Input lines refused by validation (never produced)."""
    produced: int = Field(default=0, ge=0)
    """Requests on the request topic, in input order (the resume point)."""
    done: int = Field(default=0, ge=0)
    """Requests answered ``ok``."""
    failed: int = Field(default=0, ge=0)
    """Requests answered with an error."""

    @property
    def pending(self) -> int:
        return max(0, self.total - self.done - self.failed)


class BatchJob(WireModel):
    schema_version: Literal[1] = 1
    id: str = Field(min_length=1)
    status: BatchJobStatus
    tenant: str | None = None
    source: Literal["file", "kafka"] = "file"
    """``file``: ``laneway batch submit``; ``kafka``: first seen as a
    ``batch_id`` some other producer wrote."""
    format: Literal["laneway", "openai"] = "laneway"
    """The input's line shape; the results file is written in the same."""
    content_sha256: str | None = None
    counts: BatchCounts = Field(default_factory=BatchCounts)
    created_at_ms: int
    expires_at_ms: int
    finished_at_ms: int | None = None
    """When it reached a final status."""

    @property
    def final(self) -> bool:
        return self.status in FINAL


FINAL = frozenset(
    {
        BatchJobStatus.COMPLETED,
        BatchJobStatus.FAILED,
        BatchJobStatus.EXPIRED,
        BatchJobStatus.CANCELLED,
    }
)


class BatchJobEvent(WireModel):
    """One per status change of a job, keyed by the job id."""

    schema_version: Literal[1] = 1
    job: BatchJob
    previous: BatchJobStatus | None = None
    """The status it left; ``None`` when the job was created."""
    at_ms: int
