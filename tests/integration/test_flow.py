"""Flow control on real parts: workers report their backlog to Redis, the
classifier's load level follows it, sheds bulk intake and recovers."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer, TopicPartition

from schemas.messages import InferenceRequest, Lane
from schemas.settings import BackendSettings, Settings
from streams.client import LanewayClient
from streams.kafka.topics import create_topics
from streams.stores.backlog import BacklogBoard, LaneLoad
from streams.stores.workerboard import WorkerBoard
from tests.integration.conftest import CHILD_ENV, produce_to_lane, routed_now
from workers.execution import Executor, backend_slots
from workers.lane_worker import LaneWorker


async def own_topics(settings: Settings, report_every_s: float) -> tuple[Settings, str]:
    """Settings with topics of their own (created) and the backlog reported
    every ``report_every_s``; and their prefix."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    kafka = settings.kafka.model_copy(update={"topic_prefix": prefix})
    flow = settings.flow.model_copy(update={"interval_s": report_every_s})
    own = settings.model_copy(update={"kafka": kafka, "app_id": prefix, "flow": flow})
    await create_topics(own)
    return own, prefix


def rules_worker(own: Settings, lane: Lane, board: BacklogBoard) -> LaneWorker:
    """A worker of ``lane`` that answers from the rule book and reports to ``board``."""
    rules = backend_slots(BackendSettings(light="rules", heavy="rules"))
    return LaneWorker(own, lane, executor=Executor(lane, rules), board=board)


async def test_a_worker_reports_what_waits_on_its_partitions(settings: Settings) -> None:
    own, prefix = await own_topics(settings, report_every_s=0.01)
    producer = AIOKafkaProducer(**own.kafka.client_options())
    await producer.start()
    for i in range(5):
        await producer.send_and_wait(
            own.lane_topic(Lane.BULK), b"{}", partition=0, key=str(i).encode()
        )
    await producer.stop()

    redis = aioredis.from_url(own.redis.url)
    board = BacklogBoard(redis, prefix)
    worker = rules_worker(own, Lane.BULK, board)
    await worker.start()
    try:
        fetched = []
        for _ in range(20):
            fetched += await worker._fetch(0.5, 1)
            if fetched:
                break
        assert len(fetched) == 1
        assert worker._consumer is not None
        tp = TopicPartition(own.lane_topic(Lane.BULK), 0)
        assert await worker._consumer.position(tp) == 1
        await worker._report_backlog()
        backlog = await board.read()
    finally:
        await worker.close()
        await redis.aclose()
    assert backlog is not None and backlog[Lane.BULK] == 4 and backlog[Lane.REALTIME] == 0


async def test_the_backlog_is_reported_on_its_own_timer(settings: Settings) -> None:
    """No batch loop runs (as while two long batches hold it): the reporter
    still tells the board what waits, and again once more arrives."""
    own, prefix = await own_topics(settings, report_every_s=0.1)
    producer = AIOKafkaProducer(**own.kafka.client_options())
    await producer.start()
    redis = aioredis.from_url(own.redis.url)
    board = BacklogBoard(redis, prefix)
    worker = rules_worker(own, Lane.REALTIME, board)
    await worker.start()
    reporting = asyncio.create_task(worker._report_until_stopped())

    async def waiting_becomes(n: int) -> int | None:
        seen = None
        for _ in range(100):
            backlog = await board.read()
            seen = None if backlog is None else backlog[Lane.REALTIME]
            if seen == n:
                break
            await asyncio.sleep(0.1)
        return seen

    try:
        topic = own.lane_topic(Lane.REALTIME)
        for i in range(3):
            await producer.send_and_wait(topic, b"{}", partition=0, key=str(i).encode())
        assert await waiting_becomes(3) == 3
        for i in range(4):
            await producer.send_and_wait(topic, b"{}", partition=0, key=str(i).encode())
        assert await waiting_becomes(7) == 7
    finally:
        worker.stop()
        await asyncio.wait_for(reporting, timeout=5)
        await worker.close()
        await producer.stop()
        await redis.aclose()


async def test_a_worker_reports_as_its_batches_run_not_only_on_its_timer(
    settings: Settings,
) -> None:
    """With a timer too slow to matter, the board still hears of new work:
    a worker reports as each batch starts and as it ends."""
    own, prefix = await own_topics(settings, report_every_s=600.0)
    redis = aioredis.from_url(own.redis.url)
    board = BacklogBoard(redis, prefix)
    worker = rules_worker(own, Lane.REALTIME, board)
    await worker.start()
    running = asyncio.create_task(worker.run())

    async def report_after(at_ms: int) -> LaneLoad | None:
        for _ in range(200):
            loads = await board.read_loads()
            load = None if loads is None else loads[Lane.REALTIME]
            if load is not None and load.at_ms is not None and load.at_ms > at_ms:
                return load
            await asyncio.sleep(0.05)
        return None

    try:
        first = await report_after(0)  # the reporter's first, as the worker starts
        assert first is not None and first.waiting == 0 and first.at_ms is not None
        for i in range(3):
            request = InferenceRequest(id=f"hello-{i}-{uuid.uuid4().hex[:6]}", prompt="hello")
            await produce_to_lane(own, routed_now(request, own.replies_topic))
        later = await report_after(first.at_ms)
        assert later is not None, "no report within 10 s of a batch: only the 600 s timer"
        # The last report, once the batches ended, has nothing waiting.
        for _ in range(100):
            if (await board.read() or {}).get(Lane.REALTIME) == 0 and worker._running == 0:
                break
            await asyncio.sleep(0.05)
        assert worker._running == 0 and (await board.read() or {}).get(Lane.REALTIME) == 0
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=10)
        await worker.close()
        await redis.aclose()


async def test_stale_reports_are_ignored(settings: Settings) -> None:
    redis = aioredis.from_url(settings.redis.url)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    try:
        old = int(time.time() * 1000) - 60_000
        await redis.hset(f"{prefix}:backlog", "medium:dead", f"500:{old}")
        await BacklogBoard(redis, prefix).report(Lane.MEDIUM, "alive", 7)
        assert (await BacklogBoard(redis, prefix).read()) == {
            Lane.REALTIME: 0,
            Lane.MEDIUM: 7,
            Lane.BULK: 0,
        }
    finally:
        await redis.aclose()


async def test_drain_rates_add_up_per_lane_beside_older_reports(settings: Settings) -> None:
    redis = aioredis.from_url(settings.redis.url)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    board = BacklogBoard(redis, prefix)
    try:
        now = int(time.time() * 1000)
        await redis.hset(f"{prefix}:backlog", "realtime:older", f"2:{now - 3_000}")  # no rate
        await board.report(Lane.REALTIME, "a", 3, 2.5)
        await board.report(Lane.REALTIME, "b", 1, 1.5)
        loads = await board.read_loads()
        reports = await board.read_reports()
        assert await board.read() == {Lane.REALTIME: 6, Lane.MEDIUM: 0, Lane.BULK: 0}
    finally:
        await redis.aclose()
    assert reports is not None  # each worker's own, for the gate to judge it alone
    mine = {r.worker_id: (r.lane, r.load.waiting, r.load.drain_per_s) for r in reports}
    assert mine == {
        "older": (Lane.REALTIME, 2, None),
        "a": (Lane.REALTIME, 3, 2.5),
        "b": (Lane.REALTIME, 1, 1.5),
    }
    assert loads is not None
    realtime = loads[Lane.REALTIME]
    assert (realtime.waiting, realtime.drain_per_s) == (6, 4.0) and realtime.wait_ms == 1500
    assert realtime.at_ms is not None and now - 3_000 <= realtime.at_ms < now  # the oldest
    assert loads[Lane.BULK] == LaneLoad(0) and loads[Lane.BULK].wait_ms is None


NO_CACHE = {"cache": "bypass"}


async def test_backlog_sheds_bulk_intake_and_the_stack_recovers(
    client: LanewayClient, settings: Settings
) -> None:
    redis = aioredis.from_url(settings.redis.url)
    board = BacklogBoard(redis, CHILD_ENV["LANEWAY_REDIS_KEY_PREFIX"])
    worker_id = f"pressure-{uuid.uuid4().hex[:6]}"
    try:
        # A worker reports 80 records waiting: level 2 (enter marks 32/64/128).
        # "bypass": a cached answer costs nothing and is served even when
        # shedding; this test is about what reaches the lanes.
        shed = None
        for _ in range(30):
            await board.report(Lane.MEDIUM, worker_id, 80)
            result = await client.ask(
                "Name a colour.", batch_id="b", max_tokens=4, timeout_s=60, metadata=NO_CACHE
            )
            if result.error is not None and result.error.code == "INF-429":
                shed = result
                break
            await asyncio.sleep(0.5)
        assert shed is not None and shed.error is not None
        assert "bulk intake paused" in shed.error.message and shed.error.retry_after_ms
        rules = await client.ask("ping", timeout_s=60)  # realtime rules still answered
        assert rules.status == "ok"

        await board.report(Lane.MEDIUM, worker_id, 0)  # the backlog is gone
        recovered = None
        for _ in range(60):
            result = await client.ask(
                "Name a colour.", batch_id="b", max_tokens=4, timeout_s=60, metadata=NO_CACHE
            )
            if result.status == "ok":
                recovered = result
                break
            await asyncio.sleep(0.5)
        assert recovered is not None and recovered.lane == "bulk"
    finally:
        await redis.hdel(f"{CHILD_ENV['LANEWAY_REDIS_KEY_PREFIX']}:backlog", f"medium:{worker_id}")
        await redis.aclose()


CAPITALS = ["France", "Spain", "Italy", "Japan", "Peru", "Chile", "Egypt", "Kenya"]


async def gate_knows_the_realtime_workers(settings: Settings) -> None:
    """Wait until a realtime worker's card is on the board and the
    classifier has had the time to read it (it re-reads the board once a
    heartbeat) and the lane's backlog (once a gate interval)."""
    redis = aioredis.from_url(settings.redis.url)
    board = WorkerBoard(redis, settings.redis.key_prefix)
    try:
        for _ in range(100):
            cards = await board.live() or []
            if any(card.lane == Lane.REALTIME for card in cards):
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("no realtime worker on the board")
    finally:
        await redis.aclose()
    await asyncio.sleep(settings.worker_heartbeat_s + 2 * settings.flow.gate_interval_s)


async def test_simple_work_spills_to_medium_and_realtime_keeps_room_for_those_who_ask(
    client: LanewayClient, settings: Settings
) -> None:
    """Eight simple questions at once, sent without a lane or a tight
    deadline: the classifier puts them on realtime by itself until the lane
    holds what its worker runs at once (a batch of 2), then sends the rest to
    medium. A request that asks for realtime right after is still taken
    there (the room up to the refusal mark is kept for it), and every one
    of the nine is answered."""
    await gate_knows_the_realtime_workers(settings)
    burst = [
        await client.submit(
            {
                "id": f"spill-{i}-{uuid.uuid4().hex[:6]}",
                "prompt": f"What is the capital of {country}?",
                "max_tokens": 16,
                "metadata": NO_CACHE,
            }
        )
        for i, country in enumerate(CAPITALS)
    ]
    asked = await client.submit(
        {
            "id": f"asked-{uuid.uuid4().hex[:6]}",
            "prompt": "Name a fruit.",
            "lane": "realtime",
            "max_tokens": 8,
            "metadata": NO_CACHE,
        }
    )
    results = await asyncio.wait_for(asyncio.gather(*burst), 180)
    urgent = await asyncio.wait_for(asked, 60)

    assert all(r.status == "ok" for r in results), [r.error for r in results]
    lanes = [r.lane for r in results]
    assert lanes.count(Lane.MEDIUM) >= 4, lanes  # 6 when nothing drained meanwhile
    assert all(r.path == "light" for r in results if r.lane == Lane.REALTIME), results
    assert (urgent.status, urgent.lane) == ("ok", Lane.REALTIME), urgent
