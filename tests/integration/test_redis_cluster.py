"""laneway on a real Valkey Cluster (3 primaries, 3 replicas; the session's
``redis_cluster``), with ``LANEWAY_REDIS_CLUSTER=true``:

- every store's scripts and transactions run there (their keys share a
  slot, ``streams.stores.keyspace``); the cache and job-store suites run
  again here on a cluster client;
- a stack of its own on the cluster answers the end-to-end suite
  (``test_end_to_end``'s tests, collected again here with this module's
  ``stack``, ``settings`` and ``client``), and its cache, session and
  rate-limit tests (``test_hybrid``, ``test_ratelimit``);
- a primary killed mid-traffic: a replica takes over, the fail-open stores
  serve meanwhile, and every request gets its answer.

Last in the module, as it leaves the cluster one primary short.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from schemas.messages import Lane, RequestLimits
from schemas.settings import RateLimitSettings, RedisSettings, SessionSettings, Settings
from streams.client import LanewayClient
from streams.devstack.cluster import EmbeddedCluster
from streams.devstack.supervisor import Stack
from streams.gateway.batch_shapes import BatchRecord
from streams.gateway.batch_store import BatchStore
from streams.gateway.files import FileStore
from streams.gateway.shared_limits import SharedLimiter
from streams.jobs.jsonl import parse_jsonl
from streams.jobs.store import JobStore
from streams.rules.rulefile import EXAMPLE_RULES_FILE
from streams.stores.ratelimit import QueuedChecks, RateLimiter
from streams.stores.rounds import Round
from streams.stores.sessions import SessionStore
from tests.integration import (
    test_batch_store,
    test_cache,
    test_end_to_end,
    test_hybrid,
    test_ratelimit,
)
from tests.integration.conftest import CHILD_ENV, own_stack
from workers.claims import DecodeClaims

# -- the cache and job-store suites, on a cluster client ----------------------

make_cache = test_cache.make_cache
test_store_then_exact_hit = test_cache.test_store_then_exact_hit
test_store_is_idempotent = test_cache.test_store_is_idempotent
test_paraphrase_hits_a_second_instance_after_sync = (
    test_cache.test_paraphrase_hits_a_second_instance_after_sync
)
test_expired_entries_are_not_served_and_leave_the_index = (
    test_cache.test_expired_entries_are_not_served_and_leave_the_index
)
test_index_and_entries_are_bounded = test_cache.test_index_and_entries_are_bounded

test_a_job_is_created_once_and_moves_by_the_rules = (
    test_batch_store.test_a_job_is_created_once_and_moves_by_the_rules
)
test_a_result_counts_once_however_often_it_arrives = (
    test_batch_store.test_a_result_counts_once_however_often_it_arrives
)
test_a_kafka_job_is_counted_from_its_requests_and_results = (
    test_batch_store.test_a_kafka_job_is_counted_from_its_requests_and_results
)
test_lines_and_invalid_lines_are_kept_in_order = (
    test_batch_store.test_lines_and_invalid_lines_are_kept_in_order
)
test_a_shed_request_of_a_running_job_waits_to_be_sent_again = (
    test_batch_store.test_a_shed_request_of_a_running_job_waits_to_be_sent_again
)

# -- the end-to-end suite, on a stack on the cluster ---------------------------

test_every_lane_answers_exactly_once = test_end_to_end.test_every_lane_answers_exactly_once
test_results_and_quality_topics_see_every_terminal_result = (
    test_end_to_end.test_results_and_quality_topics_see_every_terminal_result
)
test_malformed_records_get_inf_400_and_the_dlq = (
    test_end_to_end.test_malformed_records_get_inf_400_and_the_dlq
)
test_request_past_its_deadline_gets_inf_503 = (
    test_end_to_end.test_request_past_its_deadline_gets_inf_503
)
test_worker_killed_mid_batch_loses_no_request = (
    test_end_to_end.test_worker_killed_mid_batch_loses_no_request
)
test_an_id_can_be_asked_again_after_its_answer = (
    test_end_to_end.test_an_id_can_be_asked_again_after_its_answer
)
# ... and the stack's cache, sessions and rate limits.
test_a_repeated_question_is_answered_from_the_cache = (
    test_hybrid.test_a_repeated_question_is_answered_from_the_cache
)
test_a_session_remembers_earlier_turns = test_hybrid.test_a_session_remembers_earlier_turns
test_tenant_over_quota_gets_inf_429_and_others_do_not = (
    test_ratelimit.test_tenant_over_quota_gets_inf_429_and_others_do_not
)


def cluster_settings(cluster: EmbeddedCluster) -> RedisSettings:
    return RedisSettings(url=cluster.url, cluster=True, timeout_s=2.0)


@pytest.fixture
async def redis_client(redis_cluster: EmbeddedCluster) -> AsyncIterator[Any]:
    client = cluster_settings(redis_cluster).client()
    yield client
    await client.aclose()


@pytest.fixture
async def store(redis_client: Any) -> JobStore:
    return JobStore(redis_client, f"t-{uuid.uuid4().hex[:8]}", retention_s=60)


@pytest.fixture(scope="module")
def stack(
    redis_cluster: EmbeddedCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("cluster-stack")
    rules = folder / "rules.yaml"
    shutil.copyfile(EXAMPLE_RULES_FILE, rules)
    env = {
        **CHILD_ENV,
        "LANEWAY_RULES_FILE": str(rules),
        "LANEWAY_REDIS_URL": redis_cluster.url,
        "LANEWAY_REDIS_CLUSTER": "true",
        "LANEWAY_REDIS_KEY_PREFIX": f"cl-{uuid.uuid4().hex[:8]}",
    }
    yield from own_stack(Path(folder), env)


@pytest.fixture
def settings(stack: Stack) -> Settings:
    return stack.settings


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[LanewayClient]:
    async with LanewayClient(settings.kafka, client_id=f"t-{uuid.uuid4().hex[:8]}") as client:
        yield client


# -- the settings --------------------------------------------------------------


async def test_the_cluster_setting_gives_a_cluster_client(redis_cluster: EmbeddedCluster) -> None:
    client = cluster_settings(redis_cluster).client()
    try:
        assert isinstance(client, RedisCluster)
        assert len(await client.cluster_nodes()) == 6
    finally:
        await client.aclose()
    assert not isinstance(RedisSettings(url=redis_cluster.url).client(), RedisCluster)
    with pytest.raises(ValueError, match="brace"):
        RedisSettings(key_prefix="a{b}")


# -- one round trip per node ---------------------------------------------------


async def test_a_round_over_many_slots_runs_its_scripts_and_reloads_them(
    redis_client: Any, prefix: str
) -> None:
    """Rate-limit buckets of many tenants and sessions spread over the
    nodes go in one round; a flushed script cache is loaded again."""
    limits = RateLimitSettings(tenants={f"t{i}": {"rps": 1, "burst": 2} for i in range(12)})
    limiter = RateLimiter(redis_client, limits, prefix)
    sessions = SessionStore(redis_client, SessionSettings(), key_prefix=prefix)
    for i in range(6):
        await sessions.append(f"s{i}", f"r{i}", f"question {i}", f"answer {i}")
    nodes = {redis_client.get_node_from_key(sessions.key(f"s{i}")).name for i in range(6)}
    assert len(nodes) > 1, "the sessions all landed on one node"
    tenants = [f"t{i % 12}" for i in range(30)]  # 3 requests of 6 tenants, 2 of the others
    for flushed in (False, True):
        if flushed:
            await redis_client.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.ALL_NODES)
        round_ = Round(redis_client)
        at = limiter.queue(round_, tenants)
        read = sessions.queue_histories(round_, [f"s{i}" for i in range(6)])
        replies = await round_.run()
        assert isinstance(at, QueuedChecks) and read is not None
        buckets = {key_slot(f"{prefix}:ratelimit:t{i}".encode()) for i in range(12)}
        assert len(at.indexes) == len(buckets), "one script call per slot of the buckets"
        verdicts = limiter.judge(at, replies, tenants)
        if not flushed:  # burst 2: each tenant's first two pass
            assert [v.allowed for v in verdicts] == [True] * 24 + [False] * 6
            assert not any(v.degraded for v in verdicts)
        else:
            assert not any(v.allowed or v.degraded for v in verdicts), "the buckets are empty"
        histories = sessions.histories_from(read, replies)
        for i in range(6):
            assert [m.content for m in histories[f"s{i}"]] == [f"question {i}", f"answer {i}"]


async def test_decode_claims_over_many_slots_are_taken_and_let_go(
    redis_client: Any, prefix: str
) -> None:
    one = DecodeClaims(redis_client, prefix=prefix, ttl_s=30, lane=Lane.MEDIUM)
    two = DecodeClaims(redis_client, prefix=prefix, ttl_s=30, lane=Lane.MEDIUM)
    keys: dict[int, str | None] = {i: f"answer-{i}" for i in range(12)}
    marked: list[str] = []
    assert await one.mark(keys, marked) == {}
    assert sorted(marked) == sorted(k for k in keys.values() if k is not None)
    other: list[str] = []
    assert await two.mark(keys, other) == keys, "the second worker waits on every one"
    assert other == []
    await two.release(list(marked))  # not its marks: they stay
    assert len(await scan(redis_client, f"{prefix}:cache:busy:*")) == 12
    await one.let_go(marked)
    assert await scan(redis_client, f"{prefix}:cache:busy:*") == []


async def scan(redis_client: Any, pattern: str) -> list[Any]:
    return [key async for key in redis_client.scan_iter(match=pattern)]


# -- the gateway's stores ------------------------------------------------------


async def test_the_gateway_stores_transactions_and_scripts_run_on_a_cluster(
    redis_client: Any, prefix: str
) -> None:
    data = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n'  # noqa: E501
    files = FileStore(redis_client, prefix, ttl_s=60)
    record = await files.put("acme", "in.jsonl", "batch", data, parse_jsonl(data, RequestLimits()))
    assert (await files.get("acme", record.id)) == record
    assert await files.content("acme", record.id) == data
    assert await files.delete("acme", record.id)
    assert await files.get("acme", record.id) is None

    batches = BatchStore(redis_client, prefix, retention_s=60)
    batch = BatchRecord(
        id=f"batch_{uuid.uuid4().hex[:12]}",
        tenant="acme",
        input_file_id=record.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        window_s=86_400,
        created_at=int(time.time()),
    )
    await batches.create(batch)
    assert await batches.get(batch.id, "acme") == batch
    assert batch.id in await batches.submitting()
    assert await batches.take_lease(batch.id, "replica-1", lease_s=5)
    assert not await batches.take_lease(batch.id, "replica-2", lease_s=5)
    await batches.release_lease(batch.id, "replica-1")
    assert not await batches.leased(batch.id)

    limiter = SharedLimiter(redis_client, prefix)
    verdicts = [await limiter.admit("k-1", rpm=3, tpm=None) for _ in range(4)]
    assert [v.admitted for v in verdicts] == [True, True, True, False]
    assert all(v.shared for v in verdicts)
    await limiter.spend("k-2", 100)
    spent = await limiter.admit("k-2", rpm=None, tpm=100)
    assert not spent.admitted and spent.shared and spent.tokens == 100


# -- a primary killed mid-traffic ----------------------------------------------


async def test_a_primary_killed_mid_traffic_fails_over_and_loses_nothing(
    redis_cluster: EmbeddedCluster, stack: Stack, client: LanewayClient, settings: Settings
) -> None:
    """Rule answers flow while the primary of the default tenant's rate-limit
    bucket is SIGKILLed: the classifier's round fails, its stores fail open
    (requests still answered), a replica is promoted, and every request of
    the stream gets its terminal result."""
    bucket = f"{settings.redis.key_prefix}:ratelimit:-"
    sent: list[asyncio.Future[Any]] = []

    async def traffic(n: int) -> None:
        for i in range(n):
            sent.append(
                await client.submit({"id": f"fo-{i}-{uuid.uuid4().hex[:6]}", "prompt": "ping"})
            )
            await asyncio.sleep(0.02)

    flowing = asyncio.create_task(traffic(300))
    await asyncio.sleep(1.5)
    dead = redis_cluster.kill_primary(bucket)
    promoted = redis_cluster.wait_failover(bucket, dead, timeout_s=30)
    assert promoted is not dead and promoted.primary_of == dead.port
    await flowing
    done, pending = await asyncio.wait(sent, timeout=120)
    assert not pending, f"lost {len(pending)} of {len(sent)} requests"
    results = [f.result() for f in done]
    assert {r.status for r in results} == {"ok"}, [r for r in results if r.status != "ok"][:3]
    assert all(r.output == "pong" for r in results)
    # The stores use the promoted replica: the bucket is written there again.
    check = aioredis.Redis(host=redis_cluster.host, port=promoted.port, socket_timeout=2)
    try:
        for _ in range(50):
            if await check.exists(bucket):
                break
            await client.ask("ping", timeout_s=30)
            await asyncio.sleep(0.1)
        assert await check.exists(bucket), "nothing wrote the bucket after the failover"
    finally:
        await check.aclose()
    # The classifier's rate limiter failed open meanwhile, and came back.
    log = (Path(stack.broker.log_path or "").with_name("stack.log")).read_text()
    failed = "rate limiter (fail_open=True): Redis failed during check"
    assert failed in log, "the classifier never saw the primary die"
    assert "rate limiter (fail_open=True): Redis answers again" in log.split(failed, 1)[1]
