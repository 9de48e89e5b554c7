"""The faust application and its classifier agent.

The agent is thin: it turns each event into a ``SourceRecord``, calls the
pure ``admit``, then asks Redis what the request needs — the tenant's rate
limit, the session's history, the response cache, a rule's lookup — and
hands what it found to the pure ``route``. It produces what ``route``
returns and waits for the broker's acknowledgement before the event is
acked (at-least-once). Timers keep the flow controller's load level, the
route statistics, the rule file, the semantic cache index and the drift
monitor current.
Concurrency stays 1 per agent: with more, faust can commit past a message
still in flight (faust #606); scale by partitions instead.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faust

from schemas.errors import BackendUnavailable
from schemas.messages import ChatMessage, Lane, QualityEvent
from schemas.settings import Settings
from streams.cache.embedding import MiniLMEmbedder
from streams.cache.hot_questions import HotQuestions
from streams.cache.response import ResponseCache
from streams.classify.classifier import (
    Admitted,
    Classified,
    SourceRecord,
    admit,
    refuse_over_limit,
    route,
)
from streams.classify.drift import DriftMonitor
from streams.classify.flow import FlowController
from streams.classify.policy import Decision, Found
from streams.classify.registry import load_registry
from streams.classify.router import RouteBoard, SmartRouter
from streams.kafka.envelopes import Outbound, deliver, dlq_for
from streams.kafka.faust_transport import new_app, raw_sender, raw_topic
from streams.ops import BACKLOG, FLOW_LEVEL, LATENCY, RECORDS, RESULTS, ROUTED, ProcessState
from streams.rules.rulefile import RuleSource
from streams.stores.backlog import BacklogBoard, LatencyBoard
from streams.stores.ratelimit import RateLimiter
from streams.stores.sessions import SessionStore, context_digest

__all__ = ["Lookups", "build_app"]

log = logging.getLogger(__name__)


class Lookups:
    """Everything the classifier asks Redis about one accepted request."""

    def __init__(self, settings: Settings, redis: Any, rules: RuleSource) -> None:
        self.settings = settings
        self.redis = redis
        self.rules = rules
        self.limiter = RateLimiter(redis, settings.ratelimit, settings.redis.key_prefix)
        self.sessions = SessionStore(redis, settings.session, key_prefix=settings.redis.key_prefix)
        self.semantic = settings.cache_in_use and settings.cache.semantic
        embedder = MiniLMEmbedder() if self.semantic else None
        self.cache = ResponseCache(
            redis, settings.cache, key_prefix=settings.redis.key_prefix, embedder=embedder
        )
        self.hot = HotQuestions(
            redis, settings.prewarm, settings.cache, key_prefix=settings.redis.key_prefix
        )

    async def find(self, admitted: Admitted) -> tuple[Found, list[ChatMessage]]:
        """What cache, rules and the session say about the request."""
        request, settings = admitted.request, self.settings
        history = await self.sessions.history(request.session_id)
        if settings.routing.force_path is not None:
            return Found(history_turns=len(history)), history
        book = self.rules.book
        text = request.user_text()
        classified = book.classify(text)
        hit = None
        if settings.cache_in_use:
            context = context_digest(history)
            self.hot.note(request, context)
            hit = await self.cache.lookup(request, context)
        rule = None
        if hit is None and settings.routing.rules_enabled:
            match = book.match(text, classified=classified)
            if match is not None:
                rule = await book.resolve(match, self.redis, settings.redis.key_prefix)
        found = Found(hit=hit, rule=rule, intent=classified[0], history_turns=len(history))
        return found, history

    async def remember(self, classified: Classified) -> None:
        """A conversation's turn answered here (cache or rules) joins its
        session history, as the workers' answers do."""
        request, result = classified.request, classified.result
        if request is None or result is None or not request.session_id:
            return
        if result.status == "ok" and result.output:
            await self.sessions.append(
                request.session_id, request.id, request.user_text(), result.output
            )


def build_app(
    settings: Settings, state: ProcessState, rules: RuleSource | None = None
) -> faust.App:
    redis = settings.redis.client()
    rules = rules or RuleSource.from_settings(settings.rules)
    lookups = Lookups(settings, redis, rules)
    router = SmartRouter(
        load_registry(settings.routing.models_file, settings.backend), settings.routing
    )
    routes = RouteBoard(redis, settings.redis.key_prefix)
    backlog_board = BacklogBoard(redis, settings.redis.key_prefix)
    latency_board = LatencyBoard(redis, settings.redis.key_prefix)
    flow = FlowController(settings.flow.enter, settings.flow.exit, settings.flow.hold_s)
    slow = FlowController(
        settings.flow.p95_enter_ms, settings.flow.p95_exit_ms, settings.flow.hold_s
    )
    drift = DriftMonitor(settings.drift)
    app = new_app(settings, settings.app_id)
    requests = raw_topic(app, settings.topic("requests"))

    send = raw_sender(app)

    async def classify_one(record: SourceRecord) -> Classified:
        now_ms = int(time.time() * 1000)
        admitted = admit(record, now_ms=now_ms, settings=settings)
        if isinstance(admitted, Classified):
            return admitted
        verdict = await lookups.limiter.check(admitted.request.tenant)
        if not verdict.allowed:
            return refuse_over_limit(
                admitted, verdict.retry_after_ms, now_ms=now_ms, settings=settings
            )
        found, history = await lookups.find(admitted)
        classified = route(
            admitted,
            found,
            now_ms=int(time.time() * 1000),
            settings=settings,
            router=router,
            stats=routes.snapshot,
            level=max(flow.level, slow.level),
            history=history,
        )
        if classified.decision is not None and classified.decision.features is not None:
            drift.observe(classified.decision.features.as_dict())
        return classified

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
            try:
                classified = await classify_one(record)
            except Exception as exc:  # a bug must not stall the partition
                log.exception("classifier failed on %s:%s", record.topic, record.offset)
                error = BackendUnavailable(f"classifier error: {type(exc).__name__}: {exc}")
                classified = Classified("rejected", [dlq_for(record, error, settings)])
            await deliver(classified.records, send, settings)
            await lookups.remember(classified)
            _observe(classified)

    @app.timer(settings.flow.interval_s)
    async def watch_load() -> None:
        """Re-read lane backlog and p95 latency; move the load level (hysteresis)."""
        if not settings.flow.enabled:
            return
        before = max(flow.level, slow.level)
        now = time.monotonic()
        backlog = await backlog_board.read()
        if backlog is not None:  # None: Redis cannot say, keep the level we have
            for lane, waiting in backlog.items():
                BACKLOG.labels(lane).set(waiting)
            flow.update(sum(backlog.values()), now)
        latency = await latency_board.read()
        if latency is not None:
            # Bulk is slow by design; the interactive lanes say when users wait.
            slow.update(max(latency.get(Lane.REALTIME, 0.0), latency.get(Lane.MEDIUM, 0.0)), now)
        level = max(flow.level, slow.level)
        FLOW_LEVEL.set(level)
        if level != before:
            log.warning(
                "load level %d -> %d (backlog %s, p95 ms %s)",
                before,
                level,
                dict(backlog or {}),
                {k.value: round(v) for k, v in (latency or {}).items()},
            )

    @app.timer(settings.routing.weights_refresh_s)
    async def refresh_routes() -> None:
        await routes.refresh()

    @app.timer(settings.rules.reload_interval_s)
    async def reload_rules() -> None:
        if rules.reload_if_changed():
            log.info("rules reloaded from %s", settings.rules.file)

    @app.timer(settings.cache.sync_interval_s)
    async def sync_cache() -> None:
        if lookups.semantic:
            await lookups.cache.sync()

    @app.timer(settings.prewarm.flush_interval_s)
    async def count_hot_questions() -> None:
        await lookups.hot.flush()

    @app.timer(settings.drift.interval_s)
    async def watch_drift() -> None:
        if not settings.drift.enabled:
            return
        drifted = drift.publish()
        if drifted:
            log.warning("request features drifted from the baseline: %s", drifted)
            now_ms = int(time.time() * 1000)
            event = QualityEvent(
                kind="drift",
                id=f"drift-{now_ms}",
                success=False,
                latency_ms=0.0,
                ts_ms=now_ms,
                drift=drifted,
            )
            out = Outbound(settings.topic("quality"), b"drift", event.model_dump_json().encode())
            await deliver([out], send, settings)

    @app.timer(1.0)
    async def _heartbeat() -> None:
        state.beat()  # /healthz fails when the loop stops running this

    warm = {"assigned": False, "loaded": False}

    def _ready() -> None:
        """Ready once partitions are assigned and the embedder is loaded."""
        state.ready = warm["assigned"] and warm["loaded"]

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        warm["assigned"] = True
        state.detail = f"classifying {len(assigned)} partitions"
        _ready()

    @app.task
    async def _warm() -> None:
        """Load the embedder and the route statistics before the first
        request needs them, so its latency is not a model load."""
        await routes.refresh()
        if lookups.semantic:
            await lookups.cache.sync()
        warm["loaded"] = True
        _ready()

    return app


def _choice(decision: Decision) -> str:
    if decision.forced:
        return "forced"
    if decision.requested_path is not None:
        return "degraded"
    return "explored" if decision.explored else "scored"


def _observe(classified: Classified) -> None:
    RECORDS.labels("classifier", classified.outcome).inc()
    decision = classified.decision
    if classified.outcome == "routed" and decision is not None:
        ROUTED.labels(str(decision.lane), str(decision.path), _choice(decision)).inc()
    result = classified.result
    if result is not None:
        lane, path = str(result.lane or "none"), str(result.path or "none")
        code = result.error.code if result.error else ""
        RESULTS.labels(lane, path, result.status, code).inc()
        LATENCY.labels(lane, path).observe(result.timings.total_ms / 1000)
