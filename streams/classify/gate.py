"""The realtime gate: whether the realtime lane takes another model request
now, and which of its workers' partitions it should go to.

The workers report their backlog (``streams.stores.backlog``) as their
batches start and end and once a ``flow.interval_s``; between reports the
gate carries each count forward as a queue would: plus the model requests
this classifier has sent since the report was written, less what the
worker drained at its rate meanwhile. ``flow.realtime_full`` judges the
count against the marks.

A record on a lane topic waits for the one worker that holds its
partition, so the gate judges each realtime worker by its own queue where
it can: a worker whose heartbeat card lists the partitions it holds
(``WorkerCard.partitions``) and whose report is fresh. A model request goes
to the worker with the most room that serves its path (``sent`` names one
of that worker's partitions, in turn), and the lane is full for that path
only when that worker is (``full(path)``); the count mark
(``realtime_max_backlog``) stays the lane's. Summed over the lane instead,
one idle worker's free slots would hide another's queue: with four
partitions over three workers, the worker holding two gets half the
traffic on a third of the capacity. Where no
worker can be judged alone (older workers, no reports yet), the gate judges
the lane as a whole and records go where their key hashes, as before.

Without a report younger than ``stale_ms`` (none yet, flow control off,
Redis unreachable) the gate says nothing is full: it fails open.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from schemas.messages import AnswerPath, Lane
from schemas.settings import FlowSettings
from streams.classify.flow import LaneFull, realtime_full
from streams.stores.workerboard import WorkerCard

__all__ = ["RealtimeGate", "RealtimeWorker", "realtime_workers"]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class RealtimeWorker:
    """What a realtime worker's heartbeat card says the gate needs."""

    capacity: int
    partitions: tuple[int, ...]
    paths: frozenset[AnswerPath]


class _Queue:
    """One queue the gate follows (a worker's, or the lane's): its last
    report and what was sent to it since."""

    def __init__(self) -> None:
        self.waiting_reported = 0
        self.drain_per_s: float | None = None
        self.at_ms: int | None = None
        self.capacity: int | None = None
        self.sent: deque[tuple[int, int]] = deque()
        """(epoch ms, how many) of the sends the last report may not count."""

    def reported(self, waiting: int, drain_per_s: float | None, at_ms: int) -> None:
        self.waiting_reported, self.drain_per_s, self.at_ms = waiting, drain_per_s, at_ms
        while self.sent and self.sent[0][0] <= at_ms:
            self.sent.popleft()

    def add(self, now_ms: int, n: int, stale_ms: int) -> None:
        self.sent.append((now_ms, n))
        while self.sent[0][0] < now_ms - stale_ms:  # no report came: forget
            self.sent.popleft()

    def fresh(self, now_ms: int, stale_ms: int) -> bool:
        return self.at_ms is not None and now_ms - self.at_ms <= stale_ms

    def waiting(self, now_ms: int) -> int:
        sent = sum(n for _, n in self.sent)
        elapsed_s = max(0, now_ms - (self.at_ms or 0)) / 1000
        drained = (self.drain_per_s or 0.0) * elapsed_s
        return max(0, round(self.waiting_reported + sent - drained))

    def full(self, flow: FlowSettings, now_ms: int) -> LaneFull | None:
        return realtime_full(self.waiting(now_ms), flow, self.drain_per_s, self.capacity)


class RealtimeGate:
    """See the module docstring. ``reported`` and ``serving`` give the
    lane's sums; ``worker_reported`` and ``workers`` each worker's own."""

    def __init__(
        self, flow: FlowSettings, clock_ms: Callable[[], int] = _now_ms, stale_ms: int = 30_000
    ) -> None:
        self._flow = flow
        self._by_worker = flow.model_copy(update={"realtime_max_backlog": None})
        """A worker judged alone: by its batches and its wait (the count
        mark stays the lane's)."""
        self._clock_ms = clock_ms
        self._stale_ms = stale_ms
        self._lane = _Queue()
        self._queues: dict[str, _Queue] = {}
        self._workers: dict[str, RealtimeWorker] = {}
        self._turn = 0

    # -- what the boards say -------------------------------------------------

    def reported(self, waiting: int, drain_per_s: float | None, at_ms: int | None) -> None:
        """The lane's workers' latest reports, summed; written at ``at_ms``
        (``None``: now), so they count what was sent before then."""
        self._lane.reported(waiting, drain_per_s, self._clock_ms() if at_ms is None else at_ms)

    def serving(self, capacity: int | None) -> None:
        """What the lane's live workers run at once, from their heartbeat
        cards (``None``: the board cannot say)."""
        self._lane.capacity = capacity

    def workers(self, workers: Mapping[str, RealtimeWorker] | None) -> None:
        """The live realtime workers that serve a model path and say which
        partitions they hold (``None``: the board cannot say)."""
        self._workers = dict(workers or {})
        for worker_id in list(self._queues):
            if worker_id not in self._workers:
                del self._queues[worker_id]
        for worker_id, worker in self._workers.items():
            self._queues.setdefault(worker_id, _Queue()).capacity = worker.capacity

    def worker_reported(
        self, worker_id: str, waiting: int, drain_per_s: float | None, at_ms: int
    ) -> None:
        """One realtime worker's own latest report."""
        if worker_id in self._workers:
            self._queues[worker_id].reported(waiting, drain_per_s, at_ms)

    # -- what the classifier asks --------------------------------------------

    def full(self, path: AnswerPath | None = None) -> LaneFull | None:
        """The lane, when it takes no more model requests (for ``path``; any
        path when ``None``) now: when the worker with the most room that
        serves it is full (the lane's sums, where no such worker can be
        judged alone)."""
        now = self._clock_ms()
        if not self._lane.fresh(now, self._stale_ms):
            return None
        best = self._best(now, path)
        if best is None:
            return self._lane.full(self._flow, now)
        mark, waiting = self._flow.realtime_max_backlog, self._lane.waiting(now)
        if mark is not None and waiting >= mark:  # the count mark is the lane's
            return LaneFull(Lane.REALTIME, waiting, self._flow.realtime_retry_after_ms)
        return self._queues[best].full(self._by_worker, now)

    def sent(self, n: int = 1, path: AnswerPath | None = None) -> int | None:
        """``n`` more model requests (for ``path``) routed to the realtime
        lane now; the partition to write them to (``None``: where their key
        hashes)."""
        if not n:
            return None
        now = self._clock_ms()
        self._lane.add(now, n, self._stale_ms)
        best = self._best(now, path)
        if best is None:
            return None
        self._queues[best].add(now, n, self._stale_ms)
        partitions = self._workers[best].partitions
        self._turn += 1
        return partitions[self._turn % len(partitions)]

    def waiting(self) -> int:
        """The records the lane has waiting now, as far as the gate can tell."""
        return self._lane.waiting(self._clock_ms())

    def _best(self, now_ms: int, path: AnswerPath | None) -> str | None:
        """The worker judged alone with the most room (serving ``path``,
        when given): not full before spill-full before full, then the
        fewest waiting per slot."""
        ranked = []
        for worker_id, worker in self._workers.items():
            queue = self._queues[worker_id]
            if not worker.partitions or not queue.fresh(now_ms, self._stale_ms):
                continue
            if path is not None and path not in worker.paths:
                continue
            full = queue.full(self._by_worker, now_ms)
            rank = 0 if full is None else (1 if not full.asked_too else 2)
            ranked.append((rank, queue.waiting(now_ms) / max(1, worker.capacity), worker_id))
        return min(ranked)[2] if ranked else None


def realtime_workers(cards: Sequence[WorkerCard]) -> dict[str, RealtimeWorker]:
    """The realtime workers ``RealtimeGate.workers`` judges alone: those
    that serve a model path and list the partitions they hold."""
    return {
        card.worker_id: RealtimeWorker(
            card.capacity, card.partitions, frozenset(p.path for p in card.paths)
        )
        for card in cards
        if card.lane is Lane.REALTIME and card.paths and card.partitions
    }
