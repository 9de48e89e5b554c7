"""The response cache's in-memory semantic index (pure: no Redis, no asyncio).

Entries are partitioned by scope *and* entity set, so a lookup only ever
compares against prompts that could share an answer, and each keeps its
words' order (``keys.word_order``), so a prompt with the same words in
another order ("celsius to fahrenheit" / "fahrenheit to celsius") is never
its nearest. ``streams.cache.response`` re-exports ``SemanticIndex``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from streams.cache.keys import reordered

__all__ = ["SemanticIndex"]


class _Bucket:
    """The vectors of one (scope, entity set): a growing matrix with swap-removal,
    so a lookup is one matrix-vector product over exactly the allowed rows."""

    __slots__ = ("keys", "matrix", "rows")

    def __init__(self, dim: int) -> None:
        self.matrix = np.empty((8, dim), dtype=np.float32)
        self.keys: list[str] = []
        self.rows: dict[str, int] = {}

    def put(self, key: str, vector: np.ndarray) -> None:
        row = self.rows.get(key)
        if row is None:
            row = len(self.keys)
            if row == len(self.matrix):
                self.matrix = np.concatenate([self.matrix, np.empty_like(self.matrix)])
            self.keys.append(key)
            self.rows[key] = row
        self.matrix[row] = vector

    def remove(self, key: str) -> None:
        row = self.rows.pop(key)
        last = len(self.keys) - 1
        if row != last:
            moved = self.keys[last]
            self.keys[row] = moved
            self.matrix[row] = self.matrix[last]
            self.rows[moved] = row
        self.keys.pop()


@dataclass(frozen=True, slots=True)
class _Slot:
    bucket: tuple[str, frozenset[str]]
    ts_ms: int
    words: tuple[str, ...]


class SemanticIndex:
    """Nearest cached prompt by cosine similarity, among entries with the same
    scope and the same entity set only. Bounded: beyond ``max_entries`` the
    entry stored longest ago leaves first."""

    def __init__(self, dim: int, max_entries: int) -> None:
        self.dim = dim
        self.max_entries = max_entries
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._buckets: dict[tuple[str, frozenset[str]], _Bucket] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: object) -> bool:
        return key in self._slots

    def add(
        self,
        key: str,
        scope: str,
        ents: frozenset[str],
        vector: np.ndarray,
        ts_ms: int,
        words: tuple[str, ...] = (),
    ) -> None:
        """Insert or refresh ``key``; ``vector`` must be L2-normalised;
        ``words``: its prompt's ``keys.word_order``."""
        vector = np.asarray(vector, dtype=np.float32).reshape(-1)
        if vector.shape != (self.dim,):
            raise ValueError(f"vector of shape {vector.shape}, index dim {self.dim}")
        bucket_id = (scope, ents)
        old = self._slots.pop(key, None)
        if old is not None:
            ts_ms = max(ts_ms, old.ts_ms)
            if old.bucket != bucket_id:
                self._drop_from_bucket(key, old.bucket)
        bucket = self._buckets.get(bucket_id)
        if bucket is None:
            bucket = self._buckets[bucket_id] = _Bucket(self.dim)
        bucket.put(key, vector)
        self._slots[key] = _Slot(bucket_id, ts_ms, words)
        while len(self._slots) > self.max_entries:
            oldest, slot = self._slots.popitem(last=False)
            self._drop_from_bucket(oldest, slot.bucket)

    def touch(self, key: str, ts_ms: int) -> None:
        """``key`` was stored again at ``ts_ms``: it is young again."""
        slot = self._slots.get(key)
        if slot is not None and ts_ms > slot.ts_ms:
            self._slots[key] = _Slot(slot.bucket, ts_ms, slot.words)
            self._slots.move_to_end(key)

    def remove(self, key: str) -> None:
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._drop_from_bucket(key, slot.bucket)

    def expire(self, cutoff_ms: int) -> int:
        """Drop entries last stored before ``cutoff_ms`` (their TTL has run out)."""
        stale = [key for key, slot in self._slots.items() if slot.ts_ms < cutoff_ms]
        for key in stale:
            self.remove(key)
        return len(stale)

    def has_candidates(self, scope: str, ents: frozenset[str]) -> bool:
        """Whether a lookup could hit at all; when not, the query need not be embedded."""
        return (scope, ents) in self._buckets

    def nearest(
        self,
        vector: np.ndarray,
        scope: str,
        ents: frozenset[str],
        *,
        words: tuple[str, ...] = (),
        threshold: float = -1.0,
        limit: int = 3,
    ) -> list[tuple[str, float]]:
        """Up to ``limit`` ``(key, similarity)`` pairs at or above ``threshold``,
        most similar first, from the entries of this scope and entity set
        whose words do not stand in another order than ``words`` (the
        query's ``keys.word_order``)."""
        bucket = self._buckets.get((scope, ents))
        if bucket is None or not bucket.keys:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        scores = bucket.matrix[: len(bucket.keys)] @ query
        found: list[tuple[str, float]] = []
        for i in np.argsort(-scores, kind="stable"):
            if scores[i] < threshold or len(found) == limit:
                break
            key = bucket.keys[i]
            if not reordered(words, self._slots[key].words):
                found.append((key, float(scores[i])))
        return found

    def _drop_from_bucket(self, key: str, bucket_id: tuple[str, frozenset[str]]) -> None:
        bucket = self._buckets[bucket_id]
        bucket.remove(key)
        if not bucket.keys:
            del self._buckets[bucket_id]
