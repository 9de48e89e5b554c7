"""Identical requests on two workers run once (``workers.claims``), on a real
broker and Redis: the realtime and the medium worker each get a copy of one
question, and the second waits for the first's answer in the cache."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from schemas.errors import BackendUnavailable
from schemas.messages import AnswerPath, InferenceResult, Lane
from schemas.settings import BackendSettings, Settings
from streams.cache.keys import cache_key
from streams.cache.response import ResponseCache
from streams.kafka.topics import create_topics
from streams.stores.sessions import context_digest
from tests.integration.conftest import fetch_lane_records, produce_to_lane, routed_now
from tests.integration.test_coalesce import (
    CountingExecutor,
    HeldExecutor,
    ask,
    results_by_id,
    until_started,
)
from workers.claims import DecodeClaims
from workers.execution import backend_slots
from workers.lane_worker import LaneWorker

RULES = BackendSettings(light="rules", heavy="rules")
NOTHING = BackendSettings(light="openai", heavy="openai", openai_base_url="http://127.0.0.1:9/v1")


@dataclass
class Stack:
    settings: Settings
    redis: aioredis.Redis


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    """Topics and a Redis key prefix of their own."""
    prefix = f"cl{uuid.uuid4().hex[:8]}"
    kafka = settings.kafka.model_copy(update={"topic_prefix": prefix})
    redis_settings = settings.redis.model_copy(update={"key_prefix": prefix})
    own = settings.model_copy(
        update={"kafka": kafka, "redis": redis_settings, "app_id": prefix, "max_attempts": 1}
    )
    await create_topics(own)
    client = own.redis.client()
    try:
        yield Stack(own, client)
    finally:
        keys = [key async for key in client.scan_iter(f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def started(stack: Stack, lane: Lane, executor: CountingExecutor) -> LaneWorker:
    """A worker as ``laneway worker`` builds it: the cache it stores its
    answers in, and its marks."""
    own = stack.settings
    prefix = own.redis.key_prefix
    cache = ResponseCache(stack.redis, own.cache, key_prefix=prefix, embedder=None)
    claims = DecodeClaims(stack.redis, prefix=prefix, ttl_s=own.cache.claim_ttl_s, lane=lane)
    worker = LaneWorker(own, lane, executor=executor, cache=cache, claims=claims)
    await worker.start()
    return worker


async def one_question_on_two_workers(
    stack: Stack,
    first_backend: BackendSettings,
    deadline_in_ms: int | None = None,
    lanes: tuple[Lane, Lane] = (Lane.REALTIME, Lane.MEDIUM),
) -> tuple[list[str], CountingExecutor, dict[str, InferenceResult]]:
    """ "ping" on the first lane, decoded by a worker that holds its batch
    until told; "PING" (one question to the cache) on the second, taken by
    a second worker while the first decodes. Returns what the second had
    started by the time the first was let go, its executor and the results."""
    own = stack.settings
    held = HeldExecutor(lanes[0], backend_slots(first_backend))
    counting = CountingExecutor(lanes[1], backend_slots(RULES))
    first = await started(stack, lanes[0], held)
    second = await started(stack, lanes[1], counting)
    try:
        await produce_to_lane(
            own, routed_now(ask("first", "ping"), own.replies_topic, lane=lanes[0])
        )
        decoding = asyncio.create_task(first.process(await fetch_lane_records(first, 1)))
        await until_started(held)
        routed = routed_now(
            ask("second", "PING"), own.replies_topic, lane=lanes[1], deadline_in_ms=deadline_in_ms
        )
        await produce_to_lane(own, routed)
        waiting = asyncio.create_task(second.process(await fetch_lane_records(second, 1)))
        await asyncio.sleep(1.0)  # time enough to start decoding, were it to
        seen = list(counting.ran)
        held.release.set()
        await asyncio.gather(decoding, waiting)
    finally:
        held.release.set()
        await first.close()
        await second.close()
    return seen, counting, await results_by_id(own)


async def test_a_question_another_worker_decodes_waits_for_its_answer(stack: Stack) -> None:
    seen, medium, results = await one_question_on_two_workers(stack, RULES)
    assert seen == [] and medium.ran == [], "the medium worker decodes nothing"
    assert results["first"].path == AnswerPath.LIGHT
    assert results["second"].status == "ok"
    assert results["second"].output == results["first"].output == "pong"
    assert results["second"].path == AnswerPath.CACHE
    assert results["second"].model == f"cache:exact:{results['first'].model}"
    assert results["second"].lane == Lane.MEDIUM
    prefix = stack.settings.redis.key_prefix
    left = [key async for key in stack.redis.scan_iter(f"{prefix}:cache:busy:*")]
    assert left == [], "every mark let go once its answer was stored"


async def test_a_realtime_copy_never_waits_for_a_slower_lane(stack: Stack) -> None:
    lanes = (Lane.MEDIUM, Lane.REALTIME)
    seen, _, results = await one_question_on_two_workers(stack, RULES, lanes=lanes)
    assert seen == ["second"], "it decodes its own at once"
    assert results["second"].status == "ok" and results["second"].path == AnswerPath.LIGHT


async def test_a_failed_decode_on_another_worker_hands_nothing_on(stack: Stack) -> None:
    seen, medium, results = await one_question_on_two_workers(stack, NOTHING)
    assert seen == []
    assert medium.ran == ["second"], "it runs its own once the first let go without an answer"
    error = results["first"].error
    assert error is not None and error.code == BackendUnavailable.code
    assert results["second"].status == "ok" and results["second"].path == AnswerPath.LIGHT


async def test_a_request_waits_at_most_half_the_time_its_deadline_leaves(stack: Stack) -> None:
    # 1.5 s to go, less the fetch: it waits under 0.75 s, then decodes its
    # own while the first is still held.
    seen, _, results = await one_question_on_two_workers(stack, RULES, deadline_in_ms=1_500)
    assert seen == ["second"]
    assert results["second"].status == "ok" and results["second"].path == AnswerPath.LIGHT


async def test_a_mark_goes_when_its_decode_ends_not_when_its_batch_does(stack: Stack) -> None:
    # The medium batch decodes "hello" and waits for "ping", which the
    # realtime worker holds. A bulk request asking "Hello" gets the medium
    # answer meanwhile: had the medium batch kept its mark (or its answer)
    # until it ended, the bulk one would wait for "ping" too, and two
    # workers that hold what the other wants would each wait on the other.
    own = stack.settings
    held = HeldExecutor(Lane.REALTIME, backend_slots(RULES))
    counting = CountingExecutor(Lane.MEDIUM, backend_slots(RULES))
    last = CountingExecutor(Lane.BULK, backend_slots(RULES))
    realtime = await started(stack, Lane.REALTIME, held)
    medium = await started(stack, Lane.MEDIUM, counting)
    bulk = await started(stack, Lane.BULK, last)
    try:
        await produce_to_lane(own, routed_now(ask("r", "ping"), own.replies_topic))
        decoding = asyncio.create_task(realtime.process(await fetch_lane_records(realtime, 1)))
        await until_started(held)
        for rid, prompt in (("m1", "hello"), ("m2", "PING")):
            routed = routed_now(ask(rid, prompt), own.replies_topic, lane=Lane.MEDIUM)
            await produce_to_lane(own, routed)
        both = asyncio.create_task(medium.process(await fetch_lane_records(medium, 2)))
        await until_started(counting)
        routed = routed_now(ask("b", "Hello"), own.replies_topic, lane=Lane.BULK)
        await produce_to_lane(own, routed)
        await asyncio.wait_for(bulk.process(await fetch_lane_records(bulk, 1)), timeout=10)
        assert last.ran == [], "the bulk worker decodes nothing"
        assert not decoding.done() and not both.done()
        held.release.set()
        await asyncio.gather(decoding, both)
    finally:
        held.release.set()
        for worker in (realtime, medium, bulk):
            await worker.close()
    results = await results_by_id(own)
    assert counting.ran == ["m1"]
    assert all(r.status == "ok" for r in results.values())
    assert results["b"].path == results["m2"].path == AnswerPath.CACHE
    assert results["b"].output == results["m1"].output


async def test_a_mark_left_by_a_dead_worker_holds_no_longer_than_its_ttl(stack: Stack) -> None:
    own = stack.settings
    request = ask("m", "ping")
    mark = f"{own.redis.key_prefix}:cache:busy:{cache_key(request, own.cache, context_digest([]))}"
    counting = CountingExecutor(Lane.MEDIUM, backend_slots(RULES))
    medium = await started(stack, Lane.MEDIUM, counting)
    try:
        await produce_to_lane(own, routed_now(request, own.replies_topic, lane=Lane.MEDIUM))
        records = await fetch_lane_records(medium, 1)
        # A medium worker's mark (a worker that died mid-decode), 1.5 s to live.
        await stack.redis.set(mark, "medium:gone", px=1_500)
        began = time.monotonic()
        await medium.process(records)
        took = time.monotonic() - began
    finally:
        await medium.close()
    assert took >= 1.3, "it waited for the mark"
    assert counting.ran == ["m"], "then ran its own"
    result = (await results_by_id(own))["m"]
    assert result.status == "ok" and result.path == AnswerPath.LIGHT


async def test_copies_whose_answer_never_came_run_once_for_them_all(stack: Stack) -> None:
    """Three copies of one question in a medium batch wait on a dead
    worker's mark; when it expires with no answer in the cache, one of them
    decodes and the other two share its answer (before, each decoded)."""
    own = stack.settings
    copies = [ask("m1", "ping"), ask("m2", "PING"), ask("m3", "Ping")]
    key = cache_key(copies[0], own.cache, context_digest([]))
    mark = f"{own.redis.key_prefix}:cache:busy:{key}"
    counting = CountingExecutor(Lane.MEDIUM, backend_slots(RULES))
    medium = await started(stack, Lane.MEDIUM, counting)
    try:
        for request in copies:  # one partition, so m1 comes first
            routed = routed_now(request, own.replies_topic, lane=Lane.MEDIUM)
            await produce_to_lane(own, routed, key="m1")
        records = await fetch_lane_records(medium, len(copies))
        await stack.redis.set(mark, "medium:gone", px=1_000)
        await medium.process(records)
    finally:
        await medium.close()
    assert counting.ran == ["m1"], "one decode for the three copies"
    results = await results_by_id(own)
    assert [results[rid].status for rid in ("m1", "m2", "m3")] == ["ok"] * 3
    assert results["m1"].path == AnswerPath.LIGHT
    assert results["m2"].output == results["m3"].output == results["m1"].output
    assert results["m2"].path == results["m3"].path == AnswerPath.CACHE


async def test_a_decode_whose_answer_another_worker_stored_stops_and_answers_from_it(
    stack: Stack,
) -> None:
    """A medium worker decodes a long answer (about 9 s on SmolLM2) when
    another worker stores its answer to the same question (a realtime copy,
    which never waits on a slower lane's mark): the medium decode stops and
    its request is answered from the cache."""
    own = stack.settings
    story = "Write a long story about a dragon who learns to bake bread."
    request, copy = ask("m", story, max_tokens=400), ask("r", story, max_tokens=400)
    counting = CountingExecutor(Lane.MEDIUM, backend_slots(BackendSettings(heavy="rules")))
    medium = await started(stack, Lane.MEDIUM, counting)
    stopped = REGISTRY.get_sample_value("laneway_decodes_stopped_total", {"lane": "medium"}) or 0
    try:
        await produce_to_lane(own, routed_now(request, own.replies_topic, lane=Lane.MEDIUM))
        decoding = asyncio.create_task(medium.process(await fetch_lane_records(medium, 1)))
        await until_started(counting)
        await asyncio.sleep(0.5)
        assert not decoding.done()
        cache = ResponseCache(
            stack.redis, own.cache, key_prefix=own.redis.key_prefix, embedder=None
        )
        theirs = InferenceResult(
            id="r",
            status="ok",
            output="Once upon a time, a dragon baked bread.",
            lane=Lane.REALTIME,
            path=AnswerPath.LIGHT,
            model="llamacpp:smollm2-135m",
        )
        assert await cache.store(copy, theirs, context_digest([]))
        await asyncio.wait_for(decoding, timeout=30)
    finally:
        await medium.close()
    assert counting.ran == ["m"]
    result = (await results_by_id(own))["m"]
    assert result.status == "ok" and result.path == AnswerPath.CACHE
    assert result.output == theirs.output
    assert result.model == "cache:exact:llamacpp:smollm2-135m"
    after = REGISTRY.get_sample_value("laneway_decodes_stopped_total", {"lane": "medium"})
    assert after == stopped + 1


async def test_marks_set_by_a_claim_cancelled_mid_flight_are_let_go(stack: Stack) -> None:
    """A batch cancelled while its marks are being set (a drain past its
    timeout) lets go of whichever reached Redis, wherever the cancel lands:
    no copy on another worker waits for a mark that nobody will delete."""
    prefix = stack.settings.redis.key_prefix
    claims = DecodeClaims(stack.redis, prefix=prefix, ttl_s=60, lane=Lane.MEDIUM)
    for steps in range(16):
        keys: dict[int, str | None] = {0: f"q{steps}a", 1: f"q{steps}b"}
        marked: list[str] = []
        marking = asyncio.create_task(claims.mark(keys, marked))
        for _ in range(steps):
            await asyncio.sleep(0)
        marking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await marking
        await claims.let_go(marked)  # as the batch runner's ``finally`` does
        left = [key async for key in stack.redis.scan_iter(f"{prefix}:cache:busy:*")]
        assert left == [], f"cancelled after {steps} steps"
