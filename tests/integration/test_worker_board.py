"""Workers announce what they serve on the worker board in real Redis, and
the classifier's router sends a lane only the paths a live worker serves."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import redis.asyncio as aioredis

from schemas.errors import CudaFailure
from schemas.messages import AnswerPath, Lane
from schemas.settings import BackendSettings, MediumLaneSettings, RealtimeLaneSettings, Settings
from streams.classify.router import SmartRouter
from streams.kafka.topics import create_topics
from streams.routing.features import Complexity
from streams.routing.registry import builtin_registry
from streams.stores.workerboard import PathCard, WorkerBoard, WorkerCard, served_paths
from workers.lane_worker import LaneWorker


async def serving_of(board: WorkerBoard) -> dict[Lane, frozenset[AnswerPath]] | None:
    """What the classifier reads from the board (``read_workers``)."""
    cards = await board.live()
    return None if cards is None else served_paths(cards)


async def test_cards_round_trip_and_stale_ones_are_forgotten(settings: Settings) -> None:
    client = aioredis.from_url(settings.redis.url)
    board = WorkerBoard(client, f"t{uuid.uuid4().hex[:8]}", stale_s=0.5)
    light = PathCard(AnswerPath.LIGHT, "llamacpp", "smollm2-135m", "cpu")
    heavy = PathCard(AnswerPath.HEAVY, "vllm", "gemma", "cuda")
    try:
        await board.announce(WorkerCard("a", Lane.REALTIME, (light,), 8))
        await board.announce(WorkerCard("b", Lane.MEDIUM, (light, heavy), 16))
        cards = await board.live()
        assert cards is not None and {c.worker_id for c in cards} == {"a", "b"}
        assert next(c for c in cards if c.worker_id == "b").paths == (light, heavy)
        assert await serving_of(board) == {
            Lane.REALTIME: frozenset({AnswerPath.LIGHT}),
            Lane.MEDIUM: frozenset({AnswerPath.LIGHT, AnswerPath.HEAVY}),
        }
        await board.withdraw("b")
        await asyncio.sleep(0.7)  # "a" stopped announcing: it died
        await board.announce(WorkerCard("c", Lane.BULK, (heavy,), 32))
        assert await serving_of(board) == {Lane.BULK: frozenset({AnswerPath.HEAVY})}
        assert await client.hkeys(board.key) == [b"c"], "the dead worker's card is pruned"
    finally:
        await client.aclose()


async def test_a_worker_announces_only_its_lanes_paths_and_withdraws(settings: Settings) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    own = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"topic_prefix": prefix}),
            "app_id": prefix,
            "backend": BackendSettings(light="rules", heavy="rules"),
            "realtime": RealtimeLaneSettings(paths=("light",)),
            "worker_heartbeat_s": 0.2,
        }
    )
    await create_topics(own)
    client = aioredis.from_url(own.redis.url)
    board = WorkerBoard(client, prefix)
    worker = LaneWorker(own, Lane.REALTIME, workers=board)
    assert set(worker.executor.slots) == {AnswerPath.LIGHT, AnswerPath.RULES}, (
        "heavy is never loaded"
    )
    running: asyncio.Task[None] | None = None
    try:
        await worker.start()
        running = asyncio.create_task(worker.run())
        serving = None
        for _ in range(50):
            serving = await serving_of(board)
            if serving:
                break
            await asyncio.sleep(0.1)
        assert serving == {Lane.REALTIME: frozenset({AnswerPath.LIGHT})}
        assert worker.state.ready
        (card,) = await board.live() or []
        assert card.paths == (
            PathCard(AnswerPath.LIGHT, "rules", own.backend.light_model, "cpu", "q4_1"),
        )
        assert card.capacity == own.realtime.max_batch_size * own.realtime.max_inflight_batches
        # The only member of its group: every partition of the lane is its own.
        assert card.partitions == tuple(range(own.kafka.partitions))

        # What the classifier does with it: a complex realtime request, which
        # only heavy is capable of, goes down the path the lane serves.
        router = SmartRouter(builtin_registry(own.backend), own.routing)
        assert router.choose(Complexity.COMPLEX, Lane.REALTIME, {}).path is AnswerPath.HEAVY
        served = serving[Lane.REALTIME]
        assert router.choose(Complexity.COMPLEX, Lane.REALTIME, {}, served).path is AnswerPath.LIGHT

        # A CUDA error drops the loaded backend: the path leaves the card, and
        # the next heartbeat loads it, asks it, and lists it again.
        await worker.executor.slots[AnswerPath.LIGHT].mark_unhealthy(CudaFailure("device lost"))
        assert worker.card().paths == ()
        for _ in range(50):
            if worker.card().paths:
                break
            await asyncio.sleep(0.1)
        assert [p.path for p in worker.card().paths] == [AnswerPath.LIGHT]

        worker.stop()
        await asyncio.wait_for(running, timeout=10)
        assert await serving_of(board) == {}, "a worker that stops withdraws its card"
    finally:
        worker.stop()
        if running is not None:
            await asyncio.wait_for(running, timeout=10)
        await worker.close()
        await client.aclose()


async def test_a_worker_whose_model_is_missing_is_not_ready_and_lists_only_the_rest(
    settings: Settings, tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    missing = tmp_path / "missing.gguf"
    own = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"topic_prefix": prefix}),
            "app_id": prefix,
            "backend": BackendSettings(light="rules", heavy="llamacpp", heavy_model=str(missing)),
            "medium": MediumLaneSettings(paths=("light", "heavy")),
        }
    )
    await create_topics(own)
    worker = LaneWorker(own, Lane.MEDIUM)
    try:
        await worker.start()
        assert not worker.state.ready
        assert "heavy" in worker.state.detail and str(missing) in worker.state.detail
        assert [p.path for p in worker.card().paths] == [AnswerPath.LIGHT]
    finally:
        await worker.close()
