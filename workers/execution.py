"""Turning a batch of routed requests into terminal results, without Kafka.

Requests whose deadline has passed get INF-503 before any model runs; the
rest are grouped by path and run on that path's backend, with each request
bounded by the time left before its deadline. A backend that failed to load
answers INF-502 for its requests (and is retried after ``load_retry_s``)
instead of killing the worker.

Each path's backend sits behind a circuit breaker. Requests that fail for
the backend's sake (INF-502, CUDA-ERR, MEM-ERR after the batch was split in
halves down to single requests), or whose breaker is open, go down the next
eligible path (heavy <-> light) and come back marked ``degraded`` with the
path the router chose; INF-502 only when no path can serve. A CUDA error
opens the breaker at once and drops the loaded backend: the probe after the
cooldown loads it again.

A path may have several versions (``streams.routing.registry``): a worker
loads the active version of each of its paths (``slots``) and every other
version that is not retired (``versions``, keyed by path and version). A
request routed to a version runs on that version's slot; when it cannot
serve it (not loaded here, failed, circuit open) the path's active version
answers it, then the other path's, so a failing canary costs its clients
nothing while the quality loop counts its failures (``attempt`` events
carry the version).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from prometheus_client import Gauge

from schemas.backends import BACKEND_KINDS
from schemas.errors import (
    BackendUnavailable,
    CudaFailure,
    DeadlineExceeded,
    LanewayError,
    OutOfMemory,
)
from schemas.messages import (
    AnswerPath,
    ChatMessage,
    InferenceResult,
    Lane,
    RoutedRequest,
    Timings,
    Usage,
)
from schemas.settings import BackendSettings
from streams.routing.registry import ModelEntry, ModelRegistry, builtin_registry
from streams.stores.sessions import with_history
from workers.backends.base import (
    Backend,
    Generation,
    GenerationInput,
    create_backend,
    errors_of,
    map_backend_exception,
)
from workers.batcher import run_batch
from workers.breaker import CircuitBreaker
from workers.streaming import AnswerStream

__all__ = [
    "BREAKER_STATE",
    "BackendSlot",
    "Executor",
    "Failure",
    "Fallbacks",
    "SlotKey",
    "backend_slots",
    "version_slots",
]

log = logging.getLogger(__name__)

BREAKER_STATE = Gauge(
    "laneway_backend_breaker_state",
    "Circuit breaker of a path's backend, as the worker last saw it: 0 closed, 1 half-open, 2 open",
    ["lane", "path"],
)
BREAKER_LEVELS = {"closed": 0, "half-open": 1, "open": 2}


def _now_ms() -> float:
    return time.time() * 1000


class BackendSlot:
    """One path's backend, loaded on first use; a failed load is remembered
    and retried no sooner than ``retry_s`` later."""

    def __init__(
        self,
        factory: Callable[[], Backend],
        retry_s: float,
        label: str,
        breaker: CircuitBreaker | None = None,
        version: str | None = None,
    ) -> None:
        self._factory = factory
        self.version = version
        """The registry version this slot loads (``None``: rules, or unversioned)."""
        self.breaker = breaker or CircuitBreaker(failures=5, window_s=30.0, cooldown_s=10.0)
        self._retry_s = retry_s
        self.label = label
        self.backend: Backend | None = None
        self._error: LanewayError | None = None
        self._failed_at = 0.0
        self._lock = asyncio.Lock()

    async def get(self) -> Backend:
        async with self._lock:
            if self.backend is not None:
                return self.backend
            if self._error is not None and time.monotonic() - self._failed_at < self._retry_s:
                raise self._error
            backend = None
            try:
                backend = self._factory()
                await backend.load()
            except Exception as exc:
                if backend is not None:
                    with contextlib.suppress(Exception):
                        await backend.close()
                self._error = map_backend_exception(exc, errors_of(backend))
                if not isinstance(self._error, BackendUnavailable):
                    self._error = BackendUnavailable(self._error.message)
                self._failed_at = time.monotonic()
                log.error("backend %s failed to load: %s", self.label, self._error.message)
                raise self._error from exc
            self.backend, self._error = backend, None
            log.info("backend %s loaded", self.label)
            return backend

    async def mark_unhealthy(self, error: LanewayError) -> None:
        """A CUDA error leaves the device in an unknown state: the breaker
        opens at once and the loaded backend is dropped, so the half-open
        probe after the cooldown runs on a freshly loaded one."""
        self.breaker.trip()
        log.error("backend %s marked unhealthy: %s", self.label, error.message)
        async with self._lock:
            if self.backend is not None:
                with contextlib.suppress(Exception):
                    await self.backend.close()
                self.backend = None

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()
            self.backend = None


SlotKey = tuple[AnswerPath, str]
"""A model path and one of its registry versions."""


def backend_slots(
    settings: BackendSettings,
    paths: Iterable[AnswerPath] | None = None,
    registry: ModelRegistry | None = None,
) -> dict[AnswerPath, BackendSlot]:
    """The backend of the active version of each of ``paths`` (``None``:
    every model path) in ``registry`` (the built-in one, from ``settings``'
    light and heavy models, when ``None``), and of ``rules``: a worker loads
    only the models of the paths it serves. ``version_slots`` adds the other
    versions. A path the registry does not name is an error, not a silence."""
    registry = registry or builtin_registry(settings)
    slots: dict[AnswerPath, BackendSlot] = {}
    for path in registry.model_paths if paths is None else paths:
        entry = registry.for_path(path)
        if entry is None:
            known = [str(p) for p in registry.model_paths]
            raise ValueError(f"no model path {path!s} in the registry: it has {known}")
        slots[path] = _slot(settings, path, entry)
    slots[AnswerPath.RULES] = _slot(settings, AnswerPath.RULES, None)
    return slots


def version_slots(
    settings: BackendSettings, registry: ModelRegistry, paths: Iterable[AnswerPath]
) -> dict[SlotKey, BackendSlot]:
    """A backend for every version of ``paths`` that is neither the active
    one nor retired (canaries and shadows), by path and version."""
    return {
        (path, entry.version): _slot(settings, path, entry)
        for path in paths
        for entry in registry.versions(path)
        if entry.state in ("canary", "shadow")
    }


def _slot(settings: BackendSettings, path: AnswerPath, entry: ModelEntry | None) -> BackendSlot:
    """``entry``: the registry version the slot loads (``None``: the rules)."""
    if entry is None:
        kind, model, version = "rules", "rules", None
    else:
        kind, model, version = entry.backend, entry.name, entry.version
    field = BACKEND_KINDS[entry.backend].max_batch_field if entry is not None else None
    if entry is not None and entry.max_batch is not None and field is not None:
        settings = settings.model_copy(update={field: entry.max_batch})
    adapter = entry.adapter if entry is not None else None
    label = f"{path}={kind}:{model}" + (f"@{version}" if version is not None else "")
    if adapter is not None:
        label += f"+{adapter.name}"
    return BackendSlot(
        functools.partial(create_backend, kind, model, settings, adapter),
        settings.load_retry_s,
        label,
        CircuitBreaker(
            failures=settings.breaker_failures,
            window_s=settings.breaker_window_s,
            cooldown_s=settings.breaker_cooldown_s,
        ),
        version,
    )


Fallbacks = Mapping[AnswerPath, Sequence[AnswerPath]]
"""Where a path's requests go when its backend cannot serve them, in order
(``ModelRegistry.fallbacks``); a path not listed goes nowhere."""


def _backend_failed(outcome: Generation | LanewayError) -> TypeGuard[LanewayError]:
    """A failure of the backend, not of the request: another path may serve it."""
    return isinstance(outcome, BackendUnavailable | CudaFailure | OutOfMemory)


async def _infer_splitting(
    backend: Backend, inputs: list[GenerationInput]
) -> list[Generation | LanewayError]:
    """Out of memory on a batch: run its halves, down to single requests,
    before answering MEM-ERR."""
    mapping = functools.partial(map_backend_exception, errors=errors_of(backend))
    outcomes = await run_batch(backend.infer_batch, inputs, mapping)
    if len(inputs) > 1 and all(isinstance(o, OutOfMemory) for o in outcomes):
        half = len(inputs) // 2
        log.warning("out of memory on a batch of %d; retrying in halves", len(inputs))
        return await _infer_splitting(backend, inputs[:half]) + await _infer_splitting(
            backend, inputs[half:]
        )
    return outcomes


Failure = tuple[AnswerPath, str | None, LanewayError]
"""A path (and version) that failed a request, and why."""


@dataclass(frozen=True, slots=True)
class Finished:
    routed: RoutedRequest
    result: InferenceResult
    failed: tuple[Failure, ...] = ()
    """Paths (and versions) tried before the one that gave ``result``, and
    why each failed: the quality loop counts them against those paths."""


class Executor:
    def __init__(
        self,
        lane: Lane,
        slots: dict[AnswerPath, BackendSlot],
        system_prompt: str = "",
        versions: dict[SlotKey, BackendSlot] | None = None,
        fallbacks: Fallbacks | None = None,
    ) -> None:
        self.lane = lane
        self.slots = slots
        """The active version of each path served here (and rules)."""
        self.versions = versions or {}
        """Every other loaded version (canaries, shadows), by path and version."""
        self.system_prompt = system_prompt
        self.fallbacks: Fallbacks = (
            fallbacks
            if fallbacks is not None
            else {AnswerPath.LIGHT: (AnswerPath.HEAVY,), AnswerPath.HEAVY: (AnswerPath.LIGHT,)}
        )
        """Where a path's requests go when it cannot serve them (by default
        the built-in registry's: light -> heavy, heavy -> light)."""

    def all_slots(self) -> list[tuple[AnswerPath, BackendSlot]]:
        """Every slot with its path: the active ones first."""
        return [*self.slots.items(), *((key[0], slot) for key, slot in self.versions.items())]

    def _version_key(self, routed: RoutedRequest) -> str | None:
        """The version ``routed`` asks for, ``None`` for the path's active one."""
        active = self.slots.get(routed.path)
        if routed.version is None or (active is not None and active.version == routed.version):
            return None
        return routed.version

    async def execute(
        self,
        batch: Sequence[RoutedRequest],
        unwanted: Mapping[int, asyncio.Event] | None = None,
        streams: Mapping[int, AnswerStream] | None = None,
    ) -> list[Finished]:
        """One ``Finished`` per request, in the order of ``batch``.
        ``unwanted``: by index in ``batch``, an event set when that answer is
        no longer wanted; its backend may then stop generating it
        (``GenerationInput.unwanted``) and it fails with ``STOPPED``.
        ``streams``: by index, where a streamed request's pieces go as they
        are generated; each path tried begins an attempt on it."""
        unwanted = unwanted or {}
        streams = streams or {}
        started_ms = _now_ms()
        done: dict[int, Finished] = {}
        live: dict[tuple[AnswerPath, str | None, bool], list[int]] = {}
        for i, routed in enumerate(batch):
            remaining = routed.remaining_ms(int(started_ms))
            if remaining is not None and remaining <= 0:
                error = DeadlineExceeded(
                    f"deadline passed {-remaining:.0f} ms before the {self.lane} worker ran it"
                )
                done[i] = self._result(routed, error, None, started_ms, 0.0, len(batch))
            else:
                key = (routed.path, self._version_key(routed), routed.shadow)
                live.setdefault(key, []).append(i)
        for (path, version, shadow), indexes in live.items():
            group = [batch[i] for i in indexes]
            stops = [unwanted.get(i) for i in indexes]
            listeners = [streams.get(i) for i in indexes]
            finished = await self._run_path(
                path, group, len(batch), version, shadow=shadow, stops=stops, streams=listeners
            )
            done.update(zip(indexes, finished, strict=True))
        return [done[i] for i in range(len(batch))]

    def _candidates(
        self, path: AnswerPath, version: str | None, shadow: bool = False
    ) -> list[tuple[AnswerPath, str | None, BackendSlot | None]]:
        """Where ``path``'s requests (for ``version``) are tried, in order:
        that version, the path's active version, then the fallback paths'.
        A shadow copy runs on its version or not at all: another version's
        answer would compare nothing."""
        tried: list[tuple[AnswerPath, str | None, BackendSlot | None]] = []
        if version is not None:
            tried.append((path, version, self.versions.get((path, version))))
        for candidate in (path, *self.fallbacks.get(path, ())):
            slot = self.slots.get(candidate)
            tried.append((candidate, slot.version if slot else None, slot))
        return tried[:1] if shadow else tried

    async def _run_path(
        self,
        path: AnswerPath,
        group: list[RoutedRequest],
        batch_size: int,
        version: str | None = None,
        *,
        shadow: bool = False,
        stops: Sequence[asyncio.Event | None],
        streams: Sequence[AnswerStream | None],
    ) -> list[Finished]:
        """Run ``group`` on its path (and ``version``); what fails there for
        the backend's sake (unreachable, CUDA, out of memory) or meets an
        open breaker moves on to the path's active version, then the next
        eligible path (marked degraded)."""
        done: dict[int, Finished] = {}
        pending = list(range(len(group)))
        errors: dict[int, LanewayError] = {}
        failed: dict[int, list[Failure]] = {}
        skipped: list[str] = []
        candidates = self._candidates(path, version, shadow)
        asked = (path, candidates[0][1])
        for candidate, served_version, slot in candidates:
            name = candidate if served_version is None else f"{candidate}@{served_version}"
            if not pending:
                break
            if slot is None:
                skipped.append(f"no backend serves {name}")
                continue
            if not slot.breaker.allow():
                skipped.append(f"{name} circuit open")
                BREAKER_STATE.labels(self.lane, candidate).set(BREAKER_LEVELS[slot.breaker.state])
                continue
            started_ms = _now_ms()
            try:
                model, outcomes = await self._run_on(
                    slot,
                    candidate,
                    [group[i] for i in pending],
                    started_ms,
                    [stops[i] for i in pending],
                    [streams[i] for i in pending],
                )
            except BaseException:
                slot.breaker.record(ok=False)  # a half-open probe must never stay open
                raise
            inference_ms = _now_ms() - started_ms
            cuda = next((o for o in outcomes if isinstance(o, CudaFailure)), None)
            if cuda is not None:
                await slot.mark_unhealthy(cuda)
            else:
                slot.breaker.record(ok=not all(_backend_failed(o) for o in outcomes))
            BREAKER_STATE.labels(self.lane, candidate).set(BREAKER_LEVELS[slot.breaker.state])
            still: list[int] = []
            for i, outcome in zip(pending, outcomes, strict=True):
                if _backend_failed(outcome):
                    errors[i] = outcome
                    failed.setdefault(i, []).append((candidate, served_version, outcome))
                    still.append(i)
                    continue
                done[i] = self._result(
                    group[i],
                    outcome,
                    model,
                    started_ms,
                    inference_ms,
                    batch_size,
                    candidate,
                    tuple(failed.get(i, ())),
                    served_version,
                )
            pending = still
        now = _now_ms()
        for i in pending:
            error = errors.get(i) or BackendUnavailable(
                f"no path can serve {path}: {'; '.join(skipped)}"
            )
            done[i] = self._result(
                group[i],
                error,
                None,
                now,
                0.0,
                batch_size,
                path,
                tuple(f for f in failed.get(i, ()) if (f[0], f[1]) != asked),
                asked[1],
            )
        return [done[i] for i in range(len(group))]

    async def _run_on(
        self,
        slot: BackendSlot,
        path: AnswerPath,
        group: list[RoutedRequest],
        started_ms: float,
        stops: Sequence[asyncio.Event | None],
        streams: Sequence[AnswerStream | None],
    ) -> tuple[str | None, list[Generation | LanewayError]]:
        try:
            backend = await slot.get()
        except LanewayError as error:
            return None, [error] * len(group)
        model = f"{backend.kind}:{backend.model}"
        for stream in streams:
            if stream is not None:
                stream.begin(path, model)
        inputs = [
            self._input(routed, started_ms, stop, stream.text if stream is not None else None)
            for routed, stop, stream in zip(group, stops, streams, strict=True)
        ]
        return model, await _infer_splitting(backend, inputs)

    def _input(
        self,
        routed: RoutedRequest,
        now_ms: float,
        unwanted: asyncio.Event | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> GenerationInput:
        remaining = routed.remaining_ms(int(now_ms))
        request = routed.request
        messages = with_history(request, routed.history)
        if self.system_prompt and not any(m.role == "system" for m in messages):
            messages.insert(0, ChatMessage(role="system", content=self.system_prompt))
        return GenerationInput(
            messages=messages,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            deadline=None if remaining is None else time.monotonic() + remaining / 1000,
            stop=request.stop,
            seed=request.seed,
            unwanted=unwanted,
            on_text=on_text,
            top_p=request.top_p,
        )

    def _result(
        self,
        routed: RoutedRequest,
        outcome: Generation | LanewayError,
        model: str | None,
        started_ms: float,
        inference_ms: float,
        batch_size: int,
        served_by: AnswerPath | None = None,
        failed: tuple[Failure, ...] = (),
        version: str | None = None,
    ) -> Finished:
        now = _now_ms()
        path = served_by or routed.path
        requested = routed.requested_path or routed.path
        degraded = path != requested
        timings = Timings(
            queue_ms=round(max(0.0, started_ms - routed.produced_at_ms), 3),
            inference_ms=round(inference_ms, 3),
            total_ms=round(max(0.0, now - routed.produced_at_ms), 3),
            batch_size=batch_size,
        )
        request = routed.request
        if isinstance(outcome, LanewayError):
            result = InferenceResult.failure(
                request.id,
                outcome,
                lane=self.lane,
                path=path,
                model=model,
                timings=timings,
                batch_id=request.batch_id,
                explored=routed.explored,
            ).model_copy(update={"version": version, "router_version": routed.router_version})
        else:
            result = InferenceResult(
                id=request.id,
                status="ok",
                output=outcome.text,
                lane=self.lane,
                path=path,
                degraded=degraded,
                requested_path=requested if degraded else None,
                model=model,
                usage=Usage(
                    prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens
                ),
                finish_reason=outcome.finish,
                timings=timings,
                batch_id=request.batch_id,
                explored=routed.explored,
                version=version,
                router_version=routed.router_version,
            )
        return Finished(routed, result, failed)

    async def close(self) -> None:
        for _, slot in self.all_slots():
            await slot.close()
