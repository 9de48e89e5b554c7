"""Readiness: load each configured model and have it answer one short
inference (``laneway check``; a lane worker's warm-up can call
``check_paths`` with the backends it already loaded, so it reports ready
only after its model answered).

``laneway check`` exits 1 naming each model that failed, so it works as a
CI/CD step or a container health step::

    $ LANEWAY_BACKEND_HEAVY_MODEL=/models/missing.gguf laneway check
    ok    light  llamacpp:smollm2-135m  0.9 s  "Hello! How can I help?"
    FAIL  heavy  llamacpp:/models/missing.gguf  0.0 s  INF-502: model file ... does not exist
    laneway check: 1 of 2 models failed: heavy=llamacpp:/models/missing.gguf

``laneway check --tune`` measures each CPU model's tokens/s at every
candidate batch size instead, and keeps the figures for this CPU, where a
lane worker on this machine finds them at start (``workers.tune``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from schemas.errors import LanewayError
from schemas.messages import AnswerPath, ChatMessage, Lane
from schemas.settings import Settings
from streams.routing.registry import ModelRegistry, load_registry, worker_paths
from workers.backends import (
    Backend,
    GenerationInput,
    create_backend,
    errors_of,
    map_backend_exception,
)
from workers.cpu import cpu_info, cpu_slug
from workers.tune import TUNABLE, Tuning, keep, tune_model

__all__ = ["ModelCheck", "check_paths", "model_of", "probe", "run_check", "run_tune"]

PROBE_PROMPT = "Say hello."
PROBE_MAX_TOKENS = 8
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ModelCheck:
    path: str
    backend: str
    model: str
    ok: bool
    seconds: float
    detail: str
    """The start of the answer, or what went wrong (with its error code)."""

    @property
    def name(self) -> str:
        return f"{self.path}={self.backend}:{self.model}"


def model_of(registry: ModelRegistry, path: AnswerPath) -> tuple[str, str]:
    """``(backend kind, model)`` of ``path``'s active version."""
    entry = registry.for_path(path)
    if entry is None:
        known = [str(p) for p in registry.model_paths]
        raise ValueError(f"{path} is not a model path of the registry: it has {known}")
    return entry.backend, entry.name


async def probe(backend: Backend, *, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """One short inference on a loaded backend: ``(answered, detail)``."""
    probe_input = GenerationInput(
        messages=[ChatMessage(role="user", content=PROBE_PROMPT)],
        max_tokens=PROBE_MAX_TOKENS,
        temperature=0.0,
        deadline=time.monotonic() + timeout_s,
    )
    try:
        outcomes = await asyncio.wait_for(backend.infer_batch([probe_input]), timeout_s)
    except BaseException as exc:  # every failure is a failed check
        if isinstance(exc, asyncio.CancelledError):
            raise
        error = map_backend_exception(exc, errors_of(backend))
        return False, f"{error.code}: {error.message}"
    if len(outcomes) != 1:
        return False, f"backend returned {len(outcomes)} outcomes for 1 input"
    outcome = outcomes[0]
    if isinstance(outcome, LanewayError):
        return False, f"{outcome.code}: {outcome.message}"
    if outcome.completion_tokens == 0 and not outcome.text.strip():
        return False, "the model answered nothing"
    return True, outcome.text.strip()[:60]


async def check_paths(
    settings: Settings,
    paths: Sequence[AnswerPath],
    *,
    loaded: Mapping[AnswerPath, Backend] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> list[ModelCheck]:
    """Check each of ``paths``, one after another: a backend in ``loaded``
    is probed as it is (and left open); any other is created, loaded,
    probed and closed. Never raises for a failing model: its check says why."""
    registry = load_registry(settings.routing.models_file, settings.backend)
    checks = []
    for path in paths:
        kind, model = model_of(registry, path)
        entry = registry.for_path(path)
        adapter = entry.adapter if entry is not None else None
        started = time.monotonic()
        given = (loaded or {}).get(path)
        backend: Backend | None = given
        try:
            if backend is None:
                backend = create_backend(kind, model, settings.backend, adapter)
                await asyncio.wait_for(backend.load(), timeout_s)
            ok, detail = await probe(backend, timeout_s=timeout_s)
        except Exception as exc:  # a model that cannot load fails its check
            error = map_backend_exception(exc, errors_of(backend))
            ok, detail = False, f"{error.code}: {error.message}"
        finally:
            if given is None and backend is not None:
                try:
                    await backend.close()
                except Exception:  # closing a broken backend
                    pass
        checks.append(
            ModelCheck(str(path), kind, model, ok, round(time.monotonic() - started, 2), detail)
        )
    return checks


def _known_paths(registry: ModelRegistry, paths: Sequence[str] | None) -> bool:
    """Whether the registry has every path asked for (else it says which not)."""
    known = [str(p) for p in registry.model_paths]
    unknown = [p for p in paths or () if p not in known]
    if unknown:
        print(f"laneway check: no model path {unknown} in the registry: it has {known}")
    return not unknown


def run_check(settings: Settings, paths: Sequence[str] | None, *, as_json: bool = False) -> int:
    """``laneway check``: 0 when every model answered, else 1; ``paths``:
    the model paths to check (``None``: every path of the registry)."""
    registry = load_registry(settings.routing.models_file, settings.backend)
    if not _known_paths(registry, paths):
        return 2
    chosen = [AnswerPath(p) for p in paths] if paths else list(registry.model_paths)
    checks = asyncio.run(check_paths(settings, chosen))
    failed = [c for c in checks if not c.ok]
    if as_json:
        print(json.dumps([asdict(c) for c in checks]))
    else:
        for c in checks:
            mark = "ok  " if c.ok else "FAIL"
            print(f"{mark}  {c.path:5}  {c.backend}:{c.model}  {c.seconds:.1f} s  {c.detail!r}")
        if failed:
            names = ", ".join(c.name for c in failed)
            print(f"laneway check: {len(failed)} of {len(checks)} models failed: {names}")
        else:
            print(f"laneway check: all {len(checks)} models answered")
    return 1 if failed else 0


def _format_tuning(tuning: Tuning, settings: Settings) -> str:
    best = tuning.pick(0.0)
    header = f"{'batch':>5} {'in flight':>9} {'tokens/s':>9} {'vs best':>8} {'requests':>8}"
    lines = [f"{header} {'errors':>6}"]
    for rate in tuning.rates:
        share = rate.tokens_per_s / best.tokens_per_s if best.tokens_per_s else 0.0
        lines.append(
            f"{rate.batch_size:>5} {rate.inflight:>9} {rate.tokens_per_s:>9.1f} "
            f"{share:>7.0%} {rate.requests:>8} {rate.errors:>6}"
        )
    picks = []
    for lane in Lane:
        tolerance = settings.lane(lane).tune_tolerance
        pick = tuning.pick(tolerance)
        picks.append(f"{lane} {pick.batch_size} x {pick.inflight} (within {tolerance:.0%})")
    lines.append(f"best {best.batch_size} x {best.inflight}; per lane: {', '.join(picks)}")
    return "\n".join(lines)


def run_tune(
    settings: Settings,
    paths: Sequence[str] | None,
    lane: str | None = None,
    *,
    as_json: bool = False,
) -> int:
    """``laneway check --tune``: measure and keep the batch-size tuning of
    each CPU model of ``paths`` (or of the paths a worker of ``lane``
    loads; neither: every model path). 0 when every one was measured, 1
    when one failed, 2 on a path or lane the registry does not have."""
    registry = load_registry(settings.routing.models_file, settings.backend)
    if not _known_paths(registry, paths):
        return 2
    if paths:
        chosen = [AnswerPath(p) for p in paths]
    elif lane is not None:
        chosen = list(worker_paths(settings, Lane(lane), registry))
    else:
        chosen = list(registry.model_paths)
    entries = [m for p in chosen for m in registry.versions(p) if m.state != "retired"]
    models = list(dict.fromkeys(m.name for m in entries if m.backend in TUNABLE))
    skipped = sorted({f"{m.name} ({m.backend})" for m in entries if m.backend not in TUNABLE})
    cpu = cpu_info()
    tune = settings.tune
    candidates = len(tune.batch_sizes) * len(tune.inflight)
    if not as_json:
        print(
            f"laneway check --tune: {len(models)} CPU model{'' if len(models) == 1 else 's'} "
            f"on {cpu['model']} "
            f"({cpu_slug(cpu)}), {candidates} candidates each, about "
            f"{tune.seconds_per_candidate:g} s per candidate, max_tokens {tune.max_tokens}, "
            f"n_threads {settings.backend.n_threads}"
        )
        if skipped:
            print(f"not tuned (their backend sizes its own batches): {', '.join(skipped)}")
    failed: list[str] = []
    kept: list[dict[str, object]] = []
    for model in models:
        try:
            tuning = asyncio.run(tune_model(settings.backend, model, tune, cpu))
            where = keep(tuning, tune.dir)
        except Exception as exc:  # a model that cannot load fails its tuning
            error = map_backend_exception(exc)
            failed.append(model)
            print(f"FAIL  {model}  {error.code}: {error.message}")
            continue
        kept.append({"model": model, "kept": str(where), **tuning.to_json()})
        if not as_json:
            print(f"\n{model}: kept at {where}")
            print(_format_tuning(tuning, settings))
    if as_json:
        print(json.dumps(kept))
    elif failed:
        print(f"laneway check --tune: {len(failed)} of {len(models)} models failed: {failed}")
    return 1 if failed else 0
