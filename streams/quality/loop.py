"""The quality loop (``laneway router``): keeps each path's live record from
the quality events every terminal result emits, and publishes it for the
classifiers' smart router.

Quality events are keyed by request id, so they spread over every
partition of ``laneway.quality`` and the loop scales out: each replica folds
the events of the partitions it owns.

- ``laneway.quality`` -> per-(path, partition) ``PathStats`` in a faust
  table with a changelog, keyed ``<path>@<partition>``: a partition's record
  is written only from that partition, so it survives a restart or a move
  to another replica whole. Each record keeps the time of each of its
  recent outcomes, so the merge takes the newest ``success_window``
  outcomes of all partitions together: the window the router sees is as
  long and as recent as one partition's was when events were keyed by path.
  Events are folded in batches (``streams.quality.batch``): each record a
  batch touches is read and written once, and the answers its results
  remember go to Redis in one pipeline, so the loop keeps pace with the
  classifiers that emit them;
- ``laneway.feedback`` (keyed by request id) -> joined to the path that
  answered that request (remembered in Redis for a day) and re-emitted to
  ``laneway.quality`` keyed by the request id;
  a bad score (``LANEWAY_CACHE_EVICT_AT_FEEDBACK``) also evicts the cache
  entry the answer came from or was stored under, so it is not served again;
- every ``weights_refresh_s``: each replica writes the records of the
  partitions it owns to Redis (``<prefix>:route:parts``, field
  ``<path>@<partition>``), reads every replica's, merges them per path
  (``merge``) and publishes the result (``RouteBoard``), so whichever replica
  publishes last publishes the whole picture. Each lane's p95 latency goes to
  the ``LatencyBoard`` the classifier's flow controller reads: every replica
  sees a uniform sample of all results, so any replica's p95 will do.
- model versions (``streams.rollout``): an event that names its ``version``
  is also folded into a record of that version (``<path>~<version>@<partition>``;
  the path's own record still holds every version's events, as the path's
  traffic). Each publish merges them per version into
  ``<prefix>:route:versions`` (for ``laneway models list``) and judges every
  canary with traffic against its path's active version
  (``streams.rollout.rollback.decide``, on the events since its share was
  set): a canary worse by a margin is drained to 0% in the roll-out state,
  and a ``rollback`` quality event and ``laneway_rollbacks_total`` say why.
- router versions (``streams.rollout.routers``): an event that names its
  ``router_version`` is also folded into ``router~<version>@<partition>``,
  with whether the heavy path gave it. Each publish merges them per router
  version into ``<prefix>:route:routers`` (with each one's heavy share) and
  judges every canary router with traffic against the active router
  (``streams.rollout.rollback.decide_router``: success, latency, feedback,
  and the heavy share, i.e. cost); a worse one is drained to 0% the same way,
  its ``rollback`` event naming the ``router_version``.

The agents are thin (``QualityService``); the maths is
``streams.routing.stats.PathStats`` and ``streams.quality.records``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import faust
from prometheus_client import Counter, Gauge
from pydantic import ValidationError
from redis.exceptions import RedisError

from schemas.errors import InvalidRequest
from schemas.messages import AnswerPath, Feedback, QualityEvent, describe_errors
from schemas.settings import Settings
from streams.cache.response import ResponseCache
from streams.classify.router import RouteBoard
from streams.kafka.envelopes import Outbound, deliver, dlq_for
from streams.kafka.faust_transport import new_app, raw_sender, raw_topic
from streams.ops import REDIS_ERRORS, ProcessState
from streams.quality.batch import count_events, fold_batch
from streams.quality.records import (
    ROUTER_FIELD,
    LaneLatency,
    PartStats,
    PendingFeedback,
    merge_all,
    merge_routers,
    merge_versions,
    owned_records,
    read_parts,
)
from streams.rollout.board import RolloutBoard
from streams.rollout.rollback import decide, routers_to_drain
from streams.rollout.routers import ROUTER_KIND, ROUTER_NAME, RouterCatalog
from streams.routing.registry import load_registry
from streams.stores.backlog import LatencyBoard

__all__ = ["Answered", "QualityService", "build_quality_app", "router_app_id"]

log = logging.getLogger(__name__)

Wire = TypeVar("Wire", QualityEvent, Feedback)

EVENTS = Counter("laneway_quality_events_total", "Quality events folded in", ["kind", "path"])
FEEDBACK_UNMATCHED = Counter(
    "laneway_feedback_unmatched_total", "Feedback for a request id with no known answer"
)
PATH_LATENCY = Gauge("laneway_path_latency_ms", "EWMA latency per path", ["path"])
PATH_SUCCESS = Gauge("laneway_path_success_rate", "Windowed success rate per path", ["path"])
PATH_QUALITY = Gauge("laneway_path_quality", "Feedback quality per path (0..1)", ["path"])
COST = Counter("laneway_cost_total", "Model cost spent (registry units)", ["path"])
LANE_P95 = Gauge("laneway_lane_p95_ms", "p95 latency of recent results per lane", ["lane"])
ROLLBACKS = Counter(
    "laneway_rollbacks_total",
    "Canaries drained to 0% because they did worse than the active version",
    ["path", "version", "signal"],
)


FOLD_BATCH = 2000
"""Most quality events folded in one batch."""
FOLD_WITHIN_S = 0.1
"""How long a batch waits to fill before it is folded as it is."""


def router_app_id(settings: Settings) -> str:
    return f"{settings.app_id}-router"


class QualityService:
    """The quality loop's process: its boards, its table of per-partition
    records and the faust app (``app``) whose agents and timers are the
    methods below."""

    def __init__(self, settings: Settings, state: ProcessState) -> None:
        self.settings = settings
        self.state = state
        redis = self.redis = settings.redis.client()
        prefix = settings.redis.key_prefix
        self.board = RouteBoard(redis, prefix)
        self.latency_board = LatencyBoard(redis, prefix)
        self.lanes = LaneLatency()
        self.registry = load_registry(settings.routing.models_file, settings.backend)
        self.rollout = RolloutBoard(
            redis, prefix, self.registry, routers=RouterCatalog(settings.routing)
        )
        self.versions_key = f"{prefix}:route:versions"
        self.routers_key = f"{prefix}:route:routers"
        self.parts_key = f"{prefix}:route:parts"
        self.answered_key = f"{prefix}:answered:"
        self.cache = ResponseCache(redis, settings.cache, key_prefix=prefix, embedder=None)
        app = self.app = new_app(settings, router_app_id(settings))
        self.quality = raw_topic(app, settings.topic("quality"))
        self.feedback = raw_topic(app, settings.topic("feedback"))
        self.table = app.Table("path-stats", default=None, partitions=settings.kafka.partitions)
        self.send = raw_sender(app)
        self.pending = PendingFeedback(settings.routing.feedback_wait_s)
        """Feedback whose answer's result event is not read yet."""
        self._register()

    def _register(self) -> None:
        app = self.app
        # The agents keep the names they had as functions of this module.
        app.agent(self.quality, concurrency=1, name=f"{__name__}.keep_stats")(self.keep_stats)
        app.agent(self.feedback, concurrency=1, name=f"{__name__}.join_feedback")(
            self.join_feedback
        )
        app.timer(1.0)(self.join_pending)
        app.timer(self.settings.routing.weights_refresh_s)(self.publish)
        app.timer(1.0)(self._heartbeat)
        app.on_partitions_assigned.connect(self._assigned)  # type: ignore[arg-type]

    async def decode(self, event: Any, model: type[Wire]) -> Wire | None:
        """The event's value as ``model``; else it goes to the DLQ."""
        try:
            return model.model_validate_json(event.value or b"")
        except ValidationError as exc:
            error = InvalidRequest(f"not a {model.__name__}: {describe_errors(exc)}")
            await deliver([dlq_for(event.message, error, self.settings)], self.send, self.settings)
            return None

    # -- quality events ------------------------------------------------------

    async def keep_stats(self, stream: faust.StreamT) -> None:
        # faust acks a batch's events once the loop comes back for the next
        # one: offsets move only after the batch is folded and written.
        # (faust's StreamT leaves out take_events, which its Stream has.)
        batches = cast(faust.Stream[Any], stream).take_events(FOLD_BATCH, within=FOLD_WITHIN_S)
        async for events in batches:
            await self.fold_events(events)

    async def fold_events(self, events: Sequence[Any]) -> None:
        """Fold one batch of events: one Redis round trip for the answers it
        remembers and one table write per record it touches (``fold_batch``)."""
        decoded: list[tuple[QualityEvent, int]] = []
        refused: list[Outbound] = []
        for event in events:
            try:
                quality_event = QualityEvent.model_validate_json(event.value or b"")
            except ValidationError as exc:
                error = InvalidRequest(f"not a QualityEvent: {describe_errors(exc)}")
                refused.append(dlq_for(event.message, error, self.settings))
                continue
            decoded.append((quality_event, event.message.partition))
        if refused:
            await deliver(refused, self.send, self.settings)
        for (kind, path), n in count_events(e for e, _ in decoded).items():
            EVENTS.labels(kind, path).inc(n)
        await self._results([e for e, _ in decoded if e.kind == "result"])
        for (name, partition), part in fold_batch(decoded, self._read, self.settings).items():
            self._write(name, partition, json.loads(part.to_json()))

    async def _results(self, results: list[QualityEvent]) -> None:
        """Terminal results: their cost, their lanes' latency, and what
        answered each, kept for the feedback that may follow (one pipeline)."""
        answered: dict[str, Answered] = {}
        for quality_event in results:
            path = quality_event.path
            entry = self.registry.for_path(path) if path is not None else None
            tokens = quality_event.prompt_tokens + quality_event.completion_tokens
            if entry is not None and tokens:
                COST.labels(path.value if path else "none").inc(
                    tokens / 1000 * entry.cost_per_1k_tokens
                )
            if quality_event.lane is not None:
                self.lanes.add(quality_event.lane, quality_event.latency_ms)
            if path is not None:
                answered[self.answered_key + quality_event.id] = Answered(
                    path,
                    quality_event.cache_key,
                    quality_event.version,
                    quality_event.router_version,
                )
        if answered:
            await _remember(self.redis, answered)

    def _read(self, name: str) -> PartStats | None:
        current = self.table.get(name)
        return PartStats.from_json(json.dumps(current)) if current else None

    def _write(self, name: str, partition: int, value: dict[str, Any]) -> None:
        """``table[name] = value``, its changelog record on ``partition``:
        what faust's ``__setitem__`` does, with the partition given, since
        a batch's fold runs outside the iteration of any one event (faust
        takes the partition from the event being iterated)."""
        self.table.send_changelog(partition, name, value)
        self.table.data[name] = value

    # -- feedback ------------------------------------------------------------

    async def join_feedback(self, stream: faust.StreamT) -> None:
        async for event in stream.events():
            verdict = await self.decode(event, Feedback)
            if verdict is not None and not await self.join(verdict):
                # Its answer's result event is not read yet (a fast client):
                # tried again every second for feedback_wait_s.
                self.unmatched(self.pending.add(verdict, time.monotonic()))

    async def join_pending(self) -> None:
        due, late = self.pending.take(time.monotonic())
        for arrived, verdict in due:
            if not await self.join(verdict):
                self.pending.keep(arrived, verdict)
        self.unmatched(late)

    def unmatched(self, verdicts: list[Feedback]) -> None:
        for verdict in verdicts:
            FEEDBACK_UNMATCHED.inc()
            log.info("feedback for unknown request %s dropped", verdict.request_id)

    async def join(self, verdict: Feedback) -> bool:
        """Join ``verdict`` to the answer it judges: a ``feedback`` quality
        event of its path (and the cache entry evicted on a bad score);
        ``False`` when that answer is not known (yet)."""
        settings = self.settings
        answered = await _recall(self.redis, self.answered_key + verdict.request_id)
        if answered is None:
            return False
        path = answered.path
        floor = settings.cache.evict_at_feedback
        if answered.cache_key and floor is not None and verdict.score <= floor:
            if await self.cache.evict(answered.cache_key):
                log.info(
                    "cache entry of %s evicted on feedback %.2f",
                    verdict.request_id,
                    verdict.score,
                )
        joined = QualityEvent(
            kind="feedback",
            id=verdict.request_id,
            path=path,
            version=answered.version,
            router_version=answered.router_version,
            success=verdict.score >= 0,
            latency_ms=0.0,
            feedback=verdict.score,
            ts_ms=int(time.time() * 1000),
        )
        out = Outbound(  # keyed by the request, as every quality event
            settings.topic("quality"),
            verdict.request_id.encode(),
            joined.model_dump_json().encode(),
        )
        await deliver([out], self.send, settings)
        return True

    # -- publishing ----------------------------------------------------------

    async def publish(self) -> None:
        """Write the records of the partitions this replica owns, merge
        everyone's per path and publish them; then judge the canaries."""
        redis, parts_key = self.redis, self.parts_key
        owned = {
            tp.partition
            for tp in self.app.consumer.assignment()
            if tp.topic == self.quality.get_topic_name()
        }
        mine = owned_records(list(self.table.items()), owned)
        try:
            if mine:
                await redis.hset(parts_key, mapping=mine)
                await redis.expire(parts_key, 7 * 86_400)
            everyone = await redis.hgetall(parts_key)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("route").inc()
            log.warning("route statistics not published: %s", exc)
            return
        fields = read_parts(
            everyone,
            lambda name, exc: log.warning("route statistics part %r unreadable: %s", name, exc),
        )
        routing = self.settings.routing
        snapshot = merge_all(
            fields, routing.success_window, routing.ewma_alpha, routing.feedback_weight
        )
        for path, stats in snapshot.items():
            PATH_LATENCY.labels(path.value).set(stats.latency_ms)
            PATH_SUCCESS.labels(path.value).set(stats.success_rate)
            PATH_QUALITY.labels(path.value).set(stats.quality)
        p95 = self.lanes.p95()
        for lane, value in p95.items():
            LANE_P95.labels(lane.value).set(value)
        try:
            await self.board.publish(snapshot)
            await self.latency_board.report(p95)
        except (RedisError, OSError) as exc:
            REDIS_ERRORS.labels("route").inc()
            log.warning("route statistics not published: %s", exc)
        await self.judge_versions(fields)
        await self.judge_routers(fields)

    async def judge_versions(self, fields: dict[str, PartStats]) -> None:
        """Publish each version's record; drain a canary worse than its
        path's active version, and say why."""
        settings, rollout = self.settings, self.rollout
        view = await rollout.refresh()
        window, alpha = settings.routing.success_window, settings.routing.ewma_alpha
        records = merge_versions(
            fields, window, alpha, rollout.since_ms, settings.routing.feedback_weight
        )
        if records:
            try:
                await self.redis.hset(
                    self.versions_key,
                    mapping={f"{p.value}:{v}": s.to_json() for (p, v), s in records.items()},
                )
                await self.redis.expire(self.versions_key, 7 * 86_400)
            except (RedisError, OSError) as exc:
                REDIS_ERRORS.labels("route").inc()
                log.warning("version statistics not published: %s", exc)
        if not settings.rollout.auto_rollback:
            return
        for entry in view.registry.models:
            if entry.state != "canary" or not entry.traffic_share:
                continue
            active = view.registry.for_path(entry.model_path)
            assert active is not None
            canary_stats = records.get((entry.model_path, entry.version))
            reason = decide(
                canary_stats, records.get((entry.model_path, active.version)), settings.rollout
            )
            if reason is None:
                continue
            now_ms = int(time.time() * 1000)
            if not await rollout.store.drain(
                entry.model_path, entry.version, reason, now_ms=now_ms
            ):
                continue
            signal = reason.split(" ", 1)[0]
            ROLLBACKS.labels(entry.model_path.value, entry.version, signal).inc()
            log.warning("canary %s %s rolled back to 0%%: %s", entry.path, entry.version, reason)
            notice = QualityEvent(
                kind="rollback",
                id=f"rollback-{entry.path}-{entry.version}-{now_ms}",
                path=entry.model_path,
                version=entry.version,
                success=False,
                latency_ms=canary_stats.latency_ms if canary_stats else 0.0,
                ts_ms=now_ms,
                reason=reason,
            )
            await self._notify(notice)

    async def judge_routers(self, fields: dict[str, PartStats]) -> None:
        """Publish each router version's record; drain a canary router worse
        than the active one (``judge_versions`` has just refreshed the view)."""
        settings, rollout = self.settings, self.rollout
        window, alpha = settings.routing.success_window, settings.routing.ewma_alpha
        records = merge_routers(
            fields, window, alpha, rollout.router_since_ms, settings.routing.feedback_weight
        )
        if records:
            try:
                await self.redis.hset(
                    self.routers_key, mapping={v: r.to_json() for v, r in records.items()}
                )
                await self.redis.expire(self.routers_key, 7 * 86_400)
            except (RedisError, OSError) as exc:
                REDIS_ERRORS.labels("route").inc()
                log.warning("router version statistics not published: %s", exc)
        view = rollout.current.routers
        if not settings.rollout.auto_rollback or view is None:
            return
        for version, reason in routers_to_drain(view.versions, records, settings.rollout):
            now_ms = int(time.time() * 1000)
            if not await rollout.store.drain(
                ROUTER_NAME, version, reason, now_ms=now_ms, kind=ROUTER_KIND
            ):
                continue
            signal = reason.split(" ", 1)[0]
            ROLLBACKS.labels(ROUTER_FIELD, version, signal).inc()
            log.warning("canary router %s rolled back to 0%%: %s", version, reason)
            record = records.get(version)
            notice = QualityEvent(
                kind="rollback",
                id=f"rollback-router-{version}-{now_ms}",
                router_version=version,
                success=False,
                latency_ms=record.stats.latency_ms if record else 0.0,
                ts_ms=now_ms,
                reason=reason,
            )
            await self._notify(notice)

    async def _notify(self, notice: QualityEvent) -> None:
        """A quality event of the loop's own (a rollback) onto the quality topic."""
        out = Outbound(
            self.settings.topic("quality"), notice.id.encode(), notice.model_dump_json().encode()
        )
        await deliver([out], self.send, self.settings)

    # -- the process ---------------------------------------------------------

    async def _heartbeat(self) -> None:
        self.state.beat()  # /healthz fails when the loop stops running this

    async def _assigned(self, sender: Any, assigned: Any, **kwargs: Any) -> None:
        self.state.ready = True
        self.state.detail = f"keeping path statistics of {len(assigned)} partitions"


def build_quality_app(settings: Settings, state: ProcessState) -> faust.App:
    """The quality loop's faust app (``QualityService.app``)."""
    return QualityService(settings, state).app


_BARE_PATHS = ("cache", "rules", "light", "heavy")
"""The paths there were when an answer was kept as its bare path name."""


@dataclass(frozen=True, slots=True)
class Answered:
    """What feedback on an answer is joined to: the path that gave it and
    the cache entry it came from or was stored under."""

    path: AnswerPath
    cache_key: str | None = None
    version: str | None = None
    router_version: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": self.path.value,
                "cache_key": self.cache_key,
                "version": self.version,
                "router_version": self.router_version,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> Answered | None:
        """Also reads the bare path name kept before cache keys were."""
        text = raw.decode() if isinstance(raw, bytes) else raw
        try:
            if text in _BARE_PATHS:
                return cls(AnswerPath(text))
            data = json.loads(text)
            key = data.get("cache_key")
            version = data.get("version")
            router_version = data.get("router_version")
            return cls(
                AnswerPath(data["path"]),
                key if isinstance(key, str) else None,
                version if isinstance(version, str) else None,
                router_version if isinstance(router_version, str) else None,
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


async def _remember(redis: Any, answered: dict[str, Answered]) -> None:
    """Each answer under its key for a day, in one round trip."""
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for key, answer in answered.items():
                pipe.set(key, answer.to_json(), ex=86_400)
            await pipe.execute()
    except (RedisError, OSError) as exc:
        REDIS_ERRORS.labels("route").inc()
        log.debug("answer paths not kept for feedback: %s", exc)


async def _recall(redis: Any, key: str) -> Answered | None:
    try:
        raw = await redis.get(key)
    except (RedisError, OSError) as exc:
        REDIS_ERRORS.labels("route").inc()
        log.debug("feedback join failed: %s", exc)
        return None
    return Answered.from_json(raw) if raw else None
