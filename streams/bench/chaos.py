"""``laneway bench chaos``: replicas of every process, broken one at a time
while traffic flows, and nothing lost.

One embedded stack: the broker with 8 partitions per topic, a Valkey
Cluster (3 primaries, a replica each, ``LANEWAY_REDIS_CLUSTER=true``), two
classifiers, two routers (the quality loop), two batch trackers and two
workers per lane, each kind in one consumer group. A client (the SDK) sends
a steady mix of rule, cache and model questions (``chaos_request``) at
``--rate`` per second, whatever comes back, while the faults come in turn:

- ``classifier``, ``router``, ``batch-tracker``, ``worker-realtime``,
  ``worker-medium``, ``worker-bulk``: one process of that kind SIGKILLed;
  the supervisor restarts it, and the run waits until it answers
  ``/readyz`` again;
- ``redis-primary``: the primary that holds the default tenant's rate-limit
  bucket (touched by every classifier round) SIGKILLed; the run waits until
  a replica serves its slots;
- ``worker-stop``: the second medium worker sent SIGSTOP for ``--stop-s``
  (past its 10 s Kafka session timeout: the group gives its partitions to
  the other medium worker), then SIGCONT.

Each fault's window runs from the fault until the part is back, and at
least ``--window-s``; its p99 (of the requests sent in it) is set against
the p99 of the ``--before-s`` before the first fault. After the last one
the traffic stops and every request is waited for (``--drain-timeout-s``).
The client keeps every reply it reads, and each id's replies
are counted: a second reply of an id is a duplicate, which CONTRACT.md
allows (Delivery: at least once, the same result with the same id); a
reply to an id never sent, or two replies of an id that disagree, is not
within it.

Not covered: the broker itself (one embedded Tansu, never killed), a
network partition (every part is on loopback), the gateway, several
faults at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.messages import InferenceResult, Lane
from schemas.settings import Settings
from streams.bench.compare import FAQ_PROMPTS, PLACES, SIMPLE_TEMPLATES
from streams.bench.drive import NO_CACHE, RULE_PROMPTS, _percentile, warm_up
from streams.bench.results import BenchRun, Figure, Series
from streams.client import LanewayClient

__all__ = [
    "FAULTS",
    "HELP",
    "STARTS_STACK",
    "Chaos",
    "CountingClient",
    "FaultWindow",
    "Plan",
    "Sent",
    "Tally",
    "add_arguments",
    "chaos_request",
    "parse_faults",
    "run",
    "run_chaos",
    "tally",
    "window_p99",
]

HELP = "two of every process over 8 partitions and a Valkey Cluster, broken one at a time"
STARTS_STACK = True

KILLED = (
    "classifier",
    "router",
    "batch-tracker",
    "worker-realtime",
    "worker-medium",
    "worker-bulk",
)
"""Faults that SIGKILL the first process of that name (the supervisor restarts it)."""
FAULTS = (*KILLED, "redis-primary", "worker-stop")
STOPPED_WORKER = "worker-medium-2"
"""The worker ``worker-stop`` stops (the medium lane's second)."""
PARTITIONS = 8
LANES = tuple(lane for lane in Lane for _ in range(2))
"""Two workers per lane, each lane's in one consumer group."""
LATE_COPIES_S = 5.0
"""How long the client reads on once every request is answered."""
SESSION_TIMEOUT_S = 10.0
"""aiokafka's default session timeout, which the lane workers keep."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rate", type=float, default=4.0, help="requests sent per second, answered or not"
    )
    parser.add_argument("--max-tokens", type=int, default=4, help="of each model question")
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"which faults, in this order (comma-separated; of {', '.join(FAULTS)})",
    )
    parser.add_argument(
        "--before-s", type=float, default=15.0, help="traffic before the first fault"
    )
    parser.add_argument(
        "--window-s",
        type=float,
        default=15.0,
        help="each fault's window: from the fault until the part is back, at least this long",
    )
    parser.add_argument(
        "--stop-s",
        type=float,
        default=15.0,
        help=f"how long worker-stop keeps the worker stopped (past its "
        f"{SESSION_TIMEOUT_S:.0f} s session timeout)",
    )
    parser.add_argument(
        "--restart-timeout-s",
        type=float,
        default=180.0,
        help="longest wait for a killed process to be ready again (or a replica promoted)",
    )
    parser.add_argument(
        "--drain-timeout-s",
        type=float,
        default=180.0,
        help="longest wait, after the traffic stops, for the answers still due",
    )


def parse_faults(text: str) -> tuple[str, ...]:
    """The faults named in ``text`` (comma-separated), in its order."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault {unknown[0]!r}: one of {', '.join(FAULTS)}")
    return names


# -- the traffic -----------------------------------------------------------------


def chaos_request(i: int, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The ``i``-th request of the mix and its kind. Per 10: 4 rule answers
    (the classifier), 3 FAQ questions asked again and again (the response
    cache, after the first), 3 model questions past the cache (a worker):
    one on each lane (the client's wish for realtime and medium, a batch
    job's for bulk: the router would send a simple question to realtime)."""
    slot = i % 10
    if slot < 4:
        return "rule", {"prompt": RULE_PROMPTS[i % len(RULE_PROMPTS)]}
    if slot < 7:
        question = FAQ_PROMPTS[(i // 10) % len(FAQ_PROMPTS)]
        return "cache", {"prompt": question, "max_tokens": max_tokens, "temperature": 0.0}
    template = SIMPLE_TEMPLATES[i % len(SIMPLE_TEMPLATES)]
    request: dict[str, Any] = {
        "prompt": template.format(PLACES[(i // 10) % len(PLACES)]),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "metadata": NO_CACHE,
    }
    if slot == 7:
        request["lane"] = Lane.REALTIME.value
    elif slot == 8:
        request["batch_id"] = "chaos"
    else:
        request["lane"] = Lane.MEDIUM.value
    return "model", request


@dataclass(slots=True)
class Sent:
    """One request of the run: when it was sent and answered (seconds since
    the run's start) and how."""

    id: str
    kind: str
    sent_at: float
    answered_at: float | None = None
    status: str = ""
    code: str = ""
    lane: str = ""

    @property
    def latency_ms(self) -> float | None:
        if self.answered_at is None:
            return None
        return (self.answered_at - self.sent_at) * 1000


class CountingClient(LanewayClient):
    """The SDK, keeping every reply it reads (``replies``), the duplicates
    it drops and replies to ids it never sent included. (The reply topic
    cannot be read back afterwards to count them: the embedded broker's
    listed end offset leaves out the tail of a partition's last batch,
    docs/delivery.md.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replies: list[InferenceResult] = []

    def _deliver(self, result: InferenceResult) -> None:
        self.replies.append(result)
        super()._deliver(result)


class Traffic:
    """Sends ``chaos_request``s at ``rate`` per second through ``client``
    until ``stop``; keeps every one in ``sent``."""

    def __init__(self, client: Any, rate: float, max_tokens: int) -> None:
        if rate <= 0:
            raise ValueError(f"--rate must be above 0, not {rate}")
        self.client = client
        self.rate = rate
        self.max_tokens = max_tokens
        self.sent: dict[str, Sent] = {}
        self.futures: list[asyncio.Future[InferenceResult]] = []
        self.begun = time.monotonic()
        self._stop = asyncio.Event()
        self._tag = uuid.uuid4().hex[:6]

    def now(self) -> float:
        return time.monotonic() - self.begun

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        i = 0
        while not self._stop.is_set():
            due = i / self.rate
            if due > self.now():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), due - self.now())
                continue
            kind, request = chaos_request(i, self.max_tokens)
            one = Sent(f"chaos-{self._tag}-{i}", kind, self.now())
            self.sent[one.id] = one
            future = await self.client.submit({"id": one.id, **request})
            future.add_done_callback(lambda f, one=one: self._answered(one, f))
            self.futures.append(future)
            i += 1

    def _answered(self, one: Sent, future: asyncio.Future[InferenceResult]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        result = future.result()
        one.answered_at = self.now()
        one.status = result.status
        one.code = result.error.code if result.error else ""
        one.lane = str(result.lane or "-")

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every answer still due; how many never came."""
        pending = [f for f in self.futures if not f.done()]
        if pending:
            _, pending_set = await asyncio.wait(pending, timeout=timeout_s)
            return len(pending_set)
        return 0


# -- what is counted -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One fault: when it began and ended (seconds since the run's start),
    and how long the part took to be back (``None``: it was not)."""

    name: str
    start: float
    end: float
    back_after_s: float | None


def window_p99(sent: Iterable[Sent], start: float, end: float) -> float | None:
    """p99 latency (ms) of the answered requests sent in ``[start, end)``."""
    latencies = sorted(
        s.latency_ms for s in sent if start <= s.sent_at < end and s.latency_ms is not None
    )
    return _percentile(latencies, 0.99) if latencies else None


@dataclass(frozen=True, slots=True)
class Tally:
    sent: int
    answered: int
    lost: int
    errors: dict[str, int]
    """Answered with an error, by code."""
    duplicates: int
    """Replies beyond the first of an id."""
    duplicate_ids: int
    """Ids answered more than once."""
    unknown: int
    """Replies to an id never sent."""
    conflicting: int
    """Ids whose replies disagree (status, error code or output)."""
    duplicates_by_window: dict[str, int] = field(default_factory=dict)
    """Duplicate ids by the fault window their request was sent in."""

    @property
    def within_contract(self) -> bool:
        """CONTRACT.md, Delivery: at least one terminal result per request,
        and a second one only as the same result with the same id."""
        return self.lost == 0 and self.unknown == 0 and self.conflicting == 0


def tally(
    sent: dict[str, Sent],
    replies: Sequence[InferenceResult],
    windows: Sequence[FaultWindow] = (),
    also_known: Iterable[str] = (),
) -> Tally:
    """Count ``sent`` against every reply the client read (``replies``,
    duplicates included). ``also_known``: ids sent outside the
    run (the warm-up), neither counted nor unknown."""
    known = set(also_known)
    by_id: dict[str, list[InferenceResult]] = {}
    unknown = 0
    for reply in replies:
        if reply.id in sent:
            by_id.setdefault(reply.id, []).append(reply)
        elif reply.id not in known:
            unknown += 1
    twice = {rid: copies for rid, copies in by_id.items() if len(copies) > 1}
    conflicting = sum(
        1
        for copies in twice.values()
        if len({(c.status, c.error.code if c.error else "", c.output) for c in copies}) > 1
    )
    by_window: Counter[str] = Counter()
    for rid in twice:
        at = sent[rid].sent_at
        inside = [w.name for w in windows if w.start <= at < w.end]
        by_window[inside[0] if inside else "outside"] += 1
    answered = [s for s in sent.values() if s.answered_at is not None]
    return Tally(
        sent=len(sent),
        answered=len(answered),
        lost=len(sent) - len(answered),
        errors=dict(Counter(s.code or s.status for s in answered if s.status != "ok")),
        duplicates=sum(len(c) - 1 for c in twice.values()),
        duplicate_ids=len(twice),
        unknown=unknown,
        conflicting=conflicting,
        duplicates_by_window=dict(by_window),
    )


@dataclass(frozen=True, slots=True)
class Chaos:
    """What a chaos run measured."""

    tally: Tally
    before: FaultWindow
    windows: list[FaultWindow]
    sent: dict[str, Sent]
    restarts: dict[str, int]

    def p99(self, window: FaultWindow) -> float | None:
        return window_p99(self.sent.values(), window.start, window.end)


# -- the run ---------------------------------------------------------------------


def chaos_env(prefix: str, cluster_url: str) -> dict[str, str]:
    """The children's settings: 8 partitions, the cluster, a prefix of the run's own."""
    return {
        "LANEWAY_KAFKA_PARTITIONS": str(PARTITIONS),
        "LANEWAY_REDIS_URL": cluster_url,
        "LANEWAY_REDIS_CLUSTER": "true",
        "LANEWAY_REDIS_KEY_PREFIX": prefix,
        "LANEWAY_APP_ID": prefix,
        "LANEWAY_ROUTING_EXPLORATION": "0",
    }


@dataclass(frozen=True, slots=True)
class Plan:
    """What a chaos run does: its faults in turn, the traffic, and how long
    each step may take."""

    faults: Sequence[str]
    rate: float
    """Requests per second, answered or not."""
    max_tokens: int
    before_s: float
    """Traffic before the first fault: the p99 the faults are judged against."""
    window_s: float
    """Each fault's window, from the fault on (longer when the part takes
    longer to come back)."""
    stop_s: float
    """How long a worker stays stopped (past its session timeout)."""
    restart_timeout_s: float
    drain_timeout_s: float


def run_chaos(
    settings: Settings,
    plan: Plan,
    *,
    log_path: Path | None,
    lanes: tuple[Lane, ...] = LANES,
    env: dict[str, str] | None = None,
    start_timeout_s: float = 600.0,
) -> Chaos:
    """Start the cluster and the stack, run the traffic and the faults,
    stop everything; what was measured. ``lanes``: a worker per entry;
    ``env``: more settings of the children (over ``chaos_env``)."""
    from streams.devstack.cluster import EmbeddedCluster
    from streams.devstack.supervisor import Stack

    prefix = f"chaos-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    with EmbeddedCluster() as cluster:
        env = {**chaos_env(prefix, cluster.url), **(env or {})}
        own = settings.model_copy(
            update={
                "kafka": settings.kafka.model_copy(update={"partitions": PARTITIONS}),
                "redis": settings.redis.model_copy(
                    update={"url": cluster.url, "cluster": True, "key_prefix": prefix}
                ),
                "app_id": prefix,
            }
        )
        stack = Stack(
            own,
            use_external_redis=True,
            http_port_base=None,
            lanes=lanes,
            replicas=2,
            log_path=log_path,
            child_env=env,
        )
        stack.start(ready_timeout_s=start_timeout_s)
        try:
            with stack.supervising():
                return asyncio.run(_scenario(stack, cluster, plan))
        finally:
            for child in stack.children:  # a stopped worker could not hear SIGTERM
                if child.alive() and child.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGCONT)
            stack.stop()


async def _scenario(stack: Any, cluster: Any, plan: Plan) -> Chaos:
    settings = stack.settings
    client = CountingClient(settings.kafka, client_id=f"chaos-{uuid.uuid4().hex[:6]}")
    async with client:
        # One answer from the classifier and from each lane before the clock
        # starts (a first reply to a new topic waits on its metadata).
        await warm_up(client, timeout_s=plan.restart_timeout_s)
        traffic = Traffic(client, plan.rate, plan.max_tokens)
        sender = asyncio.create_task(traffic.run())
        windows: list[FaultWindow] = []
        try:
            await asyncio.sleep(plan.before_s)
            before = FaultWindow("before", 0.0, traffic.now(), 0.0)
            print(f"chaos: {len(traffic.sent)} requests sent before the first fault")
            for fault in plan.faults:
                window = await _inflict(fault, stack, cluster, traffic, plan)
                windows.append(window)
                print(
                    f"chaos: {fault} back after {window.back_after_s:.1f} s; "
                    f"{len(traffic.sent)} requests sent so far"
                )
        finally:
            traffic.stop()
            await sender
        lost = await traffic.drain(plan.drain_timeout_s)
        # A redelivered batch's second reply may come after the first: a
        # moment for late copies before the client stops reading.
        await asyncio.sleep(LATE_COPIES_S)
    replies = client.replies
    counted = tally(traffic.sent, replies, windows, also_known=_warm_ids(replies, traffic.sent))
    print(f"chaos: {lost} answers still missing after {plan.drain_timeout_s:.0f} s of draining")
    restarts = {c.name: c.restarts for c in stack.children if c.restarts}
    return Chaos(counted, before, windows, traffic.sent, restarts)


def _warm_ids(replies: Sequence[InferenceResult], sent: dict[str, Sent]) -> set[str]:
    return {r.id for r in replies if r.id.startswith("warm-") and r.id not in sent}


async def _inflict(
    fault: str,
    stack: Any,
    cluster: Any,
    traffic: Traffic,
    plan: Plan,
) -> FaultWindow:
    """Do ``fault``, wait until the part is back (bounded), and let the
    traffic run on to the end of the window."""
    start = traffic.now()
    if fault == "redis-primary":
        # The default tenant's bucket: every classifier round writes it.
        bucket = f"{stack.settings.redis.key_prefix}:ratelimit:-"
        dead = await asyncio.to_thread(cluster.kill_primary, bucket)
        await asyncio.to_thread(cluster.wait_failover, bucket, dead, plan.restart_timeout_s)
    elif fault == "worker-stop":
        child = stack.child(STOPPED_WORKER)
        os.kill(child.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(plan.stop_s)
        finally:
            os.kill(child.pid, signal.SIGCONT)
    else:
        child = stack.child(fault)
        restarts = child.restarts
        os.kill(child.pid, signal.SIGKILL)
        await asyncio.to_thread(stack.wait_restarted, child, restarts, plan.restart_timeout_s)
    back = traffic.now() - start
    await asyncio.sleep(max(0.0, plan.window_s - back))
    return FaultWindow(fault, start, traffic.now(), back)


def _figure_name(fault: str) -> str:
    return fault.replace("-", "_")


def report(chaos: Chaos) -> str:
    t = chaos.tally
    before_p99 = chaos.p99(chaos.before)
    lines = [
        f"sent {t.sent}, answered {t.answered}, lost {t.lost}; "
        f"errors {', '.join(f'{k} {v}' for k, v in sorted(t.errors.items())) or 'none'}",
        f"duplicates {t.duplicates} (of {t.duplicate_ids} ids; by window: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(t.duplicates_by_window.items())) or 'none'}); "
        f"unknown ids {t.unknown}, conflicting copies {t.conflicting}: "
        f"{'within' if t.within_contract else 'NOT within'} CONTRACT.md's delivery promise",
        f"{'window':16} {'s':>6} {'back s':>7} {'sent':>5} {'p99 ms':>9} {'x before':>9}"
        "  slowest (lane, kind)",
    ]
    for window in [chaos.before, *chaos.windows]:
        p99 = chaos.p99(window)
        count = sum(window.start <= s.sent_at < window.end for s in chaos.sent.values())
        ratio = p99 / before_p99 if p99 is not None and before_p99 else None
        slowest = max(
            (s for s in chaos.sent.values() if window.start <= s.sent_at < window.end),
            key=lambda s: s.latency_ms or 0.0,
            default=None,
        )
        lines.append(
            f"{window.name:16} {window.end - window.start:6.1f} "
            f"{window.back_after_s or 0:7.1f} {count:5d} "
            f"{p99 if p99 is not None else float('nan'):9.0f} "
            f"{ratio if ratio is not None else float('nan'):9.2f}"
            + (f"  {slowest.lane}, {slowest.kind}" if slowest is not None else "")
        )
    if chaos.restarts:
        lines.append(
            "restarts: " + ", ".join(f"{name} {n}" for name, n in sorted(chaos.restarts.items()))
        )
    return "\n".join(lines)


def bench_run(chaos: Chaos) -> BenchRun:
    t = chaos.tally
    figures = {
        "sent": Figure(t.sent, "requests", "requests sent"),
        "answered": Figure(t.answered, "requests", "requests with a terminal result"),
        "lost": Figure(t.lost, "requests", "requests never answered (must be 0)"),
        "errors": Figure(sum(t.errors.values()), "requests", "answered with an error"),
        "duplicates": Figure(t.duplicates, "replies", "replies beyond the first of an id"),
        "duplicate_ids": Figure(t.duplicate_ids, "requests", "ids answered more than once"),
        "unknown_replies": Figure(t.unknown, "replies", "replies to ids never sent"),
        "conflicting_ids": Figure(t.conflicting, "requests", "ids whose replies disagree"),
        "within_contract": Figure(int(t.within_contract), "bool", "CONTRACT.md delivery kept"),
        "p99_before_ms": Figure(chaos.p99(chaos.before), "ms", "p99 before the first fault"),
    }
    series = {}
    for window in chaos.windows:
        name = _figure_name(window.name)
        figures[f"p99_{name}_ms"] = Figure(chaos.p99(window), "ms", f"p99 during {window.name}")
        figures[f"back_{name}_s"] = Figure(
            window.back_after_s, "s", f"{window.name}: until the part was back"
        )
        points = sorted(
            (s.sent_at - window.start, s.latency_ms)
            for s in chaos.sent.values()
            if window.start <= s.sent_at < window.end and s.latency_ms is not None
        )
        series[f"latency_{name}"] = Series(
            "sent after the fault", "s", "latency", "ms", [(round(x, 3), y) for x, y in points]
        )
    code = 0 if t.within_contract else 1
    return BenchRun(code, figures, series)


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    faults = parse_faults(args.faults)
    if "worker-stop" in faults and args.stop_s <= SESSION_TIMEOUT_S:
        raise SystemExit(
            f"--stop-s {args.stop_s} must be past the workers' {SESSION_TIMEOUT_S:.0f} s "
            "session timeout"
        )
    plan = Plan(
        faults,
        rate=args.rate,
        max_tokens=args.max_tokens,
        before_s=args.before_s,
        window_s=args.window_s,
        stop_s=args.stop_s,
        restart_timeout_s=args.restart_timeout_s,
        drain_timeout_s=args.drain_timeout_s,
    )
    chaos = run_chaos(settings, plan, log_path=args.log_file)
    print(
        f"\nlaneway bench chaos: {args.rate:g} req/s (4 rule, 3 cache, 3 model of every 10), "
        f"max_tokens {args.max_tokens}; 2 classifiers, 2 routers, 2 batch trackers, "
        f"2 workers per lane, {PARTITIONS} partitions, a Valkey Cluster of 3 primaries "
        f"and 3 replicas; faults: {', '.join(faults)}"
    )
    print(report(chaos))
    return bench_run(chaos)
