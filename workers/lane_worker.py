"""A lane worker: consumes one lane topic, batches, runs, replies, commits.

Delivery is at-least-once. Offsets are committed by hand, only after every
result of the batch (reply, ``results`` and quality event) has been
acknowledged by the broker and the batch before it has committed (a worker
collects its next batch while one runs), so a worker killed mid-batch loses nothing: its
records are delivered again to the next owner of the partition, and the
client SDK drops the duplicate replies. Results are also kept in Redis by
lane record (``workers.result_store``), so a batch redelivered after its
results went out is answered again without running the models. faust is not used here because it
acks a ``take()`` batch even when the batch raised.

A request no backend could serve (INF-502) is parked on the lane's retry
topic while it has attempts and deadline left, and put back on the lane by
the ``RetryRelay`` that runs beside the worker when its backoff has passed
(``workers.retry``): the worker never sleeps on a failed request.

The model work of a batch (the cache asked again, each question decoded
once, answers stored as they are decoded) is the ``BatchRunner``'s
(``workers.runner``), and where the worker stands on each partition, which
its backlog report counts from, is ``workers.positions``'s; this module
keeps the Kafka side and the reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from prometheus_client import Counter, Gauge
from pydantic import ValidationError

from schemas.backends import backend_kind
from schemas.messages import AnswerPath, InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings
from streams.cache.response import ResponseCache
from streams.kafka.envelopes import Outbound, deliver
from streams.kafka.otlp import spans_for
from streams.kafka.spans import UNREADABLE, lane_outcomes
from streams.kafka.tracing import Traces, trace_headers, traced
from streams.ops import BATCH_SIZE, LATENCY, RECORDS, RESULTS, ProcessState
from streams.routing.registry import ModelRegistry, load_registry, worker_paths
from streams.stores.backlog import BacklogBoard, DrainRate
from streams.stores.workerboard import PathCard, WorkerBoard, WorkerCard
from workers.batcher import collect_batch
from workers.cancels import CancelWatch
from workers.check import probe
from workers.claims import DecodeClaims
from workers.execution import BackendSlot, Executor, backend_slots, version_slots
from workers.positions import ForgetOnRebalance, LanePositions, reported_backlog
from workers.result_store import RecordKey, ResultStore, record_id
from workers.retry import RetryRelay
from workers.runner import BatchRunner
from workers.settle import Answer, give_up, reject_unreadable, settle_failures, terminal_for
from workers.streaming import AnswerStream, StreamAttempts

__all__ = ["AnsweredHook", "LaneWorker"]

log = logging.getLogger(__name__)

AnsweredHook = Callable[[Sequence[tuple[RoutedRequest, InferenceResult]]], Awaitable[None]]
"""Called with a batch's fresh answers once they are acknowledged (session
history; the worker's ``BatchRunner`` stores model answers in the cache as
soon as they are decoded). It must not raise and must be idempotent: a
redelivered batch calls it again."""

IN_FLIGHT = Gauge(
    "laneway_lane_in_flight",
    "Lane records a worker has taken and not yet committed (its batches in flight)",
    ["lane"],
)

SHADOWS = Counter(
    "laneway_shadow_results_total",
    "Answers of shadow versions, recorded on the shadow topic and never sent to a client",
    ["lane", "status"],
)

REPLAYED = Counter(
    "laneway_results_replayed_total",
    "Redelivered requests answered from the result store instead of a model",
    ["lane"],
)


class LaneWorker:
    def __init__(
        self,
        settings: Settings,
        lane: Lane,
        state: ProcessState | None = None,
        executor: Executor | None = None,
        store: ResultStore | None = None,
        board: BacklogBoard | None = None,
        on_answered: AnsweredHook | None = None,
        cache: ResponseCache | None = None,
        workers: WorkerBoard | None = None,
        claims: DecodeClaims | None = None,
        attempts: StreamAttempts | None = None,
        cancels: CancelWatch | None = None,
        registry: ModelRegistry | None = None,
    ) -> None:
        """``registry``: the models to load when no ``executor`` is given
        (``None``: ``settings``' registry file or the built-in one)."""
        self.settings = settings
        self.lane = lane
        self.lane_settings = settings.lane(lane)
        self.state = state or ProcessState()
        if executor is None:
            registry = registry or load_registry(settings.routing.models_file, settings.backend)
            paths = worker_paths(settings, lane, registry)
            executor = Executor(
                lane,
                backend_slots(settings.backend, paths, registry),
                settings.backend.system_prompt,
                version_slots(settings.backend, registry, paths),
                {path: registry.fallbacks(path) for path in registry.model_paths},
            )
        self.cancel_watch = cancels
        """Reads the clients' cancels (``None``: this worker hears none)."""
        self.runner = BatchRunner(
            settings, lane, executor, cache, claims, cancels.cancels if cancels else None
        )
        """Runs the batches' model work, each question once (``workers.runner``)."""
        self.store = store
        self.board = board
        self.on_answered = on_answered
        self.workers = workers
        """Where this worker announces the paths it serves (``None``: nowhere)."""
        self.attempts = attempts or StreamAttempts(
            None, prefix=settings.redis.key_prefix, ttl_s=settings.stream.attempt_ttl_s
        )
        """Numbers the decodes of streamed requests (``workers.streaming``)."""
        self._worker_id = uuid.uuid4().hex[:8]
        self._probed: set[int] = set()
        """Slots (by ``id``) whose backend loaded and answered a test inference."""
        self.drain = DrainRate()
        """Records this worker answers a busy second (on the backlog board)."""
        self._running = 0
        """Records of the batches in flight, not yet settled."""
        self.positions = LanePositions()
        """Where this worker stands on each partition it holds (its backlog)."""
        self.relay: RetryRelay | None = None
        self.topic = settings.lane_topic(lane)
        self.group = f"{settings.app_id}.worker.{lane}"
        self.spans = spans_for(settings.tracing, f"worker-{lane}", self.group)
        """A span per lane record settled (exported with an OTLP endpoint)."""
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        """A batch started or ended (or the worker is stopping): report now."""
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None

    @property
    def executor(self) -> Executor:
        return self.runner.executor

    async def start(self) -> None:
        """Load and probe the models, then join the lane's group. In that
        order: a worker that joined first was handed its share of the
        partitions at once and held them unread while it loaded (a lane
        worker restarted beside a replica kept half the lane's requests
        waiting ~30 s on two cores, ``laneway bench chaos``); joining once it
        can answer, its replica keeps every partition meanwhile."""
        await self._warm_up()
        # Ready (``/readyz``) once it has also joined: a stack that waits for
        # its workers to be ready then finds them in their group and, from
        # their first heartbeat on, on the worker board.
        ready, self.state.ready = self.state.ready, False
        options = self.settings.kafka.client_options()
        self._producer = AIOKafkaProducer(
            acks="all",
            enable_idempotence=self.settings.kafka.enable_idempotence,
            linger_ms=1,
            **{**options, "request_timeout_ms": self.settings.kafka.produce_timeout_ms},
        )
        self._consumer = AIOKafkaConsumer(
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_interval_ms=600_000,
            fetch_max_wait_ms=self.settings.kafka.fetch_max_wait_ms,
            **options,
        )
        self._consumer.subscribe([self.topic], listener=ForgetOnRebalance(self.positions))
        await self._producer.start()
        await self._consumer.start()
        self.relay = RetryRelay(self.settings, self.lane, self._producer)
        await self.relay.start()
        if self.cancel_watch is not None:
            await self.cancel_watch.start()
        IN_FLIGHT.labels(self.lane).set(0)  # listed from the start: 0, not unknown
        self.state.ready = ready
        log.info("%s worker started on %s", self.lane, self.topic)

    async def _warm_up(self) -> None:
        """Load the model paths before the first request, so its latency is
        not a model load, and have each answer one short inference. The
        worker is ready only once the active version of every path it serves
        has answered (a canary or shadow version that fails is logged, not
        listed, and tried again); a failure is kept (answered as INF-502,
        retried at each heartbeat)."""
        failing: list[str] = []
        others: list[str] = []
        active = {id(slot) for slot in self.executor.slots.values()}
        for path, slot in self.executor.all_slots():
            if id(slot) in self._probed and slot.backend is not None:
                continue
            self._probed.discard(id(slot))  # dropped after a CUDA error: load and ask again
            problems = failing if id(slot) in active else others
            try:
                backend = await slot.get()
            except Exception as exc:
                problems.append(f"{slot.label}: {exc}")
                continue
            if path == AnswerPath.RULES or backend.kind == "rules":  # no model to ask
                self._probed.add(id(slot))
                continue
            answered, detail = await probe(backend)
            if answered:
                self._probed.add(id(slot))
                log.info("%s: %s answered its test inference: %r", self.lane, slot.label, detail)
            else:
                problems.append(f"{slot.label}: test inference failed: {detail}")
        for reason in failing:
            log.warning("%s: backend not ready: %s", self.lane, reason)
        for reason in others:
            log.warning("%s: version not served: %s", self.lane, reason)
        self.state.ready = not failing
        self.state.detail = (
            f"{self.lane} worker consuming {self.topic}"
            if not failing
            else f"{self.lane} worker not ready: {'; '.join(failing)}"
        )

    def stop(self) -> None:
        """Stop taking work; the batch in flight is finished and committed."""
        self._stopping.set()
        self._changed.set()

    async def run(self) -> None:
        """Consume the lane until ``stop()``, with the retry relay beside it.

        Up to ``max_inflight_batches`` batches run at once: the next batch is
        collected while one runs, so a continuously batching backend gets new
        requests mid-decode. Each batch commits only after the batch before
        it has committed, so an offset is never committed past a record
        still running. A relay or batch that dies takes the worker with it;
        the supervisor restarts it, and what was not committed is delivered
        again."""
        assert self._consumer is not None and self.relay is not None
        lane = self.lane_settings
        relay = asyncio.create_task(self._relay_and_cancels())
        announcing = asyncio.create_task(self._announce_until_stopped())
        reporting = asyncio.create_task(self._report_until_stopped())
        inflight: list[asyncio.Task[None]] = []
        try:
            while not self._stopping.is_set():
                if relay.done():
                    relay.result()  # raises what killed it
                    raise RuntimeError(f"{self.lane} retry relay stopped")
                for task in [t for t in inflight if t.done()]:
                    inflight.remove(task)
                    task.result()  # raises what killed the batch
                if len(inflight) >= lane.max_inflight_batches:
                    await asyncio.wait([*inflight, relay], return_when=asyncio.FIRST_COMPLETED)
                    continue
                records = await collect_batch(
                    self._fetch,
                    max_size=lane.max_batch_size,
                    max_wait_s=lane.max_wait_ms / 1000,
                    idle_timeout_s=0.5,
                )
                if records:
                    after = inflight[-1] if inflight else None
                    task = asyncio.create_task(self.process(records, after=after))
                    taken = IN_FLIGHT.labels(self.lane)
                    taken.inc(len(records))
                    self._running += len(records)
                    self._changed.set()
                    task.add_done_callback(
                        functools.partial(self._done, taken, len(records), time.monotonic())
                    )
                    inflight.append(task)
        except asyncio.CancelledError:  # past the drain time: abandon, uncommitted
            for task in inflight:
                task.cancel()
            raise
        finally:
            self._stopping.set()
            reporting.cancel()
            announcing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reporting
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(announcing, timeout=2.0)  # withdraws the card
            if inflight:  # drain: each batch finishes and commits (cancelled with run())
                await asyncio.gather(*inflight, return_exceptions=True)
            # A relay between produce and commit finishes that step (one poll).
            done, _ = await asyncio.wait({relay}, timeout=2.0)
            if not done:
                relay.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await relay

    async def _relay_and_cancels(self) -> None:
        """The retry relay and the cancel watch, side by side: either one
        dying takes the worker with it."""
        assert self.relay is not None
        runs = [self.relay.run(self._stopping)]
        if self.cancel_watch is not None:
            runs.append(self.cancel_watch.run(self._stopping))
        await asyncio.gather(*runs)

    def card(self) -> WorkerCard:
        """What this worker serves now: the paths (and versions) whose
        backend is loaded; a canary or shadow version only once it also
        answered its test inference."""
        lane = self.lane_settings
        active = {id(slot) for slot in self.executor.slots.values()}
        paths = tuple(
            _path_card(path, slot)
            for path, slot in self.executor.all_slots()
            if path != AnswerPath.RULES
            and slot.backend is not None
            and (id(slot) in active or id(slot) in self._probed)
        )
        capacity = lane.max_batch_size * lane.max_inflight_batches
        return WorkerCard(
            self._worker_id, self.lane, paths, capacity, partitions=self._lane_partitions()
        )

    def _lane_partitions(self) -> tuple[int, ...]:
        """The lane topic's partitions this worker holds now."""
        if self._consumer is None:
            return ()
        held = self._consumer.assignment()
        return tuple(sorted(tp.partition for tp in held if tp.topic == self.topic))

    async def _announce_until_stopped(self) -> None:
        """Announce the card every ``worker_heartbeat_s``; a backend that
        failed to load is tried again first, so a model that comes back is
        announced (and routed to) again."""
        if self.workers is None:
            return
        try:
            while not self._stopping.is_set():
                if any(
                    id(slot) not in self._probed or slot.backend is None
                    for _, slot in self.executor.all_slots()
                ):
                    await self._warm_up()  # a failed load is retried after load_retry_s
                await self.workers.announce(self.card())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._stopping.wait(), timeout=self.settings.worker_heartbeat_s
                    )
        finally:
            await self.workers.withdraw(self._worker_id)

    async def _report_until_stopped(self) -> None:
        """Report the backlog when a batch starts or ends, and at least every
        ``flow.interval_s``, beside the batch loop: while batches in flight
        hold that loop for seconds, the realtime gate still hears how much
        waits (reported only between batches, the report lagged a batch,
        and the gate let through what then waited twice its mark), and it
        hears of a batch as it starts, not up to an interval later (between
        reports it can only estimate, and its estimate let in what then
        waited for a second batch)."""
        if self.board is None:
            return
        while not self._stopping.is_set():
            self._changed.clear()
            try:
                await self._report_backlog()
            except (KafkaError, OSError) as exc:  # the broker will answer the next one
                log.debug("%s backlog report failed: %s", self.lane, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=self.settings.flow.interval_s)

    async def _report_backlog(self) -> None:
        """Tell the flow controller how many records wait on this worker's partitions."""
        assert self._consumer is not None and self.board is not None
        counted_ms = int(time.time() * 1000)  # before the listing: later sends are not in it
        waiting = await self.positions.waiting(self._consumer)
        await self.board.report(
            self.lane,
            self._worker_id,
            reported_backlog(self.lane, waiting, self._running),
            self.drain.per_s(time.monotonic()),
            at_ms=counted_ms,
        )

    def _done(self, gauge: Any, records: int, started: float, task: asyncio.Task[None]) -> None:
        """A batch taken at ``started`` is settled: out of the in-flight
        gauge, and into the drain rate when it ran to the end."""
        gauge.dec(records)
        self._running -= records
        self._changed.set()
        if not task.cancelled() and task.exception() is None:
            self.drain.add(started, time.monotonic(), records)

    async def _fetch(self, timeout_s: float, max_items: int) -> list[ConsumerRecord]:
        assert self._consumer is not None
        polled = await self._consumer.getmany(
            timeout_ms=max(1, int(timeout_s * 1000)), max_records=max_items
        )
        self.positions.taken(polled)
        return [record for batch in polled.values() for record in batch]

    async def process(
        self, records: Sequence[ConsumerRecord], after: asyncio.Task[None] | None = None
    ) -> None:
        """Run one batch, produce its results (or park what no backend could
        serve on the retry topic), keep them, then commit once ``after``
        (the batch taken before this one) has committed."""
        taken_ns = time.time_ns()
        outbound: list[Outbound] = []
        batch: list[tuple[RecordKey, RoutedRequest]] = []
        # Every record produced for a lane record carries a child of its traceparent.
        contexts = {
            (r.topic, r.partition, r.offset): self.spans.start(r, taken_ns) for r in records
        }
        traces: Traces = {coords: trace_headers(span) for coords, span in contexts.items()}
        for record in records:
            try:
                routed = RoutedRequest.model_validate_json(record.value or b"")
            except ValidationError as exc:
                unreadable = reject_unreadable(record, exc, self.settings, self.lane)
                coords = (record.topic, record.partition, record.offset)
                outbound += traced(unreadable, traces[coords])
                continue
            rid = record_id(routed.request.id, routed.version, shadow=routed.shadow)
            key = (record.topic, record.partition, record.offset, rid)
            batch.append((key, routed))
        streams = {
            key: AnswerStream(routed, self.lane, self._send, self.attempts, self.settings.stream)
            for key, routed in batch
            if routed.request.stream and not routed.shadow
        }

        stored, parked_before = (
            await self.store.recall([key for key, _ in batch]) if self.store else ({}, set())
        )
        fresh = [
            (key, routed) for key, routed in batch if key not in stored and key not in parked_before
        ]
        attempts = await self.store.begin([key for key, _ in fresh]) if self.store else {}
        crashed_before = any(attempts.get(key, 0) > 1 for key, _ in fresh)
        answers: list[Answer] = self.runner.withdrawn(fresh)
        withdrawn = {key for key, _, _ in answers}
        fresh = [(key, routed) for key, routed in fresh if key not in withdrawn]
        answers += await self.runner.answered_meanwhile(fresh)
        done = {key for key, _, _ in answers}
        fresh = [(key, routed) for key, routed in fresh if key not in done]
        if crashed_before:
            ran, parked, more = await self._isolate(fresh, records, traces, streams)
        else:
            ran, more = await self.runner.run(fresh, traces, streams)
            ran, parked, retry_out = settle_failures(
                ran, records, self.settings, self.lane, traces=traces
            )
            more += retry_out
        answers += ran
        outbound += more
        replayed = [(key, routed, stored[key]) for key, routed in batch if key in stored]
        if replayed:
            REPLAYED.labels(self.lane).inc(len(replayed))
            log.info(
                "%s: %d redelivered requests answered from the result store",
                self.lane,
                len(replayed),
            )

        for key, _, result in answers + replayed:  # chunks go out before their result
            if key in streams:
                await streams.pop(key).finish(result)
        for stream in streams.values():  # parked for a retry: a new attempt then
            await stream.abandon()
        now_ms = int(time.time() * 1000)
        for key, routed, result in answers + replayed:
            outbound += traced(terminal_for(result, routed, now_ms, self.settings), traces[key[:3]])
        # Kept before they are sent: whatever happens after this point, a
        # redelivery repeats these results rather than computing new ones.
        if self.store is not None:
            await self.store.put_many([(key, result) for key, _, result in answers])
        await self._produce(outbound)
        if self.spans.exporting:  # one span per lane record (streams.kafka.otlp)
            results = [(key, result) for key, _, result in answers + replayed]
            ends = lane_outcomes(batch, results, [*parked, *parked_before])
            self.spans.finish((span, ends.get(c, UNREADABLE)) for c, span in contexts.items())
        if self.store is not None:
            # Only once the retry records are acknowledged: a crash before this
            # parks them again on redelivery, a duplicate rather than a loss.
            await self.store.park_many(parked)
        live = [(routed, result) for _, routed, result in answers if not routed.shadow]
        if self.on_answered is not None and live:
            await self.on_answered(live)  # a shadow answer joins no cache, no session
        if after is not None:
            await after  # in order: a failed earlier batch fails this one too, uncommitted
        await self._commit(records)

        BATCH_SIZE.labels(self.lane).observe(len(fresh))
        for _, routed, result in answers:
            if routed.shadow:  # not a client's result: SHADOWS counts it
                SHADOWS.labels(self.lane, result.status).inc()
                continue
            code = result.error.code if result.error else ""
            RECORDS.labels(f"worker-{self.lane}", result.status).inc()
            RESULTS.labels(self.lane, result.path, result.status, code).inc()
            LATENCY.labels(self.lane, result.path).observe(result.timings.total_ms / 1000)

    async def _isolate(
        self,
        fresh: list[tuple[RecordKey, RoutedRequest]],
        records: Sequence[ConsumerRecord],
        traces: Traces,
        streams: Mapping[RecordKey, AnswerStream],
    ) -> tuple[list[Answer], list[RecordKey], list[Outbound]]:
        """A batch holding these records crashed its worker before. Run them
        one at a time, each result kept in the store as soon as it is known,
        so that only the offender crashes again: a redelivery replays its
        batch-mates' results. A record is given up (DLQ, INF-502) once it has
        crashed ``max_attempts`` times: once in its batch, then alone."""
        assert self.store is not None
        answers: list[Answer] = []
        parked: list[RecordKey] = []
        outbound: list[Outbound] = []
        for key, routed in fresh:
            if await self.store.begin_alone(key) >= self.settings.max_attempts:
                poisoned = give_up([(key, routed)], records, self.settings, self.lane)
                outbound += traced(poisoned, traces[key[:3]])
                continue
            ran, events = await self.runner.run([(key, routed)], traces, streams)
            left, park, retry_out = settle_failures(
                ran, records, self.settings, self.lane, traces=traces
            )
            await self.store.put_many([(k, result) for k, _, result in left])
            answers += left
            parked += park
            outbound += events + retry_out
        if fresh:
            log.warning(
                "%s: %d records of a batch that crashed before were run one at a time",
                self.lane,
                len(fresh),
            )
        return answers, parked, outbound

    async def _send(self, record: Outbound) -> Awaitable[object]:
        """Queue ``record`` on the producer; the ack is what this returns."""
        assert self._producer is not None
        return await self._producer.send(
            record.topic, value=record.value, key=record.key, headers=list(record.headers)
        )

    async def _produce(self, outbound: Sequence[Outbound]) -> None:
        await deliver(outbound, self._send, self.settings)

    async def _commit(self, records: Sequence[ConsumerRecord]) -> None:
        assert self._consumer is not None
        offsets: dict[TopicPartition, int] = {}
        for record in records:
            tp = TopicPartition(record.topic, record.partition)
            offsets[tp] = max(offsets.get(tp, 0), record.offset + 1)
        try:
            await self._consumer.commit(offsets)
            self.positions.committed(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # The partitions moved to another worker while this batch ran. Its
            # results are out; the new owner re-runs the batch and the client
            # drops the duplicates.
            log.warning("%s: commit after rebalance failed, batch will repeat: %s", self.lane, exc)

    async def close(self) -> None:
        self.state.ready = False
        if self.relay is not None:
            await self.relay.close()
        if self.cancel_watch is not None:
            await self.cancel_watch.close()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        await self.executor.close()
        if self.store is not None:
            await self.store.close()
        await self.spans.aclose()  # what is queued, within the export timeout


def _path_card(path: AnswerPath, slot: BackendSlot) -> PathCard:
    backend = slot.backend
    assert backend is not None
    return PathCard(path, backend.kind, backend.model, _device(backend.kind), slot.version)


def _device(kind: str) -> str:
    """Where a backend of ``kind`` runs, as announced on the worker board."""
    known = backend_kind(kind)
    return "cpu" if known is None else known.device
