"""The exported JSON Schemas: up to date with the models, and they accept
what laneway writes and reject what it refuses."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from schemas.jobs import BatchCounts, BatchJob, BatchJobEvent, BatchJobStatus
from schemas.messages import (
    AnswerPath,
    CancelRequest,
    ErrorInfo,
    Feedback,
    InferenceRequest,
    InferenceResult,
    Lane,
    QualityEvent,
    ResultChunk,
    RoutedRequest,
    Usage,
)
from schemas.wire_schema import SCHEMA_DIR, WIRE_MODELS, export, schema_text

REQUEST = InferenceRequest(
    id="req-42",
    prompt="Where is my order 1234?",
    session_id="s-1",
    tenant="acme",
    max_tokens=64,
    deadline_ms=2000,
    metadata={"cache": "bypass"},
)
EXAMPLES: dict[str, list[BaseModel]] = {
    "request": [
        REQUEST,
        InferenceRequest(id="r2", prompt="hi"),
        InferenceRequest(
            id="r3",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        ),
    ],
    "routed": [
        RoutedRequest(
            request=REQUEST,
            lane=Lane.REALTIME,
            path=AnswerPath.LIGHT,
            reply_to="laneway.replies.client-web-1-bot",
            produced_at_ms=1_699_999_999_990,
            routed_at_ms=1_700_000_000_000,
            deadline_at_ms=1_700_000_002_000,
        )
    ],
    "result": [
        InferenceResult(id="req-42", status="ok", output="It ships today.", path=AnswerPath.LIGHT),
        InferenceResult(
            id="req-43",
            status="error",
            error=ErrorInfo(
                code="INF-429", message="over quota", retryable=True, retry_after_ms=1000
            ),
        ),
    ],
    "result_chunk": [
        ResultChunk(id="req-42", attempt=1, seq=0, delta="It ships", path=AnswerPath.LIGHT),
        ResultChunk(
            id="req-42",
            attempt=1,
            seq=1,
            delta=" today.",
            finish_reason="stop",
            usage=Usage(prompt_tokens=12, completion_tokens=4),
        ),
    ],
    "cancel": [CancelRequest(id="req-42")],
    "quality": [
        QualityEvent(
            kind="result",
            id="req-42",
            path=AnswerPath.LIGHT,
            success=True,
            latency_ms=12.5,
            ts_ms=1_700_000_000_100,
        )
    ],
    "feedback": [Feedback(request_id="req-42", score=-1.0, comment="wrong answer")],
    "batch_job_event": [
        BatchJobEvent(
            job=BatchJob(
                id="batch_0123456789abcdef0123",
                status=BatchJobStatus.IN_PROGRESS,
                tenant="acme",
                content_sha256="ab" * 32,
                counts=BatchCounts(total=200, invalid=3, produced=64, done=40, failed=2),
                created_at_ms=1_700_000_000_000,
                expires_at_ms=1_700_086_400_000,
            ),
            previous=BatchJobStatus.VALIDATING,
            at_ms=1_700_000_000_050,
        )
    ],
}


def schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(WIRE_MODELS))
def test_the_committed_schema_is_what_the_model_exports(name: str) -> None:
    committed = (SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8")
    assert committed == schema_text(name), "run `laneway schema` and commit schemas/json/"


@pytest.mark.parametrize("name", sorted(WIRE_MODELS))
def test_examples_validate_and_round_trip(name: str) -> None:
    validator = jsonschema.Draft202012Validator(schema(name))
    for example in EXAMPLES[name]:
        wire = json.loads(example.model_dump_json())
        validator.validate(wire)
        assert WIRE_MODELS[name].model_validate_json(json.dumps(wire)) == example


@pytest.mark.parametrize("name", sorted(WIRE_MODELS))
def test_unknown_fields_and_a_newer_schema_version_are_refused(name: str) -> None:
    validator = jsonschema.Draft202012Validator(schema(name))
    wire = json.loads(EXAMPLES[name][0].model_dump_json())
    assert not validator.is_valid({**wire, "surprise": 1})
    assert not validator.is_valid({**wire, "schema_version": 2})


def test_export_writes_one_file_per_message(tmp_path: Any) -> None:
    written = export(tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{n}.schema.json" for n in WIRE_MODELS)
    assert all(p.read_text(encoding="utf-8") == schema_text(p.name.split(".")[0]) for p in written)
