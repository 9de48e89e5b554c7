"""``laneway distill export``: a time window of traffic as training rows.

Reads, each from the offset the broker gives for a minute before ``since``
(aiokafka ``offsets_for_times``; see ``read_window`` for why earlier) up to
the high-water mark it had when the export started:

- ``<p>.requests``: the prompt of every request produced in ``[since, until)``;
- ``<p>.results``: their terminal results (answered model requests become rows);
- ``<p>.quality``: latency, tokens and cost of each result, and the paths
  that failed before a fallback answered;
- ``<p>.feedback``: the clients' scores;
- ``<p>.shadow``, when the topic exists: answers of shadow versions, as the
  other path's answer to the same request.

Results, quality events and feedback are read up to ``until + late`` (a
result comes after its request, feedback later still); only requests of the
window make rows. Only the window is held in memory: every topic is read
partition by partition and each record outside the window is dropped as it
is read. A record that does not parse is counted and skipped.

The join (``join_rows``) is a pure function of what was read, so it is
tested on records built in the test.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from schemas.messages import AnswerPath, Feedback, InferenceRequest, InferenceResult, QualityEvent
from schemas.settings import Settings
from streams.distill.rows import ExportRow, prompt_key
from streams.routing.features import extract_features
from streams.routing.learned import feature_values
from streams.routing.registry import ModelRegistry

__all__ = [
    "Collected",
    "ExportSummary",
    "Window",
    "collect",
    "export_rows",
    "join_rows",
    "read_window",
]

log = logging.getLogger(__name__)

START_MARGIN_MS = 60_000
"""How much earlier than ``since`` the broker is asked for a start offset
(see ``read_window``): clock skew between producers and the broker, and the
broker's coarse time index, up to this much, lose no record."""


@dataclass(frozen=True, slots=True)
class Window:
    since_ms: int
    until_ms: int
    late_ms: int = 600_000
    """How long after ``until`` results, quality events and feedback are still read."""

    @classmethod
    def of(cls, since: datetime, until: datetime, late_s: float = 600.0) -> Window:
        since_ms, until_ms = int(since.timestamp() * 1000), int(until.timestamp() * 1000)
        if until_ms <= since_ms:
            raise ValueError(
                f"the window is empty: --until {until.isoformat()} is not after "
                f"--since {since.isoformat()}"
            )
        return cls(since_ms, until_ms, int(late_s * 1000))


@dataclass(slots=True)
class Collected:
    """What the topics held for one window, deduplicated by id (a resent
    record counts once: the first one read wins, except that an answer wins
    over an earlier error of the same id, as after a client's retry)."""

    requests: dict[str, tuple[int, InferenceRequest]] = field(default_factory=dict)
    results: dict[str, InferenceResult] = field(default_factory=dict)
    quality: dict[str, QualityEvent] = field(default_factory=dict)
    """``kind="result"`` events by request id."""
    feedback: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    shadows: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    """``(path, output)`` of shadow answers by request id."""
    unreadable: Counter[str] = field(default_factory=Counter)

    def add_request(self, ts_ms: int, raw: bytes | None) -> None:
        try:
            request = InferenceRequest.model_validate_json(raw or b"")
        except ValidationError:
            self.unreadable["requests"] += 1
            return
        self.requests.setdefault(request.id, (ts_ms, request))

    def add_result(self, raw: bytes | None) -> None:
        try:
            result = InferenceResult.model_validate_json(raw or b"")
        except ValidationError:
            self.unreadable["results"] += 1
            return
        known = self.results.get(result.id)
        if known is None or (known.status == "error" and result.status == "ok"):
            self.results[result.id] = result  # a retry under the same id that succeeded wins

    def add_quality(self, raw: bytes | None) -> None:
        try:
            event = QualityEvent.model_validate_json(raw or b"")
        except ValidationError:
            self.unreadable["quality"] += 1
            return
        if event.kind == "result":
            self.quality.setdefault(event.id, event)

    def add_feedback(self, raw: bytes | None) -> None:
        try:
            verdict = Feedback.model_validate_json(raw or b"")
        except ValidationError:
            self.unreadable["feedback"] += 1
            return
        self.feedback[verdict.request_id].append(verdict.score)

    def add_shadow(self, raw: bytes | None) -> None:
        """A shadow answer, read leniently (a result-shaped object with
        ``id``, ``path`` and ``output``), so a newer shadow record still counts."""
        try:
            data = json.loads(raw or b"")
        except ValueError:
            self.unreadable["shadow"] += 1
            return
        if not isinstance(data, dict):
            self.unreadable["shadow"] += 1
            return
        nested = data.get("result")
        result: dict[str, Any] = nested if isinstance(nested, dict) else data
        rid, path, output = result.get("id"), result.get("path"), result.get("output")
        if result.get("status", "ok") != "ok":
            return
        if isinstance(rid, str) and AnswerPath.names_model(path) and isinstance(output, str):
            self.shadows[rid].append((path, output))


@dataclass(slots=True)
class ExportSummary:
    rows: int = 0
    requests: int = 0
    """Requests produced in the window."""
    answered_elsewhere: int = 0
    """Answered by the cache or rules, or refused before any model: no row."""
    unanswered: int = 0
    """Requests with no result read (still running, or lost)."""
    orphan_results: int = 0
    """Model results whose request is not in the window."""
    with_feedback: int = 0
    with_both_answers: int = 0
    unreadable: dict[str, int] = field(default_factory=dict)
    topics: dict[str, int] = field(default_factory=dict)
    """Records read per topic."""

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _cost(result: InferenceResult, event: QualityEvent | None, registry: ModelRegistry) -> float:
    if event is not None and event.cost > 0:
        return event.cost
    entry = registry.for_path(result.path) if result.path is not None else None
    tokens = result.usage.prompt_tokens + result.usage.completion_tokens
    return tokens / 1000 * entry.cost_per_1k_tokens if entry is not None else 0.0


def join_rows(
    collected: Collected,
    window: Window,
    *,
    settings: Settings,
    registry: ModelRegistry,
    intent_of: Callable[[str], str | None] = lambda text: None,
) -> tuple[list[ExportRow], ExportSummary]:
    """One row per request of the window that a model path answered (or
    failed on), joined by request id; light and heavy answers to the same
    normalised prompt (in the window, or from a shadow) are set on every
    row of that prompt."""
    summary = ExportSummary(unreadable=dict(collected.unreadable))
    in_window = {
        rid: (ts, request)
        for rid, (ts, request) in collected.requests.items()
        if window.since_ms <= ts < window.until_ms
    }
    summary.requests = len(in_window)
    rows: list[ExportRow] = []
    # prompt -> path -> (the first ok output, where it came from)
    answers: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for rid, (ts, request) in sorted(in_window.items(), key=lambda kv: (kv[1][0], kv[0])):
        result = collected.results.get(rid)
        if result is None:
            summary.unanswered += 1
            continue
        path = result.path.value if result.path is not None else None
        if not AnswerPath.names_model(path):
            summary.answered_elsewhere += 1
            continue
        text = request.user_text()
        event = collected.quality.get(rid)
        scores = collected.feedback.get(rid, [])
        features = extract_features(request, settings.routing, intent=intent_of(text))
        row = ExportRow(
            id=rid,
            ts_ms=ts,
            prompt=text,
            features=feature_values(features),
            path=path,
            success=result.status == "ok",
            tenant=request.tenant,
            max_tokens=request.max_tokens,
            lane=result.lane.value if result.lane is not None else None,
            model=result.model,
            version=getattr(result, "version", None)
            or (getattr(event, "version", None) if event is not None else None),
            error_code=result.error.code if result.error is not None else None,
            degraded=result.degraded,
            explored=result.explored,
            output=result.output,
            latency_ms=event.latency_ms if event is not None else result.timings.total_ms,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            cost=_cost(result, event, registry),
            feedback=sum(scores) / len(scores) if scores else None,
            feedback_count=len(scores),
        )
        rows.append(row)
        key = prompt_key(text)
        if result.status == "ok" and result.output is not None:
            answers[key].setdefault(path, (result.output, "window"))
        for shadow_path, output in collected.shadows.get(rid, ()):
            answers[key].setdefault(shadow_path, (output, "shadow"))
    for row in rows:
        known = answers.get(prompt_key(row.prompt), {})
        light, heavy = known.get(AnswerPath.LIGHT.value), known.get(AnswerPath.HEAVY.value)
        if light is not None and heavy is not None:
            row.light_output, row.heavy_output = light[0], heavy[0]
            row.sources = sorted({light[1], heavy[1]})
            summary.with_both_answers += 1
        summary.with_feedback += row.feedback is not None
    answered_ids = set(in_window)
    summary.orphan_results = sum(
        1
        for rid, result in collected.results.items()
        if rid not in answered_ids and result.path is not None and result.path.is_model
    )
    summary.rows = len(rows)
    return rows, summary


async def read_window(
    consumer: AIOKafkaConsumer,
    tps: Sequence[TopicPartition],
    since_ms: int,
    until_ms: int,
    take: Callable[[int, bytes | None], None],
) -> int:
    """Feed ``take(ts_ms, value)`` every record of the partitions ``tps`` with
    a timestamp in ``[since_ms, until_ms)``, from ``offsets_for_times`` of
    ``since_ms - START_MARGIN_MS`` up to the high-water mark read first.
    Returns how many records were read.

    The margin is there because the offset a broker gives for a time is not
    exact. Kafka indexes the records' own (producer) timestamps. Tansu's
    memory store indexes when each batch arrived, one offset per
    millisecond (a later batch in the same millisecond replaces an earlier
    one), so its answer can be past the first record of the window, and a
    producer whose clock runs ahead of the broker's writes records that it
    places later still. Starting a minute early and filtering on the
    record's timestamp reads each record of the window once.

    Tansu answers a time past its last record with offset 0 and timestamp -1
    (Kafka with none, which aiokafka gives as ``None``): both mean nothing
    to read."""
    if not tps:
        return 0
    ends = await consumer.end_offsets(list(tps))
    starts: dict[TopicPartition, int | None]
    try:
        lookup = max(0, since_ms - START_MARGIN_MS)
        found = await consumer.offsets_for_times({tp: lookup for tp in tps})
        starts = {
            tp: None if found.get(tp) is None or found[tp].timestamp < 0 else found[tp].offset
            for tp in tps
        }
    except Exception as exc:  # a broker without timestamp lookups: from the start, filtered
        topic = tps[0].topic
        log.warning("%s: offsets_for_times failed (%s); reading from the beginning", topic, exc)
        starts = dict(await consumer.beginning_offsets(list(tps)))
    todo = {
        tp: ends[tp]
        for tp in tps
        if (start := starts.get(tp)) is not None and start < ends[tp]  # else nothing after since
    }
    if not todo:
        return 0
    # Only partitions with something to read: one assigned without a
    # position would be fetched from its end, and stop() waits for that fetch.
    consumer.assign(list(todo))
    for tp in todo:
        start = starts[tp]
        assert start is not None
        consumer.seek(tp, start)
    read = 0

    def feed(records: Sequence[Any]) -> None:
        nonlocal read
        for record in records:
            read += 1
            if since_ms <= record.timestamp < until_ms:
                take(record.timestamp, record.value)

    while todo:
        batch = await consumer.getmany(*todo, timeout_ms=500, max_records=2000)
        for tp, records in batch.items():
            if tp not in todo:
                continue
            # Every record fetched counts, also past the high-water mark read
            # first: Tansu's memory store gives the base offset of the last
            # batch plus one as its end (the batch's other records are not
            # counted), and a fetch returns whole batches.
            feed(records)
            if await consumer.position(tp) >= todo[tp]:
                del todo[tp]
                # The rest of the batch holding the end, already fetched.
                feed((await consumer.getmany(tp, timeout_ms=0)).get(tp, []))
        if not batch:  # nothing came back: re-check positions (compacted gaps, empty tails)
            for tp in list(todo):
                if await consumer.position(tp) >= todo[tp]:
                    del todo[tp]
    return read


async def collect(settings: Settings, window: Window) -> tuple[Collected, dict[str, int]]:
    """Read the window from every topic (see the module's docstring)."""
    collected = Collected()
    consumer = AIOKafkaConsumer(
        enable_auto_commit=False,
        fetch_max_wait_ms=settings.kafka.fetch_max_wait_ms,
        **settings.kafka.client_options(),
    )
    await consumer.start()
    counts: dict[str, int] = {}
    try:
        # Every topic's partitions now, before the first assign(): from then
        # on the client refreshes the metadata of its assigned topics only.
        await consumer.topics()
        partitions = {
            name: [
                TopicPartition(settings.topic(name), p)
                for p in sorted(consumer.partitions_for_topic(settings.topic(name)) or ())
            ]
            for name in ("requests", "results", "quality", "feedback", "shadow")
        }
        late = window.until_ms + window.late_ms
        plan: Sequence[tuple[str, int, Callable[[int, bytes | None], None]]] = (
            ("requests", window.until_ms, lambda ts, raw: collected.add_request(ts, raw)),
            ("results", late, lambda ts, raw: collected.add_result(raw)),
            ("quality", late, lambda ts, raw: collected.add_quality(raw)),
            ("feedback", late, lambda ts, raw: collected.add_feedback(raw)),
            ("shadow", late, lambda ts, raw: collected.add_shadow(raw)),
        )
        for name, until_ms, take in plan:
            counts[settings.topic(name)] = await read_window(
                consumer, partitions[name], window.since_ms, until_ms, take
            )
    finally:
        await consumer.stop()
    return collected, counts


async def export_rows(
    settings: Settings, window: Window, registry: ModelRegistry
) -> tuple[list[ExportRow], ExportSummary]:
    """``collect`` then ``join_rows``, with the intents of the configured rule file."""
    from streams.rules.rulefile import RuleSource

    book = RuleSource.from_settings(settings.rules).book
    collected, counts = await collect(settings, window)
    rows, summary = join_rows(
        collected,
        window,
        settings=settings,
        registry=registry,
        intent_of=lambda text: book.classify(text)[0],
    )
    summary.topics = counts
    return rows, summary


def summary_lines(summary: ExportSummary, window: Window) -> list[str]:
    lines = [
        f"window {_iso(window.since_ms)} .. {_iso(window.until_ms)}: {summary.requests} requests, "
        f"{summary.rows} rows (model answers), {summary.answered_elsewhere} answered by "
        f"cache/rules/refusals, {summary.unanswered} without a result",
        f"rows with feedback: {summary.with_feedback}; with both light and heavy answers: "
        f"{summary.with_both_answers}; model results of requests outside the window: "
        f"{summary.orphan_results}",
    ]
    if summary.unreadable:
        lines.append(f"unreadable records skipped: {dict(summary.unreadable)}")
    return lines


def _iso(ms: int) -> str:
    from datetime import UTC

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")
