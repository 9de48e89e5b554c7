"""Terminal results kept in Redis, keyed by the lane record they answer.

A worker that dies after producing a batch's results but before committing
its offsets gets the batch again on restart. With the store it re-sends the
stored results (the client drops them as duplicates) instead of running the
models a second time. The key is the lane record's topic, partition, offset
and request id, which a redelivery repeats and no other request shares.
A record parked on the retry topic (``workers.retry``) is remembered the
same way, so a redelivered batch does not park it a second time. A shadow
copy (``RoutedRequest.shadow``) is its own lane record with the same
request id as the live one; its key names ``<id>@shadow:<version>``
(``record_id``), so the two never share an entry.

Redis is never in the way: every error is logged, counted and treated as a
miss (fail-open), with short socket timeouts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import RedisError

from schemas.messages import InferenceResult
from streams.ops import REDIS_ERRORS
from streams.stores.keyspace import get_many

__all__ = ["RecordKey", "ResultStore", "record_id"]

log = logging.getLogger(__name__)

RecordKey = tuple[str, int, int, str]
"""(topic, partition, offset) of a lane record, and the request id it carries.
The id guards against a fresh broker that starts its offsets at 0 again
while an older run's results are still in Redis."""

SHADOW_MARK = "@shadow:"


def record_id(request_id: str, version: str | None = None, *, shadow: bool = False) -> str:
    """The id part of a ``RecordKey``: the request's, marked for a shadow copy."""
    return f"{request_id}{SHADOW_MARK}{version or '-'}" if shadow else request_id


def _request_id(record: RecordKey) -> str:
    return record[3].split(SHADOW_MARK, 1)[0]


class ResultStore:
    def __init__(self, client: aioredis.Redis, *, prefix: str, ttl_s: int) -> None:
        self._redis = client
        self._prefix = prefix
        self._ttl_s = ttl_s

    @classmethod
    def from_url(cls, url: str, *, prefix: str, ttl_s: int, timeout_s: float) -> ResultStore:
        client = aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        return cls(client, prefix=prefix, ttl_s=ttl_s)

    def _key(self, record: RecordKey) -> str:
        topic, partition, offset, request_id = record
        return f"{self._prefix}:done:{topic}:{partition}:{offset}:{request_id}"

    def _parked_key(self, record: RecordKey) -> str:
        return self._key(record).replace(":done:", ":parked:", 1)

    async def get_many(self, records: Sequence[RecordKey]) -> dict[RecordKey, InferenceResult]:
        return (await self.recall(records))[0]

    async def recall(
        self, records: Sequence[RecordKey]
    ) -> tuple[dict[RecordKey, InferenceResult], set[RecordKey]]:
        """What was done with each record before: its stored result, or
        that it was parked on the retry topic (both in one round trip)."""
        if not records:
            return {}, set()
        keys = [self._key(r) for r in records] + [self._parked_key(r) for r in records]
        try:
            values = await get_many(self._redis, keys)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("get").inc()
            log.warning("result store unavailable, running the batch: %s", exc)
            return {}, set()
        found = {}
        for record, value in zip(records, values[: len(records)], strict=True):
            if value is None:
                continue
            try:
                result = InferenceResult.model_validate_json(value)
            except ValidationError:
                log.warning("unreadable stored result for %s; running it again", record)
                continue
            if result.id == _request_id(record):
                found[record] = result
        parked = {
            record
            for record, value in zip(records, values[len(records) :], strict=True)
            if value is not None and record not in found
        }
        return found, parked

    async def park_many(self, records: Sequence[RecordKey]) -> None:
        """Remember that these records were parked on the retry topic, so a
        redelivery of their (uncommitted) batch does not park them twice."""
        if not records:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for record in records:
                    pipe.set(self._parked_key(record), b"1", ex=self._ttl_s)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("park").inc()
            log.warning("result store unavailable, parked records not kept: %s", exc)

    async def begin(self, records: Sequence[RecordKey]) -> dict[RecordKey, int]:
        """Count one more processing attempt of each record; the counts.
        A record processed again without a stored result has crashed its
        worker before (with its whole batch), so a count over 1 says so."""
        return await self._count(records, "attempts")

    async def begin_alone(self, record: RecordKey) -> int:
        """Count one more attempt of ``record`` run on its own (after its
        batch crashed); how many it has had. 0 when Redis cannot say."""
        return (await self._count([record], "alone")).get(record, 0)

    async def _count(self, records: Sequence[RecordKey], what: str) -> dict[RecordKey, int]:
        if not records:
            return {}
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for record in records:
                    key = self._key(record).replace(":done:", f":{what}:", 1)
                    pipe.incr(key)
                    pipe.expire(key, self._ttl_s)
                replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("attempts").inc()
            log.warning("result store unavailable, attempts not counted: %s", exc)
            return {}
        return {record: int(count) for record, count in zip(records, replies[::2], strict=True)}

    async def put_many(self, results: Sequence[tuple[RecordKey, InferenceResult]]) -> None:
        if not results:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for record, result in results:
                    pipe.set(self._key(record), result.model_dump_json(), ex=self._ttl_s)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("put").inc()
            log.warning("result store unavailable, results not kept: %s", exc)

    async def close(self) -> None:
        await self._redis.aclose()
