"""Session history on a real Redis: round trip, idempotence, trimming, TTL,
concurrent writers, and a dead Redis. Needs only Redis, not the stack."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from schemas.messages import ChatMessage
from schemas.settings import SessionSettings
from streams.routing.features import estimate_tokens
from streams.stores.sessions import SESSION_ERRORS, SessionStore, trim_to_budget

# The session-wide ``redis_url`` (conftest), set for ``connect()`` by ``prefix``.
REDIS: dict[str, str] = {}


def connect(url: str | None = None, timeout_s: float = 1.0) -> aioredis.Redis:
    return aioredis.from_url(
        url or REDIS["url"], socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    REDIS["url"] = redis_url
    client = connect()
    name = f"t-sessions-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        keys = [key async for key in client.scan_iter(match=f"{name}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


def store(prefix: str, **settings: object) -> SessionStore:
    return SessionStore(connect(), SessionSettings.model_validate(settings), key_prefix=prefix)


def exchange(i: int) -> tuple[str, str]:
    """A question and answer of 5 estimated tokens each (20 characters)."""
    return f"question {i:>11}", f"answer {i:>13}"


async def test_round_trip_oldest_first(prefix: str) -> None:
    sessions = store(prefix)
    try:
        assert await sessions.history("s1") == []
        await sessions.append("s1", "r1", "Where is order 12345?", "It shipped on Monday.")
        await sessions.append("s1", "r2", "When will it arrive?", "Wednesday.")
        await sessions.append("other", "r3", "Unrelated", "Indeed.")
        assert await sessions.history("s1") == [
            ChatMessage(role="user", content="Where is order 12345?"),
            ChatMessage(role="assistant", content="It shipped on Monday."),
            ChatMessage(role="user", content="When will it arrive?"),
            ChatMessage(role="assistant", content="Wednesday."),
        ]
        assert len(await sessions.history("other")) == 2
    finally:
        await sessions.close()


async def test_unicode_and_json_metacharacters_survive(prefix: str) -> None:
    sessions = store(prefix)
    text = 'Grüße 🚀 "quoted" \\ back/slash \n newline'
    try:
        await sessions.append("s", "r1", text, text)
        assert [m.content for m in await sessions.history("s")] == [text, text]
    finally:
        await sessions.close()


async def test_a_redelivered_request_is_appended_once(prefix: str) -> None:
    sessions = store(prefix)
    try:
        for _ in range(3):
            await sessions.append("s", "r1", "q", "a")
        await sessions.append("s", "r2", "q2", "a2")
        await sessions.append("s", "r1", "q", "a")
        assert [m.content for m in await sessions.history("s")] == ["q", "a", "q2", "a2"]
    finally:
        await sessions.close()


async def test_trimmed_to_the_budget_oldest_first(prefix: str) -> None:
    sessions = store(prefix, max_tokens=32)  # three exchanges of 10 tokens fit
    everything: list[ChatMessage] = []
    try:
        for i in range(6):
            question, answer = exchange(i)
            everything += [
                ChatMessage(role="user", content=question),
                ChatMessage(role="assistant", content=answer),
            ]
            await sessions.append("s", f"r{i}", question, answer)
        history = await sessions.history("s")
        assert history == everything[-6:]
        assert sum(estimate_tokens(m.content) for m in history) <= 32
        # The Lua script and the pure helper trim alike.
        assert history == trim_to_budget(everything, 32)
        # A trimmed exchange is still known: its redelivery adds nothing back.
        await sessions.append("s", "r0", *exchange(0))
        assert await sessions.history("s") == history
    finally:
        await sessions.close()


async def test_an_exchange_over_the_budget_keeps_no_history(prefix: str) -> None:
    sessions = store(prefix, max_tokens=8)
    try:
        await sessions.append("s", "r1", *exchange(1))
        assert await sessions.history("s") == []
    finally:
        await sessions.close()


async def test_ttl_is_set_and_refreshed(prefix: str) -> None:
    sessions = store(prefix, ttl_s=120)
    client = connect()
    try:
        await sessions.append("s", "r1", "q", "a")
        key = sessions.key("s")
        assert key == f"{prefix}:session:s"
        assert 0 < await client.ttl(key) <= 120
        await client.expire(key, 5)
        await sessions.append("s", "r2", "q", "a")
        assert 5 < await client.ttl(key) <= 120
    finally:
        await sessions.close()
        await client.aclose()


async def test_concurrent_appends_from_two_workers_lose_nothing(prefix: str) -> None:
    a, b = store(prefix, max_tokens=4096), store(prefix, max_tokens=4096)
    try:
        await asyncio.gather(
            *((a if i % 2 else b).append("s", f"r{i}", *exchange(i)) for i in range(20))
        )
        history = await a.history("s")
    finally:
        await a.close()
        await b.close()
    assert len(history) == 40
    # Every exchange whole and in place: question, then its own answer.
    pairs = list(zip(history[::2], history[1::2], strict=True))
    assert {(q.content, r.content) for q, r in pairs} == {exchange(i) for i in range(20)}
    assert all(q.role == "user" and r.role == "assistant" for q, r in pairs)


async def test_concurrent_appends_over_budget_keep_the_newest_within_it(prefix: str) -> None:
    a, b = store(prefix, max_tokens=50), store(prefix, max_tokens=50)
    try:
        await asyncio.gather(
            *((a if i % 2 else b).append("s", f"r{i}", *exchange(i)) for i in range(20))
        )
        history = await a.history("s")
    finally:
        await a.close()
        await b.close()
    assert len(history) == 10  # five exchanges of 10 tokens
    assert history[0].role == "user"


async def test_unreadable_entry_reads_as_no_history(prefix: str) -> None:
    sessions = store(prefix)
    client = connect()
    try:
        await client.set(sessions.key("s"), b"\xff not json")
        assert await sessions.history("s") == []
        # The script starts over rather than failing on it.
        await sessions.append("s", "r1", "q", "a")
        assert len(await sessions.history("s")) == 2
    finally:
        await sessions.close()
        await client.aclose()


async def test_dead_redis_gives_no_history_and_append_does_not_raise() -> None:
    sessions = SessionStore(
        connect("redis://127.0.0.1:1/0", timeout_s=0.2), SessionSettings(), key_prefix="dead"
    )
    before = SESSION_ERRORS.labels("history")._value.get()
    try:
        assert await sessions.history("s") == []
        await sessions.append("s", "r1", "q", "a")  # within the rest period: not asked
        assert SESSION_ERRORS.labels("history")._value.get() == before + 1
        sessions._failopen.end_rest()  # the rest period is over
        append_before = SESSION_ERRORS.labels("append")._value.get()
        await sessions.append("s", "r1", "q", "a")
        assert SESSION_ERRORS.labels("append")._value.get() == append_before + 1
    finally:
        await sessions.close()
