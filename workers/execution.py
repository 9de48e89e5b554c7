"""Turning a batch of routed requests into terminal results, without Kafka.

Requests whose deadline has passed get INF-503 before any model runs; the
rest are grouped by path and run on that path's backend, with each request
bounded by the time left before its deadline. A backend that failed to load
answers INF-502 for its requests (and is retried after ``load_retry_s``)
instead of killing the worker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schemas.errors import BackendUnavailable, DeadlineExceeded, LanewayError
from schemas.messages import ChatMessage, InferenceResult, Lane, Path, RoutedRequest, Timings, Usage
from schemas.settings import BackendSettings
from workers.backends.base import (
    Backend,
    Generation,
    GenerationInput,
    create_backend,
    map_backend_exception,
)
from workers.batcher import run_batch

__all__ = ["BackendSlot", "Executor", "backend_slots"]

log = logging.getLogger(__name__)


def _now_ms() -> float:
    return time.time() * 1000


class BackendSlot:
    """One path's backend, loaded on first use; a failed load is remembered
    and retried no sooner than ``retry_s`` later."""

    def __init__(self, factory: Callable[[], Backend], retry_s: float, label: str) -> None:
        self._factory = factory
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
            try:
                backend = self._factory()
                await backend.load()
            except Exception as exc:
                self._error = map_backend_exception(exc)
                if not isinstance(self._error, BackendUnavailable):
                    self._error = BackendUnavailable(self._error.message)
                self._failed_at = time.monotonic()
                log.error("backend %s failed to load: %s", self.label, self._error.message)
                raise self._error from exc
            self.backend, self._error = backend, None
            log.info("backend %s loaded", self.label)
            return backend

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()
            self.backend = None


def backend_slots(settings: BackendSettings) -> dict[Path, BackendSlot]:
    """The configured backend of each model path (and ``rules``)."""
    wanted = {
        Path.LIGHT: (settings.light, settings.light_model),
        Path.HEAVY: (settings.heavy, settings.heavy_model),
        Path.RULES: ("rules", "rules"),
    }
    return {
        path: BackendSlot(
            functools.partial(create_backend, kind, model, settings),
            settings.load_retry_s,
            f"{path}={kind}:{model}",
        )
        for path, (kind, model) in wanted.items()
    }


@dataclass(frozen=True, slots=True)
class Finished:
    routed: RoutedRequest
    result: InferenceResult


class Executor:
    def __init__(self, lane: Lane, slots: dict[Path, BackendSlot], system_prompt: str = "") -> None:
        self.lane = lane
        self.slots = slots
        self.system_prompt = system_prompt

    async def execute(self, batch: Sequence[RoutedRequest]) -> list[Finished]:
        """One ``Finished`` per request, in the order of ``batch``."""
        started_ms = _now_ms()
        done: dict[int, Finished] = {}
        live: dict[Path, list[int]] = {}
        for i, routed in enumerate(batch):
            remaining = routed.remaining_ms(int(started_ms))
            if remaining is not None and remaining <= 0:
                error = DeadlineExceeded(
                    f"deadline passed {-remaining:.0f} ms before the {self.lane} worker ran it"
                )
                done[i] = self._result(routed, error, None, started_ms, 0.0, len(batch))
            else:
                live.setdefault(routed.path, []).append(i)
        for path, indexes in live.items():
            group = [batch[i] for i in indexes]
            finished = await self._run_path(path, group, len(batch))
            done.update(zip(indexes, finished, strict=True))
        return [done[i] for i in range(len(batch))]

    async def _run_path(
        self, path: Path, group: list[RoutedRequest], batch_size: int
    ) -> list[Finished]:
        started_ms = _now_ms()
        slot = self.slots.get(path)
        model: str | None = None
        if slot is None:
            outcomes: list[Generation | LanewayError] = [
                BackendUnavailable(f"no backend serves path {path!r}")
            ] * len(group)
        else:
            try:
                backend = await slot.get()
            except LanewayError as error:
                outcomes = [error] * len(group)
            else:
                model = f"{backend.kind}:{backend.model}"
                inputs = [self._input(routed, started_ms) for routed in group]
                outcomes = await run_batch(backend.infer_batch, inputs, map_backend_exception)
        inference_ms = _now_ms() - started_ms
        return [
            self._result(routed, outcome, model, started_ms, inference_ms, batch_size)
            for routed, outcome in zip(group, outcomes, strict=True)
        ]

    def _input(self, routed: RoutedRequest, now_ms: float) -> GenerationInput:
        remaining = routed.remaining_ms(int(now_ms))
        request = routed.request
        messages = request.chat()
        if self.system_prompt and not any(m.role == "system" for m in messages):
            messages.insert(0, ChatMessage(role="system", content=self.system_prompt))
        return GenerationInput(
            messages=messages,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            timeout_s=None if remaining is None else max(remaining, 1) / 1000,
        )

    def _result(
        self,
        routed: RoutedRequest,
        outcome: Generation | LanewayError,
        model: str | None,
        started_ms: float,
        inference_ms: float,
        batch_size: int,
    ) -> Finished:
        now = _now_ms()
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
                path=routed.path,
                model=model,
                timings=timings,
                batch_id=request.batch_id,
            )
        else:
            result = InferenceResult(
                id=request.id,
                status="ok",
                output=outcome.text,
                lane=self.lane,
                path=routed.path,
                model=model,
                usage=Usage(
                    prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens
                ),
                timings=timings,
                batch_id=request.batch_id,
            )
        return Finished(routed, result)

    async def close(self) -> None:
        for slot in self.slots.values():
            await slot.close()
