"""The Batch API's objects from laneway's batch jobs (pure).

A batch is the gateway's record of it (``BatchRecord``: its input file,
endpoint, window, metadata, a cancel asked for) and laneway's job of the
same id (``schemas.jobs.BatchJob``: status and counts, kept by the job
tracker). Its OpenAI status::

    laneway job            gateway record           OpenAI status
    (none yet)             queued for submission    validating
    (none)                 submission failed        failed (errors say why)
    validating             -                        validating
    in_progress            -                        in_progress
    in_progress            cancel asked             cancelling
    finalizing             -                        finalizing
    completed              -                        completed
    failed                 -                        failed
    expired                -                        expired
    cancelled              -                        cancelled

``request_counts`` are the job's: ``total``, ``completed`` (answered ok),
``failed`` (answered with an error). Once the job is final its output file
(``file-<batch id>-output``: one line per request answered ok) and error
file (``file-<batch id>-errors``: one per request that failed or, for an
expired or cancelled batch, never ran) are its results, served by
``GET /v1/files/{id}/content``; each id is set only when it has lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from schemas.jobs import BatchJob, BatchJobStatus

__all__ = [
    "BatchRecord",
    "batch_object",
    "openai_status",
    "result_file_id",
    "result_file_of",
    "result_files",
]

OUTPUT = "output"
ERRORS = "errors"


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """What the gateway keeps of a batch beside laneway's job."""

    id: str
    tenant: str
    input_file_id: str
    endpoint: str
    completion_window: str
    window_s: int
    created_at: int
    metadata: dict[str, str] | None = None
    cancel_at: int | None = None
    """When a cancel was asked for (epoch s)."""
    error: str | None = None
    """Why the submission failed, when it did (the job never ran)."""
    lines: int = 0
    content_sha256: str = ""

    def to_hash(self) -> dict[str, str | int]:
        fields: dict[str, str | int] = {
            "id": self.id,
            "tenant": self.tenant,
            "input_file_id": self.input_file_id,
            "endpoint": self.endpoint,
            "completion_window": self.completion_window,
            "window_s": self.window_s,
            "created_at": self.created_at,
            "metadata": json.dumps(self.metadata),
            "lines": self.lines,
            "content_sha256": self.content_sha256,
        }
        if self.cancel_at is not None:
            fields["cancel_at"] = self.cancel_at
        if self.error is not None:
            fields["error"] = self.error
        return fields

    @classmethod
    def from_hash(cls, data: dict[str, str]) -> BatchRecord:
        cancel = data.get("cancel_at")
        return cls(
            id=data["id"],
            tenant=data.get("tenant", ""),
            input_file_id=data["input_file_id"],
            endpoint=data["endpoint"],
            completion_window=data["completion_window"],
            window_s=int(data["window_s"]),
            created_at=int(data["created_at"]),
            metadata=json.loads(data.get("metadata") or "null"),
            cancel_at=int(cancel) if cancel else None,
            error=data.get("error") or None,
            lines=int(data.get("lines", 0)),
            content_sha256=data.get("content_sha256", ""),
        )


_SAME = {
    BatchJobStatus.VALIDATING: "validating",
    BatchJobStatus.IN_PROGRESS: "in_progress",
    BatchJobStatus.FINALIZING: "finalizing",
    BatchJobStatus.COMPLETED: "completed",
    BatchJobStatus.FAILED: "failed",
    BatchJobStatus.EXPIRED: "expired",
    BatchJobStatus.CANCELLED: "cancelled",
}


def openai_status(record: BatchRecord, job: BatchJob | None) -> str:
    """The batch's OpenAI status (the table in the module docstring)."""
    if job is None:
        return "failed" if record.error else "validating"
    if record.cancel_at is not None and not job.final:
        return "cancelling"
    return _SAME[job.status]


def result_file_id(batch_id: str, kind: str) -> str:
    return f"file-{batch_id}-{kind}"


def result_file_of(file_id: str) -> tuple[str, str] | None:
    """``(batch id, "output" | "errors")`` of a result file's id, else ``None``."""
    if not file_id.startswith("file-batch_"):
        return None
    stem, _, kind = file_id[len("file-") :].rpartition("-")
    if kind not in (OUTPUT, ERRORS) or not stem:
        return None
    return stem, kind


def result_files(job: BatchJob | None) -> tuple[str | None, str | None]:
    """``(output_file_id, error_file_id)``: set once the job is final, each
    when it has lines."""
    if job is None or not job.final:
        return None, None
    counts = job.counts
    missing = max(0, counts.total - counts.done - counts.failed)
    output = result_file_id(job.id, OUTPUT) if counts.done else None
    errors = result_file_id(job.id, ERRORS) if counts.failed or missing else None
    return output, errors


def _s(ms: int | None) -> int | None:
    return None if ms is None else ms // 1000


def batch_object(record: BatchRecord, job: BatchJob | None) -> dict[str, Any]:
    """OpenAI's Batch object, with laneway's job under ``laneway``."""
    status = openai_status(record, job)
    output, errors = result_files(job)
    finished = _s(job.finished_at_ms) if job is not None else None
    started = job is not None and job.status is not BatchJobStatus.VALIDATING
    counts = job.counts if job is not None else None
    return {
        "id": record.id,
        "object": "batch",
        "endpoint": record.endpoint,
        "errors": (
            {
                "object": "list",
                "data": [
                    {
                        "code": "submission_failed",
                        "message": record.error,
                        "param": None,
                        "line": None,
                    }
                ],
            }
            if record.error
            else None
        ),
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": status,
        "output_file_id": output,
        "error_file_id": errors,
        "created_at": record.created_at,
        "in_progress_at": _s(job.created_at_ms) if job is not None and started else None,
        "expires_at": (
            _s(job.expires_at_ms) if job is not None else record.created_at + record.window_s
        ),
        "finalizing_at": finished if status == "completed" else None,
        "completed_at": finished if status == "completed" else None,
        "failed_at": finished if status == "failed" else None,
        "expired_at": finished if status == "expired" else None,
        "cancelling_at": record.cancel_at,
        "cancelled_at": finished if status == "cancelled" else None,
        "request_counts": {
            "total": counts.total if counts else record.lines,
            "completed": counts.done if counts else 0,
            "failed": counts.failed if counts else 0,
        },
        "metadata": record.metadata,
        "laneway": {
            "job_status": job.status.value if job is not None else None,
            "produced": counts.produced if counts else 0,
        },
    }
