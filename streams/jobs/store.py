"""Batch job state in Redis. ``<r>`` is ``LANEWAY_REDIS_KEY_PREFIX``:

- ``<r>:{batch}:job:<id>``        hash: the job (status, tenant, counts, times)
- ``<r>:{batch}:job:<id>:lines``    list: ``[line, custom_id]`` of each valid input line, in order
- ``<r>:{batch}:job:<id>:invalid``  list: ``{"line", "custom_id", "error"}`` per refused line
- ``<r>:{batch}:job:<id>:results``  hash: request id -> its result, first one kept
- ``<r>:{batch}:job:<id>:seen``     set: request ids of a job only Kafka producers wrote to
- ``<r>:{batch}:job:<id>:pending``  hash: request id -> the request, while it is unanswered
- ``<r>:{batch}:job:<id>:retry``    sorted set: request ids shed with INF-429, by when to resend
- ``<r>:{batch}:jobs``            sorted set: job id by creation time (``laneway batch list``)
- ``<r>:{batch}:open``            set: jobs not yet final (the tracker settles them)

Unlike the cache, this is no fail-open helper: it is the job's record, so a
Redis error reaches the caller (the submitter stops, the tracker does not
commit and reads the results again). Every count changes in a script with
the write that justifies it, so a redelivered result never counts twice.
A final job's keys expire after ``LANEWAY_BATCH_RETENTION_S``. All of them
share the hash tag ``{batch}``, one Redis Cluster slot
(``streams.stores.keyspace``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from schemas.jobs import FINAL, BatchCounts, BatchJob, BatchJobStatus
from streams.jobs.jsonl import BatchLine, LineError
from streams.jobs.state import TRANSITIONS
from streams.stores.keyspace import BATCH, tagged
from streams.stores.rounds import Round

__all__ = ["JobStore"]

_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
"""

# KEYS: job, results, jobs, open, seen, pending, retry
# ARGV: request id, payload, outcome field (done|failed|retry), now ms, job id,
# expires ms, resend at ms
_RECORD = """
local field = ARGV[3]
if field == 'retry' then
  if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
  if redis.call('HEXISTS', KEYS[6], ARGV[1]) == 1 then
    local status = redis.call('HGET', KEYS[1], 'status')
    if status == 'in_progress' then
      redis.call('ZADD', KEYS[7], ARGV[7], ARGV[1])
      return 0
    end
  end
  field = 'failed'
end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  redis.call('HDEL', KEYS[6], ARGV[1])
  return 0
end
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
local source = redis.call('HGET', KEYS[1], 'source')
if not source then
  source = 'kafka'
  redis.call('HSET', KEYS[1], 'id', ARGV[5], 'status', 'in_progress', 'source', 'kafka',
    'created_at_ms', ARGV[4], 'expires_at_ms', ARGV[6])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
  redis.call('SADD', KEYS[4], ARGV[5])
end
if source == 'kafka' then
  redis.call('SADD', KEYS[5], ARGV[1])
  redis.call('HSET', KEYS[1], 'total', redis.call('SCARD', KEYS[5]))
end
redis.call('HINCRBY', KEYS[1], field, 1)
local ttl = redis.call('TTL', KEYS[1])
if ttl > 0 then redis.call('EXPIRE', KEYS[2], ttl) end
return 1
"""

# KEYS: job, seen, jobs, open   ARGV: request id, now ms, job id, expires ms
_SEEN = """
local source = redis.call('HGET', KEYS[1], 'source')
if source == 'file' then return 0 end
if not source then
  redis.call('HSET', KEYS[1], 'id', ARGV[3], 'status', 'in_progress', 'source', 'kafka',
    'created_at_ms', ARGV[2], 'expires_at_ms', ARGV[4])
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
  redis.call('SADD', KEYS[4], ARGV[3])
end
local new = redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'total', redis.call('SCARD', KEYS[2]))
return new
"""

# KEYS: job, open, then every key of the job   ARGV: to, allowed from (,a,b,), now ms,
# final (1|0), job id, retention s
_MOVE = """
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return {0, ''} end
if not string.find(ARGV[2], ',' .. current .. ',', 1, true) then return {0, current} end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'finished_at_ms', ARGV[3])
  redis.call('SREM', KEYS[2], ARGV[5])
  for i = 3, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[6]) end
  redis.call('EXPIRE', KEYS[1], ARGV[6])
end
return {1, current}
"""

_RAISE = """
local current = tonumber(redis.call('HGET', KEYS[1], 'produced') or '0')
if tonumber(ARGV[1]) > current then redis.call('HSET', KEYS[1], 'produced', ARGV[1]) end
return 1
"""

_INT_FIELDS = ("total", "invalid", "produced", "done", "failed")
_PARTS = ("lines", "invalid", "results", "seen", "pending", "retry")


class JobStore:
    def __init__(self, redis: Any, prefix: str, *, retention_s: int = 7 * 86_400) -> None:
        self.redis = redis
        self.prefix = prefix
        self.retention_s = retention_s
        self._create = redis.register_script(_CREATE)
        self._record = redis.register_script(_RECORD)
        self._seen = redis.register_script(_SEEN)
        self._move = redis.register_script(_MOVE)
        self._raise = redis.register_script(_RAISE)

    # -- keys --------------------------------------------------------------

    # Every key in one cluster slot (``{batch}``): the record script writes a
    # job's parts and the job lists in one step.

    def key(self, job_id: str, part: str | None = None) -> str:
        base = tagged(self.prefix, BATCH, "job", job_id)
        return base if part is None else f"{base}:{part}"

    @property
    def jobs_key(self) -> str:
        return tagged(self.prefix, BATCH, "jobs")

    @property
    def open_key(self) -> str:
        return tagged(self.prefix, BATCH, "open")

    # -- jobs --------------------------------------------------------------

    async def create(self, job: BatchJob) -> bool:
        """Write ``job`` unless a job with its id exists; True if written."""
        fields: list[Any] = []
        for name, value in _to_hash(job).items():
            fields += [name, value]
        created = await self._create(
            keys=[self.key(job.id), self.jobs_key, self.open_key],
            args=[job.id, job.created_at_ms, *fields],
        )
        return bool(created)

    async def put_lines(
        self, job_id: str, lines: Sequence[BatchLine], errors: Sequence[LineError]
    ) -> None:
        """The job's input order and refused lines (replaced, so a resumed
        submission that died while writing them writes them whole)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.key(job_id, "lines"), self.key(job_id, "invalid"))
        for start in range(0, len(lines), 1000):
            chunk = lines[start : start + 1000]
            pipe.rpush(
                self.key(job_id, "lines"), *(json.dumps([ln.line, ln.custom_id]) for ln in chunk)
            )
        if errors:
            pipe.rpush(self.key(job_id, "invalid"), *(json.dumps(e.as_dict()) for e in errors))
        await pipe.execute()

    async def get(self, job_id: str) -> BatchJob | None:
        raw = await self.redis.hgetall(self.key(job_id))
        return _from_hash(raw) if raw else None

    async def move(self, job_id: str, to: BatchJobStatus, now_ms: int) -> BatchJobStatus | None:
        """Move the job to ``to`` if its status allows; the status it left,
        or ``None`` when it did not move (missing, or not allowed)."""
        allowed = "," + ",".join(s for s, nexts in TRANSITIONS.items() if to in nexts) + ","
        keys = [self.key(job_id), self.open_key]
        keys += [self.key(job_id, part) for part in _PARTS]
        moved, previous = await self._move(
            keys=keys,
            args=[to.value, allowed, now_ms, 1 if to in FINAL else 0, job_id, self.retention_s],
        )
        return BatchJobStatus(_text(previous)) if moved else None

    async def raise_produced(self, job_id: str, produced: int) -> None:
        """``produced`` only ever grows: the resume point of the submitter."""
        await self._raise(keys=[self.key(job_id)], args=[produced])

    async def open_jobs(self) -> list[str]:
        return sorted(_text(m) for m in await self.redis.smembers(self.open_key))

    async def list_jobs(self, limit: int = 50) -> list[BatchJob]:
        """The newest jobs first; ids whose job expired are dropped from the list."""
        ids = [_text(i) for i in await self.redis.zrevrange(self.jobs_key, 0, limit - 1)]
        jobs, gone = [], []
        for job_id in ids:
            job = await self.get(job_id)
            if job is None:
                gone.append(job_id)
            else:
                jobs.append(job)
        if gone:
            await self.redis.zrem(self.jobs_key, *gone)
        return jobs

    async def cancelled(self, batch_ids: Iterable[str]) -> set[str]:
        """Which of ``batch_ids`` belong to a cancelled job: one round trip,
        for a lane worker that skips the cancelled requests of a batch."""
        ids = sorted(set(batch_ids))
        if not ids:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.key(job_id), "status")
        statuses = await pipe.execute()
        return {j for j, s in zip(ids, statuses, strict=True) if s and _text(s) == "cancelled"}

    # -- results -----------------------------------------------------------

    async def record(
        self,
        entries: Sequence[tuple[str, str, str, bool | int]],
        *,
        now_ms: int,
        window_s: int,
    ) -> int:
        """``(job id, request id, result JSON, outcome)`` per terminal result,
        in one round trip; a request already recorded is left as it is. The
        outcome is ``True`` (ok), ``False`` (an error) or the epoch ms at
        which to send the request again (shed with INF-429): a request of a
        running job that the submitter left in ``pending`` is then put on
        ``retry`` instead of counted (else it counts as failed). How many
        were recorded."""
        if not entries:
            return 0
        round_ = Round(self.redis)
        expires = now_ms + window_s * 1000
        for job_id, request_id, payload, outcome in entries:
            if outcome is True or outcome is False:
                field, resend_at = ("done" if outcome else "failed"), 0
            else:
                field, resend_at = "retry", int(outcome)
            round_.script(
                self._record,
                [
                    self.key(job_id),
                    self.key(job_id, "results"),
                    self.jobs_key,
                    self.open_key,
                    *(self.key(job_id, part) for part in ("seen", "pending", "retry")),
                ],
                [request_id, payload, field, now_ms, job_id, expires, resend_at],
            )
        return sum(int(n) for n in _raised(await round_.run()))

    async def put_pending(self, job_id: str, requests: dict[str, str]) -> None:
        """The requests about to be produced, kept until answered so that
        the tracker can send a shed one again."""
        if requests:
            await self.redis.hset(self.key(job_id, "pending"), mapping=requests)

    async def due_retries(
        self, job_id: str, now_ms: int, limit: int = 100
    ) -> list[tuple[str, str]]:
        """``(request id, request JSON)`` of the job's shed requests due now,
        taken off the retry set (a crash before they are produced again
        leaves them unanswered until the window ends: never twice)."""
        key = self.key(job_id, "retry")
        ids = [_text(i) for i in await self.redis.zrangebyscore(key, "-inf", now_ms, 0, limit)]
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(key, *ids)
        pipe.hmget(self.key(job_id, "pending"), ids)
        _, bodies = await pipe.execute()
        return [(i, _text(b)) for i, b in zip(ids, bodies, strict=True) if b is not None]

    async def seen(self, entries: Sequence[tuple[str, str]], *, now_ms: int, window_s: int) -> int:
        """``(job id, request id)`` per request seen on the request topic:
        counts the requests of jobs that Kafka producers alone write to."""
        if not entries:
            return 0
        round_ = Round(self.redis)
        expires = now_ms + window_s * 1000
        for job_id, request_id in entries:
            round_.script(
                self._seen,
                [self.key(job_id), self.key(job_id, "seen"), self.jobs_key, self.open_key],
                [request_id, now_ms, job_id, expires],
            )
        return sum(int(n) for n in _raised(await round_.run()))

    async def lines(self, job_id: str, chunk: int = 1000) -> AsyncIterator[list[tuple[int, str]]]:
        """The job's valid lines, ``(line number, custom_id)``, in input order."""
        start = 0
        while True:
            raw = await self.redis.lrange(self.key(job_id, "lines"), start, start + chunk - 1)
            if not raw:
                return
            yield [(int(n), str(c)) for n, c in map(json.loads, raw)]
            start += chunk

    async def invalid(self, job_id: str) -> list[dict[str, Any]]:
        return [json.loads(r) for r in await self.redis.lrange(self.key(job_id, "invalid"), 0, -1)]

    async def results(self, job_id: str, request_ids: Sequence[str]) -> list[str | None]:
        if not request_ids:
            return []
        raw = await self.redis.hmget(self.key(job_id, "results"), list(request_ids))
        return [None if r is None else _text(r) for r in raw]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _to_hash(job: BatchJob) -> dict[str, str | int]:
    fields: dict[str, str | int] = {
        "id": job.id,
        "status": job.status.value,
        "tenant": job.tenant or "",
        "source": job.source,
        "format": job.format,
        "content_sha256": job.content_sha256 or "",
        "created_at_ms": job.created_at_ms,
        "expires_at_ms": job.expires_at_ms,
    }
    fields.update(job.counts.model_dump())
    return fields


def _from_hash(raw: dict[Any, Any]) -> BatchJob:
    data = {_text(k): _text(v) for k, v in raw.items()}
    counts = BatchCounts(**{name: int(data.get(name, 0)) for name in _INT_FIELDS})
    finished = data.get("finished_at_ms")
    return BatchJob(
        id=data["id"],
        status=BatchJobStatus(data["status"]),
        tenant=data.get("tenant") or None,
        source=data.get("source", "file"),
        format=data.get("format", "laneway"),
        content_sha256=data.get("content_sha256") or None,
        counts=counts,
        created_at_ms=int(data["created_at_ms"]),
        expires_at_ms=int(data["expires_at_ms"]),
        finished_at_ms=int(finished) if finished else None,
    )


def _raised(replies: list[Any]) -> list[Any]:
    """``replies`` of a ``Round``, or the first error among them raised: the
    job store is no fail-open helper."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return replies
