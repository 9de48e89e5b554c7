"""faust's aiokafka transport with the fetch wait taken from settings.

faust-streaming 0.15 hard-codes ``fetch_max_wait_ms=1500`` for its worker
consumer. Against the embedded Tansu broker that held every classified
request for ~630 ms (measured: client round trip of a rule answer 655 ms
with faust's value, 152 ms with 10 ms). Everything else of faust's driver is
kept; only the wait is set before the consumer starts.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from schemas.settings import Settings
from streams.kafka.envelopes import Outbound

__all__ = ["LanewayApp", "faust_datadir", "new_app", "raw_sender", "raw_topic"]


def _transport_class(fetch_max_wait_ms: int) -> type[faust_aiokafka.Transport]:
    class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # aiokafka reads this attribute when start() builds the fetcher.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class TunedConsumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class Transport(faust_aiokafka.Transport):
        Consumer = TunedConsumer

    return Transport


class LanewayApp(faust.App):
    """A faust app whose Kafka consumer waits at most ``fetch_max_wait_ms``."""

    def __init__(self, *args: Any, fetch_max_wait_ms: int, **kwargs: Any) -> None:
        self._transport_cls = _transport_class(fetch_max_wait_ms)
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Any:
        return self._transport_cls(self.conf.broker_consumer, self)


def _broker_options(settings: Settings) -> dict[str, Any]:
    kafka = settings.kafka
    options: dict[str, Any] = {
        "broker": [f"kafka://{hostport.strip()}" for hostport in kafka.bootstrap.split(",")],
    }
    context = kafka.ssl_context()
    if kafka.sasl_mechanism:
        options["broker_credentials"] = faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password.get_secret_value() if kafka.sasl_password else None,
            mechanism=kafka.sasl_mechanism,
            ssl_context=context,
        )
    elif context is not None:
        options["broker_credentials"] = faust.SSLCredentials(context)
    return options


def faust_datadir() -> Path:
    """The directory faust insists on creating (``datadir`` and its ``v1``).
    laneway's tables live in memory, so it holds nothing; it lies under the
    temp dir, one per user, so that an app (a bench's or a test's has an id
    of its own each run) leaves no ``<app_id>-data`` in the working directory."""
    path = Path(tempfile.gettempdir()) / f"laneway-faust-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def new_app(settings: Settings, app_id: str, *, consumer: bool = True) -> LanewayApp:
    """A faust app as laneway runs them: acks=all, topics created up front by
    the registry, tables in memory and rebuilt from their changelogs, no
    faust web server (``streams.ops`` serves /metrics and the probes), no
    directory in the working directory (``faust_datadir``).
    ``consumer=False``: faust's Kafka consumer is never started (an app that
    reads its topics itself, ``streams.kafka.intake``: no agents, no tables)."""
    app = LanewayApp(
        app_id,
        datadir=faust_datadir(),
        fetch_max_wait_ms=settings.kafka.fetch_max_wait_ms,
        store="memory://",
        topic_partitions=settings.kafka.partitions,
        topic_replication_factor=settings.kafka.replication_factor,
        topic_allow_declare=False,
        web_enabled=False,
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=100,
        broker_commit_interval=1.0,
        # faust's 60 s defaults held a restarted classifier's partitions for
        # ~110 s (the dead member's session had to expire); 10 s gave 24 s.
        producer_request_timeout=settings.kafka.produce_timeout_ms / 1000,
        broker_session_timeout=10.0,
        broker_rebalance_timeout=10.0,
        # The check guards a table kept on disk (RocksDB) against a changelog
        # emptied under it; laneway's tables are in memory, so an offset it
        # holds was read from the changelog by this process. The embedded
        # broker lists a changelog's end one short of its last batch
        # (docs/delivery.md), so the check crashed a router replica taking
        # over a killed one's partitions it had stood by for ("persisted
        # offset ... is higher than the last offset", laneway bench chaos).
        recovery_consistency_check=False,
        **_broker_options(settings),
    )
    if not consumer:
        app.boot_strategy = app.BootStrategy(app, enable_kafka_consumer=False)
    return app


def raw_topic(app: faust.App, name: str) -> Any:
    """A topic of raw bytes keys and values (laneway decodes them itself)."""
    return app.topic(
        name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def raw_sender(app: faust.App) -> Callable[[Outbound], Awaitable[Any]]:
    """``send`` for ``streams.kafka.envelopes.deliver``: produce an ``Outbound``
    as raw bytes; the returned awaitable resolves on the broker's ack."""

    async def send(record: Outbound) -> Any:
        return await app.send(
            record.topic,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
            partition=record.partition,
            key_serializer="raw",
            value_serializer="raw",
        )

    return send
