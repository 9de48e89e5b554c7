"""Dynamic batching that knows nothing of Kafka.

``collect_batch`` gathers items from any async source until the batch is
full or ``max_wait_s`` has passed since its first item. ``run_batch`` calls
a batch function and guarantees one outcome per item: a raised error, or a
result count that does not match, is spread to every item as a
``LanewayError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from schemas.errors import BackendUnavailable, LanewayError

__all__ = ["collect_batch", "run_batch"]

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741
R = TypeVar("R")

Fetch = Callable[[float, int], Awaitable[list[T]]]
"""``fetch(timeout_s, max_items)``: up to ``max_items`` items, waiting at most ``timeout_s``."""


async def collect_batch(
    fetch: Fetch[T],
    *,
    max_size: int,
    max_wait_s: float,
    idle_timeout_s: float,
    clock: Callable[[], float] | None = None,
) -> list[T]:
    """One batch: waits up to ``idle_timeout_s`` for a first item (``[]`` if
    none comes), then fills up to ``max_size`` items within ``max_wait_s``."""
    now = clock or asyncio.get_running_loop().time
    batch = await fetch(idle_timeout_s, max_size)
    if not batch:
        return []
    closes_at = now() + max_wait_s
    while len(batch) < max_size:
        remaining = closes_at - now()
        if remaining <= 0:
            break
        batch.extend(await fetch(remaining, max_size - len(batch)))
    return batch


async def run_batch(
    infer: Callable[[Sequence[I]], Awaitable[Sequence[R | LanewayError]]],
    items: Sequence[I],
    map_error: Callable[[BaseException], LanewayError],
) -> list[R | LanewayError]:
    """Exactly one outcome per item, whatever the batch function does."""
    if not items:
        return []
    try:
        outcomes = list(await infer(items))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        error = map_error(exc)
        return [error] * len(items)
    if len(outcomes) != len(items):
        error = BackendUnavailable(
            f"backend returned {len(outcomes)} results for a batch of {len(items)}"
        )
        return [error] * len(items)
    return outcomes
