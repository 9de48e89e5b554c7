"""Pure session helpers, and the store's fail-open path against a fake Redis."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from schemas.messages import ChatMessage, InferenceRequest
from schemas.settings import SessionSettings
from streams.routing.features import estimate_tokens
from streams.stores.sessions import (
    SESSION_ERRORS,
    SessionStore,
    context_digest,
    trim_to_budget,
    with_history,
)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def bot(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


def turn(text: str) -> ChatMessage:
    return user(text) if text.startswith("q") else bot(text)


def tokens(turns: list[ChatMessage]) -> int:
    return sum(estimate_tokens(m.content) for m in turns)


# Each message is 8 characters = 2 tokens, an exchange 4 tokens.
CHAT = [
    user("q1......"),
    bot("a1......"),
    user("q2......"),
    bot("a2......"),
    user("q3......"),
    bot("a3......"),
]


def test_trim_keeps_everything_within_budget() -> None:
    assert trim_to_budget(CHAT, 12) == CHAT
    assert trim_to_budget([], 0) == []


def test_trim_drops_oldest_first_and_never_starts_with_an_answer() -> None:
    # 10 tokens: dropping q1 would fit, but a1 would then lead without its question.
    assert trim_to_budget(CHAT, 10) == CHAT[2:]
    assert trim_to_budget(CHAT, 8) == CHAT[2:]
    assert trim_to_budget(CHAT, 7) == CHAT[4:]
    assert trim_to_budget(CHAT, 1) == []


def test_trim_result_always_fits() -> None:
    chat = [user("x" * n) if n % 2 else bot("y" * n) for n in range(1, 40)]
    for budget in range(0, 300, 7):
        kept = trim_to_budget(chat, budget)
        assert tokens(kept) <= budget
        assert kept == chat[len(chat) - len(kept) :]
        assert not kept or kept[0].role == "user"


def test_with_history_puts_system_first_then_history_then_the_request() -> None:
    history = [user("earlier question"), bot("earlier answer")]
    request = InferenceRequest(
        id="r",
        messages=[
            ChatMessage(role="system", content="be brief"),
            user("and now?"),
        ],
    )
    assert with_history(request, history) == [
        ChatMessage(role="system", content="be brief"),
        *history,
        user("and now?"),
    ]
    prompt = InferenceRequest(id="r", prompt="follow-up")
    assert with_history(prompt, history) == [*history, user("follow-up")]
    assert with_history(prompt, []) == [user("follow-up")]


def test_context_digest_is_short_stable_and_tells_conversations_apart() -> None:
    a = [user("order 12345?"), bot("shipped")]
    b = [user("order 99999?"), bot("shipped")]
    assert context_digest(a) == context_digest(list(a))
    assert context_digest(a) != context_digest(b)
    assert len(context_digest(a)) == 16
    # Role matters, and joining contents must not collide.
    assert context_digest([user("hi")]) != context_digest([bot("hi")])
    assert context_digest([user("ab"), user("c")]) != context_digest([user("a"), user("bc")])
    assert context_digest([]) == ""


class DeadRedis:
    """Answers nothing; counts how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def register_script(self, _source: str) -> Any:
        async def script(**_kwargs: Any) -> Any:
            self.calls += 1
            raise RedisConnectionError("down")

        return script

    async def get(self, _key: str) -> Any:
        self.calls += 1
        raise RedisConnectionError("down")


async def test_store_fails_open_and_rests_redis_after_an_error() -> None:
    redis = DeadRedis()
    store = SessionStore(redis, SessionSettings(), key_prefix="t")  # type: ignore[arg-type]
    before = SESSION_ERRORS.labels("history")._value.get()
    assert await store.history("s1") == []
    assert await store.history("s1") == []
    await store.append("s1", "r1", "q", "a")
    assert redis.calls == 1
    assert SESSION_ERRORS.labels("history")._value.get() == before + 1


async def test_store_asks_nothing_without_a_session_or_when_disabled() -> None:
    redis = DeadRedis()
    store = SessionStore(redis, SessionSettings(), key_prefix="t")  # type: ignore[arg-type]
    assert await store.history(None) == []
    await store.append(None, "r1", "q", "a")
    off = SessionStore(redis, SessionSettings(enabled=False), key_prefix="t")  # type: ignore[arg-type]
    assert await off.history("s1") == []
    await off.append("s1", "r1", "q", "a")
    assert redis.calls == 0
