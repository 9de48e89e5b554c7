"""The model registry: what each model path can do and what it costs.

A YAML file (``LANEWAY_ROUTING_MODELS_FILE``) lists the models; without
one, the registry describes the two embedded models. The router reads
capability (``max_complexity``), lanes and cost from here; the workers
load the backend named for each path in ``BackendSettings``. Example::

    models:
      - name: smollm2-135m
        version: q4_1
        backend: llamacpp
        path: light
        lanes: [realtime, medium, bulk]
        max_complexity: simple
        cost_per_1k_tokens: 0.0002
        max_batch: 8
        expected_latency_ms: 800
"""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.messages import Lane, Path
from schemas.settings import BackendSettings
from streams.classify.features import Complexity

__all__ = ["ModelEntry", "ModelRegistry", "RegistryError", "load_registry"]


class RegistryError(ValueError):
    """The model registry file cannot be used; the message says why."""


class ModelEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str = "1"
    backend: Literal["llamacpp", "openai", "vllm", "rules"]
    path: Literal["light", "heavy"]
    lanes: tuple[Lane, ...] = (Lane.REALTIME, Lane.MEDIUM, Lane.BULK)
    max_complexity: Literal["simple", "moderate", "complex"] = "complex"
    cost_per_1k_tokens: float = Field(default=0.0, ge=0)
    max_batch: int = Field(default=8, ge=1)
    expected_latency_ms: float = Field(default=1_000.0, gt=0)
    """Latency the router assumes before the quality loop has measured any."""

    @property
    def model_path(self) -> Path:
        return Path(self.path)

    @property
    def capability(self) -> Complexity:
        return Complexity.named(self.max_complexity)


class ModelRegistry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: tuple[ModelEntry, ...]

    @model_validator(mode="after")
    def _one_per_path(self) -> ModelRegistry:
        paths = [m.path for m in self.models]
        if not paths:
            raise ValueError("the registry lists no models")
        if len(set(paths)) != len(paths):
            raise ValueError(f"one model per path, got paths {paths}")
        return self

    def for_path(self, path: Path) -> ModelEntry | None:
        return next((m for m in self.models if m.path == path.value), None)

    def eligible(self, complexity: Complexity, lane: Lane) -> list[ModelEntry]:
        """Models capable of ``complexity`` that serve ``lane``; when none
        is, the most capable model serving the lane (an answer from a
        smaller model beats none)."""
        serving = [m for m in self.models if lane in m.lanes] or list(self.models)
        capable = [m for m in serving if m.capability >= complexity]
        return capable or [max(serving, key=lambda m: m.capability)]


def builtin_registry(backend: BackendSettings) -> ModelRegistry:
    """The embedded models: SmolLM2-135M answers simple questions cheaply;
    Gemma-3-270M takes everything. Costs are relative (per 1k tokens)."""
    return ModelRegistry(
        models=(
            ModelEntry(
                name=backend.light_model,
                version="q4_1",
                backend=backend.light,
                path="light",
                max_complexity="simple",
                cost_per_1k_tokens=0.0002,
                max_batch=8,
                expected_latency_ms=800,
            ),
            ModelEntry(
                name=backend.heavy_model,
                version="q4_k_m",
                backend=backend.heavy,
                path="heavy",
                max_complexity="complex",
                cost_per_1k_tokens=0.0010,
                max_batch=8,
                expected_latency_ms=2_000,
            ),
        )
    )


def load_registry(path: FsPath | None, backend: BackendSettings) -> ModelRegistry:
    if path is None:
        return builtin_registry(backend)
    try:
        data = yaml.safe_load(path.read_text())
        return ModelRegistry.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise RegistryError(f"model registry {path}: {exc}") from exc
