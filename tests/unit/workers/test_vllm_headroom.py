"""The GPU worker's headroom from what vLLM reports, without vLLM or a GPU:
the engine is described by the attributes vLLM's own engine has
(``vllm_config.cache_config.num_gpu_blocks`` and ``block_size``)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from schemas.settings import BackendSettings
from workers.backends.vllm_headroom import (
    SequenceGate,
    concurrency_limit,
    kv_cache_tokens,
    max_concurrent_sequences,
)


def engine(blocks: object, block_size: object = 16) -> SimpleNamespace:
    cache = SimpleNamespace(num_gpu_blocks=blocks, block_size=block_size)
    return SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache))


def test_the_defaults_are_the_articles_headroom() -> None:
    settings = BackendSettings()
    assert settings.vllm_gpu_memory_utilization == 0.8
    assert settings.vllm_kv_concurrency_share == 0.7


def test_kv_cache_tokens_are_blocks_times_block_size() -> None:
    assert kv_cache_tokens(engine(2048, 16)) == 32_768


@pytest.mark.parametrize(
    "described",
    [SimpleNamespace(), engine(None), engine(0), engine(100, None), engine("8")],
    ids=["no config", "not profiled", "no blocks", "no block size", "not a number"],
)
def test_an_engine_that_does_not_report_its_cache_gives_none(described: object) -> None:
    assert kv_cache_tokens(described) is None


def test_seventy_percent_of_the_sequences_the_cache_holds_at_full_length() -> None:
    # 32,768 tokens hold 8 sequences of 4,096: 70% of them is 5.6, so 5.
    assert max_concurrent_sequences(32_768, 4096, 0.7) == 5
    assert max_concurrent_sequences(32_768, 4096, 1.0) == 8
    # A cache that holds one sequence still runs one.
    assert max_concurrent_sequences(4096, 4096, 0.7) == 1


@pytest.mark.parametrize(("length", "share"), [(0, 0.7), (4096, 0.0), (4096, 1.5)])
def test_impossible_inputs_are_refused(length: int, share: float) -> None:
    with pytest.raises(ValueError):
        max_concurrent_sequences(32_768, length, share)


def test_the_limit_follows_the_settings_share() -> None:
    settings = BackendSettings(vllm_kv_concurrency_share=0.5)
    assert concurrency_limit(engine(2048, 16), settings, 4096) == 4


def test_a_configured_max_num_seqs_caps_the_limit() -> None:
    settings = BackendSettings(vllm_max_num_seqs=3)
    assert concurrency_limit(engine(2048, 16), settings, 4096) == 3
    assert concurrency_limit(engine(20_480, 16), BackendSettings(), 4096) == 56


def test_without_a_report_only_a_configured_max_num_seqs_limits() -> None:
    assert concurrency_limit(SimpleNamespace(), BackendSettings(), 4096) is None
    assert concurrency_limit(SimpleNamespace(), BackendSettings(vllm_max_num_seqs=6), 4096) == 6


async def test_the_gate_holds_requests_to_its_limit() -> None:
    gate = SequenceGate(2)
    inside, most = 0, 0
    release = asyncio.Event()

    async def one() -> bool:
        nonlocal inside, most
        async with gate.slot(None) as admitted:
            inside += 1
            most = max(most, inside)
            await release.wait()
            inside -= 1
            return admitted

    tasks = [asyncio.create_task(one()) for _ in range(5)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert (inside, gate.running) == (2, 2)  # three wait for a slot
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*tasks), 5) == [True] * 5
    assert most == 2 and gate.running == 0


async def test_a_request_waits_no_longer_than_its_deadline() -> None:
    gate = SequenceGate(1)
    held = asyncio.Event()
    done = asyncio.Event()

    async def holder() -> None:
        async with gate.slot(None):
            held.set()
            await done.wait()

    task = asyncio.create_task(holder())
    await asyncio.wait_for(held.wait(), 5)
    started = time.monotonic()
    async with gate.slot(time.monotonic() + 0.05) as admitted:
        assert admitted is False
    assert time.monotonic() - started < 2
    async with gate.slot(time.monotonic() - 1) as admitted:  # already past
        assert admitted is False
    done.set()
    await asyncio.wait_for(task, 5)
    async with gate.slot(time.monotonic() + 1) as admitted:  # a slot is free again
        assert admitted is True


async def test_without_a_limit_every_request_runs() -> None:
    gate = SequenceGate(None)
    async with gate.slot(time.monotonic() - 1) as admitted:
        assert admitted is True and gate.running == 1


def test_a_gate_needs_a_limit_of_one_or_more() -> None:
    with pytest.raises(ValueError):
        SequenceGate(0)
