"""``student.json``: where a student adapter came from and how it measured.

Written beside ``adapter.gguf`` (and the PEFT directory ``peft/``) by
``laneway distill student``; read by ``laneway models register`` (which
refuses a student not offered) and ``laneway models list`` (which shows
where a student version came from). The keys are the file's contract::

    {"kind": "laneway.student/1", "base_model": "smollm2-135m",
     "base_gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "teacher": "gemma3-270m",
     "window": {"start": iso, "end": iso} | null,
     "rows": {"train": n, "held_out": n, "dropped_bad": n, "dropped_failed": n},
     "lora": {"r": 8, "alpha": 16.0, "targets": [...], "steps": 60, "lr": 0.001},
     "metrics": {"loss_first": .., "loss_last": .., "base_agreement": ..,
                 "student_agreement": .., "base_tokens_per_s": ..,
                 "student_tokens_per_s": ..},
     "offered": bool, "reason": str, "created": iso, "commit": str}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "ADAPTER_FILE",
    "PEFT_DIR",
    "PROVENANCE_FILE",
    "STUDENT_KIND",
    "LoraInfo",
    "ProvenanceError",
    "RowCounts",
    "StudentMetrics",
    "StudentProvenance",
    "TimeWindow",
]

ADAPTER_FILE = "adapter.gguf"
PEFT_DIR = "peft"
PROVENANCE_FILE = "student.json"
STUDENT_KIND = "laneway.student/1"
"""``student.json``'s ``kind``: the format this laneway writes and reads."""

_STRICT = ConfigDict(extra="forbid", frozen=True)


class ProvenanceError(ValueError):
    """A ``student.json`` that cannot be read; the message names the file."""


class TimeWindow(BaseModel):
    model_config = _STRICT

    start: str
    """The first training row's time (ISO 8601, UTC)."""
    end: str


class RowCounts(BaseModel):
    model_config = _STRICT

    train: int = Field(ge=0)
    """Distinct prompts trained on."""
    held_out: int = Field(ge=0)
    """Distinct prompts kept out of training, on which agreement is measured."""
    dropped_bad: int = Field(ge=0)
    """Teacher answers a client rated bad (mean feedback below 0): never targets."""
    dropped_failed: int = Field(ge=0)
    """Teacher requests that failed, or answered nothing: never targets."""


class LoraInfo(BaseModel):
    model_config = _STRICT

    r: int = Field(ge=1)
    alpha: float = Field(gt=0)
    targets: list[str]
    """transformers module names (``v_proj``, ...), the same in every layer."""
    steps: int = Field(ge=0)
    lr: float = Field(gt=0)


class StudentMetrics(BaseModel):
    model_config = _STRICT

    loss_first: float | None
    loss_last: float | None
    """Mean training loss over the last steps (see ``lora.train_lora``)."""
    base_agreement: float | None
    """Share of held-out prompts where the base light model agrees with the teacher."""
    student_agreement: float | None
    base_tokens_per_s: float | None
    """llama.cpp, greedy, the same settings for both."""
    student_tokens_per_s: float | None


class StudentProvenance(BaseModel):
    model_config = _STRICT

    kind: Literal["laneway.student/1"] = "laneway.student/1"
    base_model: str
    """The light model's registry name (``smollm2-135m``) or its GGUF path."""
    base_gguf: str
    """The base GGUF's file name; the adapter applies to exactly that file."""
    teacher: str
    """The heavy model whose answers were the targets."""
    window: TimeWindow | None
    rows: RowCounts
    lora: LoraInfo
    metrics: StudentMetrics
    offered: bool
    """Whether the student may be offered for promotion (shadow, canary)."""
    reason: str
    created: str
    commit: str

    def write(self, directory: Path) -> Path:
        path = directory / PROVENANCE_FILE
        partial = path.with_name(path.name + ".partial")
        partial.write_text(self.model_dump_json(indent=2) + "\n")
        partial.replace(path)
        return path

    @classmethod
    def read(cls, path: Path) -> StudentProvenance:
        """From ``student.json`` or the directory holding it."""
        if path.is_dir():
            path = path / PROVENANCE_FILE
        try:
            data = path.read_bytes()
            kind = json.loads(data).get("kind")
        except OSError as exc:
            raise ProvenanceError(f"{path} cannot be read: {exc.strerror or exc}") from None
        except (ValueError, AttributeError) as exc:
            raise ProvenanceError(f"{path} cannot be read: not a JSON object: {exc}") from None
        if kind != STUDENT_KIND:
            raise ProvenanceError(f"{path} is of kind {kind!r}; this laneway reads {STUDENT_KIND}")
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise ProvenanceError(
                f"{path} cannot be read: not a student provenance: {exc}"
            ) from None
