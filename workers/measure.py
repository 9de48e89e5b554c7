"""A backend's speed called directly, no Kafka: tokens/s at a batch size
and a number of batches in flight.

The one measuring code of laneway: ``laneway bench backend`` (every batch
size side by side), ``laneway bench pipeline`` (the ceiling a model
reaches called directly) and the batch-size tuner (``workers.tune``,
a bounded time per candidate) all call ``direct_rates``.

A candidate runs its prompts in batches of its size, each of ``inflight``
callers sending its next batch as soon as its last one is answered (as a
lane worker keeps ``max_inflight_batches``); "refill" keeps that many
sequences in flight, each replaced by the next prompt as it finishes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from schemas.errors import LanewayError
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings
from workers.backends.base import Backend, Generation, GenerationInput, create_backend

__all__ = ["Rate", "direct_rates", "refilled", "timed"]


@dataclass(frozen=True, slots=True)
class Rate:
    model: str
    batch_size: int
    inflight: int
    """Batches the caller kept in flight at once (a lane worker keeps up to
    ``max_inflight_batches``); 1 = each batch waits for the one before."""
    requests: int
    completion_tokens: int
    seconds: float
    cpu_seconds: float
    """CPU time of the whole process: on a shared machine, less swayed by
    the other processes than the wall clock."""
    errors: int = 0
    refilled: bool = False
    """``batch_size`` sequences kept in flight, each replaced as it finishes,
    instead of whole batches."""

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.completion_tokens / self.cpu_seconds if self.cpu_seconds else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def sequences(self) -> int:
        """Sequences the backend decodes together at most."""
        return self.batch_size * (1 if self.refilled else self.inflight)


async def direct_rates(
    settings: BackendSettings,
    model: str,
    batch_sizes: Sequence[int],
    prompts: Sequence[str],
    max_tokens: int,
    kind: str = "llamacpp",
    inflight: Sequence[int] = (1,),
    refill: bool = False,
    budget_s: float | None = None,
) -> list[Rate]:
    """Rates of ``model`` on ``kind``, called directly: at each batch size
    (and number of batches in flight), in batches of that size; with
    ``refill``, also that many sequences kept in flight one by one. The
    backend may decode as many sequences together as the largest batch
    times the most batches in flight. ``budget_s``: each candidate sends
    new work for this long (every caller at least one batch), going round
    ``prompts`` as often as it takes; ``None``: every prompt once."""
    if kind == "llamacpp":
        together = max(batch_sizes) * max(inflight)
        if budget_s is None:
            together = min(len(prompts), together)
        wanted = max(settings.llamacpp_max_sequences, together)
        settings = settings.model_copy(update={"llamacpp_max_sequences": wanted})
    backend = create_backend(kind, model, settings)
    await backend.load()
    system = [ChatMessage(role="system", content=settings.system_prompt)]
    inputs = [
        GenerationInput([*system, ChatMessage(role="user", content=p)], max_tokens, 0.0)
        for p in prompts
    ]
    rates = []
    try:
        await backend.infer_batch(inputs[:1])  # warm-up: first-call allocations
        for size in batch_sizes:
            for depth in inflight:
                rates.append(await timed(backend, model, inputs, size, depth, budget_s))
            if refill and size > 1:
                rates.append(await refilled(backend, model, inputs, size, budget_s))
    finally:
        await backend.close()
    return rates


def _batches(
    inputs: Sequence[GenerationInput], size: int, endless: bool
) -> Iterator[Sequence[GenerationInput]]:
    """``inputs`` in batches of ``size``: once, or round and round."""
    if not endless:
        yield from (inputs[at : at + size] for at in range(0, len(inputs), size))
        return
    ring = itertools.cycle(inputs)
    while True:
        yield [next(ring) for _ in range(size)]


async def timed(
    backend: Backend,
    model: str,
    inputs: Sequence[GenerationInput],
    size: int,
    depth: int,
    budget_s: float | None = None,
) -> Rate:
    """``depth`` callers, each sending the next batch of ``size`` as soon
    as its last one is answered; with ``budget_s``, no new batch is sent
    once that long has passed."""
    tokens = errors = requests = 0
    batches = _batches(inputs, size, endless=budget_s is not None)
    started, cpu_started = time.perf_counter(), time.process_time()
    stops_at = started + budget_s if budget_s is not None else None

    async def caller() -> None:
        nonlocal tokens, errors, requests
        for batch in batches:  # shared: each batch goes to one caller
            for outcome in await backend.infer_batch(batch):
                requests += 1
                if isinstance(outcome, Generation):
                    tokens += outcome.completion_tokens
                elif isinstance(outcome, LanewayError):
                    errors += 1
            if stops_at is not None and time.perf_counter() >= stops_at:
                return

    await asyncio.gather(*(caller() for _ in range(depth)))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return Rate(model, size, depth, requests, tokens, seconds, cpu, errors)


async def refilled(
    backend: Backend,
    model: str,
    inputs: Sequence[GenerationInput],
    width: int,
    budget_s: float | None = None,
) -> Rate:
    """``width`` callers, each sending the next prompt alone as soon as its
    last one is answered: the backend always has ``width`` sequences."""
    tokens = errors = requests = 0
    queue = iter(inputs) if budget_s is None else itertools.cycle(inputs)
    started, cpu_started = time.perf_counter(), time.process_time()
    stops_at = started + budget_s if budget_s is not None else None

    async def caller() -> None:
        nonlocal tokens, errors, requests
        for item in queue:  # shared: each prompt goes to one caller
            (outcome,) = await backend.infer_batch([item])
            requests += 1
            if isinstance(outcome, Generation):
                tokens += outcome.completion_tokens
            else:
                errors += 1
            if stops_at is not None and time.perf_counter() >= stops_at:
                return

    await asyncio.gather(*(caller() for _ in range(width)))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return Rate(model, width, 1, requests, tokens, seconds, cpu, errors, refilled=True)
