"""Conversation history per ``session_id``, kept in Redis.

A follow-up question ("and when will it arrive?") only makes sense with the
turns before it, so a worker reads the session's history before inference
(``history`` + ``with_history``) and appends the new exchange after an ok
result (``append``). History is a convenience, not a record of truth:

- Redis unreachable or the entry unreadable: the request runs without
  history (fail open), counted in ``laneway_session_errors_total``, and Redis
  is left alone for a second (``streams.stores.failopen``) so a dead Redis costs one socket
  timeout per second, not one per request.
- A redelivered batch must not add the same exchange twice, and two workers
  may answer requests of one session at once. One Lua script reads, checks
  the request id, appends, trims and writes back, so both hold.

Redis layout: one string key per session, ``{prefix}:session:{session_id}``,
holding JSON ``{"turns": [{"role", "content", "tokens"}, ...], "ids": [...]}``
with a TTL of ``SessionSettings.ttl_s`` refreshed on every append. ``tokens``
is ``streams.routing.features.estimate_tokens(content)``, computed here in Python, so
the script trims by exactly the estimate the pure ``trim_to_budget`` uses.
``ids`` are the last ``REMEMBERED_IDS`` request ids appended, kept even after
their turns were trimmed away.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from prometheus_client import Counter
from pydantic import ValidationError
from redis.exceptions import RedisError

from schemas.messages import ChatMessage, InferenceRequest
from schemas.settings import SessionSettings
from streams.routing.features import estimate_tokens
from streams.stores.failopen import FailOpen
from streams.stores.rounds import Round

__all__ = [
    "SESSION_ERRORS",
    "SessionStore",
    "context_digest",
    "trim_to_budget",
    "with_history",
]

log = logging.getLogger(__name__)

SESSION_ERRORS = Counter(
    "laneway_session_errors_total",
    "Session history reads or writes that failed (the request went on without)",
    ["op"],
)

REMEMBERED_IDS = 64
"""Request ids an entry remembers for idempotence. A redelivery replays the
uncommitted tail of one partition; a session rarely has more requests than
this in flight at once."""

# KEYS[1]: the session. ARGV: request id, new turns (JSON array of
# {role, content, tokens}), token budget, TTL in seconds, ids to remember.
# Returns 1 when appended, 0 when the request id was already there.
# The trim mirrors trim_to_budget(): oldest turns go first until the sum of
# tokens fits, then any assistant turns left at the front (an answer whose
# question was trimmed away would only confuse the model).
_APPEND = """
local raw = redis.call('GET', KEYS[1])
local turns, ids = {}, {}
if raw then
  local ok, state = pcall(cjson.decode, raw)
  if ok and type(state) == 'table' then
    if type(state.turns) == 'table' then turns = state.turns end
    if type(state.ids) == 'table' then ids = state.ids end
  end
end
local ttl = tonumber(ARGV[4])
for _, seen in ipairs(ids) do
  if seen == ARGV[1] then
    redis.call('EXPIRE', KEYS[1], ttl)
    return 0
  end
end
for _, turn in ipairs(cjson.decode(ARGV[2])) do
  turns[#turns + 1] = turn
end
local budget = tonumber(ARGV[3])
local total = 0
for _, turn in ipairs(turns) do total = total + (tonumber(turn.tokens) or 0) end
local first = 1
while first <= #turns and total > budget do
  total = total - (tonumber(turns[first].tokens) or 0)
  first = first + 1
end
while first <= #turns and turns[first].role == 'assistant' do
  first = first + 1
end
local kept = {}
for i = first, #turns do kept[#kept + 1] = turns[i] end
ids[#ids + 1] = ARGV[1]
local remember = tonumber(ARGV[5])
local kept_ids = {}
for i = math.max(1, #ids - remember + 1), #ids do kept_ids[#kept_ids + 1] = ids[i] end
redis.call('SET', KEYS[1], cjson.encode({turns = kept, ids = kept_ids}), 'EX', ttl)
return 1
"""


def _tokens(message: ChatMessage) -> int:
    return estimate_tokens(message.content)


def trim_to_budget(turns: Sequence[ChatMessage], max_tokens: int) -> list[ChatMessage]:
    """The newest turns whose estimated tokens sum to at most ``max_tokens``.

    Oldest turns go first, so the model keeps the context nearest the new
    question. Assistant turns left at the front are dropped too: an answer
    without its question reads as noise. The Lua append script trims the
    same way, so ``history`` never depends on which one ran last.
    """
    kept = list(turns)
    total = sum(_tokens(m) for m in kept)
    first = 0
    while first < len(kept) and total > max_tokens:
        total -= _tokens(kept[first])
        first += 1
    while first < len(kept) and kept[first].role == "assistant":
        first += 1
    return kept[first:]


def with_history(request: InferenceRequest, history: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The chat a model sees: the request's system messages, the session's
    history, then the request's own turns (its messages, or its prompt as a
    user turn).

    System messages lead because chat templates expect them first and the
    caller's instructions must govern the history too.
    """
    own = request.chat()
    system = [m for m in own if m.role == "system"]
    rest = [m for m in own if m.role != "system"]
    return [*system, *history, *rest]


def context_digest(history: Sequence[ChatMessage]) -> str:
    """A short stable hash of the history, for cache keys.

    The same question means something else in another conversation, so the
    cache keys on this as well as the prompt. Empty history gives ``""``:
    requests without a session keep the cache keys they had before sessions
    existed (and the nightly pre-warm stays valid for them).
    """
    if not history:
        return ""
    canonical = json.dumps(
        [[m.role, m.content] for m in history], ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.blake2b(canonical.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _decode(raw: bytes | str) -> list[ChatMessage]:
    """Turns of a stored entry; entries that do not parse are skipped.

    Lua's cjson writes an empty array as ``{}``, so anything but a list means
    "no turns".
    """
    state = json.loads(raw)
    turns: Any = state.get("turns") if isinstance(state, dict) else None
    if not isinstance(turns, list):
        return []
    out: list[ChatMessage] = []
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        try:
            out.append(ChatMessage(role=turn.get("role"), content=turn.get("content")))
        except ValidationError:
            continue
    return out


class SessionStore:
    """History of each session in Redis; never raises, fails open."""

    def __init__(
        self, redis: aioredis.Redis, settings: SessionSettings, *, key_prefix: str
    ) -> None:
        self._redis = redis
        self._settings = settings
        self._prefix = key_prefix
        self._append = redis.register_script(_APPEND)
        self._failopen = FailOpen("session store", log=log, errors=SESSION_ERRORS)

    def key(self, session_id: str) -> str:
        return f"{self._prefix}:session:{session_id}"

    def _available(self) -> bool:
        return self._settings.enabled and not self._failopen.resting()

    async def history(self, session_id: str | None) -> list[ChatMessage]:
        """The session's turns, oldest first; ``[]`` whenever there is none to
        be had (no session, disabled, absent, Redis down, entry unreadable)."""
        if session_id is None or not self._available():
            return []
        try:
            raw = await self._redis.get(self.key(session_id))
        except (RedisError, OSError) as exc:
            self._failopen.failed("history", exc)
            return []
        return self.history_from(session_id, raw)

    # -- batched: the reads go into the batch's round trip --------------------

    def queue_histories(
        self, round_: Round, session_ids: Sequence[str]
    ) -> list[tuple[int, str | list[str]]] | None:
        """Queue the read of these sessions' histories into ``round_``: one
        ``MGET`` on one Redis; on a cluster one ``GET`` each (redis-py's
        cluster pipelines refuse ``MGET``; the round still sends one
        pipeline per node). Per command the index of its reply and the
        session it reads (a ``GET``) or the sessions (an ``MGET``);
        ``None`` when there is nothing to read (none, disabled, Redis
        resting)."""
        if not session_ids or not self._available():
            return None
        if round_.cluster:
            return [(round_.add("get", self.key(s)), s) for s in session_ids]
        return [(round_.add("mget", [self.key(s) for s in session_ids]), list(session_ids))]

    def histories_from(
        self, queued: list[tuple[int, str | list[str]]], replies: Sequence[object]
    ) -> dict[str, list[ChatMessage]]:
        """Each session's history from the round's ``replies`` to what
        ``queue_histories`` queued; none when a read failed."""
        read = [(replies[at], ids) for at, ids in queued]
        failure = next((r for r, _ in read if isinstance(r, BaseException)), None)
        if failure is not None:
            self.failed(failure)
            return {}
        histories = {}
        for reply, read_of in read:
            if isinstance(read_of, str):
                histories[read_of] = self.history_from(read_of, reply)
                continue
            for session, raw in zip(read_of, cast(list[object], reply), strict=True):
                histories[session] = self.history_from(session, raw)
        return histories

    def history_from(self, session_id: str, raw: object) -> list[ChatMessage]:
        """The history from what ``GET`` answered (or the error it raised)."""
        if isinstance(raw, RedisError | OSError):
            self._failopen.failed("history", raw)
            return []
        self._failopen.answered()
        if raw is None:
            return []
        if not isinstance(raw, bytes | str):
            SESSION_ERRORS.labels("decode").inc()
            return []
        try:
            turns = _decode(raw)
        except ValueError as exc:  # not JSON: written by something else
            SESSION_ERRORS.labels("decode").inc()
            log.warning("session %s holds no readable history: %s", session_id, exc)
            return []
        # The budget may have shrunk since the entry was written.
        return trim_to_budget(turns, self._settings.max_tokens)

    def failed(self, exc: BaseException) -> None:
        """The round trip the reads were queued in failed as a whole."""
        self._failopen.failed("history", exc)

    async def append(
        self, session_id: str | None, request_id: str, user_text: str, answer: str
    ) -> None:
        """Add one exchange (the user's text and the answer) to the session,
        once per ``request_id``, trimmed to the budget, TTL refreshed.

        Called after an ok result; a failure here must never fail the result,
        so nothing is raised.
        """
        if session_id is None or not self._available():
            return
        try:
            await self._append(
                keys=[self.key(session_id)], args=self._append_args(request_id, user_text, answer)
            )
        except (RedisError, OSError) as exc:
            self._failopen.failed("append", exc)
        except Exception as exc:  # e.g. text that cannot be UTF-8 encoded
            SESSION_ERRORS.labels("append").inc()
            log.exception("session append for %s failed: %s", request_id, exc)
        else:
            self._failopen.answered()

    async def append_many(self, exchanges: Sequence[tuple[str, str, str, str]]) -> None:
        """``append`` for ``(session_id, request_id, user_text, answer)``
        exchanges, in one round trip, in order (two turns of one session land
        in the order given). Never raises."""
        if not exchanges or not self._available():
            return
        round_ = Round(self._redis)
        for session_id, request_id, user_text, answer in exchanges:
            try:
                args = self._append_args(request_id, user_text, answer)
                # Text Redis cannot take would fail the whole pipeline at send.
                self.key(session_id).encode()
                request_id.encode()
                str(args[1]).encode()
            except Exception as exc:
                SESSION_ERRORS.labels("append").inc()
                log.exception("session append for %s failed: %s", request_id, exc)
                continue
            round_.script(self._append, [self.key(session_id)], args)
        try:
            replies = await round_.run()
        except (RedisError, OSError) as exc:
            self._failopen.failed("append", exc)
            return
        except Exception as exc:
            SESSION_ERRORS.labels("append").inc()
            log.exception("session appends of a batch failed: %s", exc)
            return
        errors = [r for r in replies if isinstance(r, Exception)]
        for error in errors:
            if isinstance(error, RedisError | OSError):
                self._failopen.failed("append", error)
            else:
                SESSION_ERRORS.labels("append").inc()
        if len(errors) < len(replies):
            self._failopen.answered()

    def _append_args(self, request_id: str, user_text: str, answer: str) -> list[str | int]:
        turns = json.dumps(
            [
                {"role": "user", "content": user_text, "tokens": estimate_tokens(user_text)},
                {"role": "assistant", "content": answer, "tokens": estimate_tokens(answer)},
            ],
            ensure_ascii=False,
        )
        return [request_id, turns, self._settings.max_tokens, self._settings.ttl_s, REMEMBERED_IDS]

    async def close(self) -> None:
        await self._redis.aclose()
