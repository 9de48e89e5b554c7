"""The batch size measured on the machine that runs it.

How much batching buys a CPU model depends on the CPU: on one AMD EPYC
(Zen 5) Gemma-3-270M ran 0.71x as many tokens/s at batch 8 as at batch 1,
where other CPUs gained 2-2.4x. So a fixed batch size is right on some
machines and a loss on others. The tuner measures a model's tokens/s at
each candidate batch size and number of batches in flight (a bounded time
each, ``TuneSettings``), with the shared measuring code
(``workers.measure.direct_rates``), and keeps every measured figure in
one JSON file per model and CPU::

    <LANEWAY_TUNE_DIR>/<cpu-slug>/<model>.json

A lane worker at start reads it (``tuned_for_lane``) and picks with its
lane's ``tune_tolerance`` (``choose``): the candidate with the fewest
sequences at once whose tokens/s is within that share of the best. Bulk
and medium take (nearly) the best throughput; realtime, with a wider
tolerance, the smallest batch that gives up little of it, since each of
its answers' tokens come slower the more sequences decode beside it.

A kept tuning is used only while it still describes the machine: the same
model file (path, size, modification time), the same CPU, ``n_threads``
and llama.cpp batch mode; else the worker says why and runs on its
settings (or tunes at start, with ``LANEWAY_TUNE_AT_START``). What is set
explicitly wins over a tuning: a registry entry's ``max_batch``,
``LANEWAY_BACKEND_LLAMACPP_MAX_SEQUENCES``, the lane's
``max_batch_size`` / ``max_inflight_batches``. Backends that size their
batches themselves (vLLM's scheduler on a GPU, an OpenAI-compatible
server) are not tuned.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from schemas.messages import AnswerPath, Lane
from schemas.settings import BackendSettings, Settings, TuneSettings
from streams.routing.registry import ModelEntry, ModelRegistry, worker_paths
from workers.cpu import cpu_info, cpu_slug
from workers.measure import Rate, direct_rates
from workers.models import resolve_gguf

__all__ = [
    "TUNABLE",
    "TUNE_PROMPTS",
    "TUNE_SCHEMA",
    "LaneTuning",
    "ModelFile",
    "Tuning",
    "choose",
    "keep",
    "kept_path",
    "lane_tuning",
    "load_kept",
    "tune_model",
    "tuned_for_lane",
]

log = logging.getLogger(__name__)

TUNE_SCHEMA = "laneway.tune/1"
"""The ``schema`` field of a kept tuning."""

TUNABLE = frozenset({"llamacpp"})
"""Backend kinds whose batch size laneway sets on a CPU. vLLM's scheduler
sizes its own batches on a GPU; an OpenAI-compatible server its own."""

TUNE_PROMPTS = (
    "What is the capital of France?",
    "Explain why the sky is blue.",
    "Write a haiku about autumn.",
    "How do vaccines work?",
    "Name three prime numbers and say why they are prime.",
    "What does a compiler do?",
    "Summarise the water cycle.",
    "Why do cats purr?",
    "Give two tips for a job interview.",
    "What is the difference between weather and climate?",
    "How does a bicycle stay upright?",
    "Describe a rainbow to someone who has never seen one.",
    "What is photosynthesis?",
    "Why is the ocean salty?",
    "Suggest a name for a small bakery.",
    "How far away is the Moon?",
)
"""Different short questions, so that no two sequences of a batch are alike."""


@dataclass(frozen=True, slots=True)
class ModelFile:
    """Which model file was measured: a changed file is tuned again."""

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> ModelFile:
        stat = path.stat()
        return cls(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class Tuning:
    """Every candidate's measured rate of one model on one CPU, and what
    the figures depend on."""

    model: str
    file: ModelFile
    cpu: Mapping[str, Any]
    """``workers.cpu.cpu_info()`` of the machine that measured."""
    n_threads: int
    batch_invariant: bool
    max_tokens: int
    seconds_per_candidate: float
    rates: tuple[Rate, ...]
    measured_at: str = field(
        default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    )

    def pick(self, tolerance: float) -> Rate:
        return choose(self.rates, tolerance)

    def to_json(self) -> dict[str, Any]:
        best = choose(self.rates, 0.0)
        return {
            "schema": TUNE_SCHEMA,
            "model": self.model,
            "file": asdict(self.file),
            "cpu": dict(self.cpu),
            "cpu_slug": cpu_slug(self.cpu),
            "n_threads": self.n_threads,
            "batch_invariant": self.batch_invariant,
            "max_tokens": self.max_tokens,
            "seconds_per_candidate": self.seconds_per_candidate,
            "measured_at": self.measured_at,
            "best": {"batch_size": best.batch_size, "inflight": best.inflight},
            "rates": [
                {
                    "batch_size": r.batch_size,
                    "inflight": r.inflight,
                    "requests": r.requests,
                    "completion_tokens": r.completion_tokens,
                    "seconds": round(r.seconds, 4),
                    "cpu_seconds": round(r.cpu_seconds, 4),
                    "errors": r.errors,
                    "tokens_per_s": round(r.tokens_per_s, 2),
                }
                for r in self.rates
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tuning:
        """Raises ``ValueError`` (``KeyError``, ``TypeError``) on a file
        that is not a tuning of this schema."""
        if data.get("schema") != TUNE_SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r} is not {TUNE_SCHEMA!r}")
        model = str(data["model"])
        rates = tuple(
            Rate(
                model,
                int(r["batch_size"]),
                int(r["inflight"]),
                int(r["requests"]),
                int(r["completion_tokens"]),
                float(r["seconds"]),
                float(r["cpu_seconds"]),
                int(r["errors"]),
            )
            for r in data["rates"]
        )
        file = data["file"]
        return cls(
            model,
            ModelFile(str(file["path"]), int(file["size"]), int(file["mtime_ns"])),
            dict(data["cpu"]),
            int(data["n_threads"]),
            bool(data["batch_invariant"]),
            int(data["max_tokens"]),
            float(data["seconds_per_candidate"]),
            rates,
            str(data["measured_at"]),
        )


def choose(rates: Sequence[Rate], tolerance: float = 0.0) -> Rate:
    """The candidate to run: of those that answered without errors, the
    one with the fewest sequences at once (batch size x in flight; then
    fewer in flight) whose tokens/s is at least ``1 - tolerance`` times the
    best. ``tolerance`` 0: the best. A ``ValueError`` when none answered."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance {tolerance} is not in [0, 1)")
    usable = [r for r in rates if not r.errors and not r.refilled and r.completion_tokens > 0]
    if not usable:
        raise ValueError(f"none of {len(rates)} candidates answered without errors")
    best = max(r.tokens_per_s for r in usable)
    within = [r for r in usable if r.tokens_per_s >= (1 - tolerance) * best]
    return min(within, key=lambda r: (r.sequences, r.inflight, r.batch_size))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.") or "model"


def kept_path(tune_dir: Path, cpu: Mapping[str, Any], model: str) -> Path:
    """Where the tuning of ``model`` on ``cpu`` is kept."""
    return tune_dir / cpu_slug(cpu) / f"{_slug(model)}.json"


def keep(tuning: Tuning, tune_dir: Path) -> Path:
    """Write ``tuning`` where ``load_kept`` finds it (atomically: a worker
    reading at the same time sees the old file or the new one)."""
    path = kept_path(tune_dir, tuning.cpu, tuning.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    partial.write_text(json.dumps(tuning.to_json(), indent=2) + "\n")
    os.replace(partial, path)
    return path


def _mismatch(
    tuning: Tuning, file: ModelFile, cpu: Mapping[str, Any], backend: BackendSettings
) -> str | None:
    """Why ``tuning`` does not describe this model and machine (``None``: it does)."""
    if tuning.file != file:
        return f"the model file changed since it was measured ({tuning.file} -> {file})"
    if cpu_slug(tuning.cpu) != cpu_slug(cpu) or tuning.cpu.get("cores") != cpu.get("cores"):
        return f"it was measured on another CPU ({dict(tuning.cpu)})"
    if tuning.n_threads != backend.n_threads:
        return f"it was measured with n_threads {tuning.n_threads}, not {backend.n_threads}"
    if tuning.batch_invariant != backend.llamacpp_batch_invariant:
        return (
            f"it was measured with llamacpp_batch_invariant {tuning.batch_invariant}, "
            f"not {backend.llamacpp_batch_invariant}"
        )
    return None


def load_kept(
    tune_dir: Path,
    model: str,
    backend: BackendSettings,
    cpu: Mapping[str, Any] | None = None,
) -> tuple[Tuning | None, str]:
    """The kept tuning of ``model`` that still describes this machine
    (``cpu``: this one's when ``None``), and where it was found; or
    ``None`` and why none is used. Never raises for a missing, unreadable
    or stale file: it is not used."""
    cpu = cpu if cpu is not None else cpu_info()
    path = kept_path(tune_dir, cpu, model)
    if not path.is_file():
        return None, f"no tuning kept at {path}"
    try:
        tuning = Tuning.from_json(json.loads(path.read_text()))
        file = ModelFile.of(resolve_gguf(model, backend.model_dir))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"the tuning at {path} cannot be used: {exc}"
    if tuning.model != model:
        return None, f"the tuning at {path} is of {tuning.model!r}, not {model!r}"
    stale = _mismatch(tuning, file, cpu, backend)
    if stale is not None:
        return None, f"the tuning at {path} is stale: {stale}"
    return tuning, str(path)


async def tune_model(
    backend: BackendSettings,
    model: str,
    tune: TuneSettings,
    cpu: Mapping[str, Any] | None = None,
) -> Tuning:
    """Measure ``model`` on llama.cpp at every candidate of ``tune``, each
    for about ``tune.seconds_per_candidate``. Raises what loading the model
    raises (``BackendUnavailable`` for a missing file)."""
    file = ModelFile.of(resolve_gguf(model, backend.model_dir))
    rates = await direct_rates(
        backend,
        model,
        tune.batch_sizes,
        TUNE_PROMPTS,
        tune.max_tokens,
        "llamacpp",
        tune.inflight,
        budget_s=tune.seconds_per_candidate,
    )
    return Tuning(
        model,
        file,
        dict(cpu if cpu is not None else cpu_info()),
        backend.n_threads,
        backend.llamacpp_batch_invariant,
        tune.max_tokens,
        tune.seconds_per_candidate,
        tuple(rates),
    )


@dataclass(frozen=True, slots=True)
class LaneTuning:
    """What a lane worker runs with, and the log lines that say why."""

    settings: Settings
    registry: ModelRegistry
    notes: tuple[str, ...]


def _entries(registry: ModelRegistry, paths: Sequence[AnswerPath]) -> list[ModelEntry]:
    """The registry entries a worker of ``paths`` loads (not retired)."""
    return [m for p in paths for m in registry.versions(p) if m.state != "retired"]


async def lane_tuning(
    settings: Settings,
    lane: Lane,
    registry: ModelRegistry,
    cpu: Mapping[str, Any] | None = None,
) -> LaneTuning:
    """``settings`` and ``registry`` as a worker of ``lane`` runs them: for
    each CPU model it loads, the kept tuning (or one measured now, with
    ``tune.at_start``) picked with the lane's ``tune_tolerance`` sets that
    model's llama.cpp sequences (its registry ``max_batch``: batch size x
    in flight), and the lane's ``max_batch_size`` and
    ``max_inflight_batches`` are the largest its models picked. An
    explicit setting of any of these wins."""
    tune, lane_settings = settings.tune, settings.lane(lane)
    notes: list[str] = []
    if not tune.use_kept and not tune.at_start:
        return LaneTuning(
            settings, registry, ("batch sizes are not tuned (LANEWAY_TUNE_USE_KEPT)",)
        )
    cpu = dict(cpu if cpu is not None else cpu_info())
    picks: dict[str, Rate] = {}
    for entry in _entries(registry, worker_paths(settings, lane, registry)):
        if entry.name in picks:
            continue
        if entry.backend not in TUNABLE:
            notes.append(f"{entry.name}: {entry.backend} sizes its own batches; not tuned")
            continue
        tuning, where = (
            load_kept(tune.dir, entry.name, settings.backend, cpu)
            if tune.use_kept
            else (None, "kept tunings are not used (LANEWAY_TUNE_USE_KEPT=false)")
        )
        if tuning is None and tune.at_start:
            notes.append(f"{entry.name}: {where}; tuning it now (LANEWAY_TUNE_AT_START)")
            try:
                tuning = await tune_model(settings.backend, entry.name, tune, cpu)
                where = f"measured now, kept at {keep(tuning, tune.dir)}"
            except Exception as exc:  # a model that cannot load fails later, by its slot
                notes.append(f"{entry.name}: tuning failed: {exc}")
                continue
        if tuning is None:
            notes.append(f"{entry.name}: {where}; the lane's settings are used")
            continue
        try:
            pick = tuning.pick(lane_settings.tune_tolerance)
        except ValueError as exc:
            notes.append(f"{entry.name}: the tuning ({where}) has nothing to pick: {exc}")
            continue
        best = tuning.pick(0.0)
        picks[entry.name] = pick
        notes.append(
            f"{entry.name}: tuned on this CPU ({where}, {tuning.measured_at}): batch "
            f"{pick.batch_size} x {pick.inflight} in flight, {pick.tokens_per_s:.1f} tokens/s "
            f"(best {best.tokens_per_s:.1f} at {best.batch_size} x {best.inflight}; "
            f"tolerance {lane_settings.tune_tolerance:.0%})"
        )
    if not picks:
        notes.append(
            f"{lane}: batch {lane_settings.max_batch_size} x "
            f"{lane_settings.max_inflight_batches} in flight, from the lane's settings"
        )
        return LaneTuning(settings, registry, tuple(notes))
    explicit_sequences = "llamacpp_max_sequences" in settings.backend.model_fields_set
    models = []
    served = worker_paths(settings, lane, registry)
    for entry in registry.models:
        picked = picks.get(entry.name)
        if picked is not None and entry.path in served:
            if entry.max_batch is not None:
                notes.append(f"{entry.name}: the registry's max_batch {entry.max_batch} wins")
            elif explicit_sequences:
                notes.append(
                    f"{entry.name}: LANEWAY_BACKEND_LLAMACPP_MAX_SEQUENCES "
                    f"{settings.backend.llamacpp_max_sequences} wins"
                )
            else:
                entry = entry.model_copy(update={"max_batch": picked.sequences})
        models.append(entry)
    update: dict[str, int] = {}
    wanted = {
        "max_batch_size": max(p.batch_size for p in picks.values()),
        "max_inflight_batches": max(p.inflight for p in picks.values()),
    }
    for name, value in wanted.items():
        if name in lane_settings.model_fields_set:
            notes.append(
                f"{lane}: {name} {getattr(lane_settings, name)} is set explicitly and "
                f"wins over the tuned {value}"
            )
        else:
            update[name] = value
    tuned_lane = lane_settings.model_copy(update=update)
    notes.append(
        f"{lane}: batch {tuned_lane.max_batch_size} x {tuned_lane.max_inflight_batches} in flight"
    )
    return LaneTuning(
        settings.model_copy(update={lane.value: tuned_lane}),
        ModelRegistry(models=tuple(models)),
        tuple(notes),
    )


async def tuned_for_lane(
    settings: Settings, lane: Lane, registry: ModelRegistry
) -> tuple[Settings, ModelRegistry]:
    """``lane_tuning``, its notes logged: what a lane worker starts with."""
    tuned = await lane_tuning(settings, lane, registry)
    for note in tuned.notes:
        log.info("%s batch size: %s", lane, note)
    return tuned.settings, tuned.registry
