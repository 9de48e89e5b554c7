"""Which cacheable questions clients ask most, day by day.

The classifier counts every request the cache could answer (temperature 0,
no conversation context, cache not bypassed) in memory, under its exact
cache key, and adds the counts to Redis every ``flush_interval_s`` in one
round trip. The nightly pre-warm (``streams.cache.prewarm``) ranks the keys over
the last ``days`` and refreshes the entries of the hot ones before they
expire. Variants the cache treats as one question ("What is DNS?", "what is
dns") count as one; the first one seen that day is the one re-asked.

Redis layout (``P`` = the key prefix, ``D`` = the UTC day, ``YYYYMMDD``)::

    P:hot:{D}:n   sorted set: cache key -> times asked that day
    P:hot:{D}:q   hash: cache key -> the question (JSON: prompt or messages,
                  max_tokens, tenant where the cache keeps tenants apart)

Both expire ``days`` + 1 days after their last write and are trimmed
together to ``track_max`` keys, the least asked leaving first. The braces
keep a day's two keys in one Redis Cluster slot; the trim script declares
both.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from schemas.messages import InferenceRequest
from schemas.settings import CacheSettings, PrewarmSettings
from streams.cache.keys import cache_control, cache_key
from streams.ops import REDIS_ERRORS

__all__ = ["HotQuestion", "HotQuestions", "day_of", "question_of", "rank", "read_days"]

log = logging.getLogger(__name__)

_ADD = """
local counts, questions = KEYS[1], KEYS[2]
local ttl, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV, 3 do
  redis.call('ZINCRBY', counts, ARGV[i + 1], ARGV[i])
  redis.call('HSETNX', questions, ARGV[i], ARGV[i + 2])
end
local extra = redis.call('ZCARD', counts) - keep
if extra > 0 then
  local gone = redis.call('ZRANGE', counts, 0, extra - 1)
  redis.call('ZREMRANGEBYRANK', counts, 0, extra - 1)
  for i = 1, #gone, 500 do
    redis.call('HDEL', questions, unpack(gone, i, math.min(i + 499, #gone)))
  end
end
redis.call('EXPIRE', counts, ttl)
redis.call('EXPIRE', questions, ttl)
return math.max(extra, 0)
"""

DAY_S = 86_400


def day_of(epoch_s: float) -> str:
    """The UTC day of ``epoch_s`` as ``YYYYMMDD``."""
    return time.strftime("%Y%m%d", time.gmtime(epoch_s))


def day_keys(key_prefix: str, day: str) -> tuple[str, str]:
    return f"{key_prefix}:hot:{{{day}}}:n", f"{key_prefix}:hot:{{{day}}}:q"


def question_of(request: InferenceRequest, cache: CacheSettings) -> str:
    """What the pre-warm needs to ask ``request`` again, as JSON: the text,
    the budget, its stop strings and the model it named (both in its cache
    scope: ``streams.cache.keys.cache_scope``) and, where the cache keeps
    tenants apart, the tenant, so the answer is stored under the same key."""
    body: dict[str, Any] = {"max_tokens": request.max_tokens}
    if request.messages is not None:
        body["messages"] = [m.model_dump(mode="json") for m in request.messages]
    else:
        body["prompt"] = request.prompt
    if request.stop:
        body["stop"] = list(request.stop)
    named = request.named_model()
    if named is not None:
        body["model"] = named
    if cache.per_tenant and request.tenant:
        body["tenant"] = request.tenant
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class HotQuestion:
    key: str
    """The question's exact cache key."""
    count: float
    """Times asked over the days ranked."""
    question: str
    """``question_of`` JSON."""

    @property
    def tenant(self) -> str | None:
        tenant = json.loads(self.question).get("tenant")
        return tenant if isinstance(tenant, str) else None

    def request(self, request_id: str, **fields: Any) -> InferenceRequest:
        return InferenceRequest.model_validate(
            {**json.loads(self.question), "id": request_id, "temperature": 0.0, **fields}
        )


def rank(
    days: Iterable[tuple[Mapping[str, float], Mapping[str, str]]], *, min_count: int, top: int
) -> list[HotQuestion]:
    """The ``top`` questions asked at least ``min_count`` times over
    ``days`` (each: counts by key, questions by key), most asked first; a
    key's question is the one its most recent day holds (``days`` newest first)."""
    counts: dict[str, float] = {}
    questions: dict[str, str] = {}
    for day_counts, day_questions in days:
        for key, count in day_counts.items():
            counts[key] = counts.get(key, 0.0) + count
            if key not in questions and key in day_questions:
                questions[key] = day_questions[key]
    hot = [
        HotQuestion(key, count, questions[key])
        for key, count in counts.items()
        if count >= min_count and key in questions
    ]
    hot.sort(key=lambda h: (-h.count, h.key))
    return hot[:top]


async def read_days(
    redis: Any, key_prefix: str, days: int, now_s: float
) -> list[tuple[dict[str, float], dict[str, str]]]:
    """Each of the last ``days`` days' counts and questions, newest first."""
    out = []
    for back in range(days):
        counts_key, questions_key = day_keys(key_prefix, day_of(now_s - back * DAY_S))
        pipe = redis.pipeline(transaction=False)
        pipe.zrange(counts_key, 0, -1, withscores=True)
        pipe.hgetall(questions_key)
        scored, held = await pipe.execute()
        counts = {_text(k): float(v) for k, v in scored}
        questions = {_text(k): _text(v) for k, v in held.items()}
        out.append((counts, questions))
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class HotQuestions:
    """The classifier's counter: ``note`` per request, ``flush`` on a timer."""

    def __init__(
        self, redis: Any, settings: PrewarmSettings, cache: CacheSettings, key_prefix: str
    ) -> None:
        self._redis = redis
        self._settings = settings
        self._cache = cache
        self._prefix = key_prefix
        self._add = redis.register_script(_ADD)
        self._pending: dict[str, list[Any]] = {}
        """cache key -> [times asked since the last flush, question JSON]"""

    @property
    def pending(self) -> int:
        return len(self._pending)

    def note(self, request: InferenceRequest, context: str, key: str | None = None) -> None:
        """Count ``request`` if the cache could ever answer it. No I/O.
        ``key``: its exact cache key without context, when the caller has it."""
        if not self._settings.track or context or request.temperature != 0:
            return
        if cache_control(request) != (True, True):  # bypass, or no-store: kept out
            return
        key = key or cache_key(request, self._cache)
        seen = self._pending.get(key)
        if seen is not None:
            seen[0] += 1
        elif len(self._pending) < self._settings.track_max:  # bounded between flushes
            self._pending[key] = [1, question_of(request, self._cache)]

    async def flush(self, now_s: float | None = None) -> int:
        """Add the counts to today's keys; returns how many keys were
        written. On a Redis error the counts are dropped (they are
        statistics) and the error is counted."""
        if not self._pending:
            return 0
        pending, self._pending = self._pending, {}
        day = day_of(time.time() if now_s is None else now_s)
        args: list[Any] = [(self._settings.days + 1) * DAY_S, self._settings.track_max]
        for key, (count, question) in pending.items():
            args += [key, count, question]
        try:
            await self._add(keys=list(day_keys(self._prefix, day)), args=args)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("prewarm").inc()
            log.warning("hot question counts dropped (%d keys): %s", len(pending), exc)
            return 0
        return len(pending)
