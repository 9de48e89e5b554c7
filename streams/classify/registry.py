"""The model registry: what each model path can do and what it costs, and
which versions of each path exist.

A YAML file (``LANEWAY_ROUTING_MODELS_FILE``) lists the models; without
one, the registry describes the two embedded models (``BackendSettings``'
light and heavy model, as the active versions). The router reads
capability (``max_complexity``), lanes and cost of each path's *active*
version from here; the workers load a backend for every version of their
paths that is not ``retired`` (``workers.execution.backend_slots``).

A path may list several versions (``name`` is the model the ``backend``
loads, ``version`` its label, unique within the path), each with a
``state``: exactly one ``active`` per path (an entry without a state is
the active one, so files written before versions existed still load), and
any number of ``canary`` (``share``: the part of the path's traffic it
gets, 0..1), ``shadow`` (a copy of ``share`` of the path's requests,
default all, answered but never sent to the client) and ``retired``. The
live states and shares are the roll-out state in Redis
(``streams.rollout``), which overrides the file's; the file says what
versions exist. Example::

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
      - name: smollm2-360m
        version: "2"
        state: canary
        share: 0.05
        backend: llamacpp
        path: light
        max_complexity: simple
"""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.messages import Lane, Path
from schemas.settings import BackendSettings
from streams.classify.features import Complexity

__all__ = [
    "ModelEntry",
    "ModelRegistry",
    "RegistryError",
    "VersionState",
    "builtin_registry",
    "load_registry",
]

VersionState = Literal["active", "canary", "shadow", "retired"]


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
    max_batch: int | None = Field(default=None, ge=1)
    """Most requests this model runs at once: llama.cpp's sequences in one
    context (else ``LANEWAY_BACKEND_LLAMACPP_MAX_SEQUENCES``), vLLM's
    ``max_num_seqs`` (else ``LANEWAY_BACKEND_VLLM_MAX_NUM_SEQS``, else vLLM's
    default); an OpenAI-compatible server sets its own."""
    expected_latency_ms: float = Field(default=1_000.0, gt=0)
    """Latency the router assumes before the quality loop has measured any."""
    state: VersionState = "active"
    share: float | None = Field(default=None, ge=0, le=1)
    """A canary's part of its path's traffic (unset: 0); the part of the
    path's requests a shadow gets a copy of (unset: all)."""

    @property
    def traffic_share(self) -> float:
        """The share this version's state gives it: 1 for the active version
        (what the canaries leave), 0 for a retired one."""
        if self.state == "canary":
            return self.share or 0.0
        if self.state == "shadow":
            return 1.0 if self.share is None else self.share
        return 1.0 if self.state == "active" else 0.0

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
    def _one_active_per_path(self) -> ModelRegistry:
        if not self.models:
            raise ValueError("the registry lists no models")
        for path in dict.fromkeys(m.path for m in self.models):
            versions = [m.version for m in self.models if m.path == path]
            if len(set(versions)) != len(versions):
                raise ValueError(f"path {path}: versions must be unique, got {versions}")
            active = [m.version for m in self.models if m.path == path and m.state == "active"]
            if len(active) != 1:
                raise ValueError(
                    f"path {path}: exactly one active version, got {len(active)} {active} "
                    f"of versions {versions}"
                )
        return self

    @property
    def active_models(self) -> tuple[ModelEntry, ...]:
        """One entry per path: its active version."""
        return tuple(m for m in self.models if m.state == "active")

    def for_path(self, path: Path) -> ModelEntry | None:
        """The path's active version."""
        return next((m for m in self.active_models if m.path == path.value), None)

    def versions(self, path: Path) -> tuple[ModelEntry, ...]:
        """Every version of ``path``, in file order."""
        return tuple(m for m in self.models if m.path == path.value)

    def version(self, path: Path, version: str) -> ModelEntry | None:
        return next((m for m in self.versions(path) if m.version == version), None)

    def eligible(self, complexity: Complexity, lane: Lane) -> list[ModelEntry]:
        """Active models capable of ``complexity`` that serve ``lane``; when
        none is, the most capable model serving the lane (an answer from a
        smaller model beats none)."""
        models = self.active_models
        serving = [m for m in models if lane in m.lanes] or list(models)
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
                expected_latency_ms=800,
            ),
            ModelEntry(
                name=backend.heavy_model,
                version="q4_k_m",
                backend=backend.heavy,
                path="heavy",
                max_complexity="complex",
                cost_per_1k_tokens=0.0010,
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
