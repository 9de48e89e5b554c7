"""The key layout: the keys a script or a transaction takes together hash
to one Redis Cluster slot (redis-py's own ``key_slot``), the others spread."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from schemas.settings import CacheSettings, RedisSettings
from streams.cache.hot_questions import day_keys
from streams.cache.response import ResponseCache
from streams.gateway.batch_store import BatchStore
from streams.gateway.files import FileStore
from streams.gateway.shared_limits import SharedLimiter
from streams.jobs.store import _PARTS, JobStore
from streams.stores.keyspace import CACHE, own_slot, tagged


def slots(*keys: str) -> set[int]:
    return {key_slot(key.encode()) for key in keys}


@pytest.fixture
def redis() -> aioredis.Redis:
    """A client that is never connected: the stores only register scripts."""
    return aioredis.Redis()


def test_tagged_and_own_slot_build_the_keys() -> None:
    assert tagged("laneway", CACHE, "e", "k1") == "laneway:{cache}:e:k1"
    assert own_slot("laneway:gateway:file", "file-1") == "laneway:gateway:file:{file-1}"
    for bad in ("", "a{b", "a}b"):
        with pytest.raises(ValueError, match="hash tag"):
            tagged("laneway", bad)


def test_a_prefix_with_braces_is_refused() -> None:
    with pytest.raises(ValueError, match="brace"):
        RedisSettings(key_prefix="laneway{1}")


def test_the_cache_is_one_slot(redis: aioredis.Redis) -> None:
    cache = ResponseCache(redis, CacheSettings(), key_prefix="p", embedder=None)
    keys = [cache.entry_key(f"k{i}") for i in range(50)]
    assert len(slots(*keys, "p:{cache}:index", "p:{cache}:version")) == 1


def test_a_jobs_keys_and_the_job_lists_are_one_slot(redis: aioredis.Redis) -> None:
    store = JobStore(redis, "p")
    keys = [store.key(f"batch_{i}", part) for i in range(20) for part in (None, *_PARTS)]
    assert len(slots(*keys, store.jobs_key, store.open_key)) == 1


def test_the_gateways_batches_are_one_slot(redis: aioredis.Redis) -> None:
    store = BatchStore(redis, "p", retention_s=60)
    keys = [store.key(f"batch_{i}", part) for i in range(20) for part in (None, "lease")]
    keys += [store.tenant_key(t) for t in ("acme", "", "other")]
    assert len(slots(*keys, store.submitting_key)) == 1


def test_a_file_and_an_api_key_each_own_a_slot_and_spread(redis: aioredis.Redis) -> None:
    files = FileStore(redis, "p", ttl_s=60)
    limits = SharedLimiter(redis, "p")
    for n in range(20):
        assert len(slots(files.key(f"file-{n}"), files.key(f"file-{n}", "data"))) == 1
        assert len(slots(*limits._keys(f"key-{n}"))) == 1
    assert len(slots(*(files.key(f"file-{n}") for n in range(20)))) > 1
    assert len(slots(*(limits._keys(f"key-{n}")[0] for n in range(20)))) > 1
    # An id a client sends with braces of its own still keeps its keys together.
    assert len(slots(files.key("a}{b"), files.key("a}{b", "data"))) == 1


def test_a_days_hot_questions_are_one_slot() -> None:
    assert len(slots(*day_keys("p", "20261207"))) == 1
