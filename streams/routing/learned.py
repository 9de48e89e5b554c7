"""The learned router's artifact and its scoring: numpy only, shared by the
classifier (one request at a time) and by ``laneway distill train|report``
(whole matrices), so what is evaluated is what serves.

The artifact is one JSON file, no pickle: loading it runs no code.

    {"format": "laneway-learned-router/1", "version": "lr-20261203T161500Z-1a2b3c4d",
     "created": "2026-12-03T16:15:00Z", "features": ["log_tokens", ..., "intent=greeting"],
     "mean": [...], "scale": [...], "embedding_model": "all-MiniLM-L6-v2", "embedding_dim": 384,
     "heads": {"full": {"inputs": "features+embedding", "coef": [...], "intercept": -0.3,
                        "threshold": 0.41},
               "features": {"inputs": "features", ...}},
     "heavy_share": 0.3, "labels": {"feedback": 12, "agreement": 4, "success": 20},
     "window": {"since": "...", "until": "..."}, "metrics": {...}, "holdout": 0.2, "rows": 36}

Each head is a logistic regression: ``p = sigmoid(coef . x + intercept)``
is the chance that the light path's answer is good enough for the request;
``x`` is the standardised feature vector (``(v - mean) / scale``), followed by
the request's MiniLM embedding for the ``full`` head. The ``features`` head
serves requests whose embedding is not at hand. A request goes heavy when
``p < threshold``: the threshold was calibrated so that a target share of the
training traffic goes heavy. ``margin`` is ``logit(p) - logit(threshold)``:
positive when the light path is predicted good enough.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from streams.routing.features import RequestFeatures

__all__ = [
    "BASE_FEATURES",
    "ArtifactError",
    "Head",
    "LearnedRouter",
    "RouterArtifact",
    "feature_names",
    "feature_values",
    "save_artifact",
    "vectorise",
]


BASE_FEATURES = (
    "log_tokens",
    "has_code",
    "has_math",
    "reasoning",
    "has_deadline",
    "log_deadline_s",
    "log_depth",
)
"""Numeric features every artifact may use; categorical ones are
``intent=<name>``, ``language=<tag>`` and ``tier=<tier>``, one-hot, their
values taken from the training rows."""

_CATEGORICAL = ("intent", "language", "tier")
_P_CLIP = 1e-4


class ArtifactError(ValueError):
    """A router artifact that cannot be used; the message names the file and why."""


class Head(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    inputs: Literal["features", "features+embedding"]
    coef: list[float]
    intercept: float
    threshold: float = Field(gt=0, lt=1)
    """``p`` below it sends the request heavy."""


class RouterArtifact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["laneway-learned-router/1"] = "laneway-learned-router/1"
    version: str = Field(min_length=1)
    created: str
    features: list[str]
    mean: list[float]
    scale: list[float]
    embedding_model: str | None = None
    embedding_dim: int = Field(default=0, ge=0)
    heads: dict[Literal["full", "features"], Head]
    heavy_share: float = Field(ge=0, le=1)
    """Share of the training traffic calibrated to go heavy."""
    labels: dict[str, int] = Field(default_factory=dict)
    """Training rows per label source: ``feedback``, ``agreement``, ``success``."""
    window: dict[str, str | None] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    holdout: float = Field(default=0.0, ge=0, lt=1)
    """Share of rows (by a hash of the request id) kept out of training."""
    rows: int = 0

    @model_validator(mode="after")
    def _shapes(self) -> RouterArtifact:
        n = len(self.features)
        if len(self.mean) != n or len(self.scale) != n:
            raise ValueError(
                f"{n} features but {len(self.mean)} means and {len(self.scale)} scales"
            )
        if "features" not in self.heads:
            raise ValueError("the 'features' head is missing")
        for name, head in self.heads.items():
            width = n + (self.embedding_dim if head.inputs == "features+embedding" else 0)
            if len(head.coef) != width:
                raise ValueError(f"head {name!r} has {len(head.coef)} weights, expected {width}")
        unknown = [f for f in self.features if not _known_feature(f)]
        if unknown:
            raise ValueError(f"unknown features {unknown}")
        return self


def _known_feature(name: str) -> bool:
    if name in BASE_FEATURES:
        return True
    kind, sep, _ = name.partition("=")
    return bool(sep) and kind in _CATEGORICAL


def feature_values(features: RequestFeatures | Mapping[str, Any]) -> dict[str, Any]:
    """A request's features as a plain mapping (an export row stores them so)."""
    if isinstance(features, RequestFeatures):
        return {f.name: getattr(features, f.name) for f in fields(RequestFeatures)}
    return dict(features)


def feature_names(rows: Sequence[Mapping[str, Any]], min_count: int = 2) -> list[str]:
    """The features an artifact trained on ``rows`` (feature mappings) uses:
    the numeric ones, and each categorical value seen at least ``min_count`` times."""
    counts: dict[str, int] = {}
    for row in rows:
        for kind in _CATEGORICAL:
            value = row.get(kind)
            if value is not None:
                name = f"{kind}={value}"
                counts[name] = counts.get(name, 0) + 1
    return [*BASE_FEATURES, *sorted(n for n, c in counts.items() if c >= min_count)]


def _value(name: str, row: Mapping[str, Any]) -> float:
    if name == "log_tokens":
        return math.log1p(max(0, int(row.get("tokens") or 0)))
    if name in ("has_code", "has_math", "reasoning"):
        return 1.0 if row.get(name) else 0.0
    deadline = row.get("deadline_ms")
    if name == "has_deadline":
        return 0.0 if deadline is None else 1.0
    if name == "log_deadline_s":
        return 0.0 if deadline is None else math.log1p(max(0, int(deadline)) / 1000)
    if name == "log_depth":
        return math.log1p(max(0, int(row.get("depth") or 0)))
    kind, _, value = name.partition("=")
    return 1.0 if str(row.get(kind)) == value else 0.0


def vectorise(
    names: Sequence[str], rows: Sequence[RequestFeatures | Mapping[str, Any]]
) -> np.ndarray:
    """``(len(rows), len(names))`` float64: each row's raw feature values."""
    out = np.zeros((len(rows), len(names)), dtype=np.float64)
    for i, row in enumerate(rows):
        values = feature_values(row)
        for j, name in enumerate(names):
            out[i, j] = _value(name, values)
    return out


def _logit(p: np.ndarray | float) -> Any:
    clipped = np.clip(p, _P_CLIP, 1 - _P_CLIP)
    return np.log(clipped / (1 - clipped))


class LearnedRouter:
    """A loaded artifact, ready to score requests."""

    def __init__(self, artifact: RouterArtifact, source: str = "<memory>") -> None:
        self.artifact = artifact
        self.source = source
        self.version = artifact.version
        self._mean = np.asarray(artifact.mean, dtype=np.float64)
        scale = np.asarray(artifact.scale, dtype=np.float64)
        self._scale = np.where(scale > 0, scale, 1.0)
        self._heads = {
            name: (np.asarray(h.coef, dtype=np.float64), h.intercept, h.threshold)
            for name, h in artifact.heads.items()
        }

    @classmethod
    def from_file(cls, path: Path) -> LearnedRouter:
        try:
            artifact = RouterArtifact.model_validate_json(path.read_bytes())
        except OSError as exc:
            raise ArtifactError(f"router artifact {path}: cannot read it: {exc}") from exc
        except ValidationError as exc:
            raise ArtifactError(f"router artifact {path}: not a usable artifact: {exc}") from exc
        return cls(artifact, str(path))

    def save(self, path: Path) -> None:
        save_artifact(self.artifact, path)

    @property
    def uses_embedding(self) -> bool:
        return "full" in self._heads

    def head_for(self, has_embedding: bool) -> Literal["full", "features"]:
        return "full" if has_embedding and self.uses_embedding else "features"

    def probabilities(
        self,
        features: Sequence[RequestFeatures | Mapping[str, Any]] | np.ndarray,
        embeddings: np.ndarray | None = None,
    ) -> np.ndarray:
        """P(light is good enough) per row. ``features``: feature mappings, or
        the raw matrix from ``vectorise``; ``embeddings``: ``(n, dim)`` rows
        (the ``full`` head), or ``None`` (the ``features`` head)."""
        raw = (
            features
            if isinstance(features, np.ndarray)
            else vectorise(self.artifact.features, features)
        )
        x = (raw - self._mean) / self._scale
        head = self.head_for(embeddings is not None)
        coef, intercept, _ = self._heads[head]
        if head == "full":
            assert embeddings is not None
            if embeddings.shape != (len(x), self.artifact.embedding_dim):
                raise ValueError(
                    f"embeddings of shape {embeddings.shape}, expected "
                    f"({len(x)}, {self.artifact.embedding_dim})"
                )
            x = np.hstack([x, embeddings.astype(np.float64)])
        z = x @ coef + intercept
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -50, 50))))

    def threshold(self, has_embedding: bool) -> float:
        return self._heads[self.head_for(has_embedding)][2]

    def margin(
        self, features: RequestFeatures | Mapping[str, Any], embedding: np.ndarray | None = None
    ) -> tuple[float, float]:
        """``(p, logit(p) - logit(threshold))`` for one request: the margin is
        positive when the light path is predicted good enough."""
        rows = None if embedding is None else np.asarray(embedding).reshape(1, -1)
        p = float(self.probabilities([features], rows)[0])
        return p, float(_logit(p) - _logit(self.threshold(rows is not None)))


def save_artifact(artifact: RouterArtifact, path: Path) -> None:
    """Write the artifact as indented JSON (a new file, then renamed in place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(artifact.model_dump(mode="json"), indent=1) + "\n")
    partial.replace(path)
