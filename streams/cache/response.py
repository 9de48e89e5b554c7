"""The response cache the classifier checks before anything else.

Two ways to hit, tried in order:

* **exact**: the request's key (``cache_key``) names a Redis entry. The key
  hashes the normalised text (case, spacing and trailing punctuation do not
  matter) and the *scope*: max_tokens class, temperature class, tenant (with
  ``per_tenant``) and a digest of the conversation context.
* **semantic**: the nearest cached prompt by embedding, if its cosine
  similarity reaches ``threshold``. The in-memory index is partitioned by
  scope *and* entity set (``entities``), so "Where is order 123?" is never
  answered with the reply to "Where is order 456?", however close their
  embeddings are: a wrong answer costs more than a model call.

Only deterministic (temperature 0), successful, non-degraded answers of a
model path (light/heavy) are stored; never errors, rule answers or cache
replays, so a failure can never come back as a success.

Redis layout (``P`` = the process's key prefix)::

    P:cache:e:<key>   hash, TTL ttl_s: output, model, path, text, entities,
                      scope, created_ms, vec (base64 float32, once embedded)
    P:cache:index     sorted set of <key> scored by the Redis time (ms) of
                      its last store; trimmed to max_entries, the trimmed
                      entries deleted with it so Redis stays bounded too

Any process may store. Processes with an embedder (the classifier) keep an
in-memory index and ``sync()`` it from the sorted set, embedding entries that
arrived without a vector and writing the vector back for the others.

Redis trouble never fails a request: lookups miss, stores are dropped, the
failure is counted and Redis is left alone for a second (``streams.stores.failopen``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import redis.asyncio as aioredis
from prometheus_client import Counter, Gauge, Histogram
from redis.exceptions import RedisError

from schemas.messages import InferenceRequest, InferenceResult, Path
from schemas.settings import CacheSettings
from streams.cache.embedding import Embedder
from streams.cache.keys import (
    MODEL_PATHS,
    cache_control,
    cache_key,
    cache_scope,
    entities,
    key_of,
    normalise_prompt,
    request_entities,
    store_refusal,
)
from streams.cache.semantic_index import SemanticIndex
from streams.stores.failopen import FailOpen

__all__ = [
    "EVICTIONS",
    "INDEX_SIZE",
    "LOOKUPS",
    "SIMILARITY",
    "STORES",
    "CacheHit",
    "ResponseCache",
    "SemanticIndex",
    "cache_control",
    "cache_key",
    "cache_scope",
    "entities",
    "normalise_prompt",
    "request_entities",
    "store_refusal",
]

log = logging.getLogger(__name__)

LOOKUPS = Counter(
    "laneway_cache_lookups_total",
    "Cache lookups by result: exact, semantic, miss, bypass (client asked, or "
    "temperature > 0 so nothing could be cached), error (Redis or embedder failed)",
    ["result"],
)
STORES = Counter(
    "laneway_cache_stores_total",
    "Answers offered to the cache by result: stored, skipped (not cacheable), error",
    ["result"],
)
EVICTIONS = Counter(
    "laneway_cache_evictions_total", "Cache entries removed on a client's bad feedback"
)
INDEX_SIZE = Gauge("laneway_cache_index_entries", "Entries in this process's semantic index")
SIMILARITY = Histogram(
    "laneway_cache_semantic_similarity",
    "Best cosine similarity of a semantic lookup that had candidates (for tuning threshold)",
    buckets=(0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 1.0),
)


@dataclass(frozen=True, slots=True)
class CacheHit:
    output: str
    kind: Literal["exact", "semantic"]
    similarity: float
    """1.0 for an exact hit."""
    model: str | None
    path: Path
    """The path that produced the cached answer (light or heavy)."""
    key: str
    """The entry served (for a semantic hit, the cached prompt's key, not the request's)."""

    @property
    def label(self) -> str:
        """The ``model`` of a result served from this hit: ``cache:<kind>:<model>``."""
        return f"cache:{self.kind}:{self.model or '-'}"


# KEYS: entry, index. ARGV: ttl_s, max_entries, entry key prefix, member, field/value pairs.
# One script so the entry, its TTL and its index slot appear together, scored
# by Redis's clock (processes with skewed clocks agree on "newest"). The
# trimmed entries it deletes are not declared in KEYS: fine on one Redis or
# Valkey, not on a cluster.
_STORE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'created_ms', now, unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
redis.call('ZADD', KEYS[2], now, ARGV[4])
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[2])
if excess > 0 then
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, excess - 1)) do
    redis.call('DEL', ARGV[3] .. member)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, excess - 1)
end
return now
"""

# Write a vector back only while the entry lives: HSET on an expired key would
# resurrect it as a vector without an answer and without a TTL.
_SET_VECTOR = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'vec', ARGV[1])
  return 1
end
return 0
"""

_SYNC_OVERLAP_MS = 5_000
"""An incremental sync rereads this much before the newest score it saw, so an
entry scored a moment earlier but written just after the last sync is not lost."""
_SYNC_BATCH = 256
_EMBED_BATCH = 16
"""Small, so a lookup waiting for the embedder behind a sync waits little."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _encode_vector(vector: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


def _decode_vector(value: Any, dim: int) -> np.ndarray | None:
    """The stored vector, or ``None`` if absent or of another width (another model)."""
    text = _text(value)
    if not text:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    if len(raw) != 4 * dim:
        return None
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


class ResponseCache:
    """Exact and semantic answers from Redis for the classifier; stores for everyone.

    ``redis`` is owned by the caller (one client per process) and is not
    closed here. ``embedder`` is ``None`` in processes that only store: their
    entries get embedded by the next ``sync()`` of a process that has one.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: CacheSettings,
        *,
        key_prefix: str,
        embedder: Embedder | None,
    ) -> None:
        self._redis = redis
        self._settings = settings
        self._entry_prefix = f"{key_prefix}:cache:e:"
        self._index_key = f"{key_prefix}:cache:index"
        self._embedder = embedder if settings.semantic else None
        self._index = (
            SemanticIndex(self._embedder.dim, settings.max_entries) if self._embedder else None
        )
        self._store_script = redis.register_script(_STORE)
        self._vector_script = redis.register_script(_SET_VECTOR)
        self._failopen = FailOpen("response cache", log=log, label="cache")
        self._synced_to_ms: int | None = None
        self._sync_lock = asyncio.Lock()

    @property
    def index_size(self) -> int:
        return len(self._index) if self._index is not None else 0

    def entry_key(self, key: str) -> str:
        return self._entry_prefix + key

    # -- lookup ------------------------------------------------------------

    async def lookup(self, request: InferenceRequest, context: str = "") -> CacheHit | None:
        """The cached answer for ``request``, or ``None``. Never raises."""
        if not self._settings.enabled:
            return None
        read, _ = cache_control(request)
        if not read or request.temperature != 0:
            LOOKUPS.labels("bypass").inc()
            return None
        if self._failopen.resting():
            LOOKUPS.labels("error").inc()
            return None
        try:
            hit = await self._lookup(request, context)
        except (RedisError, OSError) as exc:
            self._failopen.failed("lookup", exc)
            LOOKUPS.labels("error").inc()
            return None
        except Exception:
            log.exception("cache lookup failed; answering without the cache")
            LOOKUPS.labels("error").inc()
            return None
        self._failopen.answered()
        LOOKUPS.labels(hit.kind if hit else "miss").inc()
        return hit

    async def _lookup(self, request: InferenceRequest, context: str) -> CacheHit | None:
        text = normalise_prompt(request)
        scope = cache_scope(request, self._settings, context)
        key = key_of(scope, text)
        hit = await self._fetch(key, "exact", 1.0)
        if hit is not None or self._index is None or self._embedder is None:
            return hit
        ents = request_entities(request)
        if not self._index.has_candidates(scope, ents):
            return None
        vector = await self._embed_quietly(text)  # a broken model must not look like Redis down
        if vector is None:
            return None
        candidates = self._index.nearest(vector, scope, ents)
        if candidates:
            SIMILARITY.observe(candidates[0][1])
        for candidate, similarity in candidates:
            if similarity < self._settings.threshold:
                break
            hit = await self._fetch(candidate, "semantic", similarity)
            if hit is not None:
                return hit
            self._index.remove(candidate)  # expired or trimmed: not served
            INDEX_SIZE.set(len(self._index))
        return None

    async def _fetch(
        self, key: str, kind: Literal["exact", "semantic"], similarity: float
    ) -> CacheHit | None:
        output, model, path = await self._redis.hmget(
            self.entry_key(key), ["output", "model", "path"]
        )
        text, path_name = _text(output), _text(path)
        if not text or path_name not in {p.value for p in MODEL_PATHS}:
            return None
        return CacheHit(
            output=text,
            kind=kind,
            similarity=similarity,
            model=_text(model) or None,
            path=Path(path_name),
            key=key,
        )

    # -- evict -------------------------------------------------------------

    async def evict(self, key: str) -> bool:
        """Remove entry ``key`` (a client said its answer is bad): no process
        serves it again, exact or semantic (a semantic candidate whose entry
        is gone leaves the index on its next lookup). Never raises."""
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.delete(self.entry_key(key))
            pipe.zrem(self._index_key, key)
            removed, _ = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failopen.failed("evict", exc)
            return False
        self._failopen.answered()
        if self._index is not None:
            self._index.remove(key)
            INDEX_SIZE.set(len(self._index))
        if removed:
            EVICTIONS.inc()
        return bool(removed)

    # -- store -------------------------------------------------------------

    async def store(
        self, request: InferenceRequest, result: InferenceResult, context: str = ""
    ) -> bool:
        """Keep ``result`` as the answer to ``request`` if it is safe to replay.
        Idempotent (a redelivered answer overwrites its own entry). Never raises."""
        if not self._settings.enabled:
            return False
        refusal = store_refusal(request, result)
        if refusal is not None:
            log.debug("not caching %s: %s", request.id, refusal)
            STORES.labels("skipped").inc()
            return False
        if self._failopen.resting():
            STORES.labels("error").inc()
            return False
        try:
            await self._store(request, result, context)
        except (RedisError, OSError) as exc:
            self._failopen.failed("store", exc)
            STORES.labels("error").inc()
            return False
        except Exception:
            log.exception("cache store failed for %s", request.id)
            STORES.labels("error").inc()
            return False
        self._failopen.answered()
        STORES.labels("stored").inc()
        return True

    async def _store(
        self, request: InferenceRequest, result: InferenceResult, context: str
    ) -> None:
        text = normalise_prompt(request)
        scope = cache_scope(request, self._settings, context)
        key = key_of(scope, text)
        ents = request_entities(request)
        vector = await self._embed_quietly(text)
        fields: list[str] = [
            "output",
            result.output or "",
            "model",
            result.model or "",
            "path",
            result.path.value if result.path else "",
            "text",
            text,
            "entities",
            json.dumps(sorted(ents)),
            "scope",
            scope,
        ]
        if vector is not None:
            fields += ["vec", _encode_vector(vector)]
        now_ms = await self._store_script(
            keys=[self.entry_key(key), self._index_key],
            args=[
                self._settings.ttl_s,
                self._settings.max_entries,
                self._entry_prefix,
                key,
                *fields,
            ],
        )
        if vector is not None and self._index is not None:
            self._index.add(key, scope, ents, vector, int(now_ms))
            INDEX_SIZE.set(len(self._index))

    async def _embed_quietly(self, text: str) -> np.ndarray | None:
        """The text's vector, or ``None`` when there is no embedder or it
        failed: a lookup then misses, and a store without a vector is still an
        exact entry that ``sync`` embeds later."""
        if self._embedder is None:
            return None
        try:
            vectors = await asyncio.to_thread(self._embedder.embed, [text])
        except Exception:
            log.exception("embedding failed; going on without a vector")
            return None
        return vectors[0]

    # -- sync --------------------------------------------------------------

    async def sync(self) -> int:
        """Bring the semantic index up to date with Redis; returns the entries
        added. The first call rebuilds it whole (the index survives a restart);
        later calls read what was stored since. Never raises."""
        if self._index is None or self._embedder is None or not self._settings.enabled:
            return 0
        if self._failopen.resting():
            return 0
        async with self._sync_lock:
            try:
                added = await self._sync(self._index, self._embedder)
            except (RedisError, OSError) as exc:
                self._failopen.failed("sync", exc)
                return 0
            except Exception:
                log.exception("cache index sync failed")
                return 0
            self._failopen.answered()
            return added

    async def _sync(self, index: SemanticIndex, embedder: Embedder) -> int:
        if self._synced_to_ms is None:
            # Load the model here, off the request path, not in the first lookup.
            await asyncio.to_thread(embedder.embed, ["warm up"])
        seconds, micros = await self._redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        cutoff_ms = now_ms - self._settings.ttl_s * 1000
        await self._redis.zremrangebyscore(self._index_key, "-inf", f"({cutoff_ms}")
        members: Any  # redis-py's stubs cannot tell withscores pairs from plain members
        if self._synced_to_ms is None:
            members = await self._redis.zrange(
                self._index_key, -self._settings.max_entries, -1, withscores=True
            )
        else:
            since = max(cutoff_ms, self._synced_to_ms - _SYNC_OVERLAP_MS)
            members = await self._redis.zrangebyscore(
                self._index_key, since, "+inf", withscores=True
            )
            members = members[-self._settings.max_entries :]
        fresh: list[tuple[str, int]] = []
        listed: list[tuple[Any, float]] = list(members)
        for member, score in listed:
            key, ts_ms = _text(member) or "", int(score)
            if key in index:
                index.touch(key, ts_ms)
            else:
                fresh.append((key, ts_ms))
        added = 0
        for start in range(0, len(fresh), _SYNC_BATCH):
            added += await self._load_entries(index, embedder, fresh[start : start + _SYNC_BATCH])
        index.expire(cutoff_ms)
        if listed:
            self._synced_to_ms = max(int(listed[-1][1]), self._synced_to_ms or 0)
        elif self._synced_to_ms is None:
            self._synced_to_ms = now_ms
        INDEX_SIZE.set(len(index))
        return added

    async def _load_entries(
        self, index: SemanticIndex, embedder: Embedder, batch: list[tuple[str, int]]
    ) -> int:
        """Read a batch of entries, embed those without a usable vector (and
        write it back), and add them all to the index."""
        pipe = self._redis.pipeline(transaction=False)
        for key, _ in batch:
            pipe.hmget(self.entry_key(key), ["text", "entities", "scope", "vec"])
        rows = await pipe.execute()
        ready: list[tuple[str, int, str, frozenset[str], np.ndarray | None, str]] = []
        for (key, ts_ms), (text, ents_json, scope, vec) in zip(batch, rows, strict=True):
            text_s, scope_s = _text(text), _text(scope)
            if text_s is None or scope_s is None:
                continue  # expired or trimmed since it was listed
            ents = frozenset(json.loads(_text(ents_json) or "[]"))
            ready.append((key, ts_ms, scope_s, ents, _decode_vector(vec, index.dim), text_s))
        missing = [i for i, entry in enumerate(ready) if entry[4] is None]
        vectors: dict[int, np.ndarray] = {}
        for start in range(0, len(missing), _EMBED_BATCH):
            chunk = missing[start : start + _EMBED_BATCH]
            embedded = await asyncio.to_thread(embedder.embed, [ready[i][5] for i in chunk])
            vectors.update(zip(chunk, embedded, strict=True))
        if vectors:
            pipe = self._redis.pipeline(transaction=False)
            for i, embedded_row in vectors.items():
                await self._vector_script(
                    keys=[self.entry_key(ready[i][0])],
                    args=[_encode_vector(embedded_row)],
                    client=pipe,
                )
            await pipe.execute()
        for i, (key, ts_ms, scope_s, ents, vector, _) in enumerate(ready):
            row = vector if vector is not None else vectors[i]
            index.add(key, scope_s, ents, row, ts_ms)
        return len(ready)

    async def close(self) -> None:
        """Forget the index. The Redis client belongs to the caller."""
        if self._index is not None:
            self._index = SemanticIndex(self._index.dim, self._settings.max_entries)
            self._synced_to_ms = None
