"""JSON Schema for every wire message, exported from the pydantic models.

``laneway schema`` writes them; the copies in ``schemas/json/`` are the
contract's machine-readable half (CONTRACT.md is the other) and a test keeps
them equal to what the models export, so a wire change shows in review.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from schemas.jobs import BatchJobEvent
from schemas.messages import (
    CancelRequest,
    Feedback,
    InferenceRequest,
    InferenceResult,
    QualityEvent,
    ResultChunk,
    RoutedRequest,
)

__all__ = ["SCHEMA_DIR", "WIRE_MODELS", "export", "schema_text"]

WIRE_MODELS: dict[str, type[BaseModel]] = {
    "request": InferenceRequest,  # laneway.requests
    "routed": RoutedRequest,  # laneway.lane.<lane>, laneway.retry.<lane>
    "result": InferenceResult,  # reply topics, laneway.results
    "result_chunk": ResultChunk,  # reply topics, before the result of a streamed request
    "cancel": CancelRequest,  # laneway.cancels
    "quality": QualityEvent,  # laneway.quality
    "feedback": Feedback,  # laneway.feedback
    "batch_job_event": BatchJobEvent,  # laneway.batch.jobs
}
"""File stem -> message model, one per kind of record laneway reads or writes."""

SCHEMA_DIR = Path(__file__).with_name("json")


def schema_text(name: str) -> str:
    """The JSON Schema of ``WIRE_MODELS[name]``, as the file holds it."""
    schema = WIRE_MODELS[name].model_json_schema(mode="validation")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"laneway/{name}.schema.json",
        **schema,
    }
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def export(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Write every message's schema to ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in WIRE_MODELS:
        path = directory / f"{name}.schema.json"
        path.write_text(schema_text(name), encoding="utf-8")
        written.append(path)
    return written
