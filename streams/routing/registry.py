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
      - name: smollm2-135m
        version: student-1
        state: shadow
        adapter: /data/students/20261207T0400Z   # laneway distill student --out
        backend: llamacpp
        path: light
        max_complexity: simple
      - name: smollm2-360m
        version: "2"
        state: canary
        share: 0.05
        backend: llamacpp
        path: light
        max_complexity: simple
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from schemas.backends import BACKEND_KINDS, BackendName
from schemas.messages import AUTO_MODEL, AnswerPath, Lane
from schemas.settings import BackendSettings, Settings
from streams.routing.features import Complexity

__all__ = [
    "ModelEntry",
    "ModelRegistry",
    "NamedModel",
    "RegistryError",
    "VersionState",
    "builtin_registry",
    "lanes_serving",
    "load_registry",
    "worker_paths",
]

VersionState = Literal["active", "canary", "shadow", "retired"]


class RegistryError(ValueError):
    """The model registry file cannot be used; the message says why."""


class ModelEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str = "1"
    backend: BackendName
    """One of ``schemas.backends.BACKEND_KINDS``."""
    path: AnswerPath
    """The model path this entry is a version of: ``light`` and ``heavy`` in
    the built-in registry, or any other name (``AnswerPath``'s rules; ``cache`` and
    ``rules`` are taken): a third model is a third path."""
    lanes: tuple[Lane, ...] = (Lane.REALTIME, Lane.MEDIUM, Lane.BULK)
    max_complexity: Literal["simple", "moderate", "complex"] = "complex"
    cost_per_1k_tokens: float = Field(default=0.0, ge=0)
    max_batch: int | None = Field(default=None, ge=1)
    """Most requests this model runs at once: llama.cpp's sequences in one
    context (else ``LANEWAY_BACKEND_LLAMACPP_MAX_SEQUENCES``), vLLM's
    ``max_num_seqs`` (else ``LANEWAY_BACKEND_VLLM_MAX_NUM_SEQS``, else vLLM's
    default); an OpenAI-compatible server sets its own."""
    fallback: tuple[AnswerPath, ...] | None = None
    """Where the path's requests go when none of its versions can serve them
    (backend down, circuit open), in order; read from the active version.
    Unset: every other model path, nearest in capability first (the built-in
    registry: light -> heavy, heavy -> light); ``[]``: nowhere (INF-502)."""
    expected_latency_ms: float = Field(default=1_000.0, gt=0)
    """Latency the router assumes before the quality loop has measured any."""
    state: VersionState = "active"
    share: float | None = Field(default=None, ge=0, le=1)
    """A canary's part of its path's traffic (unset: 0); the part of the
    path's requests a shadow gets a copy of (unset: all)."""
    adapter: Path | None = None
    """A LoRA adapter the ``backend`` applies to ``name``'s weights (unset:
    none): for ``llamacpp`` a GGUF LoRA adapter, loaded with the model; for
    ``vllm`` a PEFT adapter directory, served as a ``LoRARequest``. A
    directory that ``laneway distill student`` wrote may be given for
    either (its ``adapter.gguf`` or ``peft/`` is taken), and its
    ``student.json`` is the provenance ``laneway models list`` shows. A
    relative path is relative to the registry file. A backend that takes no
    adapter (``openai``: the server decides what it serves; ``rules``)
    refuses one here, when the registry loads. See
    ``schemas.backends.BackendKind.adapter``."""

    @property
    def traffic_share(self) -> float:
        """The share this version's state gives it: 1 for the active version
        (what the canaries leave), 0 for a retired one."""
        if self.state == "canary":
            return self.share or 0.0
        if self.state == "shadow":
            return 1.0 if self.share is None else self.share
        return 1.0 if self.state == "active" else 0.0

    @model_validator(mode="after")
    def _adapter_for_a_backend_that_takes_one(self) -> ModelEntry:
        if self.adapter is not None and BACKEND_KINDS[self.backend].adapter is None:
            takes = [k for k, kind in BACKEND_KINDS.items() if kind.adapter is not None]
            raise ValueError(
                f"version {self.version} of {self.name}: backend {self.backend} takes no LoRA "
                f"adapter (adapter {self.adapter}); only {takes} do"
            )
        return self

    @field_validator("path")
    @classmethod
    def _a_model_path(cls, path: AnswerPath) -> AnswerPath:
        if not path.is_model:
            raise ValueError(
                f"{path!s} is not a model path: cache and rules are answered in the classifier"
            )
        return path

    @property
    def model_path(self) -> AnswerPath:
        return self.path

    @property
    def capability(self) -> Complexity:
        return Complexity.named(self.max_complexity)


@dataclass(frozen=True, slots=True)
class NamedModel:
    """A model a request named (``InferenceRequest.model``), as the registry knows it."""

    path: AnswerPath
    version: str | None
    """The version named by its model's name; ``None`` when the path was
    named (the roll-out assigns the version, as for any request)."""
    name: str
    """The model's name (the named version's, else the path's active one)."""


class ModelRegistry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: tuple[ModelEntry, ...]

    @model_validator(mode="after")
    def _one_active_per_path(self) -> ModelRegistry:
        if not self.models:
            raise ValueError("the registry lists no models")
        paths = dict.fromkeys(m.path for m in self.models)
        for path in paths:
            versions = [m.version for m in self.models if m.path == path]
            if len(set(versions)) != len(versions):
                raise ValueError(f"path {path}: versions must be unique, got {versions}")
            active = [m.version for m in self.models if m.path == path and m.state == "active"]
            if len(active) != 1:
                raise ValueError(
                    f"path {path}: exactly one active version, got {len(active)} {active} "
                    f"of versions {versions}"
                )
        for m in self.models:
            unknown = [str(p) for p in m.fallback or () if p not in paths or p == m.path]
            if unknown:
                raise ValueError(
                    f"path {m.path} version {m.version}: fallback {unknown} is not another "
                    f"path of the registry {[str(p) for p in paths]}"
                )
        return self

    @property
    def model_paths(self) -> tuple[AnswerPath, ...]:
        """Every model path, in file order."""
        return tuple(dict.fromkeys(m.model_path for m in self.models))

    @property
    def active_models(self) -> tuple[ModelEntry, ...]:
        """One entry per path: its active version."""
        return tuple(m for m in self.models if m.state == "active")

    def for_path(self, path: AnswerPath) -> ModelEntry | None:
        """The path's active version."""
        return next((m for m in self.active_models if m.path == path), None)

    def versions(self, path: AnswerPath) -> tuple[ModelEntry, ...]:
        """Every version of ``path``, in file order."""
        return tuple(m for m in self.models if m.path == path)

    def fallbacks(self, path: AnswerPath) -> tuple[AnswerPath, ...]:
        """Where ``path``'s requests go when it cannot serve them, in order:
        its active version's ``fallback``, else every other model path,
        nearest in capability first (the more capable on a tie)."""
        entry = self.for_path(path)
        if entry is None:
            return ()
        if entry.fallback is not None:
            return entry.fallback
        others = [m for m in self.active_models if m.path != path]
        others.sort(key=lambda m: (abs(m.capability - entry.capability), -m.capability))
        return tuple(m.model_path for m in others)

    def serving(self, lane: Lane) -> list[ModelEntry]:
        """The active versions whose ``lanes`` list ``lane`` (all of them
        when none does)."""
        models = self.active_models
        return [m for m in models if lane in m.lanes] or list(models)

    def cheapest(self, lane: Lane) -> AnswerPath:
        """The model path serving ``lane`` that costs least per token (the
        less capable on a tie): the realtime workers' default, and where
        flow control moves work off a dearer path under load."""
        return min(self.serving(lane), key=lambda m: (m.cost_per_1k_tokens, m.capability)).path

    def most_capable(self, lane: Lane) -> AnswerPath:
        """The most capable model path serving ``lane`` (the cheaper on a
        tie): the bulk workers' default."""
        return max(self.serving(lane), key=lambda m: (m.capability, -m.cost_per_1k_tokens)).path

    @cached_property
    def _named(self) -> dict[str, NamedModel]:
        """Every name a request's ``model`` may give, first come first kept:
        each model path, then each version that is not retired by its
        model's ``name`` and as results name it (``<backend>:<name>``),
        active versions first."""
        out: dict[str, NamedModel] = {}
        for entry in self.active_models:
            out.setdefault(entry.path.value, NamedModel(entry.path, None, entry.name))
        ordered = [*self.active_models, *(m for m in self.models if m.state != "active")]
        for entry in ordered:
            if entry.state == "retired":
                continue
            named = NamedModel(entry.path, entry.version, entry.name)
            out.setdefault(entry.name, named)
            out.setdefault(f"{entry.backend}:{entry.name}", named)
        out.pop(AUTO_MODEL, None)  # ``auto`` always leaves the choice to the router
        return out

    def named(self, name: str) -> NamedModel | None:
        """The model ``name`` names (a path, or a model's name), ``None`` if
        none (``auto`` names none: the router chooses)."""
        return self._named.get(name)

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names a request's ``model`` may give: ``auto`` and ``named``'s."""
        return (AUTO_MODEL, *self._named)

    def version(self, path: AnswerPath, version: str) -> ModelEntry | None:
        return next((m for m in self.versions(path) if m.version == version), None)

    def eligible(self, complexity: Complexity, lane: Lane) -> list[ModelEntry]:
        """Active models capable of ``complexity`` that serve ``lane``; when
        none is, the most capable model serving the lane (an answer from a
        smaller model beats none)."""
        serving = self.serving(lane)
        capable = [m for m in serving if m.capability >= complexity]
        return capable or [max(serving, key=lambda m: m.capability)]


def worker_paths(settings: Settings, lane: Lane, registry: ModelRegistry) -> tuple[AnswerPath, ...]:
    """The model paths a worker on ``lane`` loads: only the forced one when
    ``routing.force_path`` sends everything down one path; else its lane's
    ``paths``; unset, the registry's paths that serve the lane (all of
    them when none does): realtime the cheapest, bulk the most capable,
    medium every one. A path the registry does not name is a ``RegistryError``."""
    if settings.routing.force_path is not None:
        chosen: tuple[AnswerPath, ...] = (settings.routing.force_path,)
    elif settings.lane(lane).paths is not None:
        chosen = tuple(settings.lane(lane).paths or ())
    elif lane is Lane.REALTIME:
        chosen = (registry.cheapest(lane),)
    elif lane is Lane.BULK:
        chosen = (registry.most_capable(lane),)
    else:
        chosen = tuple(m.path for m in registry.serving(lane))
    unknown = [p for p in chosen if registry.for_path(p) is None]
    if unknown:
        raise RegistryError(
            f"{lane} workers are to serve {[str(p) for p in unknown]}, which the model "
            f"registry does not name: it has {[str(p) for p in registry.model_paths]} "
            f"(LANEWAY_{lane.value.upper()}_PATHS, LANEWAY_ROUTING_FORCE_PATH)"
        )
    return chosen


def lanes_serving(
    settings: Settings, registry: ModelRegistry, path: AnswerPath
) -> tuple[Lane, ...]:
    """The lanes whose workers load ``path`` as configured (``worker_paths``;
    a lane configured with a path the registry lacks serves nothing here)."""
    out = []
    for lane in Lane:
        try:
            if path in worker_paths(settings, lane, registry):
                out.append(lane)
        except RegistryError:
            continue
    return tuple(out)


def builtin_registry(backend: BackendSettings) -> ModelRegistry:
    """The embedded models: SmolLM2-135M answers simple questions cheaply;
    Gemma-3-270M takes everything. Costs are relative (per 1k tokens)."""
    return ModelRegistry(
        models=(
            ModelEntry(
                name=backend.light_model,
                version="q4_1",
                backend=backend.light,
                path=AnswerPath.LIGHT,
                max_complexity="simple",
                cost_per_1k_tokens=0.0002,
                expected_latency_ms=800,
            ),
            ModelEntry(
                name=backend.heavy_model,
                version="q4_k_m",
                backend=backend.heavy,
                path=AnswerPath.HEAVY,
                max_complexity="complex",
                cost_per_1k_tokens=0.0010,
                expected_latency_ms=2_000,
            ),
        )
    )


def load_registry(path: Path | None, backend: BackendSettings) -> ModelRegistry:
    """The registry file at ``path`` (``None``: ``builtin_registry``), its
    relative adapter paths made relative to the file's folder."""
    if path is None:
        return builtin_registry(backend)
    try:
        data = yaml.safe_load(path.read_text())
        registry = ModelRegistry.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise RegistryError(f"model registry {path}: {exc}") from exc
    return ModelRegistry(
        models=tuple(
            m.model_copy(update={"adapter": path.parent / m.adapter})
            if m.adapter is not None and not m.adapter.is_absolute()
            else m
            for m in registry.models
        )
    )
