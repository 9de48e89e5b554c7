"""The gateway's batch records in Redis, beside laneway's jobs
(``streams.jobs.store``). ``<r>`` is ``LANEWAY_REDIS_KEY_PREFIX``:

- ``<r>:gateway:{batches}:<id>``            hash: the ``BatchRecord``
- ``<r>:gateway:{batches}:<id>:lease``      string: the replica submitting it, expiring
- ``<r>:gateway:{batches}:tenant:<tenant>`` sorted set: the tenant's batch ids by creation
- ``<r>:gateway:{batches}:submitting``      set: batches whose submission has not ended

All share the hash tag ``{batches}``, one Redis Cluster slot
(``streams.stores.keyspace``).

A record expires with its job: its window and ``LANEWAY_BATCH_RETENTION_S``
after its creation. Like the job store, and unlike the cache, this is the
batch's record: a Redis error reaches the caller (a 5xx, or a submission
tried again at the next sweep).
"""

from __future__ import annotations

from typing import Any

from streams.gateway.batch_shapes import BatchRecord
from streams.stores.keyspace import GATEWAY_BATCHES, tagged

__all__ = ["BatchStore"]

# KEYS: lease. ARGV: replica, lease ms. Take it if free or ours; 1 if held now.
_TAKE = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: lease. ARGV: replica. Drop it if ours.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class BatchStore:
    def __init__(self, redis: Any, key_prefix: str, *, retention_s: int) -> None:
        self.redis = redis
        self.key_prefix = key_prefix
        self.retention_s = retention_s
        self._take = redis.register_script(_TAKE)
        self._release = redis.register_script(_RELEASE)

    # Every key in one cluster slot (``{batches}``): one transaction writes
    # a record and both lists.

    def key(self, batch_id: str, part: str | None = None) -> str:
        base = f"{self._base}:{batch_id}"
        return base if part is None else f"{base}:{part}"

    def tenant_key(self, tenant: str) -> str:
        return f"{self._base}:tenant:{tenant or '-'}"

    @property
    def submitting_key(self) -> str:
        return f"{self._base}:submitting"

    @property
    def _base(self) -> str:
        return tagged(f"{self.key_prefix}:gateway", GATEWAY_BATCHES)

    async def create(self, record: BatchRecord) -> None:
        """Keep ``record`` and queue its submission."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key(record.id), mapping=record.to_hash())
        pipe.expire(self.key(record.id), record.window_s + self.retention_s)
        pipe.zadd(self.tenant_key(record.tenant), {record.id: record.created_at})
        pipe.sadd(self.submitting_key, record.id)
        await pipe.execute()

    async def get(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        """The record; ``None`` when there is none, or it is not ``tenant``'s
        (``tenant=None``: whoever's)."""
        raw = await self.redis.hgetall(self.key(batch_id))
        if not raw:
            return None
        record = BatchRecord.from_hash({_text(k): _text(v) for k, v in raw.items()})
        if tenant is not None and record.tenant != tenant:
            return None
        return record

    async def list_for(
        self, tenant: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[BatchRecord], bool]:
        """The tenant's batches, newest first, after the one named; and
        whether there are more."""
        ids = [_text(i) for i in await self.redis.zrevrange(self.tenant_key(tenant), 0, -1)]
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        records: list[BatchRecord] = []
        gone: list[str] = []
        for batch_id in ids:
            if len(records) > limit:
                break
            record = await self.get(batch_id)
            if record is None:
                gone.append(batch_id)
            else:
                records.append(record)
        if gone:
            await self.redis.zrem(self.tenant_key(tenant), *gone)
        return records[:limit], len(records) > limit

    async def set_fields(self, batch_id: str, **fields: str | int) -> None:
        await self.redis.hset(self.key(batch_id), mapping=fields)

    async def submitting(self) -> list[str]:
        return sorted(_text(m) for m in await self.redis.smembers(self.submitting_key))

    async def submitted(self, batch_id: str) -> None:
        """The submission ended (every line produced, or the job stopped)."""
        await self.redis.srem(self.submitting_key, batch_id)

    async def take_lease(self, batch_id: str, replica: str, lease_s: float) -> bool:
        """Hold (or renew) the right to submit the batch; ``False`` while
        another replica holds it."""
        taken = await self._take(
            keys=[self.key(batch_id, "lease")], args=[replica, int(lease_s * 1000)]
        )
        return bool(taken)

    async def release_lease(self, batch_id: str, replica: str) -> None:
        await self._release(keys=[self.key(batch_id, "lease")], args=[replica])

    async def leased(self, batch_id: str) -> bool:
        return bool(await self.redis.exists(self.key(batch_id, "lease")))
