"""The response cache against a real Redis and the real all-MiniLM-L6-v2 model.

Needs only Redis (``LANEWAY_REDIS_URL``, else an embedded Valkey), not the
stack: every test uses its own key prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from schemas.messages import AnswerPath, ErrorInfo, InferenceRequest, InferenceResult, Usage
from schemas.settings import CacheSettings
from streams.cache.embedding import MiniLMEmbedder
from streams.cache.response import LOOKUPS, STORES, ResponseCache
from streams.ops import REDIS_ERRORS
from streams.stores.rounds import Round


def req(prompt: str, **fields: Any) -> InferenceRequest:
    return InferenceRequest(
        id=fields.pop("id", f"r-{uuid.uuid4().hex[:8]}"), prompt=prompt, **fields
    )


def answer(
    request: InferenceRequest, output: str | None = "Use the reset link.", **fields: Any
) -> InferenceResult:
    values: dict[str, Any] = {"id": request.id, "status": "ok", "output": output}
    values.update({"path": AnswerPath.LIGHT, "model": "smollm2-135m"}, **fields)
    return InferenceResult(**values)


def count(metric: Any, label: str) -> float:
    return float(metric.labels(label)._value.get())


@pytest.fixture
def make_cache(redis_client: aioredis.Redis, prefix: str) -> Any:
    def make(embedder: MiniLMEmbedder | None, **settings: Any) -> ResponseCache:
        return ResponseCache(
            redis_client, CacheSettings(**settings), key_prefix=prefix, embedder=embedder
        )

    return make


async def test_store_then_exact_hit(make_cache: Any, minilm: MiniLMEmbedder) -> None:
    cache = make_cache(minilm)
    question = req("How do I reset my password?")
    assert await cache.lookup(question) is None
    before = count(LOOKUPS, "exact")
    assert await cache.store(question, answer(question, model="gemma3-270m", path=AnswerPath.HEAVY))

    hit = await cache.lookup(req("  how do I RESET my password "))
    assert hit is not None
    assert (hit.kind, hit.similarity, hit.output) == ("exact", 1.0, "Use the reset link.")
    assert (hit.model, hit.path) == ("gemma3-270m", AnswerPath.HEAVY)
    assert count(LOOKUPS, "exact") == before + 1
    # Another budget class or another context is another question.
    assert await cache.lookup(req("How do I reset my password?", max_tokens=2000)) is None
    assert await cache.lookup(question, context="user: on the mobile app") is None


async def test_store_is_idempotent(
    make_cache: Any, redis_client: aioredis.Redis, prefix: str
) -> None:
    cache = make_cache(None)
    question = req("What are your opening hours?")
    assert await cache.store(question, answer(question, "9 to 5"))
    assert await cache.store(question, answer(question, "9 to 5"))
    assert await redis_client.zcard(f"{prefix}:{{cache}}:index") == 1
    ttl = await redis_client.ttl(cache.entry_key((await cache.lookup(question)).key))
    assert 0 < ttl <= CacheSettings().ttl_s


async def test_an_answer_about_today_is_kept_for_an_hour_not_a_day(
    make_cache: Any, redis_client: aioredis.Redis
) -> None:
    cache = make_cache(None)
    today, always = req("What is on today's menu?"), req("What is on the menu?")
    for question in (today, always):
        assert await cache.store(question, answer(question, "Soup."))

    async def ttl_of(question: InferenceRequest) -> int:
        hit = await cache.lookup(question)
        assert hit is not None
        return int(await redis_client.ttl(cache.entry_key(hit.key)))

    settings = CacheSettings()
    assert 0 < await ttl_of(today) <= settings.relative_time_ttl_s < settings.ttl_s
    assert settings.relative_time_ttl_s < await ttl_of(always) <= settings.ttl_s
    # Never longer than the cache's own lifetime.
    assert make_cache(None, ttl_s=600, relative_time_ttl_s=3_600).lifetime_s("today") == 600


async def test_paraphrase_hits_a_second_instance_after_sync(
    make_cache: Any, redis_client: aioredis.Redis, minilm: MiniLMEmbedder
) -> None:
    # A worker without an embedder stores; the classifier's cache embeds on sync.
    worker = make_cache(None)
    question = req("How do I reset my password?")
    assert await worker.store(question, answer(question))
    assert await worker.sync() == 0  # nothing to index without an embedder

    classifier = make_cache(minilm)
    assert await classifier.lookup(req("how can I reset my password")) is None  # not synced yet
    assert await classifier.sync() == 1
    assert classifier.index_size == 1
    hit = await classifier.lookup(req("how can I reset my password"))
    assert hit is not None and hit.kind == "semantic"
    assert hit.similarity > 0.95 and hit.output == "Use the reset link."
    assert hit.key == (await classifier.lookup(question)).key  # the stored entry
    assert await redis_client.hexists(classifier.entry_key(hit.key), "vec")  # written back

    # A restarted classifier rebuilds its index from Redis alone.
    restarted = make_cache(minilm)
    assert await restarted.sync() == 1
    assert await restarted.sync() == 0  # nothing new since
    hit = await restarted.lookup(req("I forgot my password, how do I reset it?"))
    assert hit is not None and hit.kind == "semantic" and hit.similarity > 0.9


async def test_stores_by_one_instance_reach_anothers_index_incrementally(
    make_cache: Any, minilm: MiniLMEmbedder
) -> None:
    first, second = make_cache(minilm), make_cache(minilm)
    assert await second.sync() == 0
    question = req("How do I cancel my subscription?")
    assert await first.store(question, answer(question, "Settings, then Cancel."))
    assert first.index_size == 1  # its own store is indexed at once
    assert await second.sync() == 1
    hit = await second.lookup(req("How can I cancel my subscription?"))
    assert hit is not None and hit.kind == "semantic" and hit.output == "Settings, then Cancel."


async def test_below_threshold_and_unrelated_questions_miss(
    make_cache: Any, minilm: MiniLMEmbedder
) -> None:
    cache = make_cache(minilm)
    question = req("How do I cancel my subscription?")
    assert await cache.store(question, answer(question))
    assert await cache.lookup(req("How do I upgrade my subscription?")) is None  # 0.64
    assert await cache.lookup(req("What is the capital of France?")) is None
    assert await cache.lookup(req("How can I cancel my subscription?")) is not None


async def test_different_order_numbers_never_share_an_answer(
    make_cache: Any, minilm: MiniLMEmbedder
) -> None:
    cache = make_cache(minilm, threshold=0.5)
    for prompt, status in [
        ("Where is order 123?", "Order 123 shipped."),
        ("Where is my order 12345?", "Order 12345 is packed."),
    ]:
        question = req(prompt)
        assert await cache.store(question, answer(question, status))
    assert await cache.lookup(req("Where is order 456?")) is None
    assert await cache.lookup(req("Where is my order 12346?")) is None
    hit = await cache.lookup(req("where's my order 12345"))
    assert hit is not None and hit.output == "Order 12345 is packed."


async def test_a_swapped_direction_never_shares_an_answer(
    make_cache: Any, minilm: MiniLMEmbedder
) -> None:
    """In lower case no entity tells the two apart, and their embeddings are
    0.99 alike; the word-order guard refuses the hit, in the instance that
    stored the entry and in one that read it from Redis, one by one and in a
    batch."""
    cache = make_cache(minilm)
    question = req("how do i convert celsius to fahrenheit?")
    assert await cache.store(question, answer(question, "Multiply by 9/5, then add 32."))
    other = make_cache(minilm)
    assert await other.sync() == 1
    for instance in (cache, other):
        swapped, paraphrase = (
            req("how do i convert fahrenheit to celsius?"),
            req("how can i convert celsius to fahrenheit"),
        )
        assert await instance.lookup(swapped) is None
        hit = await instance.lookup(paraphrase)
        assert hit is not None and hit.kind == "semantic"
        # The batch classifier's path: one embedding call for both.
        missed, found = await instance.semantic_many(
            [instance.probe(swapped), instance.probe(paraphrase)]
        )
        assert missed is None and found is not None and found.key == hit.key


async def test_unsafe_answers_are_never_stored(
    make_cache: Any, redis_client: aioredis.Redis, prefix: str
) -> None:
    cache = make_cache(None)
    question = req("How do I reset my password?")
    error = ErrorInfo(code="INF-503", message="inference timed out", retryable=True)
    before = count(STORES, "skipped")
    refused = [
        (question, answer(question, status="error", output=None, error=error)),
        (req("How do I reset my password?", temperature=0.7), None),
        (req("How do I reset my password?", metadata={"cache": "no-store"}), None),
        (question, answer(question, degraded=True, requested_path=AnswerPath.HEAVY)),
        (question, answer(question, path=AnswerPath.RULES)),
        (question, answer(question, path=AnswerPath.CACHE)),
        (question, answer(question, "")),
    ]
    for request, result in refused:
        assert not await cache.store(request, result or answer(request))
    assert count(STORES, "skipped") == before + len(refused)
    assert [key async for key in redis_client.scan_iter(match=f"{prefix}:*")] == []


async def test_bypass_is_never_read(make_cache: Any, minilm: MiniLMEmbedder) -> None:
    cache = make_cache(minilm)
    question = req("What are your opening hours?")
    assert await cache.store(question, answer(question, "9 to 5"))
    before = count(LOOKUPS, "bypass")
    assert (
        await cache.lookup(req("What are your opening hours?", metadata={"cache": "bypass"}))
        is None
    )
    assert await cache.lookup(req("What are your opening hours?", temperature=0.8)) is None
    assert count(LOOKUPS, "bypass") == before + 2
    assert await cache.lookup(question) is not None


async def test_expired_entries_are_not_served_and_leave_the_index(
    make_cache: Any, minilm: MiniLMEmbedder
) -> None:
    cache = make_cache(minilm, ttl_s=1)
    question = req("Explain photosynthesis in simple terms")
    assert await cache.store(question, answer(question, "Plants make sugar from light."))
    assert (await cache.lookup(req("explain photosynthesis simply"))) is not None
    await asyncio.sleep(1.3)
    assert await cache.lookup(question) is None
    assert await cache.lookup(req("explain photosynthesis simply")) is None
    await cache.sync()
    assert cache.index_size == 0


async def test_index_and_entries_are_bounded(
    make_cache: Any, redis_client: aioredis.Redis, prefix: str, minilm: MiniLMEmbedder
) -> None:
    cache = make_cache(minilm, max_entries=3)
    questions = [req(f"What is fact number {n}?") for n in range(5)]
    for question in questions:
        assert await cache.store(question, answer(question, f"fact {question.prompt}"))
    assert await redis_client.zcard(f"{prefix}:{{cache}}:index") == 3
    assert cache.index_size == 3
    assert await cache.lookup(questions[0]) is None  # trimmed, entry deleted too
    assert await cache.lookup(questions[4]) is not None
    entries = [key async for key in redis_client.scan_iter(match=f"{prefix}:{{cache}}:e:*")]
    assert len(entries) == 3


async def test_per_tenant_entries_stay_apart(make_cache: Any, minilm: MiniLMEmbedder) -> None:
    cache = make_cache(minilm, per_tenant=True)
    question = req("How do I reset my password?", tenant="acme")
    assert await cache.store(question, answer(question))
    assert await cache.lookup(req("How do I reset my password?", tenant="globex")) is None
    assert await cache.lookup(req("how can I reset my password", tenant="globex")) is None
    assert await cache.lookup(req("how can I reset my password", tenant="acme")) is not None


async def test_dead_redis_fails_open_fast(minilm: MiniLMEmbedder) -> None:
    dead = aioredis.from_url(
        "redis://127.0.0.1:1/0", socket_timeout=0.2, socket_connect_timeout=0.2
    )
    cache = ResponseCache(dead, CacheSettings(), key_prefix="test-dead", embedder=minilm)
    question = req("How do I reset my password?")
    errors = count(REDIS_ERRORS, "cache")
    lookup_errors, store_errors = count(LOOKUPS, "error"), count(STORES, "error")
    try:
        assert await cache.lookup(question) is None
        started = time.perf_counter()
        assert await cache.store(question, answer(question)) is False
        assert await cache.lookup(question) is None
        assert await cache.sync() == 0
        assert time.perf_counter() - started < 0.1  # Redis left alone after the failure
    finally:
        await cache.close()
        await dead.aclose()
    assert count(REDIS_ERRORS, "cache") == errors + 1
    assert count(LOOKUPS, "error") == lookup_errors + 2
    assert count(STORES, "error") == store_errors + 1


async def test_an_entry_keeps_its_models_token_count_and_old_entries_read_without(
    make_cache: Any, redis_client: aioredis.Redis
) -> None:
    cache = make_cache(None)
    question = req("How long does shipping take?")
    result = answer(
        question, "Three to five days.", usage=Usage(prompt_tokens=9, completion_tokens=6)
    )
    assert await cache.store(question, result)
    hit = await cache.lookup(question)
    assert hit is not None and hit.completion_tokens == 6
    round_ = Round(redis_client)  # the batch classifier's read, one script for the batch
    at = cache.queue_exact(round_, [hit.key])
    assert cache.exact_from((await round_.run())[at], [hit.key])[hit.key].completion_tokens == 6
    # An entry a worker stored before the count was kept: read as before, count unknown.
    await redis_client.hdel(cache.entry_key(hit.key), "completion_tokens")
    old = await cache.lookup(question)
    assert old is not None and old.output == "Three to five days." and old.completion_tokens is None


async def test_an_entry_keeps_why_its_answer_ended(
    make_cache: Any, redis_client: aioredis.Redis
) -> None:
    cache = make_cache(None)
    cut, whole = req("Tell me about your return policy."), req("What are your opening hours?")
    assert await cache.store(
        cut, answer(cut, "Returns are accepted within", finish_reason="length")
    )
    assert await cache.store(whole, answer(whole, "Nine to five.", finish_reason="stop"))
    hits = [await cache.lookup(cut), await cache.lookup(whole)]
    assert [h.finish_reason if h else None for h in hits] == ["length", "stop"]
    round_ = Round(redis_client)  # the batch classifier's read says so too
    keys = [h.key for h in hits if h is not None]
    at = cache.queue_exact(round_, keys)
    found = cache.exact_from((await round_.run())[at], keys)
    assert [found[k].finish_reason for k in keys] == ["length", "stop"]


async def test_a_named_models_answer_is_its_own(make_cache: Any) -> None:
    cache = make_cache(None)
    heavy = req("Why is the sea salty?", model="heavy")
    assert await cache.store(heavy, answer(heavy, "Rivers carry salt.", path=AnswerPath.HEAVY))
    assert await cache.lookup(req("Why is the sea salty?", model="heavy")) is not None
    assert await cache.lookup(req("Why is the sea salty?")) is None
    assert await cache.lookup(req("Why is the sea salty?", model="auto")) is None
    assert await cache.lookup(req("Why is the sea salty?", model="light")) is None
