"""Counting hot questions (no Redis I/O here) and ranking them."""

import json

import redis.asyncio as aioredis

from schemas.messages import InferenceRequest
from schemas.settings import CacheSettings, PrewarmSettings
from streams.cache.hot_questions import HotQuestion, HotQuestions, day_of, question_of, rank
from streams.cache.keys import cache_key

CACHE = CacheSettings()


def req(prompt: str, **fields: object) -> InferenceRequest:
    return InferenceRequest.model_validate({"id": "r", "prompt": prompt, **fields})


def counter(**settings: object) -> HotQuestions:
    # A client that is never used: note() does no I/O.
    unused = aioredis.Redis.from_url("redis://127.0.0.1:1/0")
    return HotQuestions(unused, PrewarmSettings.model_validate(settings), CACHE, key_prefix="t")


def test_only_questions_the_cache_could_answer_are_counted() -> None:
    hot = counter()
    hot.note(req("What is DNS?"), context="")
    hot.note(req("what is dns"), context="")  # the same cache key
    hot.note(req("What is DNS?", temperature=0.7), context="")
    hot.note(req("What is DNS?", metadata={"cache": "bypass"}), context="")
    hot.note(req("What is DNS?", metadata={"cache": "no-store"}), context="")
    hot.note(req("What is DNS?"), context="a1b2c3")  # depends on a conversation
    assert hot.pending == 1
    ((count, question),) = hot._pending.values()
    assert count == 2 and json.loads(question) == {"max_tokens": 128, "prompt": "What is DNS?"}


def test_counting_is_bounded_between_flushes_and_can_be_off() -> None:
    hot = counter(track_max=10)
    for n in range(25):
        hot.note(req(f"question {n}"), context="")
    assert hot.pending == 10
    off = counter(track=False)
    off.note(req("What is DNS?"), context="")
    assert off.pending == 0


def test_the_question_asks_again_under_the_same_cache_key() -> None:
    for original in (
        req("Where is my parcel?", tenant="acme", max_tokens=32),
        req("Where is my parcel?", stop=["\n"], model="heavy"),  # both in the key's scope
        InferenceRequest.model_validate(
            {
                "id": "r",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Where is my parcel?"},
                ],
            }
        ),
    ):
        for cache in (CACHE, CacheSettings(per_tenant=True)):
            again = HotQuestion("k", 3, question_of(original, cache)).request("prewarm-1")
            assert cache_key(again, cache) == cache_key(original, cache)


def test_rank_sums_days_keeps_the_newest_question_and_cuts_at_min_count_and_top() -> None:
    today = ({"a": 2.0, "b": 1.0}, {"a": '{"prompt":"A today"}', "b": '{"prompt":"B"}'})
    yesterday = ({"a": 1.0, "c": 5.0, "d": 2.0}, {"a": '{"prompt":"A then"}', "c": "{}"})
    ranked = rank([today, yesterday], min_count=3, top=10)
    assert [(h.key, h.count) for h in ranked] == [("c", 5.0), ("a", 3.0)]
    assert ranked[1].question == '{"prompt":"A today"}'
    assert [h.key for h in rank([today, yesterday], min_count=1, top=2)] == ["c", "a"]
    # A count without its question (trimmed meanwhile) cannot be asked again.
    assert rank([({"x": 9.0}, {})], min_count=1, top=5) == []


def test_days_are_utc() -> None:
    assert day_of(0) == "19700101" and day_of(86_399) == "19700101" and day_of(86_400) == "19700102"
