"""The faust application and its classifier agent.

The agent is thin: it turns each event into a ``SourceRecord``, calls the
pure ``classify_record``, asks the tenant's rate limiter about an accepted
request, and produces what it returns, waiting for the
broker's acknowledgement before the event is acked (at-least-once).
Concurrency stays 1 per agent: with more, faust can commit past a message
still in flight (faust #606); scale by partitions instead.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faust

from schemas.errors import BackendUnavailable
from schemas.settings import Settings
from streams.backlog import BacklogBoard
from streams.classifier import Classified, SourceRecord, classify_record, refuse_over_limit
from streams.envelopes import Outbound, deliver, dlq_for
from streams.faust_transport import LanewayApp
from streams.flow import FlowController
from streams.ops import BACKLOG, FLOW_LEVEL, LATENCY, RECORDS, RESULTS, ProcessState
from streams.ratelimit import RateLimiter
from streams.rules import RuleBook

__all__ = ["build_app"]

log = logging.getLogger(__name__)


def _faust_broker_options(settings: Settings) -> dict[str, Any]:
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


def build_app(settings: Settings, state: ProcessState, rules: RuleBook | None = None) -> faust.App:
    rules = rules or RuleBook()
    redis = settings.redis.client()
    limiter = RateLimiter(redis, settings.ratelimit, settings.redis.key_prefix)
    board = BacklogBoard(redis, settings.redis.key_prefix)
    flow = FlowController(settings.flow.enter, settings.flow.exit, settings.flow.hold_s)
    app = LanewayApp(
        settings.app_id,
        fetch_max_wait_ms=settings.kafka.fetch_max_wait_ms,
        store="memory://",
        topic_partitions=settings.kafka.partitions,
        topic_replication_factor=settings.kafka.replication_factor,
        topic_allow_declare=False,  # the registry created every topic up front
        web_enabled=False,  # /metrics, /healthz, /readyz come from streams.ops
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=100,
        broker_commit_interval=1.0,
        **_faust_broker_options(settings),
    )
    requests = app.topic(
        settings.topic("requests"),
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )

    async def send(record: Outbound) -> Any:
        return await app.send(
            record.topic,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
            key_serializer="raw",
            value_serializer="raw",
        )

    @app.agent(requests, concurrency=1)
    async def classify(stream: faust.StreamT) -> None:
        async for event in stream.events():
            message = event.message
            record = SourceRecord(
                value=event.value,
                key=event.key,
                timestamp_ms=int(message.timestamp * 1000),
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
            )
            now_ms = int(time.time() * 1000)
            try:
                classified = classify_record(
                    record, now_ms=now_ms, settings=settings, rules=rules, level=flow.level
                )
                if classified.request is not None:
                    verdict = await limiter.check(classified.request.tenant)
                    if not verdict.allowed:
                        classified = refuse_over_limit(
                            classified,
                            verdict.retry_after_ms,
                            age_ms=now_ms - record.timestamp_ms,
                            now_ms=now_ms,
                            settings=settings,
                        )
            except Exception as exc:  # a bug must not stall the partition
                log.exception("classifier failed on %s:%s", record.topic, record.offset)
                error = BackendUnavailable(f"classifier error: {type(exc).__name__}: {exc}")
                classified = Classified("rejected", [dlq_for(record, error, settings)])
            await deliver(classified.records, send, settings)
            _observe(classified)

    @app.timer(settings.flow.interval_s)
    async def watch_load() -> None:
        """Re-read the lane backlog and move the load level (hysteresis)."""
        if not settings.flow.enabled:
            return
        backlog = await board.read()
        if backlog is None:
            return  # Redis cannot say: keep the level we have
        for lane, waiting in backlog.items():
            BACKLOG.labels(lane).set(waiting)
        before = flow.level
        level = flow.update(sum(backlog.values()), time.monotonic())
        FLOW_LEVEL.set(level)
        if level != before:
            log.warning("load level %d -> %d (backlog %s)", before, level, dict(backlog))

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        state.ready = True
        state.detail = f"classifying {len(assigned)} partitions"

    return app


def _observe(classified: Classified) -> None:
    RECORDS.labels("classifier", classified.outcome).inc()
    result = classified.result
    if result is not None:
        lane, path = str(result.lane or "none"), str(result.path or "none")
        code = result.error.code if result.error else ""
        RESULTS.labels(lane, path, result.status, code).inc()
        LATENCY.labels(lane, path).observe(result.timings.total_ms / 1000)
