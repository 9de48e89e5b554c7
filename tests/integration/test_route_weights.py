"""The quality loop closes: a light backend that fails loses its traffic
within a bounded number of requests, and wins it back once it recovers.

The light path is an OpenAI-compatible ``llama_cpp.server`` this test
starts and stops; the heavy path is Gemma in llama.cpp. Cache off, so every
request reaches the router.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest

from schemas.messages import AnswerPath, InferenceResult, Lane
from streams.classify.router import RouteBoard
from streams.client import LanewayClient
from streams.devstack.embedded import free_port
from streams.devstack.supervisor import Stack

from .conftest import own_stack
from .servers import llama_cpp_server

PROMPTS = ["Name a colour.", "Name a fruit.", "Name an animal.", "Name a city.", "Name a tree."]


class LightServer:
    """The light backend's server, stoppable and restartable on one port."""

    def __init__(self) -> None:
        self.port = free_port()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        started, self._stop = threading.Event(), threading.Event()
        stop = self._stop

        def serve() -> None:
            with llama_cpp_server(self.port):
                started.set()
                stop.wait()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        assert started.wait(90), "llama_cpp.server did not start"

    def stop(self) -> None:
        if self._stop is not None and self._thread is not None:
            self._stop.set()
            self._thread.join(30)


@pytest.fixture(scope="module")
def light() -> Iterator[LightServer]:
    server = LightServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def weighted(light: LightServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack with only the realtime worker."""
    prefix = f"weights-{uuid.uuid4().hex[:8]}"
    env = {
        "LANEWAY_APP_ID": prefix,
        "LANEWAY_REDIS_KEY_PREFIX": prefix,
        "LANEWAY_BACKEND_LIGHT": "openai",
        "LANEWAY_BACKEND_LIGHT_MODEL": "smollm2",
        "LANEWAY_BACKEND_OPENAI_BASE_URL": light.url,
        "LANEWAY_BACKEND_OPENAI_TIMEOUT_S": "5",
        "LANEWAY_BACKEND_BREAKER_COOLDOWN_S": "2",
        # The one worker serves both paths, so the router has a choice to make.
        "LANEWAY_REALTIME_PATHS": '["light", "heavy"]',
        "LANEWAY_CACHE_ENABLED": "false",
        "LANEWAY_ROUTING_EXPLORATION": "0.15",
        # Scored on cost and success only: Gemma decoding in the worker answers
        # four tokens faster than a server across HTTP, and would win on latency
        # alone; the cheaper light path must win while healthy.
        "LANEWAY_ROUTING_W_LAT": "0",
        "LANEWAY_ROUTING_SUCCESS_WINDOW": "10",
    }
    yield from own_stack(tmp_path_factory.mktemp("weights"), env, lanes=(Lane.REALTIME,))


async def ask_many(client: LanewayClient, n: int) -> list[InferenceResult]:
    results = []
    for i in range(n):
        result = await client.ask(PROMPTS[i % len(PROMPTS)], max_tokens=4, timeout_s=120)
        assert result.status == "ok", result  # a fallback always answers
        results.append(result)
        await asyncio.sleep(0.3)  # give the quality loop its turn, as real traffic would
    return results


def scored(results: list[InferenceResult]) -> list[str]:
    """The path the router chose on its score for each result, leaving out
    the ones it sent down another path to explore (a degraded answer names
    the path it was meant for)."""
    return [str(r.requested_path or r.path) for r in results if not r.explored]


async def test_a_failing_path_loses_its_traffic_and_wins_it_back(
    weighted: Stack, light: LightServer
) -> None:
    settings = weighted.settings
    asked = 0
    board = RouteBoard(settings.redis.client(), settings.redis.key_prefix)
    async with LanewayClient(settings.kafka, client_id="weights") as client:
        healthy = scored(await ask_many(client, 8))
        asked += 8
        assert len(healthy) >= 3 and set(healthy) == {"light"}, healthy

        light.stop()
        failing = scored(await ask_many(client, 20))
        asked += 20
        # Within 20 requests the router stops choosing light on its score.
        assert len(failing) >= 8 and "light" not in failing[-4:], failing
        stats = await board.refresh()
        assert stats[AnswerPath.LIGHT].success_rate < settings.routing.min_success_rate

        light.start()
        # Exploration keeps sampling light; each success heals its record.
        for _ in range(15):  # bounded: at most 150 requests
            await ask_many(client, 10)
            asked += 10
            stats = await board.refresh()
            if stats[AnswerPath.LIGHT].success_rate >= settings.routing.min_success_rate:
                break
        assert stats[AnswerPath.LIGHT].success_rate >= settings.routing.min_success_rate, stats
        # Healthy again, light wins on its score once the classifier has
        # re-read the statistics (every weights_refresh_s, two hops from here).
        await asyncio.sleep(3 * settings.routing.weights_refresh_s)
        back: list[str] = []
        for _ in range(4):  # bounded: at most 40 requests
            back += scored(await ask_many(client, 10))
            asked += 10
            if len(back) >= 4 and set(back[-4:]) == {"light"}:
                break
        assert len(back) >= 4 and set(back[-4:]) == {"light"}, (back, await board.refresh())
    # The router's /metrics counts every event it folded: at least one
    # result per request asked (the failed attempts come on top).
    folded = 0.0
    for _ in range(60):  # bounded: 30 s for the loop's last batches
        folded = weighted.metric_total("laneway_quality_events_total", "router")
        if folded >= asked:
            break
        await asyncio.sleep(0.5)
    assert folded >= asked, (folded, asked)
    print(f"\nscored choices: healthy {healthy}; failing {failing}; recovered {back}")
