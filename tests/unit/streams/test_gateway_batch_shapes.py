"""The Batch API's objects from laneway's jobs (streams.gateway.batch_shapes),
the batch file check (streams.gateway.files) and feedback bodies
(streams.gateway.feedback): pure functions."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from schemas.jobs import BatchCounts, BatchJob, BatchJobStatus
from schemas.messages import RequestLimits
from streams.gateway.batch_shapes import (
    BatchRecord,
    batch_object,
    openai_status,
    result_file_of,
    result_files,
)
from streams.gateway.errors import GatewayError
from streams.gateway.feedback import parse_feedback, request_id_of
from streams.gateway.files import line_urls, validate_batch_file

RECORD = BatchRecord(
    id="batch_0123456789abcdef01234567",
    tenant="acme",
    input_file_id="file-1",
    endpoint="/v1/chat/completions",
    completion_window="24h",
    window_s=86_400,
    created_at=1_000,
    metadata={"team": "search"},
    lines=4,
)


def job(status: BatchJobStatus, **counts: int) -> BatchJob:
    return BatchJob(
        id=RECORD.id,
        status=status,
        tenant="acme",
        format="openai",
        counts=BatchCounts(**counts),
        created_at_ms=1_000_500,
        expires_at_ms=87_400_000,
        finished_at_ms=1_090_000
        if status in (BatchJobStatus.COMPLETED, BatchJobStatus.CANCELLED)
        else None,
    )


def test_every_job_status_maps_to_openais_and_a_cancel_asked_for_is_cancelling() -> None:
    assert openai_status(RECORD, None) == "validating"
    assert openai_status(replace(RECORD, error="gone"), None) == "failed"
    for status in BatchJobStatus:
        assert openai_status(RECORD, job(status)) == status.value
    asked = replace(RECORD, cancel_at=1_050)
    assert openai_status(asked, job(BatchJobStatus.IN_PROGRESS)) == "cancelling"
    assert openai_status(asked, job(BatchJobStatus.CANCELLED)) == "cancelled"


def test_result_files_exist_once_final_and_only_with_lines() -> None:
    assert result_files(job(BatchJobStatus.IN_PROGRESS, total=4, done=4)) == (None, None)
    output, errors = result_files(job(BatchJobStatus.COMPLETED, total=4, done=4))
    assert output == f"file-{RECORD.id}-output" and errors is None
    assert result_file_of(output) == (RECORD.id, "output")
    output, errors = result_files(job(BatchJobStatus.CANCELLED, total=4, done=0, failed=1))
    assert output is None and errors is not None, "failed and never-run lines are errors"
    assert result_file_of(errors) == (RECORD.id, "errors")
    assert result_file_of("file-0123abcd") is None
    assert result_file_of(f"file-{RECORD.id}-other") is None


def test_the_batch_object_carries_openais_fields_and_the_jobs_counts() -> None:
    shown = batch_object(
        RECORD, job(BatchJobStatus.COMPLETED, total=4, produced=4, done=3, failed=1)
    )
    assert shown["object"] == "batch" and shown["status"] == "completed"
    assert shown["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert shown["completed_at"] == 1_090 and shown["in_progress_at"] == 1_000
    assert shown["metadata"] == {"team": "search"} and shown["errors"] is None
    assert shown["output_file_id"] and shown["error_file_id"]
    queued = batch_object(RECORD, None)
    assert queued["request_counts"] == {"total": 4, "completed": 0, "failed": 0}
    assert queued["expires_at"] == 1_000 + 86_400 and queued["in_progress_at"] is None
    assert BatchRecord.from_hash({k: str(v) for k, v in RECORD.to_hash().items()}) == RECORD


def line(custom_id: str, **extra: object) -> str:
    row = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}]},
        **extra,
    }
    return json.dumps(row)


def test_a_batch_file_is_checked_whole_and_every_bad_line_named() -> None:
    laneway_shape = json.dumps({"custom_id": "c", "body": {"prompt": "hi"}})
    data = "\n".join([line("a"), "{", line("a"), laneway_shape, line("d")]).encode()
    with pytest.raises(GatewayError) as bad:
        validate_batch_file(data, RequestLimits(), max_lines=100)
    assert bad.value.status == 400 and bad.value.code == "invalid_batch_file"
    errors = bad.value.body()["error"]["laneway"]["errors"]
    assert [e["line"] for e in errors] == [2, 3, 4]
    assert "OpenAI's line shape" in errors[2]["error"]
    with pytest.raises(GatewayError, match="no requests"):
        validate_batch_file(b"\n\n", RequestLimits(), max_lines=100)
    parsed = validate_batch_file((line("a") + "\n" + line("b")).encode(), RequestLimits(), 100)
    assert [ln.custom_id for ln in parsed.lines] == ["a", "b"]
    assert line_urls(parsed) == ("/v1/chat/completions",)


def test_feedback_takes_a_score_or_thumbs_on_an_answer_id() -> None:
    verdict = parse_feedback({"id": "chatcmpl-gw-12", "thumbs": "up", "comment": "good"})
    assert (verdict.request_id, verdict.score, verdict.comment) == ("gw-12", 1.0, "good")
    assert parse_feedback({"id": "batch_req_r-1", "score": -0.5}).request_id == "r-1"
    assert request_id_of("gw-9") == "gw-9"
    for body, param in [
        ({"id": "x"}, "score"),
        ({"id": "x", "score": 1, "thumbs": "up"}, "score"),
        ({"id": "x", "score": 2}, "score"),
        ({"id": "x", "score": True}, "score"),
        ({"id": "x", "thumbs": "sideways"}, "thumbs"),
        ({"id": "", "score": 1}, "id"),
        ({"id": "x", "score": 1, "stars": 5}, "stars"),
        ({"id": "x", "score": 1, "comment": 7}, "comment"),
    ]:
        with pytest.raises(GatewayError) as bad:
            parse_feedback(body)
        assert bad.value.status == 400 and bad.value.param == param, body
