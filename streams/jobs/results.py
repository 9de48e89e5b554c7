"""``laneway batch results``: one output line per valid input line, in input
order, and an errors file (refused input lines, then failed requests).

A laneway-shaped job's output line::

    {"custom_id": "q1", "id": "<request id>", "line": 3,
     "response": {"output": "...", "model": "...", "path": "light", "lane": "bulk",
                  "usage": {...}, "degraded": false, "finish_reason": "length"},
     "error": null}

An OpenAI-shaped job's is the OpenAI Batch API's (``response.body`` is a
``chat.completion``), so existing tooling reads it. A line without a result
has ``error.code`` ``batch_cancelled``, ``batch_expired`` or, while the job
runs, ``batch_pending``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from schemas.jobs import BatchJob, BatchJobStatus
from schemas.messages import InferenceResult
from schemas.settings import Settings
from streams.jobs.jsonl import request_id
from streams.jobs.store import JobStore

__all__ = ["ResultsSummary", "output_line", "write_results"]


@dataclass(slots=True)
class ResultsSummary:
    job: BatchJob
    written: int = 0
    ok: int = 0
    errors: int = 0
    """Output lines with an error (missing results included)."""
    missing: int = 0
    """Valid lines with no result (yet)."""
    invalid: int = 0


def _missing_code(job: BatchJob) -> str:
    if job.status in (BatchJobStatus.CANCELLED, BatchJobStatus.EXPIRED):
        return f"batch_{job.status.value}"
    return "batch_pending"


def output_line(
    job: BatchJob, line: int | None, custom_id: str, rid: str, result: InferenceResult | None
) -> dict[str, Any]:
    """The output line of one input line (pure)."""
    error: dict[str, Any] | None = None
    if result is None:
        error = {"code": _missing_code(job), "message": f"no result: the job is {job.status}"}
    elif result.status != "ok" or result.error is not None:
        info = result.error
        error = {
            "code": info.code if info else "error",
            "message": info.message if info else "",
            "retryable": info.retryable if info else False,
        }
    if job.format == "openai":
        return _openai_line(custom_id, rid, result if error is None else None, error)
    response = None
    if error is None and result is not None:
        response = {
            "output": result.output,
            "model": result.model,
            "path": result.path,
            "lane": result.lane,
            "usage": result.usage.model_dump(),
            "degraded": result.degraded,
            "finish_reason": result.finish_reason or "stop",
        }
    return {"custom_id": custom_id, "id": rid, "line": line, "response": response, "error": error}


def _openai_line(
    custom_id: str, rid: str, result: InferenceResult | None, error: dict[str, Any] | None
) -> dict[str, Any]:
    if result is None:
        return {"id": f"batch_req_{rid}", "custom_id": custom_id, "response": None, "error": error}
    usage = result.usage
    body = {
        "id": rid,
        "object": "chat.completion",
        "model": result.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.output or ""},
                # A result written before laneway said why an answer ended: stop.
                "finish_reason": result.finish_reason or "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        },
    }
    return {
        "id": f"batch_req_{rid}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": rid, "body": body},
        "error": None,
    }


def _decode(raw: str | None) -> InferenceResult | None:
    return None if raw is None else InferenceResult.model_validate_json(raw)


async def write_results(
    settings: Settings, job_id: str, out: Path, errors_out: Path | None = None
) -> ResultsSummary:
    """Write the job's results to ``out`` and its errors to ``errors_out``
    (``<out stem>.errors.jsonl`` when not given). ``KeyError`` when there is
    no such job."""
    errors_out = errors_out or out.with_name(out.stem + ".errors.jsonl")
    redis = settings.redis.client()
    try:
        store = JobStore(redis, settings.redis.key_prefix)
        job = await store.get(job_id)
        if job is None:
            raise KeyError(job_id)
        summary = ResultsSummary(job)
        with out.open("w", encoding="utf-8") as sink, errors_out.open("w", encoding="utf-8") as bad:
            for invalid in await store.invalid(job_id):
                summary.invalid += 1
                _write(
                    bad, {**invalid, "error": {"code": "invalid_line", "message": invalid["error"]}}
                )
            if job.source == "kafka":
                await _kafka_job(store, job, sink, bad, summary)
            else:
                async for chunk in store.lines(job_id):
                    ids = [request_id(job_id, custom_id) for _, custom_id in chunk]
                    found = await store.results(job_id, ids)
                    for (line, custom_id), rid, raw in zip(chunk, ids, found, strict=True):
                        _emit(
                            sink, bad, summary, output_line(job, line, custom_id, rid, _decode(raw))
                        )
        return summary
    finally:
        await redis.aclose()


async def _kafka_job(
    store: JobStore, job: BatchJob, sink: IO[str], bad: IO[str], summary: ResultsSummary
) -> None:
    """A job only Kafka producers wrote to has no input order: its results
    by request id, which is also its ``custom_id``."""
    results: dict[str, str] = {}
    async for key, value in store.redis.hscan_iter(store.key(job.id, "results")):
        results[key.decode() if isinstance(key, bytes) else key] = (
            value.decode() if isinstance(value, bytes) else value
        )
    for rid in sorted(results):
        _emit(sink, bad, summary, output_line(job, None, rid, rid, _decode(results[rid])))


def _emit(sink: IO[str], bad: IO[str], summary: ResultsSummary, row: dict[str, Any]) -> None:
    _write(sink, row)
    summary.written += 1
    if row["error"] is None:
        summary.ok += 1
        return
    summary.errors += 1
    if row["error"]["code"].startswith("batch_"):
        summary.missing += 1
    _write(bad, row)


def _write(sink: IO[str], row: dict[str, Any]) -> None:
    sink.write(json.dumps(row, ensure_ascii=False) + "\n")
