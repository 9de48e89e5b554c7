"""The classifier's batch pipeline: a batch of request records in, the
records to produce for each out, with as few round trips as the batch allows.

Per batch:

1. ``admit`` every record (pure): invalid ones get INF-400 and the DLQ,
   expired ones INF-503, as one by one.
2. ``waves``: records that share a key (the request topic's key is the
   session, else the id) or a session are split into successive waves, so
   the second turn of a conversation is looked up after the first one's
   answer joined the session, exactly as one by one. Traffic without
   repeated keys is one wave.
3. ``BatchLookups.find_many`` asks Redis for the whole wave in one
   pipelined round trip: every rate-limit script, every session read, the
   exact cache entry of every request as it would be keyed without history,
   every rule lookup and the cache's version counter. Only requests whose
   session has history need a second trip (their exact key hashes that
   history). Cheap checks first: exact cache, then rules, then the semantic
   cache, then the router. A request that named its ``model`` is never
   answered by a rule (its rule is not looked up). A request a rule owns is
   never embedded; the rest are embedded in one call, and only those the
   index could answer.
   When the version moved since the index last synced, it syncs first, so
   a paraphrase asked right after its original's answer was stored hits.
4. ``route`` every request (pure).

Every step runs per record inside its own ``try``: a bug on one record
dead-letters that record alone and its batch-mates are answered. Redis
trouble follows ``streams.stores.failopen``: the batch is still answered
by rules and routing.

The request loop (``streams.classify.app``, a plain aiokafka intake) only
turns records into ``SourceRecord`` s, calls ``BatchClassifier.classify``
and delivers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from schemas.errors import BackendUnavailable
from schemas.messages import AnswerPath, ChatMessage, RequestLimits
from schemas.settings import Settings
from streams.cache.embedding import Embedder, MiniLMEmbedder
from streams.cache.hot_questions import HotQuestions
from streams.cache.response import CacheHit, Probe, ResponseCache
from streams.classify.classifier import (
    Admitted,
    Classified,
    SourceRecord,
    admit,
    refuse_over_limit,
    route,
)
from streams.classify.drift import DriftMonitor
from streams.classify.flow import LaneFull
from streams.classify.gate import RealtimeGate
from streams.classify.policy import Found
from streams.classify.router import SmartRouter
from streams.classify.stages import StageClock
from streams.classify.tokens import TokenCounter, texts_of
from streams.kafka.envelopes import dlq_for
from streams.rollout.assign import RolloutView
from streams.rollout.routers import ShadowTally
from streams.routing.features import RequestFeatures, TextTraits, text_traits
from streams.routing.stats import PathStats
from streams.rules.engine import RuleAnswer, RuleMatch
from streams.rules.rulefile import RuleSource
from streams.stores.ratelimit import RateLimiter, Verdict
from streams.stores.rounds import Round
from streams.stores.sessions import SessionStore, context_digest
from streams.stores.workerboard import Serving

__all__ = [
    "BatchClassifier",
    "BatchLookups",
    "Looked",
    "Pipeline",
    "Plan",
    "semantic_wanted",
    "wave_keys",
    "waves",
]

log = logging.getLogger(__name__)


def waves(keys: Sequence[Iterable[object]]) -> list[list[int]]:
    """Indices ``0..len(keys)-1`` split into waves to run one after another.

    ``keys[i]`` are the ordering keys of item ``i`` (its record key, its
    session); ``None`` keys order nothing. An item goes into the wave after
    the last one holding an earlier item that shares a key with it, so the
    items of one key are in increasing waves in their order, and items
    without shared keys all go into the first wave.
    """
    last_wave: dict[object, int] = {}
    out: list[list[int]] = []
    for i, item_keys in enumerate(keys):
        item_keys = [k for k in item_keys if k is not None]
        wave = 1 + max((last_wave.get(k, -1) for k in item_keys), default=-1)
        if wave == len(out):
            out.append([])
        out[wave].append(i)
        for k in item_keys:
            last_wave[k] = wave
    return out


@dataclass(slots=True)
class Plan:
    """What the batch asks about one admitted request, and what it found."""

    admitted: Admitted
    text: str
    intent: tuple[str | None, float] = (None, 0.0)
    traits: TextTraits | None = None
    match: RuleMatch | None = None
    """The rule that owns the text, if any (its lookup not yet read)."""
    bare: Probe | None = None
    """The cache probe keyed without history (``None``: the cache may not answer)."""
    verdict: Verdict = field(default_factory=lambda: Verdict(allowed=True))
    history: list[ChatMessage] = field(default_factory=list)
    probe: Probe | None = None
    """The probe keyed by the history actually found."""
    hit: CacheHit | None = None
    rule: RuleAnswer | None = None
    rule_read: tuple[str, str] | None = None
    replies: dict[str, Any] = field(default_factory=dict)
    """What Redis answered this request's own reads (its rule lookup)."""
    embedding: Any = None
    """The text's MiniLM row for the learned router (model-bound requests only)."""

    def found(self) -> Found:
        return Found(
            hit=self.hit,
            rule=self.rule,
            intent=self.intent[0],
            history_turns=len(self.history),
            embedding=self.embedding,
            traits=self.traits,
        )


def semantic_wanted(plans: Sequence[Plan]) -> list[int]:
    """The requests the semantic cache is asked about, cheap checks first:
    allowed by the rate limit, cacheable, no exact hit and no rule answer.
    A request a rule answered is never embedded."""
    return [
        i
        for i, plan in enumerate(plans)
        if plan.verdict.allowed
        and plan.probe is not None
        and plan.hit is None
        and plan.rule is None
    ]


@dataclass(slots=True)
class _FirstRound:
    """What the batch's first round trip found, shared by its requests."""

    verdicts: list[Verdict] = field(default_factory=list)
    histories: dict[str, list[ChatMessage]] = field(default_factory=dict)
    bare_hits: dict[str, CacheHit] = field(default_factory=dict)
    version: Any = None


@dataclass(frozen=True, slots=True)
class Looked:
    """What the lookups found for one admitted request."""

    verdict: Verdict
    found: Found
    history: list[ChatMessage]


class BatchLookups:
    """Everything the classifier asks Redis (and the embedder) about a
    batch of accepted requests."""

    def __init__(
        self,
        settings: Settings,
        redis: Any,
        rules: RuleSource,
        *,
        embedder: Embedder | None = None,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.rules = rules
        prefix = settings.redis.key_prefix
        self.limiter = RateLimiter(redis, settings.ratelimit, prefix)
        self.sessions = SessionStore(redis, settings.session, key_prefix=prefix)
        self.semantic = settings.cache_in_use and settings.cache.semantic
        learned = (
            settings.routing.learned_router is not None
            or settings.routing.learned_router_dir is not None
        ) and not settings.routing.force_path
        if embedder is None and (self.semantic or learned):
            embedder = MiniLMEmbedder()
        self.router_embedder = embedder if learned else None
        """Embeds the model-bound requests for the learned router's full head."""
        self.cache = ResponseCache(
            redis, settings.cache, key_prefix=prefix, embedder=embedder if self.semantic else None
        )
        self.hot = HotQuestions(redis, settings.prewarm, settings.cache, key_prefix=prefix)

    async def find_many(self, batch: Sequence[Admitted]) -> list[Looked | BaseException]:
        """What the rate limit, the session, the cache and the rules say
        about each request; an exception in place of a request whose
        lookups failed for a reason other than Redis (a bug)."""
        out: list[Looked | BaseException] = list(batch)  # type: ignore[arg-type]
        plans: dict[int, Plan] = {}
        seen: dict[str, Any] = {}
        for i, admitted in enumerate(batch):
            try:
                plans[i] = self._plan(admitted, seen)
            except Exception as exc:
                out[i] = exc
        live = list(plans.values())
        first = await self._first_round(live)
        for (i, plan), verdict in zip(list(plans.items()), first.verdicts, strict=True):
            try:
                self._after_first_round(plan, verdict, first)
            except Exception as exc:
                out[i] = exc
                del plans[i]
        live = list(plans.values())
        await self._second_round(live)
        if not self.settings.routing.force_path:
            await self._semantic(live, first.version)
            await self._embed_for_router(live)
        for i, plan in plans.items():
            try:
                out[i] = self._looked(plan)
            except Exception as exc:
                out[i] = exc
        return out

    # -- the steps -----------------------------------------------------------

    def _plan(self, admitted: Admitted, seen: dict[str, Any]) -> Plan:
        """What to ask about one request. ``seen``: what this batch already
        worked out per text (intent, rule match, text traits; pure functions
        of the text and the rule book), so a text asked many times is
        classified once."""
        request = admitted.request
        plan = Plan(admitted, request.user_text())
        if self.settings.routing.force_path is not None:
            return plan
        known = seen.get(plan.text)
        if known is None:
            book = self.rules.book
            intent = book.classify(plan.text)
            match = (
                book.match(plan.text, classified=intent)
                if self.settings.routing.rules_enabled
                else None
            )
            known = seen[plan.text] = (intent, match, text_traits(plan.text))
        plan.intent, plan.match, plan.traits = known
        if request.named_model() is not None:
            plan.match = None  # that model answers it, not a rule (``policy.decide``)
        if self.settings.cache_in_use:
            plan.bare = self.cache.probe(request)
        return plan

    async def _first_round(self, plans: list[Plan]) -> _FirstRound:
        """Rate limits, sessions, bare exact entries, rule lookups and the
        cache version, all in one round trip of a few commands."""
        found = _FirstRound()
        round_ = Round(self.redis)
        tenants = [p.admitted.request.tenant for p in plans]
        limits = self.limiter.queue(round_, tenants) if plans else []
        sessions = list(dict.fromkeys(s for p in plans if (s := p.admitted.request.session_id)))
        sessions_at = self.sessions.queue_histories(round_, sessions)
        cache_open = not self.cache.resting()
        bare = list(dict.fromkeys(p.bare.key for p in plans if p.bare is not None))
        bare_at = self.cache.queue_exact(round_, bare) if bare and cache_open else None
        version_at = self.cache.queue_version(round_) if cache_open and plans else None
        book, prefix = self.rules.book, self.settings.redis.key_prefix
        rule_at: dict[int, int] = {}
        for n, plan in enumerate(plans):
            if plan.match is not None and plan.match.rule.lookup is not None:
                plan.rule_read = book.lookup_read(plan.match, prefix)
                if plan.rule_read is not None:
                    key, form = plan.rule_read
                    rule_at[n] = round_.add("hgetall" if form == "hash" else "get", key)
        replies: list[Any] = []
        if len(round_):
            try:
                replies = await round_.run()
            except Exception as exc:  # the whole round: every helper fails open once
                replies = [exc] * len(round_)
        if isinstance(limits, list):
            found.verdicts = limits
        else:
            found.verdicts = self.limiter.judge(limits, replies, tenants)
        if sessions_at is not None:
            found.histories = self.sessions.histories_from(sessions_at, replies)
        if bare_at is not None:
            found.bare_hits = self.cache.exact_from(replies[bare_at], bare)
        if version_at is not None:
            found.version = replies[version_at]
        for n, at in rule_at.items():
            plans[n].replies["rule"] = replies[at]
        return found

    def _after_first_round(self, plan: Plan, verdict: Verdict, found: _FirstRound) -> None:
        request = plan.admitted.request
        plan.verdict = verdict
        if not verdict.allowed:
            return
        if request.session_id is not None:
            plan.history = found.histories.get(request.session_id, [])
        if self.settings.routing.force_path is not None:
            return
        context = context_digest(plan.history)
        if plan.bare is not None:
            plan.probe = plan.bare if not context else self.cache.probe(request, context)
            if not context:
                plan.hit = found.bare_hits.get(plan.bare.key)
        if plan.hit is None and plan.match is not None:
            if plan.match.rule.lookup is None:
                plan.rule = self.rules.book.resolve_read(plan.match, "", None)
            elif "rule" in plan.replies and plan.rule_read is not None:
                plan.rule = self.rules.book.resolve_read(
                    plan.match, plan.rule_read[0], plan.replies["rule"]
                )
        if self.settings.cache_in_use and plan.rule is None:  # a rule's answer is never cached
            self.hot.note(request, context, key=plan.bare.key if plan.bare else None)

    async def _second_round(self, plans: list[Plan]) -> None:
        """The exact entries of requests whose history is part of their key."""
        waiting = [
            p
            for p in plans
            if p.verdict.allowed and p.history and p.probe is not None and p.probe is not p.bare
        ]
        if not waiting or self.cache.resting():
            return
        keys = list(dict.fromkeys(p.probe.key for p in waiting if p.probe is not None))
        round_ = Round(self.redis)
        at = self.cache.queue_exact(round_, keys)
        try:
            reply = (await round_.run())[at]
        except Exception as exc:
            reply = exc
        hits = self.cache.exact_from(reply, keys)
        for plan in waiting:
            if plan.probe is not None and plan.probe.key in hits:
                plan.hit = hits[plan.probe.key]
                plan.rule = None  # the cache answers first

    async def _semantic(self, plans: list[Plan], version: Any) -> None:
        if not self.cache.semantic:
            return
        wanted = [plans[i] for i in semantic_wanted(plans)]
        if not wanted:
            return
        if version is not None:
            await self.cache.sync_if_moved(version)
        hits = await self.cache.semantic_many([p.probe for p in wanted])  # type: ignore[misc]
        for plan, hit in zip(wanted, hits, strict=True):
            plan.hit = hit

    async def _embed_for_router(self, plans: list[Plan]) -> None:
        """One embedding call for the requests the router will route (allowed,
        no cache hit, no rule answer), when a learned router is loaded. On
        failure the router uses its features-only head."""
        if self.router_embedder is None:
            return
        wanted = [
            p
            for p in plans
            if p.verdict.allowed
            and p.hit is None
            and p.rule is None
            and p.admitted.request.named_model() is None  # its path is named, not routed
        ]
        if not wanted:
            return
        texts = list(dict.fromkeys(p.text for p in wanted))
        try:
            vectors = await asyncio.to_thread(self.router_embedder.embed, texts)
        except Exception:
            log.exception("embedding for the learned router failed; routing on features")
            return
        by_text = dict(zip(texts, vectors, strict=True))
        for plan in wanted:
            plan.embedding = by_text[plan.text]

    def _looked(self, plan: Plan) -> Looked:
        if plan.verdict.allowed and plan.probe is not None:
            if plan.hit is not None:
                self.cache.count(plan.hit.kind)
            else:
                self.cache.count("error" if self.cache.resting() else "miss")
        return Looked(plan.verdict, plan.found(), plan.history)

    # -- after the batch ----------------------------------------------------

    async def remember(self, batch: Sequence[Classified]) -> None:
        """Turns answered here (cache or rules) join their sessions, as the
        workers' answers do; one round trip for the batch."""
        exchanges = []
        for classified in batch:
            request, result = classified.request, classified.result
            if request is None or result is None or not request.session_id:
                continue
            if result.status == "ok" and result.output:
                exchanges.append(
                    (request.session_id, request.id, request.user_text(), result.output)
                )
        await self.sessions.append_many(exchanges)


_FEATURES = tuple(f.name for f in fields(RequestFeatures))


def _ordering_keys(record: SourceRecord, admitted: Admitted | Classified) -> tuple[object, ...]:
    """What orders a record against its batch-mates: its key, its session."""
    session = admitted.request.session_id if isinstance(admitted, Admitted) else None
    return _keys_of(record, session)


def _keys_of(record: SourceRecord, session: str | None) -> tuple[object, ...]:
    return (
        ("key", record.key) if record.key is not None else None,
        ("session", session) if session else None,
    )


def wave_keys(
    records: Sequence[SourceRecord], wave: Sequence[tuple[int, Classified]]
) -> set[object]:
    """The ordering keys of a classified wave (for ``Pipeline.chain``)."""
    out: set[object] = set()
    for i, classified in wave:
        session = classified.request.session_id if classified.request is not None else None
        out.update(k for k in _keys_of(records[i], session) if k is not None)
    return out


class Pipeline:
    """Deliveries run one after another in the background, in the order
    they were chained, while the next batch is looked up and classified.

    A step starts only when the one before it finished, so records are
    produced, sessions appended and records marked done in batch order;
    the request loop chains a batch's acks after its last delivery, and
    waits for the previous batch before it chains the next (one batch in flight). ``keys``
    are the ordering keys of the steps not yet done: a batch that shares one
    waits (``clear_of``) before its lookups, so a session's next turn still
    reads the history its previous turn wrote. A step that fails stops every
    step after it (nothing later is acked) and the failure is raised by the
    next ``wait`` or ``chain``."""

    def __init__(self) -> None:
        self._tail: asyncio.Task[None] | None = None
        self.keys: set[object] = set()

    def chain(self, step: Callable[[], Awaitable[None]], keys: Iterable[object] = ()) -> None:
        previous = self._tail
        if previous is not None and previous.done():
            previous.result()  # a failed step: raise it here, chain nothing more
            previous = None
        held = set(keys)
        self.keys |= held

        async def run() -> None:
            if previous is not None:
                await previous
            await step()
            self.keys -= held

        self._tail = asyncio.get_running_loop().create_task(run())

    async def wait(self) -> None:
        """Until every chained step is done."""
        if self._tail is not None:
            await self._tail

    async def clear_of(self, keys: set[object]) -> None:
        if keys & self.keys:
            await self.wait()


class BatchClassifier:
    """Records in, ``Classified`` out, one per record in order."""

    def __init__(
        self,
        settings: Settings,
        lookups: BatchLookups,
        router: SmartRouter,
        *,
        stats: Callable[[], Mapping[AnswerPath, PathStats]] = dict,
        level: Callable[[], int] = lambda: 0,
        serving: Callable[[], Serving | None] = lambda: None,
        gate: RealtimeGate | None = None,
        drift: DriftMonitor | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        rollout: Callable[[], RolloutView | None] = lambda: None,
        tally: ShadowTally | None = None,
        tokens: TokenCounter | None = None,
        clock: StageClock | None = None,
    ) -> None:
        """``serving``: per lane, the paths live workers serve (the worker
        board); ``None`` while it is not known. ``gate``: whether the
        realtime lane is full; each model request routed there is counted on
        it as it is routed, so a burst in one wave fills the lane no further
        than one at a time would. ``rollout``: the model (and router)
        versions as last read (``streams.rollout``); ``tally``: where shadow
        router versions' decisions are counted; ``tokens``: counts the
        tokens of the answers given here (rules, cache), once loaded; ``clock``:
        where the time of each stage of a batch goes (``streams.classify.stages``)."""
        self.settings = settings
        self.lookups = lookups
        self.router = router
        self._stats = stats
        self._level = level
        self._serving = serving
        self._gate = gate
        self._drift = drift
        self._clock_ms = clock_ms
        self._rollout = rollout
        self.tally = tally
        self.tokens = tokens
        self.clock = clock or StageClock()

    async def classify(self, records: Sequence[SourceRecord]) -> list[Classified]:
        """Each record's outcome, in order; runs the waves one after another.
        ``classify_waves`` lets the caller deliver each wave before the next."""
        out: dict[int, Classified] = {}
        async for wave in self.classify_waves(records):
            out.update(wave)
        return [out[i] for i in range(len(records))]

    async def classify_waves(
        self,
        records: Sequence[SourceRecord],
        *,
        before: Callable[[set[object]], Awaitable[None]] | None = None,
    ) -> AsyncIterator[list[tuple[int, Classified]]]:
        """``(index, Classified)`` pairs, a wave at a time (see ``waves``).
        The caller delivers and remembers a wave before asking for the next,
        so a later turn of a session sees the earlier one. ``before`` is
        awaited with the batch's ordering keys before its first lookup (the
        request loop waits there for an earlier batch still delivering one of them)."""
        now_ms, limits = self._clock_ms(), self.settings.request_limits()
        admitted = [self._admit(r, now_ms, limits) for r in records]
        keys = [_ordering_keys(r, a) for r, a in zip(records, admitted, strict=True)]
        self.clock.lap("decode")
        if before is not None:
            await before({k for item in keys for k in item if k is not None})
            self.clock.lap("produce")  # held by an earlier batch's delivery
        for wave in waves(keys):
            yield await self._wave(records, admitted, wave)

    async def _wave(
        self,
        records: Sequence[SourceRecord],
        admitted: Sequence[Admitted | Classified],
        wave: list[int],
    ) -> list[tuple[int, Classified]]:
        done: dict[int, Classified] = {}
        asking: list[int] = []
        for i in wave:
            item = admitted[i]
            if isinstance(item, Classified):
                done[i] = item
            else:
                asking.append(i)
        looked = await self._find(records, admitted, asking)
        self.clock.lap("lookups")
        await self._count_tokens(admitted, asking, looked)
        stats, level = self._stats(), self._level()
        for i, found in zip(asking, looked, strict=True):
            item = admitted[i]
            assert isinstance(item, Admitted)
            if isinstance(found, BaseException):
                done[i] = self._failed(records[i], found)
                continue
            try:
                done[i] = self._route(item, found, stats, level)
            except Exception as exc:
                done[i] = self._failed(records[i], exc)
        self.clock.lap("route")
        return [(i, done[i]) for i in wave]

    async def _count_tokens(
        self,
        admitted: Sequence[Admitted | Classified],
        asking: list[int],
        looked: list[Looked | BaseException],
    ) -> None:
        """Count, in a thread, the texts the wave's own answers (cache hits,
        rule answers) need counted and nobody counted yet, so that routing
        them reads kept counts and the event loop never tokenizes."""
        tokens = self.tokens
        if tokens is None or not tokens.ready or self.settings.routing.force_path is not None:
            return
        texts: list[str] = []
        for i, found in zip(asking, looked, strict=True):
            item = admitted[i]
            if isinstance(found, BaseException) or not isinstance(item, Admitted):
                continue
            if not found.verdict.allowed:
                continue
            request, hit, rule = item.request, found.found.hit, found.found.rule
            if hit is not None:
                texts += texts_of(request)
                if hit.completion_tokens is None:
                    texts.append(hit.output)
            elif rule is not None and request.named_model() is None:
                texts += [*texts_of(request), rule.text]
        unknown = tokens.unknown(texts)
        if unknown:
            await asyncio.to_thread(tokens.learn, unknown)  # never raises

    async def _find(
        self,
        records: Sequence[SourceRecord],
        admitted: Sequence[Admitted | Classified],
        asking: list[int],
    ) -> list[Looked | BaseException]:
        if not asking:
            return []
        try:
            return await self.lookups.find_many([admitted[i] for i in asking])  # type: ignore[misc]
        except Exception as exc:  # a bug in the batch step: each record as it stands
            log.exception("batch lookups failed; classifying %d records alone", len(asking))
            return [exc] * len(asking)

    def _admit(
        self, record: SourceRecord, now_ms: int, limits: RequestLimits
    ) -> Admitted | Classified:
        try:
            return admit(
                record,
                now_ms=now_ms,
                settings=self.settings,
                limits=limits,
                registry=self.router.registry,
            )
        except Exception as exc:
            return self._failed(record, exc)

    def _route(
        self, admitted: Admitted, looked: Looked, stats: Mapping[AnswerPath, PathStats], level: int
    ) -> Classified:
        now_ms = self._clock_ms()
        if not looked.verdict.allowed:
            return refuse_over_limit(
                admitted, looked.verdict.retry_after_ms, now_ms=now_ms, settings=self.settings
            )
        classified = route(
            admitted,
            looked.found,
            now_ms=now_ms,
            settings=self.settings,
            router=self.router,
            stats=stats,
            level=level,
            history=looked.history,
            serving=self._serving(),
            full=self._full_for(looked.found),
            place=self._place,
            rollout=self._rollout(),
            tokens=self.tokens,
        )
        decision = classified.decision
        if self.tally is not None and decision is not None:
            taken = decision.requested_path or decision.path
            for version, path in classified.router_shadows:
                self.tally.note(version, taken, path)
        if self._drift is not None and decision is not None and decision.features is not None:
            features = decision.features
            # ``as_dict`` is ``dataclasses.asdict``, a deep copy: ~100 us a
            # request on this path. The fields are plain values.
            self._drift.observe({name: getattr(features, name) for name in _FEATURES})
        return classified

    def _full_for(self, found: Found) -> Callable[[AnswerPath], LaneFull | None] | None:
        """The gate, for ``route`` to ask with the path it chose; only for a
        request that may go to a lane (a cache hit or a rule's answer is
        given here whatever it says)."""
        if self._gate is None or found.hit is not None or found.rule is not None:
            return None
        return self._gate.full

    def _place(self, path: AnswerPath) -> int | None:
        """The realtime partition for a request routed there, counted on the
        gate as it is routed, so a burst in one wave fills the lane no
        further than one at a time would."""
        return None if self._gate is None else self._gate.sent(path=path)

    def _failed(self, record: SourceRecord, exc: BaseException) -> Classified:
        """A bug on one record: that record to the DLQ, its batch-mates go on."""
        log.error(
            "classifier failed on %s:%s:%s: %s: %s",
            record.topic,
            record.partition,
            record.offset,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        error = BackendUnavailable(f"classifier error: {type(exc).__name__}: {exc}")
        return Classified("rejected", [dlq_for(record, error, self.settings)])
