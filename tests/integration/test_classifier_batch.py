"""The batch classifier against a real Redis and the real all-MiniLM-L6-v2,
and inside a running classifier process on the real broker.

- The pipelined lookups of a batch find what the one-by-one calls find.
- Cheap checks first: a rule-owned request is never embedded.
- Through Kafka: a batch with one invalid record answers it INF-400 (and
  dead-letters it) and the rest normally; a paraphrase asked right after its
  original's answer was stored hits the semantic cache at once (the periodic
  index sync is turned off in this stack, so only the version read in the
  batch's round trip can have brought the entry in).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult
from schemas.settings import (
    CacheSettings,
    RateLimitSettings,
    RedisSettings,
    RoutingSettings,
    RulesSettings,
    Settings,
    TenantLimit,
)
from streams.cache.embedding import MiniLMEmbedder
from streams.cache.response import ResponseCache
from streams.classify.batch import BatchLookups
from streams.classify.classifier import Admitted, SourceRecord, admit
from streams.client import LanewayClient
from streams.rules.rulefile import EXAMPLE_RULES_FILE, RuleSource
from streams.stores.sessions import context_digest

from .conftest import own_stack, read_topic

NOW_MS = 0  # admission below only checks deadlines, and these have none


class CountingEmbedder:
    """MiniLM, counting the texts it embeds."""

    def __init__(self, inner: MiniLMEmbedder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.extend(texts)
        return self.inner.embed(texts)


def _settings(redis_url: str, prefix: str) -> Settings:
    return Settings(
        redis=RedisSettings(url=redis_url, key_prefix=prefix, timeout_s=2),
        rules=RulesSettings(file=EXAMPLE_RULES_FILE),
        routing=RoutingSettings(exploration=0.0),
        ratelimit=RateLimitSettings(tenants={"tiny": TenantLimit(rps=0.01, burst=2)}),
    )


def _admitted(settings: Settings, *bodies: dict[str, Any]) -> list[Admitted]:
    out = []
    for i, body in enumerate(bodies):
        record = SourceRecord(json.dumps(body).encode(), None, NOW_MS, "t", 0, i)
        admitted = admit(record, now_ms=NOW_MS, settings=settings)
        assert isinstance(admitted, Admitted)
        out.append(admitted)
    return out


def _answer(request: InferenceRequest, output: str) -> InferenceResult:
    return InferenceResult(
        id=request.id, status="ok", output=output, path=AnswerPath.LIGHT, model="smollm2-135m"
    )


async def test_pipelined_lookups_find_what_one_by_one_lookups_find(
    redis_url: str, redis_client: aioredis.Redis, prefix: str, minilm: MiniLMEmbedder
) -> None:
    settings = _settings(redis_url, prefix)
    rules = RuleSource.from_settings(settings.rules)
    batch = BatchLookups(settings, redis_client, rules, embedder=minilm)
    # What workers stored earlier, and a conversation under way.
    cached = InferenceRequest(id="c", prompt="Name a large animal that lives in the sea.")
    await batch.cache.store(cached, _answer(cached, "The blue whale."))
    await batch.sessions.append("s1", "t0", "My name is Ann.", "Hello Ann!")
    history = await batch.sessions.history("s1")
    in_context = InferenceRequest(id="x", prompt="What is my name?", session_id="s1")
    await batch.cache.store(in_context, _answer(in_context, "Ann."), context_digest(history))
    await redis_client.hset(
        f"{prefix}:orders:12345", mapping={"status": "shipped", "eta": "Monday"}
    )
    await batch.cache.sync()

    bodies: list[dict[str, Any]] = [
        {"id": "exact", "prompt": "name a large animal that lives in the sea"},
        {"id": "semantic", "prompt": "Name a big animal living in the sea."},
        {"id": "ruled", "prompt": "How do I reset my password?"},  # a rule, before the cache
        {"id": "rule", "prompt": "hello"},
        {"id": "lookup", "prompt": "where is order 12345"},
        {"id": "missing", "prompt": "where is order 99999"},
        {"id": "context", "prompt": "What is my name?", "session_id": "s1"},
        {"id": "routed", "prompt": "Explain why the sky is blue."},
        {
            "id": "bypass",
            "prompt": "Name a large animal that lives in the sea.",
            "metadata": {"cache": "bypass"},
        },
        *({"id": f"tiny-{i}", "prompt": "Explain tides.", "tenant": "tiny"} for i in range(4)),
    ]
    found = await batch.find_many(_admitted(settings, *bodies))

    # The same questions one by one, as the classifier asked them before.
    single = BatchLookups(settings, redis_client, rules, embedder=minilm)
    await single.cache.sync()
    # The rate limit's bucket is shared: refill it for the one-by-one pass.
    await redis_client.delete(f"{prefix}:ratelimit:tiny")
    for admitted, looked in zip(_admitted(settings, *bodies), found, strict=True):
        assert not isinstance(looked, BaseException), looked
        request = admitted.request
        verdict = await single.limiter.check(request.tenant)
        assert looked.verdict.allowed == verdict.allowed, request.id
        if not verdict.allowed:
            continue
        one_history = await single.sessions.history(request.session_id)
        assert looked.history == one_history, request.id
        context = context_digest(one_history)
        hit = await single.cache.lookup(request, context)
        book = rules.book
        text = request.user_text()
        match = book.match(text)
        rule = await book.resolve(match, redis_client, prefix) if match else None
        if hit is not None and hit.kind == "exact":
            assert looked.found.hit == hit, request.id
        elif rule is not None:  # rules now come before the semantic cache
            assert looked.found.rule == rule and looked.found.hit is None, request.id
        else:
            # Embedded in a batch or alone, a vector may differ in its last
            # bits (torch picks kernels by batch shape): the same entry, at
            # the same similarity up to float32 rounding.
            assert looked.found.rule is None, request.id
            assert (looked.found.hit is None) == (hit is None), request.id
            if hit is not None and looked.found.hit is not None:
                assert looked.found.hit.similarity == pytest.approx(hit.similarity, abs=1e-5)
                assert replace(looked.found.hit, similarity=hit.similarity) == hit, request.id
        assert looked.found.intent == book.classify(text)[0]
        assert looked.found.history_turns == len(one_history)

    by_id = {a.request.id: f for a, f in zip(_admitted(settings, *bodies), found, strict=True)}
    assert by_id["exact"].found.hit.kind == "exact"  # type: ignore[union-attr]
    assert by_id["semantic"].found.hit.kind == "semantic"  # type: ignore[union-attr]
    assert by_id["context"].found.hit.output == "Ann."  # type: ignore[union-attr]
    assert by_id["ruled"].found.rule.rule == "password_reset"  # type: ignore[union-attr]
    assert by_id["bypass"].found.hit is None  # type: ignore[union-attr]
    assert by_id["lookup"].found.rule.text.startswith("Order 12345 is shipped")  # type: ignore[union-attr]
    assert by_id["missing"].found.rule.text.startswith("I couldn't find order 99999")  # type: ignore[union-attr]
    assert [by_id[f"tiny-{i}"].verdict.allowed for i in range(4)] == [True, True, False, False]  # type: ignore[union-attr]
    assert by_id["tiny-2"].verdict.retry_after_ms > 0  # type: ignore[union-attr]


async def test_a_request_a_rule_owns_is_never_embedded(
    redis_url: str, redis_client: aioredis.Redis, prefix: str, minilm: MiniLMEmbedder
) -> None:
    settings = _settings(redis_url, prefix)
    embedder = CountingEmbedder(minilm)
    batch = BatchLookups(settings, redis_client, RuleSource(None), embedder=embedder)
    cached = InferenceRequest(id="c", prompt="Name a large animal that lives in the sea.")
    await batch.cache.store(cached, _answer(cached, "The blue whale."))
    await batch.cache.sync()
    embedder.texts.clear()
    found = await batch.find_many(
        _admitted(
            settings,
            {"id": "r", "prompt": "hello"},
            {"id": "e", "prompt": "Name a large animal that lives in the sea"},
            {"id": "s", "prompt": "Name a big animal living in the sea."},
            {"id": "s2", "prompt": "Name a big animal living in the sea."},
        )
    )
    assert embedder.texts == ["name a big animal living in the sea"]  # once for the batch
    kinds = [f.found.hit.kind if f.found.hit else f.found.rule.rule for f in found]  # type: ignore[union-attr]
    assert kinds == ["greeting", "exact", "semantic", "semantic"]


async def test_model_bound_requests_are_embedded_once_for_the_learned_router(
    redis_url: str,
    redis_client: aioredis.Redis,
    prefix: str,
    minilm: MiniLMEmbedder,
    tmp_path: Path,
) -> None:
    from streams.routing.learned import BASE_FEATURES, RouterArtifact, save_artifact

    names = list(BASE_FEATURES)
    zeros = [0.0] * len(names)
    artifact = tmp_path / "router.json"
    save_artifact(
        RouterArtifact(
            version="lr-test",
            created="2026-12-03T00:00:00Z",
            features=names,
            mean=zeros,
            scale=[1.0] * len(names),
            embedding_model="all-MiniLM-L6-v2",
            embedding_dim=minilm.dim,
            heads={
                "features": {
                    "inputs": "features",
                    "coef": zeros,
                    "intercept": 0.0,
                    "threshold": 0.5,
                },
                "full": {
                    "inputs": "features+embedding",
                    "coef": zeros + [0.0] * minilm.dim,
                    "intercept": 0.0,
                    "threshold": 0.5,
                },
            },
            heavy_share=0.3,
        ),
        artifact,
    )
    base = _settings(redis_url, prefix)
    settings = base.model_copy(
        update={"routing": base.routing.model_copy(update={"learned_router": artifact})}
    )
    embedder = CountingEmbedder(minilm)
    batch = BatchLookups(settings, redis_client, RuleSource(None), embedder=embedder)
    cached = InferenceRequest(id="c", prompt="What is the capital of Peru?")
    await batch.cache.store(cached, _answer(cached, "Lima."))
    embedder.texts.clear()
    bodies = [
        {"id": "r", "prompt": "hello"},  # a rule answers: never embedded
        {"id": "e", "prompt": "What is the capital of Peru?"},  # an exact hit
        {"id": "m", "prompt": "Who discovered oxygen?"},
        {"id": "m2", "prompt": "Who discovered oxygen?"},
    ]
    found = await batch.find_many(_admitted(settings, *bodies))
    embeddings = {b["id"]: f.found.embedding for b, f in zip(bodies, found, strict=True)}  # type: ignore[union-attr]
    assert embeddings["r"] is None and embeddings["e"] is None
    assert embedder.texts.count("Who discovered oxygen?") == 1  # once for the router
    assert np.allclose(embeddings["m"], minilm.embed(["Who discovered oxygen?"])[0], atol=1e-5)
    # Without an artifact the router asks for nothing.
    plain = BatchLookups(base, redis_client, RuleSource(None), embedder=embedder)
    embedder.texts.clear()
    again = await plain.find_many(_admitted(base, *bodies[2:]))
    assert all(f.found.embedding is None for f in again)  # type: ignore[union-attr]
    assert "Who discovered oxygen?" not in embedder.texts


# -- through Kafka -------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier_stack(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """Broker, Redis, a classifier and the router; no lane workers. The
    periodic index sync is off (an hour), so only a batch's version read
    brings a new cache entry into the classifier's index."""
    prefix = f"batch-{uuid.uuid4().hex[:8]}"
    env = {
        "LANEWAY_APP_ID": prefix,
        "LANEWAY_REDIS_KEY_PREFIX": prefix,
        "LANEWAY_REDIS_URL": redis_url,
        "LANEWAY_CACHE_SYNC_INTERVAL_S": "3600",
        "LANEWAY_ROUTING_EXPLORATION": "0",
    }
    for stack in own_stack(tmp_path_factory.mktemp("batch"), env, lanes=()):
        yield stack.settings


async def test_one_bad_record_in_a_batch_is_refused_and_the_rest_answered(
    classifier_stack: Settings,
) -> None:
    settings = classifier_stack
    tag = uuid.uuid4().hex[:6]
    async with LanewayClient(settings.kafka, client_id=f"t-{tag}") as client:
        await client.ask("ping", timeout_s=60)  # the reply topic is known to the classifier
        prompts = ["hi", "thanks", "ping"] * 4
        good = [{"id": f"good-{tag}-{i}", "prompt": p} for i, p in enumerate(prompts)]
        bad = {"id": f"bad-{tag}", "prompt": 5, "reply_to": client.reply_to}
        values = [json.dumps({**g, "reply_to": client.reply_to}).encode() for g in good]
        values.insert(6, json.dumps(bad).encode())
        loop = asyncio.get_running_loop()
        futures = [  # the client resolves these as the replies come in
            client._pending.setdefault(json.loads(v)["id"], loop.create_future()) for v in values
        ]
        # One burst from a plain producer, so the records arrive together.
        producer = AIOKafkaProducer(**settings.kafka.client_options())
        await producer.start()
        try:
            sent = [await producer.send(settings.topic("requests"), v) for v in values]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
        results = await asyncio.wait_for(asyncio.gather(*futures), 60)
    refused = [r for r in results if r.status == "error"]
    assert [(r.id, r.error.code) for r in refused] == [(bad["id"], "INF-400")]  # type: ignore[union-attr]
    answered = [r for r in results if r.status == "ok"]
    assert len(answered) == len(good) and {r.path for r in answered} == {AnswerPath.RULES}
    dlq = await read_topic(settings, settings.topic("dlq"))
    assert any(r.value == json.dumps(bad).encode() for r in dlq)


async def test_a_paraphrase_right_after_its_original_was_stored_hits_at_once(
    classifier_stack: Settings,
) -> None:
    settings = classifier_stack
    tag = uuid.uuid4().hex[:6]
    redis = settings.redis.client()
    try:
        # As a worker stores a model's answer: no embedder, no vector.
        worker = ResponseCache(
            redis, CacheSettings(), key_prefix=settings.redis.key_prefix, embedder=None
        )
        async with LanewayClient(settings.kafka, client_id=f"t-{tag}") as client:
            await client.ask("ping", timeout_s=60)
            original = InferenceRequest(
                id=f"o-{tag}", prompt="Name a large animal that lives in the sea."
            )
            assert await worker.store(original, _answer(original, f"The blue whale {tag}."))
            paraphrase = await client.ask("Name a big animal living in the sea.", timeout_s=60)
    finally:
        await redis.aclose()
    assert paraphrase.path == AnswerPath.CACHE, paraphrase
    assert paraphrase.model == "cache:semantic:smollm2-135m"
    assert paraphrase.output == f"The blue whale {tag}."


async def test_quality_events_spread_over_partitions_and_merge_into_route_statistics(
    classifier_stack: Settings,
) -> None:
    settings = classifier_stack
    tag = uuid.uuid4().hex[:6]
    async with LanewayClient(settings.kafka, client_id=f"t-{tag}") as client:
        answers = await asyncio.gather(*(client.ask("ping", timeout_s=60) for _ in range(24)))
    assert all(a.path == AnswerPath.RULES for a in answers)
    quality = await read_topic(settings, settings.topic("quality"))
    mine = [r for r in quality if json.loads(r.value)["id"] in {a.id for a in answers}]
    assert {r.key for r in mine} == {a.id.encode() for a in answers}  # keyed by request id
    assert len({r.partition for r in mine}) > 1
    redis = settings.redis.client()
    prefix = settings.redis.key_prefix
    try:
        merged, parts = None, {}
        for _ in range(40):  # published every weights_refresh_s
            parts = await redis.hgetall(f"{prefix}:route:parts")
            raw = await redis.hget(f"{prefix}:route:stats", "rules")
            merged = json.loads(raw) if raw else None
            if merged and merged["n"] >= 24 and len(parts) > 1:
                break
            await asyncio.sleep(0.5)
    finally:
        await redis.aclose()
    rules_parts = sorted(k.decode() for k in parts if k.startswith(b"rules@"))
    assert len(rules_parts) > 1, parts  # one record per partition that saw rule answers
    assert merged is not None and merged["n"] == sum(
        json.loads(parts[k.encode()])["n"] for k in rules_parts
    )
