"""Honest health of a running lane worker (real broker and Redis, the
worker's own ops endpoints): ``/healthz`` fails while its event loop is
wedged and recovers once it runs again; ``/readyz`` stays not ready while
the model of a path it serves cannot load.

The wedge comes from a backend that blocks the loop's thread (as a
synchronous call in async code does); everything else is the worker as
``laneway worker`` runs it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane
from schemas.settings import Settings
from streams.kafka.topics import create_topics
from streams.ops import OpsServer, ProcessState, heartbeat
from tests.integration.conftest import read_topic, routed_now
from tests.unit.streams.test_ops import get
from workers.backends.base import Generation, GenerationInput, Outcome
from workers.execution import BackendSlot, Executor
from workers.lane_worker import LaneWorker

WEDGE = "wedge the loop"


class Wedging:
    """Answers at once, except that a request asking for ``WEDGE`` holds the
    event loop's thread for ``seconds``."""

    kind = "wedging"
    model = "wedge"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def load(self) -> None: ...

    async def infer_batch(self, inputs: Sequence[GenerationInput]) -> list[Outcome]:
        if any(WEDGE in m.content for i in inputs for m in i.messages):
            time.sleep(self.seconds)  # noqa: ASYNC251 - the wedge under test
        return [Generation(text="done", prompt_tokens=1, completion_tokens=1) for _ in inputs]

    async def check_health(self) -> bool:
        return True

    async def close(self) -> None: ...


async def own_topics(settings: Settings) -> Settings:
    prefix = f"h{uuid.uuid4().hex[:8]}"
    kafka = settings.kafka.model_copy(update={"topic_prefix": prefix})
    own = settings.model_copy(update={"kafka": kafka, "app_id": prefix})
    await create_topics(own)
    return own


async def test_healthz_fails_while_a_workers_loop_is_wedged_and_recovers(
    settings: Settings,
) -> None:
    own = await own_topics(settings)
    state = ProcessState(stall_s=1.0)
    ops = OpsServer("127.0.0.1", 0, state).start()
    slot = BackendSlot(lambda: Wedging(4.0), retry_s=60, label="light=wedging:wedge")
    worker = LaneWorker(
        own, Lane.REALTIME, state, executor=Executor(Lane.REALTIME, {AnswerPath.LIGHT: slot})
    )
    await worker.start()
    beats = asyncio.create_task(heartbeat(state, interval_s=0.2))
    runner = asyncio.create_task(worker.run())
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def watch() -> None:  # another thread, as a kubelet's probe is another process
        while not done.is_set():
            seen.append(get(ops.port, "/healthz"))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    try:
        await asyncio.sleep(0.5)
        assert await asyncio.to_thread(get, ops.port, "/healthz") == (200, "ok\n")
        assert (await asyncio.to_thread(get, ops.port, "/readyz"))[0] == 200
        watcher.start()
        request = InferenceRequest(id=f"wedge-{uuid.uuid4().hex[:6]}", prompt=WEDGE)
        routed = routed_now(request, own.replies_topic, path=AnswerPath.LIGHT, lane=Lane.REALTIME)
        producer = AIOKafkaProducer(**own.kafka.client_options())
        await producer.start()
        try:
            await producer.send_and_wait(
                own.lane_topic(Lane.REALTIME), routed.model_dump_json().encode()
            )
        finally:
            await producer.stop()
        replies: list[InferenceResult] = []
        for _ in range(60):  # bounded: a minute
            replies = [
                InferenceResult.model_validate_json(r.value)
                for r in await read_topic(own, own.replies_topic, timeout_s=1)
            ]
            if replies:
                break
        await asyncio.sleep(1.0)  # beating again: the watcher sees the recovery
    finally:
        done.set()
        if watcher.is_alive():
            await asyncio.to_thread(watcher.join)
        worker.stop()
        await asyncio.wait_for(runner, 30)
        beats.cancel()
        await worker.close()
        ops.close()

    assert [(r.id, r.status, r.output) for r in replies] == [(request.id, "ok", "done")]
    stalled = [body for code, body in seen if code == 503]
    assert seen[0] == (200, "ok\n"), seen  # alive before the wedge,
    assert stalled and all("event loop stalled" in body for body in stalled), seen  # not during,
    assert seen[-1] == (200, "ok\n"), seen  # and alive again after it


async def test_readyz_is_not_ready_while_a_served_model_cannot_load(settings: Settings) -> None:
    own = await own_topics(settings)
    state = ProcessState()
    ops = OpsServer("127.0.0.1", 0, state).start()

    def load() -> Wedging:
        raise FileNotFoundError("no model file at /models/missing.gguf")

    slot = BackendSlot(load, retry_s=60, label="light=llamacpp:missing")
    worker = LaneWorker(
        own, Lane.REALTIME, state, executor=Executor(Lane.REALTIME, {AnswerPath.LIGHT: slot})
    )
    try:
        await worker.start()
        code, body = await asyncio.to_thread(get, ops.port, "/readyz")
        assert code == 503 and "not ready" in body and "missing.gguf" in body, body
        assert (await asyncio.to_thread(get, ops.port, "/healthz"))[0] == 200  # alive, not ready
    finally:
        await worker.close()
        ops.close()
