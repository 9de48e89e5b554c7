"""A lane batch's model work: each question decoded once.

``LaneWorker`` reads a batch off its lane, and hands the requests that need
a model to a ``BatchRunner``, which answers each distinct question once:

1. the cache again, just before the batch runs (``answered_meanwhile``): an
   identical request answered while this one waited in the lane;
2. one decode for the identical requests of one batch, and none for a
   request an earlier batch of this worker is decoding
   (``workers.coalesce``);
3. none for a request another worker has marked as decoding
   (``workers.claims``): it waits for that answer to reach the cache.

A question this worker decodes whose answer another worker stores first
(a realtime copy, which never waits on a slower lane's mark) stops
decoding and is answered from the cache (``_decode``).

Copies of one question whose answer never came (another worker's decode
failed, or the wait gave up) run once for them all, not once each; only
when that run fails too, or when this worker's own decode failed, does each
copy run on its own.

Each model answer is stored in the response cache as soon as it is decoded,
and this worker's marks let go right after, before it waits on anyone
else's: no two workers wait on each other. Producing, keeping and committing
the batch stay with the worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from prometheus_client import Counter

from schemas.messages import InferenceResult, Lane, RoutedRequest
from schemas.settings import Settings
from streams.cache.response import CacheHit, ResponseCache
from streams.kafka.envelopes import Outbound
from streams.kafka.tracing import Traces, traced
from streams.stores.sessions import context_digest
from workers.answered import attempt_events, cached_result, cancelled_result
from workers.cancels import Cancels
from workers.claims import DecodeClaims
from workers.coalesce import InFlight, shared_result, split_duplicates
from workers.execution import Executor, Finished
from workers.result_store import RecordKey
from workers.settle import Answer
from workers.streaming import AnswerStream

__all__ = ["BatchRunner"]

STORES_AT_ONCE = 32
"""Cache stores a worker has in flight at once (a bulk batch may be large)."""

COALESCED = Counter(
    "laneway_cache_late_hits_total",
    "Requests a worker answered without a model: an identical one was answered as they "
    "waited (from the cache), in the same batch, in a batch in flight before theirs, "
    "or on another worker",
    ["lane"],
)

STOPPED = Counter(
    "laneway_decodes_stopped_total",
    "Decodes a worker stopped because another worker's answer to the same question "
    "reached the cache first; the request was answered from the cache",
    ["lane"],
)

WATCH_S = 0.1
"""How often a batch asks whether the answers it is decoding reached the
cache from another worker."""

Item = tuple[RecordKey, RoutedRequest]


class BatchRunner:
    """Runs one worker's batches on its model paths, each question once."""

    def __init__(
        self,
        settings: Settings,
        lane: Lane,
        executor: Executor,
        cache: ResponseCache | None = None,
        claims: DecodeClaims | None = None,
        cancels: Cancels | None = None,
    ) -> None:
        self.settings = settings
        self.lane = lane
        self.executor = executor
        self.cache = cache
        """Asked again just before a batch runs, and given each answer as
        soon as it is decoded (``None``: no cache)."""
        self.claims = claims if cache is not None else None
        """Where this worker marks the questions it decodes, and finds the
        ones another worker is decoding (``None``: it decodes every copy)."""
        self.in_flight = InFlight()
        """The shareable requests this worker's batches are decoding now."""
        self.cancels = cancels
        """The requests whose clients cancelled them (``None``: none are heard)."""

    def withdrawn(self, fresh: Sequence[Item]) -> list[Answer]:
        """Requests cancelled before their batch ran: answered at once."""
        if self.cancels is None:
            return []
        now_ms = int(time.time() * 1000)
        return [
            (key, routed, cancelled_result(routed, self.lane, now_ms))
            for key, routed in fresh
            if self.cancels.cancelled(routed.request.id)
        ]

    async def answered_meanwhile(self, fresh: Sequence[Item]) -> list[Answer]:
        """Requests whose exact answer reached the cache while they waited:
        the classifier routed them before an identical request's answer was
        stored (a burst of one popular question)."""
        if self.cache is None:
            return []
        fresh = [(key, routed) for key, routed in fresh if not routed.shadow]  # runs its version
        results = await self._from_cache([routed for _, routed in fresh])
        found: list[Answer] = [
            (key, routed, result)
            for (key, routed), result in zip(fresh, results, strict=True)
            if result is not None
        ]
        if found:
            COALESCED.labels(self.lane).inc(len(found))
        return found

    async def run(
        self,
        fresh: list[Item],
        traces: Traces,
        streams: Mapping[RecordKey, AnswerStream] | None = None,
    ) -> tuple[list[Answer], list[Outbound]]:
        """Run ``fresh`` on the model paths, identical requests once: in
        this batch, across the batches in flight (``workers.coalesce``) and
        across workers (``workers.claims``). Returns the answers and a
        quality event per path that failed before a fallback answered.
        ``streams``: by record, where a streamed request's decode sends its
        pieces (a copy answered by another's decode gets its text whole)."""
        streams = streams or {}
        leaders, answer_keys, followers = split_duplicates(fresh, self.settings)
        ours, elsewhere = self.in_flight.claim(answer_keys)
        joining: asyncio.Task[dict[int, InferenceResult | None]] | None = None
        marked: list[str] = []
        try:
            theirs = await self.claims.mark(ours, marked) if self.claims is not None else {}
            mine = [i for i in ours if i not in theirs]
            if theirs:
                joining = asyncio.create_task(self._join(theirs, leaders))
            finished = (
                await self._decode(
                    [leaders[i][1] for i in mine],
                    [ours[i] for i in mine],
                    [streams.get(leaders[i][0]) for i in mine],
                )
                if mine
                else []
            )
            self.in_flight.settle([ours[i] for i in mine], [item.result for item in finished])
            await self._keep(finished)
            await self._let_go(marked)  # the workers waiting on them find them now
            joined = await joining if joining is not None else {}  # another worker's, cached
        except BaseException:
            if joining is not None:
                joining.cancel()
            self.in_flight.settle(list(ours.values()), None)  # the waiting run their own
            raise
        finally:
            await self._let_go(marked)
        self.in_flight.settle([theirs[i] for i in joined], list(joined.values()))
        keys = [leaders[i][0] for i in mine]
        answers: list[Answer] = [
            (key, item.routed, item.result) for key, item in zip(keys, finished, strict=True)
        ]
        led: dict[int, InferenceResult | None] = {
            i: item.result for i, item in zip(mine, finished, strict=True)
        }
        led.update(joined)
        for i, running in elsewhere.items():  # an earlier batch's: started first
            led[i] = await asyncio.shield(running)
        now_ms = int(time.time() * 1000)
        shared = 0
        alone: list[Item] = []  # their leader failed: each runs on its own
        unanswered: dict[int, list[Item]] = {}  # no answer came: one runs for them all
        sharing = [(leaders[i][0], leaders[i][1], i) for i in [*elsewhere, *theirs]]
        sharing += [(f.key, f.routed, f.leader) for f in followers]
        for key, routed, leader in sharing:
            result = led[leader]
            if result is not None and result.status == "ok":
                answers.append((key, routed, shared_result(routed, result, self.lane, now_ms)))
                shared += 1
            elif result is None:
                unanswered.setdefault(leader, []).append((key, routed))
            else:
                alone.append((key, routed))
        while alone or unanswered:
            firsts = [copies[0] for copies in unanswered.values()]
            batch = [*firsts, *alone]
            more = await self.executor.execute(
                [routed for _, routed in batch], streams=_by_index(batch, streams)
            )
            await self._keep(more)
            finished += more
            keys += [key for key, _ in batch]
            answers += [
                (key, item.routed, item.result) for (key, _), item in zip(batch, more, strict=True)
            ]
            now_ms = int(time.time() * 1000)
            alone = []
            for copies, item in zip(unanswered.values(), more[: len(firsts)], strict=True):
                if item.result.status == "ok":
                    answers += [
                        (key, routed, shared_result(routed, item.result, self.lane, now_ms))
                        for key, routed in copies[1:]
                    ]
                    shared += len(copies) - 1
                else:
                    alone += copies[1:]
            unanswered = {}
        if shared:
            COALESCED.labels(self.lane).inc(shared)
        return (
            answers,
            [
                event
                for key, item in zip(keys, finished, strict=True)
                if not item.routed.shadow  # shadow trouble is on the shadow topic, not the path's
                for event in traced(attempt_events(item, self.settings), traces[key[:3]])
            ],
        )

    async def _decode(
        self,
        requests: list[RoutedRequest],
        answer_keys: list[str | None],
        streams: Sequence[AnswerStream | None] = (),
    ) -> list[Finished]:
        """Run this worker's ``requests``; one whose answer reaches the cache
        from another worker while it decodes (a realtime copy that did not
        wait for this slower lane's mark, or the other way round) is
        stopped and answered from the cache, freeing its place in the
        batch. A backend that cannot stop finishes it, and that answer
        stands."""
        listening = {n: stream for n, stream in enumerate(streams) if stream is not None}
        watched = (
            {n: key for n, key in enumerate(answer_keys) if key is not None}
            if self.cache is not None and self.claims is not None
            else {}
        )
        cancels = self.cancels
        if not watched and cancels is None:
            return await self.executor.execute(requests, streams=listening)
        wanted = range(len(requests)) if cancels is not None else watched
        unwanted = {n: asyncio.Event() for n in wanted}
        if cancels is not None:
            for n, event in unwanted.items():
                cancels.watch(requests[n].request.id, event)
        decoded = asyncio.Event()
        watching = asyncio.create_task(self._watch(watched, unwanted, decoded))
        try:
            finished = await self.executor.execute(requests, unwanted, listening)
        finally:
            # The watcher also ends on ``decoded``: redis-py can swallow a
            # cancel that lands mid-command (redis/redis-py#2028), and a
            # watcher that went on polling held this batch forever.
            decoded.set()
            watching.cancel()
            await asyncio.wait({watching}, timeout=WATCH_S * 10)
            if cancels is not None:
                for n, event in unwanted.items():
                    cancels.unwatch(requests[n].request.id, event)
        stopped = [
            n
            for n, event in unwanted.items()
            if event.is_set() and finished[n].result.status != "ok"
        ]
        if cancels is not None:
            now_ms = int(time.time() * 1000)
            for n in [n for n in stopped if cancels.cancelled(requests[n].request.id)]:
                result = cancelled_result(requests[n], self.lane, now_ms)
                finished[n] = Finished(requests[n], result, finished[n].failed)
                stopped.remove(n)
        if not stopped:
            return finished
        STOPPED.labels(self.lane).inc(len(stopped))
        cached = await self._from_cache([requests[n] for n in stopped])
        again: list[int] = []
        for n, answer in zip(stopped, cached, strict=True):
            if answer is None:  # gone again (evicted): decode it after all
                again.append(n)
                continue
            finished[n] = Finished(requests[n], answer, finished[n].failed)
        if again:
            rerun = await self.executor.execute(
                [requests[n] for n in again],
                streams={j: listening[n] for j, n in enumerate(again) if n in listening},
            )
            for n, item in zip(again, rerun, strict=True):
                finished[n] = item
        return finished

    async def _watch(
        self, watched: dict[int, str], unwanted: dict[int, asyncio.Event], decoded: asyncio.Event
    ) -> None:
        """Every ``WATCH_S``, set the event of each watched answer key that
        has a cache entry now, until all are set or ``decoded`` is."""
        pending = dict(watched)
        while pending and not decoded.is_set():
            await asyncio.sleep(WATCH_S)
            if decoded.is_set() or self.cache is None:
                return
            found = await self.cache.present(list(pending.values()))
            for n in [n for n, key in pending.items() if key in found]:
                unwanted[n].set()
                del pending[n]

    async def _keep(self, finished: Sequence[Finished]) -> None:
        """Store the answers just decoded in the response cache (it keeps
        only what is safe to replay), before their batch is produced: a
        copy of the question on another worker, waiting on this worker's
        mark, finds its answer as soon as the decode ends. Each batch waits
        on others' marks while holding its own, so keeping answers until
        the batch ends could make two workers wait on each other."""
        if self.cache is None:
            return
        cache = self.cache
        live = [  # a shadow joins no cache; a failure is not offered to it
            item
            for item in finished
            if not item.routed.shadow and item.result.status == "ok" and item.result.output
        ]
        for start in range(0, len(live), STORES_AT_ONCE):
            await asyncio.gather(
                *(
                    cache.store(
                        item.routed.request, item.result, context_digest(item.routed.history)
                    )
                    for item in live[start : start + STORES_AT_ONCE]
                )
            )

    async def _join(
        self, theirs: dict[int, str], leaders: Sequence[Item]
    ) -> dict[int, InferenceResult | None]:
        """The answers other workers decoded for ``theirs``, from the cache
        once their marks are gone (``DecodeClaims.outwait``); ``None``
        where none came and the request runs here."""
        assert self.claims is not None
        requests = {i: leaders[i][1] for i in theirs}
        gone = sorted(await self.claims.outwait(theirs, requests))
        cached = await self._from_cache([requests[i] for i in gone])
        found = dict(zip(gone, cached, strict=True))
        return {i: found.get(i) for i in theirs}

    async def _let_go(self, marked: list[str]) -> None:
        if self.claims is not None:
            await self.claims.let_go(marked)

    async def _from_cache(self, requests: Sequence[RoutedRequest]) -> list[InferenceResult | None]:
        """Each request's exact answer in the cache, as this lane's result
        (``None`` where there is none)."""
        cache = self.cache
        assert cache is not None
        hits: list[CacheHit | None] = await asyncio.gather(
            *(cache.lookup(routed.request, context_digest(routed.history)) for routed in requests)
        )
        now_ms = int(time.time() * 1000)
        return [
            cached_result(routed, hit, self.lane, now_ms) if hit is not None else None
            for routed, hit in zip(requests, hits, strict=True)
        ]


def _by_index(
    batch: Sequence[Item], streams: Mapping[RecordKey, AnswerStream]
) -> dict[int, AnswerStream]:
    """``streams`` of ``batch``'s records, by their index in it."""
    return {n: streams[key] for n, (key, _) in enumerate(batch) if key in streams}
