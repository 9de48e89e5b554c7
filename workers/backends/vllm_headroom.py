"""The source article's headroom for a GPU worker, as numbers vLLM gives.

vLLM sizes its KV cache from ``gpu_memory_utilization`` (0.8: a fifth of the
GPU stays free for bursts) once it has profiled the model, and reports it as
blocks of ``block_size`` tokens; its log line "Maximum concurrency for N
tokens per request: X.XXx" is those tokens over ``max_model_len``. The
article keeps the requests running at once under 70% of that, so a burst of
long prompts finds room instead of preempting (and recomputing) running
sequences. ``concurrency_limit`` turns the engine's report into that number,
and a ``SequenceGate`` holds the backend's ``generate`` calls to it: a
request waits for a slot, never past its deadline.

Pure functions of what the engine reports, tested without vLLM or a GPU
(``tests/unit/workers/test_vllm_headroom.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from schemas.settings import BackendSettings

__all__ = ["SequenceGate", "concurrency_limit", "kv_cache_tokens", "max_concurrent_sequences"]


def kv_cache_tokens(engine: Any) -> int | None:
    """Tokens the engine's KV cache holds (``num_gpu_blocks * block_size``
    of its ``vllm_config.cache_config``); ``None`` where the engine does not
    say (not profiled yet, or an engine without that config)."""
    config = getattr(getattr(engine, "vllm_config", None), "cache_config", None)
    blocks = getattr(config, "num_gpu_blocks", None)
    block_size = getattr(config, "block_size", None)
    if not isinstance(blocks, int) or not isinstance(block_size, int):
        return None
    if blocks <= 0 or block_size <= 0:
        return None
    return blocks * block_size


def max_concurrent_sequences(kv_tokens: int, max_model_len: int, share: float) -> int:
    """Sequences of ``max_model_len`` tokens that ``share`` of a KV cache of
    ``kv_tokens`` holds, rounded down, at least 1 (one request always runs:
    vLLM refuses to start when not even one fits)."""
    if max_model_len <= 0:
        raise ValueError(f"max_model_len must be positive, got {max_model_len}")
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    return max(1, math.floor(share * kv_tokens / max_model_len))


def concurrency_limit(engine: Any, settings: BackendSettings, max_model_len: int) -> int | None:
    """Most requests the backend hands the engine at once: the article's
    share (``vllm_kv_concurrency_share``) of the sequences its KV cache
    holds at ``max_model_len``, and never more than ``vllm_max_num_seqs``
    where set (vLLM would queue the rest itself). ``None``: no KV cache
    report, so no limit beyond vLLM's own scheduler."""
    tokens = kv_cache_tokens(engine)
    if tokens is None:
        return settings.vllm_max_num_seqs
    limit = max_concurrent_sequences(tokens, max_model_len, settings.vllm_kv_concurrency_share)
    if settings.vllm_max_num_seqs is not None:
        limit = min(limit, settings.vllm_max_num_seqs)
    return limit


class SequenceGate:
    """At most ``limit`` requests in the engine at once (``None``: no limit);
    the others wait here, in arrival order, each until its deadline at most.

        async with gate.slot(item.deadline) as admitted:
            if not admitted:
                return DeadlineExceeded("no sequence slot before the deadline")
            ...  # engine.generate(...) and its stream
    """

    def __init__(self, limit: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self._free = None if limit is None else asyncio.Semaphore(limit)
        self._clock = clock
        self.running = 0

    @contextlib.asynccontextmanager
    async def slot(self, deadline: float | None) -> AsyncIterator[bool]:
        """Yields ``True`` holding a slot until the block ends, or ``False``
        once ``deadline`` (on the ``clock``) passed without one."""
        free = self._free
        if free is not None:
            left = None if deadline is None else deadline - self._clock()
            try:
                await asyncio.wait_for(free.acquire(), left)
            except TimeoutError:
                yield False
                return
        self.running += 1
        try:
            yield True
        finally:
            self.running -= 1
            if free is not None:
                free.release()
