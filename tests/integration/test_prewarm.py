"""Hot questions counted by the classifier, and the pre-warm that refreshes
their cache entries, on the real stack."""

from __future__ import annotations

import asyncio
import time
import uuid

from schemas.messages import AnswerPath, InferenceRequest
from schemas.settings import Settings
from streams.cache.hot_questions import DAY_S, HotQuestions, day_keys, day_of, rank, read_days
from streams.cache.keys import cache_key
from streams.cache.prewarm import prewarm
from streams.client import LanewayClient


async def test_counts_are_added_per_day_trimmed_and_expire(settings: Settings) -> None:
    prefix = f"hot-{uuid.uuid4().hex[:8]}"
    redis = settings.redis.client()
    options = settings.prewarm.model_copy(update={"track_max": 3, "days": 2})
    hot = HotQuestions(redis, options, settings.cache, key_prefix=prefix)
    now = time.time()
    try:
        for flushed in ({0: 5, 1: 4}, {2: 3, 3: 1}):  # yesterday, in two flushes
            for n, times in flushed.items():
                for _ in range(times):
                    hot.note(InferenceRequest(id="r", prompt=f"question {n}"), context="")
            assert await hot.flush(now - DAY_S) == 2
        hot.note(InferenceRequest(id="r", prompt="question 3"), context="")
        assert await hot.flush(now) == 1  # today
        assert await hot.flush(now) == 0  # nothing new

        days = await read_days(redis, prefix, 2, now)
        assert [sorted(counts.values()) for counts, _ in days] == [[1.0], [3.0, 4.0, 5.0]]
        # Trimmed to 3 keys a day, the least asked first, its question with it.
        counts_key, questions_key = day_keys(prefix, day_of(now - DAY_S))
        assert await redis.hlen(questions_key) == 3
        assert 2 * DAY_S < await redis.ttl(counts_key) <= 3 * DAY_S
        ranked = rank(days, min_count=3, top=10)
        assert [h.request("x").prompt for h in ranked] == [
            "question 0",
            "question 1",
            "question 2",
        ]
    finally:
        for day in (day_of(now), day_of(now - DAY_S)):
            await redis.delete(*day_keys(prefix, day))
        await redis.aclose()


async def test_prewarm_refreshes_a_hot_question_whose_entry_expired(
    settings: Settings, client: LanewayClient
) -> None:
    prompt = "In one word, what is the opposite of wet?"
    today = "In one word, what is the weather like today?"  # hot too, but never warmed
    question = InferenceRequest(id="q", prompt=prompt, max_tokens=8)
    key = cache_key(question, settings.cache)
    today_key = cache_key(InferenceRequest(id="t", prompt=today, max_tokens=8), settings.cache)
    entry = f"{settings.redis.key_prefix}:{{cache}}:e:{key}"
    redis = settings.redis.client()
    try:
        for _ in range(3):
            for asked in (prompt, today):
                result = await client.ask(asked, max_tokens=8, timeout_s=120)
                assert result.status == "ok"
        # The classifier adds its counts every flush_interval_s.
        for _ in range(40):
            counts, _ = (await read_days(redis, settings.redis.key_prefix, 1, time.time()))[0]
            if counts.get(key, 0) >= 3 and counts.get(today_key, 0) >= 3:
                break
            await asyncio.sleep(0.5)
        assert counts.get(key, 0) >= 3 and counts.get(today_key, 0) >= 3, counts
        for _ in range(20):  # the worker stores the answer just after sending it
            if await redis.exists(entry):
                break
            await asyncio.sleep(0.25)
        await redis.delete(entry)  # as if it had expired

        options = settings.prewarm.model_copy(update={"min_count": 3, "top": 500})
        report = await prewarm(settings.model_copy(update={"prewarm": options}), client=client)
        ttl = await redis.ttl(entry)
    finally:
        await redis.aclose()
    assert report.hot >= 1 and report.warmed >= 1, report
    assert report.time_relative >= 1, report
    assert not report.failed, report
    assert ttl > options.refresh_below_s
    assert report.coverage_after == 1.0 and report.coverage_before < 1.0, report

    again = await client.ask(prompt, max_tokens=8, timeout_s=120)
    assert again.path == AnswerPath.CACHE and again.model is not None
    assert again.model.startswith("cache:exact:"), again
