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
  embeddings are, and never answers a prompt with one whose words stand in
  another order (``reordered``: "celsius to fahrenheit" / "fahrenheit to
  celsius"): a wrong answer costs more than a model call.

Only deterministic (temperature 0), successful, non-degraded answers of a
model path (light/heavy) are stored; never errors, rule answers or cache
replays, so a failure can never come back as a success.

Redis layout (``P`` = the process's key prefix)::

    P:{cache}:e:<key>   hash, TTL ttl_s: output, model, path, completion_tokens, finish_reason
                      (the model's count of output's tokens; entries stored
                      before it was kept lack it, and their hits say None),
                      text, entities, scope, created_ms, vec (base64
                      float32, once embedded)
    P:{cache}:index   sorted set of <key> scored by the Redis time (ms) of
                      its last store; trimmed to max_entries, the trimmed
                      entries deleted with it so Redis stays bounded too
    P:{cache}:version counter, incremented by every store: the batch
                      classifier reads it in its round trip and syncs its
                      index before a semantic lookup when it moved, so a
                      paraphrase asked right after a store already hits

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import redis.asyncio as aioredis
from prometheus_client import Counter, Gauge, Histogram
from redis.exceptions import RedisError

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult
from schemas.settings import CacheSettings
from streams.cache.embedding import Embedder
from streams.cache.keys import (
    cache_control,
    cache_key,
    cache_scope,
    entities,
    key_of,
    normalise_prompt,
    reordered,
    request_entities,
    store_refusal,
    time_relative,
    word_order,
)
from streams.cache.semantic_index import SemanticIndex
from streams.stores.failopen import FailOpen
from streams.stores.keyspace import CACHE, tagged
from streams.stores.rounds import Round

__all__ = [
    "EVICTIONS",
    "INDEX_SIZE",
    "LOOKUPS",
    "SIMILARITY",
    "STORES",
    "CacheHit",
    "Probe",
    "ResponseCache",
    "SemanticIndex",
    "cache_control",
    "cache_key",
    "cache_scope",
    "entities",
    "normalise_prompt",
    "reordered",
    "request_entities",
    "store_refusal",
    "word_order",
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


@dataclass(slots=True)
class Probe:
    """What the cache compares one request by (``ResponseCache.probe``)."""

    key: str
    """The exact-match key."""
    scope: str
    text: str
    """The normalised text."""
    request: InferenceRequest
    _ents: frozenset[str] | None = None
    _words: tuple[str, ...] | None = None

    @property
    def ents(self) -> frozenset[str]:
        """The request's entities, found when first asked: only the semantic
        lookup needs them, and most requests are answered before it."""
        if self._ents is None:
            self._ents = request_entities(self.request)
        return self._ents

    @property
    def words(self) -> tuple[str, ...]:
        """The text's ``word_order``, found when first asked (as ``ents``)."""
        if self._words is None:
            self._words = word_order(self.text)
        return self._words


_HIT_FIELDS = ["output", "model", "path", "completion_tokens", "finish_reason"]


@dataclass(frozen=True, slots=True)
class CacheHit:
    output: str
    kind: Literal["exact", "semantic"]
    similarity: float
    """1.0 for an exact hit."""
    model: str | None
    path: AnswerPath
    """The path that produced the cached answer (light or heavy)."""
    key: str
    """The entry served (for a semantic hit, the cached prompt's key, not the request's)."""
    completion_tokens: int | None = None
    """The answer's tokens as its model counted them when it was stored
    (``None``: an entry stored before the count was kept)."""
    finish_reason: Literal["stop", "length"] = "stop"
    """Why the stored answer ended: ``length`` when its model was cut at
    ``max_tokens`` (the entry's budget class: ``streams.cache.keys``);
    ``stop`` for entries stored before the reason was kept."""

    @property
    def label(self) -> str:
        """The ``model`` of a result served from this hit: ``cache:<kind>:<model>``."""
        return f"cache:{self.kind}:{self.model or '-'}"


# KEYS: entry, index, version. ARGV: ttl_s, max_entries, entry key prefix,
# member, field/value pairs.
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
redis.call('INCR', KEYS[3])
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

# KEYS: entries. Returns _HIT_FIELDS per entry, in order: the
# entries a whole batch asks about, in one command (a pipeline of one HMGET
# per entry costs the client a reply to parse per entry and more).
_FETCH = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HMGET', key, 'output', 'model', 'path', 'completion_tokens', 'finish_reason')
end
return out
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


def _hit_of(
    row: Any, kind: Literal["exact", "semantic"], similarity: float, key: str
) -> CacheHit | None:
    """A hit from an entry's ``_HIT_FIELDS`` (``None`` when absent or not a
    model path's answer)."""
    output, model, path, *later = row
    text, path_name = _text(output), _text(path)
    if not text or not AnswerPath.names_model(path_name):
        return None
    tokens = _text(later[0]) if later else None
    finish = _text(later[1]) if len(later) > 1 else None
    return CacheHit(
        output=text,
        kind=kind,
        similarity=similarity,
        model=_text(model) or None,
        path=AnswerPath(path_name),
        key=key,
        completion_tokens=int(tokens) if tokens and tokens.isdigit() else None,
        finish_reason="length" if finish == "length" else "stop",
    )


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
        # One slot for the whole cache: the store script trims the index and
        # deletes the trimmed entries, the fetch script reads a batch's.
        self._entry_prefix = tagged(key_prefix, CACHE, "e:")
        self._index_key = tagged(key_prefix, CACHE, "index")
        self._version_key = tagged(key_prefix, CACHE, "version")
        self._seen_version: Any = None
        """The version counter as it read before the last successful sync."""
        self._embedder = embedder if settings.semantic else None
        self._index = (
            SemanticIndex(self._embedder.dim, settings.max_entries) if self._embedder else None
        )
        self._store_script = redis.register_script(_STORE)
        self._vector_script = redis.register_script(_SET_VECTOR)
        self._fetch_script = redis.register_script(_FETCH)
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
        probe = self.probe(request, context)
        if probe is None:
            return None
        if self._failopen.resting():
            LOOKUPS.labels("error").inc()
            return None
        try:
            hit = await self._lookup(probe)
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

    async def _lookup(self, probe: Probe) -> CacheHit | None:
        request, text, scope, key = probe.request, probe.text, probe.scope, probe.key
        hit = await self._fetch(key, "exact", 1.0)
        if hit is not None or self._index is None or self._embedder is None:
            return hit
        ents = request_entities(request)
        if not self._index.has_candidates(scope, ents):
            return None
        vector = await self._embed_quietly(text)  # a broken model must not look like Redis down
        if vector is None:
            return None
        candidates = self._index.nearest(vector, scope, ents, words=probe.words)
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
        row = await self._redis.hmget(self.entry_key(key), _HIT_FIELDS)
        return _hit_of(row, kind, similarity, key)

    # -- batched lookup (the batch classifier) -------------------------------
    #
    # ``probe`` each request, queue the exact reads (and the version) into
    # the batch's round trip, judge them with ``exact_from``; the requests no
    # exact entry and no rule answered go to ``semantic_many`` together: one
    # embedding call, one round trip for the candidates' entries. ``count``
    # records each request's outcome once, as ``lookup`` does.

    @property
    def semantic(self) -> bool:
        """Whether this cache answers paraphrases (it has an embedder and an index)."""
        return self._index is not None and self._embedder is not None

    def probe(self, request: InferenceRequest, context: str = "") -> Probe | None:
        """What the request is looked up by, or ``None`` when the cache may
        not answer it (disabled, bypassed, sampled; counted as ``bypass``)."""
        if not self._settings.enabled:
            return None
        read, _ = cache_control(request)
        if not read or request.temperature != 0:
            LOOKUPS.labels("bypass").inc()
            return None
        text = normalise_prompt(request)
        scope = cache_scope(request, self._settings, context)
        return Probe(key_of(scope, text), scope, text, request)

    def resting(self) -> bool:
        return self._failopen.resting()

    def queue_exact(self, round_: Round, keys: Sequence[str]) -> int:
        """Queue the read of the entries ``keys`` (exact keys) as one command."""
        return round_.script(self._fetch_script, [self.entry_key(k) for k in keys], [])

    def queue_version(self, round_: Round) -> int | None:
        """Queue the read of the version counter (only with a semantic index)."""
        return round_.add("get", self._version_key) if self.semantic else None

    def exact_from(self, reply: Any, keys: Sequence[str]) -> dict[str, CacheHit]:
        """The exact hits among ``keys`` from the reply of ``queue_exact``."""
        if isinstance(reply, BaseException):
            self.failed("lookup", reply)
            return {}
        self._failopen.answered()
        hits = {}
        for key, row in zip(keys, reply, strict=True):
            try:
                hit = _hit_of(row, "exact", 1.0, key)
            except Exception:
                log.exception("cache entry %s unreadable; answering without it", key)
                continue
            if hit is not None:
                hits[key] = hit
        return hits

    def failed(self, op: str, exc: BaseException) -> None:
        if isinstance(exc, RedisError | OSError):
            self._failopen.failed(op, exc)
        else:
            log.error("cache %s failed: %s: %s", op, type(exc).__name__, exc)

    @staticmethod
    def count(result: Literal["exact", "semantic", "miss", "error"]) -> None:
        LOOKUPS.labels(result).inc()

    async def sync_if_moved(self, version: Any) -> bool:
        """Sync the index now if the version read in this batch's round trip
        differs from the one the last sync started from: an entry stored since
        is then found by this batch's semantic lookups, not a second later.
        Returns whether it synced."""
        if not self.semantic or isinstance(version, BaseException):
            return False
        if version == self._seen_version:
            return False
        await self.sync(version=version)
        return True

    async def semantic_many(self, probes: list[Probe]) -> list[CacheHit | None]:
        """The nearest cached answer for each probe at or above ``threshold``:
        one embedding call for every probe that has candidates at all, one
        round trip for the candidates' entries. Never raises (misses instead)."""
        out: list[CacheHit | None] = [None] * len(probes)
        index, embedder = self._index, self._embedder
        if index is None or embedder is None or not probes or self._failopen.resting():
            return out
        wanted = [i for i, p in enumerate(probes) if index.has_candidates(p.scope, p.ents)]
        if not wanted:
            return out
        texts = list(dict.fromkeys(probes[i].text for i in wanted))  # each text once
        try:
            vectors = await asyncio.to_thread(embedder.embed, texts)
        except Exception:
            log.exception("embedding failed; going on without a vector")
            return out
        by_text = dict(zip(texts, vectors, strict=True))
        threshold = self._settings.threshold
        queued: list[tuple[int, str, float]] = []
        for i in wanted:
            probe = probes[i]
            candidates = index.nearest(
                by_text[probe.text], probe.scope, probe.ents, words=probe.words
            )
            if candidates:
                SIMILARITY.observe(candidates[0][1])
            for key, similarity in candidates:
                if similarity < threshold:
                    break
                queued.append((i, key, similarity))
        if not queued:
            return out
        keys = list(dict.fromkeys(key for _, key, _ in queued))
        round_ = Round(self._redis)
        at = self.queue_exact(round_, keys)
        try:
            reply = (await round_.run())[at]
        except (RedisError, OSError) as exc:
            reply = exc
        except Exception:
            log.exception("semantic lookups failed; answering without the cache")
            return out
        if isinstance(reply, BaseException):
            self.failed("lookup", reply)
            return out
        self._failopen.answered()
        rows = dict(zip(keys, reply, strict=True))
        for i, key, similarity in queued:
            if out[i] is not None:
                continue
            hit = _hit_of(rows[key], "semantic", similarity, key)
            if hit is None:
                index.remove(key)  # expired or trimmed: not served
                INDEX_SIZE.set(len(index))
            out[i] = hit
        return out

    async def present(self, keys: Sequence[str]) -> set[str]:
        """Which of the exact ``keys`` have an entry now, in one round trip
        (a worker asks while it decodes them: another worker may have
        answered first). Never raises: nothing is present when Redis fails."""
        if not keys or self._failopen.resting():
            return set()
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.exists(self.entry_key(key))
                found = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failopen.failed("present", exc)
            return set()
        self._failopen.answered()
        return {key for key, there in zip(keys, found, strict=True) if there}

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
        if result.usage.completion_tokens > 0:
            fields += ["completion_tokens", str(result.usage.completion_tokens)]
        if result.finish_reason in ("stop", "length"):
            fields += ["finish_reason", result.finish_reason]
        if vector is not None:
            fields += ["vec", _encode_vector(vector)]
        now_ms = await self._store_script(
            keys=[self.entry_key(key), self._index_key, self._version_key],
            args=[
                self.lifetime_s(text),
                self._settings.max_entries,
                self._entry_prefix,
                key,
                *fields,
            ],
        )
        if vector is not None and self._index is not None:
            self._index.add(key, scope, ents, vector, int(now_ms), word_order(text))
            INDEX_SIZE.set(len(self._index))

    def lifetime_s(self, text: str) -> int:
        """How long the answer to ``text`` (normalised) is kept: shorter for
        a question about a time that moves on (``time_relative``)."""
        ttl_s = self._settings.ttl_s
        if time_relative(text):
            return min(ttl_s, self._settings.relative_time_ttl_s)
        return ttl_s

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

    async def sync(self, *, version: Any = None) -> int:
        """Bring the semantic index up to date with Redis; returns the entries
        added. The first call rebuilds it whole (the index survives a restart);
        later calls read what was stored since. ``version``: the version
        counter as read before this call (see ``sync_if_moved``). Never raises."""
        if self._index is None or self._embedder is None or not self._settings.enabled:
            return 0
        if self._failopen.resting():
            return 0
        async with self._sync_lock:
            try:
                if version is None:
                    version = await self._redis.get(self._version_key)
                added = await self._sync(self._index, self._embedder)
                self._seen_version = version
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
            round_ = Round(self._redis)  # loads the script where Redis lacks it
            for i, embedded_row in vectors.items():
                round_.script(
                    self._vector_script,
                    [self.entry_key(ready[i][0])],
                    [_encode_vector(embedded_row)],
                )
            for reply in await round_.run():
                if isinstance(reply, BaseException):
                    raise reply
        for i, (key, ts_ms, scope_s, ents, vector, text_s) in enumerate(ready):
            row = vector if vector is not None else vectors[i]
            index.add(key, scope_s, ents, row, ts_ms, word_order(text_s))
        return len(ready)

    async def close(self) -> None:
        """Forget the index. The Redis client belongs to the caller."""
        if self._index is not None:
            self._index = SemanticIndex(self._index.dim, self._settings.max_entries)
            self._synced_to_ms = None
