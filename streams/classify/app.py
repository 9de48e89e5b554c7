"""The faust application and the classifier's request loop.

The loop is thin: it takes the request records in batches
(``streams.kafka.intake``: what the consumer holds, up to
``LANEWAY_CLASSIFIER_BATCH_MAX`` records), turns them into
``SourceRecord`` s and hands them to
``streams.classify.batch.BatchClassifier``, which admits, looks up (one
pipelined Redis round trip per batch, one embedding call) and routes them.
Everything a wave of the batch produced is sent at once and every
acknowledgement gathered (``deliver``) before the next wave; only once the
whole batch is acknowledged is it marked done, and only done offsets are
committed (at-least-once). A ``Pipeline`` produces batch N while N+1 is
looked up, one batch in flight.

Why the request topic is read by a plain aiokafka consumer and not a faust
agent: profiled under ``laneway bench --classifier``, faust's consumer
machinery (its consumer thread and the hand-over of each record to the
event loop, one ``Event`` per record, stream buffering, per-event acks and
monitor sensors) took about a third of the process's CPU, more than the
whole classification. ``Intake.batches`` hands over each ``getmany`` as one
batch, and the intake commits by hand what is done, waits on a rebalance
for the batches in flight before it commits and gives the partitions up, and
leaves the group on stop (see ``streams.kafka.intake``). It joins faust's
old consumer group (the app id), so the offsets an older classifier
committed are kept; faust's own Kafka consumer is not started
(``new_app(..., consumer=False)``). Members of one group must share an
assignor, and faust's is not aiokafka's: on an upgrade, stop the older
classifiers before these start (they would be refused the group).

faust still runs the process: the producer, the timers below (the flow
controller's load level, the route statistics, the rule file, the semantic
cache index and the drift monitor), the worker's signals and logging.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any

import faust
from aiokafka import ConsumerRecord
from prometheus_client import Histogram

from schemas.messages import Lane, QualityEvent
from schemas.settings import Settings
from streams.classify.batch import BatchClassifier, BatchLookups, Pipeline, wave_keys
from streams.classify.classifier import Classified, SourceRecord
from streams.classify.drift import DriftMonitor
from streams.classify.flow import FlowController
from streams.classify.gate import RealtimeGate, realtime_workers
from streams.classify.policy import Decision
from streams.classify.router import RouteBoard, SmartRouter
from streams.classify.stages import STAGE_SECONDS
from streams.classify.tokens import TokenCounter
from streams.kafka.batches import BatchSend
from streams.kafka.envelopes import Outbound, deliver
from streams.kafka.faust_transport import new_app, raw_sender
from streams.kafka.intake import Intake, Taken
from streams.kafka.otlp import Ended, spans_for
from streams.kafka.spans import classified_outcome
from streams.kafka.tracing import trace_headers, traced
from streams.ops import (
    BACKLOG,
    FLOW_LEVEL,
    LATENCY,
    RECORDS,
    RESULTS,
    ROUTED,
    SPILLED,
    TIME_TO_FIRST_TOKEN,
    ProcessState,
)
from streams.rollout.board import RolloutBoard
from streams.rollout.routers import RouterCatalog, ShadowTally, tally_key
from streams.routing.registry import load_registry
from streams.rules.rulefile import RuleSource
from streams.stores.backlog import BacklogBoard, LaneLoad, LatencyBoard, lane_loads
from streams.stores.workerboard import Serving, WorkerBoard, lane_capacity, served_paths

__all__ = ["ClassifierService", "build_app", "observe_outcomes", "source_record"]

log = logging.getLogger(__name__)

BATCH_SIZE = Histogram(
    "laneway_classifier_batch_size",
    "Request records the classifier took in one batch",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)


def source_record(record: ConsumerRecord) -> SourceRecord:
    """A consumed record as the classifier reads it."""
    return SourceRecord(
        record.value,
        record.key,
        record.timestamp,
        record.topic,
        record.partition,
        record.offset,
        tuple(record.headers or ()),
    )


def batch_sender(app: faust.App) -> BatchSend:
    """``send`` for ``deliver`` through faust's own (acks=all) aiokafka
    producer, a batch per partition (``streams.kafka.batches``): the request
    loop's hot path produces thousands of records a second, and ``app.send`` costs a
    topic object, a future message and a producer call per record."""

    async def producer() -> Any:
        started = await app.maybe_start_producer()
        return started._ensure_producer()

    return BatchSend(producer)


class ClassifierService:
    """The classifier process: its boards, its ``BatchClassifier``, and the
    faust app (``app``) whose task, timers and shutdown hook are the methods
    below. State the timers read and write is kept here as attributes."""

    def __init__(
        self, settings: Settings, state: ProcessState, rules: RuleSource | None = None
    ) -> None:
        self.settings = settings
        self.state = state
        redis = self.redis = settings.redis.client()
        prefix = settings.redis.key_prefix
        self.rules = rules or RuleSource.from_settings(settings.rules)
        self.lookups = BatchLookups(settings, redis, self.rules)
        registry = load_registry(settings.routing.models_file, settings.backend)
        self.router = SmartRouter(registry, settings.routing)
        self.routes = RouteBoard(redis, prefix)
        self.workers = WorkerBoard(redis, prefix, stale_s=3 * settings.worker_heartbeat_s)
        routers = RouterCatalog(settings.routing)
        self.rollout = RolloutBoard(
            redis, prefix, registry, self.workers, routers if routers.enabled else None
        )
        self.tally = ShadowTally()
        self.serving: Serving | None = None
        """Per lane, the paths live workers serve, as last read (``None``:
        Redis could not say)."""
        self.loads: dict[Lane, LaneLoad] | None = None
        """The lane backlog board as last read (``None``: Redis could not say)."""
        self.backlog_board = BacklogBoard(redis, prefix)
        self.latency_board = LatencyBoard(redis, prefix)
        flow = settings.flow
        self.flow = FlowController(flow.enter, flow.exit, flow.hold_s)
        self.gate = RealtimeGate(flow)  # realtime full? between the workers' reports too
        self.slow = FlowController(flow.p95_enter_ms, flow.p95_exit_ms, flow.hold_s)
        self.drift = DriftMonitor(settings.drift)
        self.batches = BatchClassifier(
            settings,
            self.lookups,
            self.router,
            stats=lambda: self.routes.snapshot,
            level=self.level,
            serving=lambda: self.serving,
            gate=self.gate,
            drift=self.drift,
            rollout=lambda: self.rollout.current,
            tally=self.tally,
            tokens=TokenCounter.for_registry(settings, registry),
        )
        self.app = new_app(settings, settings.app_id, consumer=False)
        self.send = raw_sender(self.app)
        self.produce = batch_sender(self.app)
        self.assigned = False
        self.loaded = False
        self.spans = spans_for(
            settings.tracing, "classifier", settings.app_id
        )  # exported: an endpoint
        take = settings.classifier
        self.intake = Intake(
            settings,
            settings.topic("requests"),
            settings.app_id,
            max_records=take.batch_max,
            wait_s=take.batch_wait_ms / 1000,
            settle_s=take.settle_s,
            on_assigned=self._assigned,
        )
        self._register()

    def _register(self) -> None:
        app, settings = self.app, self.settings
        app.task(self.classify)
        app.on_before_shutdown.connect(self._drain)  # type: ignore[arg-type]
        app.timer(settings.flow.interval_s)(self.watch_load)
        app.timer(settings.flow.gate_interval_s)(self.watch_realtime)
        app.timer(settings.worker_heartbeat_s)(self.read_worker_board)
        app.timer(settings.routing.weights_refresh_s)(self.refresh_routes)
        app.timer(settings.rollout.refresh_s)(self.refresh_rollout)
        app.timer(settings.rules.reload_interval_s)(self.reload_rules)
        app.timer(settings.cache.sync_interval_s)(self.sync_cache)
        app.timer(settings.prewarm.flush_interval_s)(self.count_hot_questions)
        app.timer(settings.drift.interval_s)(self.watch_drift)
        app.timer(1.0)(self._heartbeat)
        app.task(self._warm)

    def level(self) -> int:
        """The load level: the higher of the backlog's and the p95 latency's."""
        return max(self.flow.level, self.slow.level)

    # -- readiness -----------------------------------------------------------

    def _ready(self) -> None:
        """Ready once partitions are assigned and the embedder is loaded."""
        self.state.ready = self.assigned and self.loaded

    def _assigned(self, assigned: set[Any]) -> None:
        self.assigned = True
        self.state.detail = f"classifying {len(assigned)} partitions"
        self._ready()

    async def _warm(self) -> None:
        """Load the embedder, the token counter's vocabulary and the route
        statistics before the first request needs them, so its latency is
        not a model load."""
        if self.batches.tokens is not None:
            await asyncio.to_thread(self.batches.tokens.load)
        await self.routes.refresh()
        await self.rollout.refresh()
        if self.lookups.semantic:
            await self.lookups.cache.sync()
        _settle_the_heap()
        self.loaded = True
        self._ready()

    async def _heartbeat(self) -> None:
        self.state.beat()  # /healthz fails when the loop stops running this

    # -- the request loop ----------------------------------------------------

    async def classify(self) -> None:
        # The gate's marks before the first batch: a restart's backlog comes
        # as one burst, and the timers first fire an interval after start.
        await self.read_workers()
        if self.settings.flow.enabled:
            await self.read_realtime_load()
        await self.intake.start()
        pipeline = Pipeline()  # batch N is produced and acked while N+1 is looked up
        spans, clock = self.spans, self.batches.clock
        try:
            async for taken in self.intake.batches():
                clock.start()  # the time between batches: the consumer and the event loop
                taken_ns = time.time_ns()
                BATCH_SIZE.observe(len(taken.records))
                records = [source_record(record) for record in taken.records]
                waves = self.batches.classify_waves(records, before=pipeline.clear_of)
                done = 0
                async for wave in waves:
                    outcomes = [classified for _, classified in wave]
                    # Each request's records carry a child of its traceparent (or a new trace).
                    trace = {i: spans.start(records[i], taken_ns) for i, _ in wave}
                    out = [r for i, c in wave for r in traced(c.records, trace_headers(trace[i]))]
                    handled = (
                        [(trace[i], classified_outcome(c)) for i, c in wave]
                        if spans.exporting
                        else []
                    )
                    await pipeline.wait()  # one batch in flight at most, and its errors surface
                    wave_done = partial(self.settle, outcomes, out, handled)
                    pipeline.chain(wave_done, wave_keys(records, wave))
                    done += len(wave)
                    if done < len(records):  # another wave: it reads what this one wrote
                        await pipeline.wait()
                    clock.lap("produce")
                pipeline.chain(partial(self.acked, taken))
                clock.flush()
        except BaseException:
            self.intake.abandon()  # nothing still open is committed; the process stops
            raise

    async def _drain(self, sender: Any, **kwargs: Any) -> None:
        """Stop taking, let the batches in flight finish, commit, leave the group."""
        await self.intake.stop()
        await self.spans.aclose()  # what is queued, within the export timeout

    async def settle(
        self, outcomes: list[Classified], out: list[Outbound], handled: list[Ended]
    ) -> None:
        """Produce a wave's records (``out``) and wait for every ack; then end
        its spans, and keep its sessions and metrics."""
        started = time.perf_counter()
        await deliver(out, self.produce, self.settings)
        self.spans.finish(handled)
        await self.lookups.remember(outcomes)
        observe_outcomes(outcomes)
        STAGE_SECONDS.labels("deliver").inc(time.perf_counter() - started)

    async def acked(self, taken: Taken) -> None:
        """Every output of the batch is acknowledged: its offsets may move."""
        self.intake.done(taken)

    # -- load and the realtime gate ------------------------------------------

    async def watch_load(self) -> None:
        """Re-read lane backlog and p95 latency; move the load level (hysteresis)."""
        if not self.settings.flow.enabled:
            return
        before = self.level()
        now = time.monotonic()
        loads = self.loads  # watch_realtime's last read, at most gate_interval_s old
        backlog: dict[Lane, int] | None = None
        if loads is not None:  # None: Redis cannot say, keep the level we have
            backlog = {lane: load.waiting for lane, load in loads.items()}
            for lane, waiting in backlog.items():
                BACKLOG.labels(lane).set(waiting)
            self.flow.update(sum(backlog.values()), now)
        latency = await self.latency_board.read()
        if latency is not None:
            # Bulk is slow by design; the interactive lanes say when users wait.
            interactive = max(latency.get(Lane.REALTIME, 0.0), latency.get(Lane.MEDIUM, 0.0))
            self.slow.update(interactive, now)
        level = self.level()
        FLOW_LEVEL.set(level)
        if level != before:
            log.warning(
                "load level %d -> %d (backlog %s, p95 ms %s)",
                before,
                level,
                dict(backlog or {}),
                {k.value: round(v) for k, v in (latency or {}).items()},
            )

    async def read_realtime_load(self) -> None:
        """The lane backlog board, for the gate: a worker reports as its
        batches start and end."""
        reports = await self.backlog_board.read_reports()
        if reports is None:  # Redis cannot say; the gate fails open once stale
            self.loads = None
            return
        loads = self.loads = lane_loads(reports)
        realtime = loads[Lane.REALTIME]
        gate = self.gate
        gate.reported(realtime.waiting, realtime.drain_per_s, realtime.at_ms)
        for report in reports:
            load = report.load
            if report.lane is Lane.REALTIME and load.at_ms is not None:
                gate.worker_reported(report.worker_id, load.waiting, load.drain_per_s, load.at_ms)

    async def read_workers(self) -> None:
        """Which paths live workers serve on each lane (``None``: Redis
        cannot say), and what the realtime ones run at once and on which
        partitions (the gate's marks, and where it steers)."""
        cards = await self.workers.live()
        self.serving = None if cards is None else served_paths(cards)
        self.gate.serving(None if cards is None else lane_capacity(cards).get(Lane.REALTIME))
        if self.settings.flow.realtime_steer:
            self.gate.workers(None if cards is None else realtime_workers(cards))

    async def watch_realtime(self) -> None:
        """Re-read the realtime load more often than the load levels (which
        read what this read last)."""
        if self.settings.flow.enabled:
            await self.read_realtime_load()

    async def read_worker_board(self) -> None:
        await self.read_workers()

    # -- what the classifier reads from Redis and files ----------------------

    async def refresh_routes(self) -> None:
        await self.routes.refresh()

    async def refresh_rollout(self) -> None:
        """The live model versions (``laneway models``) and who serves them;
        the router scores each path by its active version's registry entry."""
        self.router.registry = (await self.rollout.refresh()).registry
        await self.tally.flush(self.redis, tally_key(self.settings.redis.key_prefix))

    async def reload_rules(self) -> None:
        if self.rules.reload_if_changed():
            log.info("rules reloaded from %s", self.settings.rules.file)

    async def sync_cache(self) -> None:
        if self.lookups.semantic:
            await self.lookups.cache.sync()

    async def count_hot_questions(self) -> None:
        await self.lookups.hot.flush()

    async def watch_drift(self) -> None:
        if not self.settings.drift.enabled:
            return
        drifted = self.drift.publish()
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
            out = Outbound(
                self.settings.topic("quality"),
                event.id.encode(),
                event.model_dump_json().encode(),
            )
            await deliver([out], self.send, self.settings)


def build_app(
    settings: Settings, state: ProcessState, rules: RuleSource | None = None
) -> faust.App:
    """The classifier's faust app (``ClassifierService.app``)."""
    return ClassifierService(settings, state, rules).app


def _settle_the_heap() -> None:
    """Keep the garbage collector off what was loaded at start, and off the
    request path.

    torch, transformers and the embedder leave ~500,000 objects that live as
    long as the process, and every full collection walked all of them:
    measured under ``laneway bench --classifier`` (60,000 requests), 23 full
    collections of ~0.4 s each, about a third of the process's CPU.
    ``gc.freeze()`` moves them out of the collector's generations (they are
    never freed anyway). A request's objects are freed by reference counting
    as soon as its batch is delivered; at the default young threshold (700
    net allocations) the collector still ran ~60 times a second over the
    batches in flight. At 50,000 it runs only when that many objects are left
    in reference cycles, a few MB: the same bench then used 250 instead of
    ~370 us of CPU per rule answer.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)


def _choice(decision: Decision) -> str:
    if decision.forced:
        return "forced"
    if decision.named is not None:
        return "named"
    if decision.requested_path is not None:
        return "degraded"
    return "explored" if decision.explored else "scored"


def observe_outcomes(outcomes: Sequence[Classified]) -> None:
    """Metrics of a wave: counts added once per label set, not per record
    (``labels()`` is a locked dictionary lookup; thousands a second add up)."""
    counts: Counter[tuple[Any, tuple[str, ...]]] = Counter()
    latencies: dict[tuple[str, str], list[float]] = {}
    first_tokens: dict[tuple[str, str], list[float]] = {}
    for classified in outcomes:
        counts[(RECORDS, ("classifier", classified.outcome))] += 1
        decision = classified.decision
        if classified.outcome == "routed" and decision is not None:
            counts[(ROUTED, (str(decision.lane), str(decision.path), _choice(decision)))] += 1
            if decision.spilled_from is not None:
                counts[(SPILLED, (str(decision.spilled_from), str(decision.lane)))] += 1
        result = classified.result
        if result is not None:
            lane, path = str(result.lane or "none"), str(result.path or "none")
            code = result.error.code if result.error else ""
            counts[(RESULTS, (lane, path, result.status, code))] += 1
            latencies.setdefault((lane, path), []).append(result.timings.total_ms / 1000)
            streamed = classified.request is not None and classified.request.stream
            if streamed and result.status == "ok":  # its one chunk: all of it at once
                first_tokens.setdefault((lane, path), []).append(result.timings.total_ms / 1000)
    for (metric, labels), n in counts.items():
        metric.labels(*labels).inc(n)
    for histogram_of, observed in ((LATENCY, latencies), (TIME_TO_FIRST_TOKEN, first_tokens)):
        for labels, seconds in observed.items():
            histogram = histogram_of.labels(*labels)
            for value in seconds:
                histogram.observe(value)
