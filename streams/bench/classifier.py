"""``laneway bench classifier``: how many requests a second one classifier
process answers by itself, measured black box through Kafka.

The bench starts an embedded Tansu broker and Valkey (or uses the broker of
``--bootstrap`` and the Redis of ``LANEWAY_REDIS_URL``), creates the topics
under a prefix of its own, and starts one classifier process on them: no
lane workers, no router. It stores a few answers in the response cache, then
runs three phases on the same process, one after another:

- ``rules``: greetings and the like that a rule answers;
- ``exact``: questions whose answer is in the cache under their exact key;
- ``semantic``: paraphrases of cached questions, answered from the semantic
  cache (every request is embedded).

Each phase produces ``n`` requests at once with a plain aiokafka producer at
its default settings and reads the replies with a plain consumer; its rate is
``n`` over the time from the first send to the last reply. Tenants' rate
limits are set high enough not to refuse anything (the scripts still run).

``--lag`` also starts a router (the quality loop) and a batch tracker on the
same topics, beside the classifier on the same machine, and after each phase
waits until their consumer groups have caught up (``streams.bench.lag``):
each one's pace is the time from the first send until it had no lag, over
the classifier's own time for the phase (1.0: it kept up; the target is at
most 1.2). ``--batch-share`` gives that share of the requests a
``batch_id``, so the tracker records their results as well.

``python -m streams.bench.classifier --baseline DIR`` first measures a
classifier started from another checkout (``DIR``, e.g. a ``git worktree``
of an older commit) on the same broker and Redis, so the two are compared in
one run on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult
from schemas.settings import Settings
from streams.bench.lag import Follower, caught_up, followers, pace
from streams.bench.results import BenchRun, Figure
from streams.cache.response import ResponseCache
from streams.classify.stages import LOOP_STAGES
from streams.devstack.embedded import EmbeddedBroker, EmbeddedRedis, free_port
from streams.devstack.supervisor import is_ready
from streams.kafka.topics import create_topics, wait_for_broker

__all__ = [
    "HELP",
    "BenchProcess",
    "Classifier",
    "Counted",
    "PhaseRow",
    "add_arguments",
    "counted",
    "format_rows",
    "format_stages",
    "lag_figures",
    "main",
    "measure",
    "phase_requests",
    "run",
    "stage_figures",
]

HELP = "one classifier process alone: rule, exact-cache and semantic answers per second"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--requests", type=int, default=5000, help="requests per phase")
    _add_lag_arguments(parser)


def _add_lag_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lag",
        action="store_true",
        help="also run a router and a batch tracker beside the classifier and report how "
        "long each takes to catch up, as a multiple of the classifier's time",
    )
    parser.add_argument(
        "--batch-share",
        type=_share,
        default=0.0,
        help="share of the requests (0..1) that carry a batch_id, for the tracker to record",
    )


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError(f"a share is between 0 and 1, not {share}")
    return share


RULE_PROMPTS = ["Hello!", "thanks", "ping", "help"]
EXACT_PROMPTS = [
    "What is the capital of France?",
    "Name a colour.",
    "What colour is the sky?",
    "Name a fruit.",
]
# (stored question, paraphrase asked): all-MiniLM-L6-v2 cosine above the 0.93 threshold.
SEMANTIC_PAIRS = [
    ("How do I reset my password?", "how can I reset my password"),
    ("Name a large animal that lives in the sea.", "Name a big animal living in the sea."),
]
PHASES = ("rules", "exact", "semantic")
_UNLIMITED = json.dumps({"rps": 1_000_000, "burst": 1_000_000})


@dataclass(frozen=True, slots=True)
class PhaseRow:
    label: str
    phase: str
    sent: int
    answered: int
    expected: int
    """Answers of the kind the phase is about (rules, exact or semantic hits)."""
    seconds: float
    cpu_s: float | None = None
    """CPU time the classifier process used in the phase (Linux only)."""
    batches: float | None = None
    """Batches the classifier took in the phase (from its /metrics)."""
    taken: float | None = None
    """Request records in those batches (from its /metrics)."""
    stages: Mapping[str, float] | None = None
    """Seconds the classifier's request loop spent per stage in the phase
    (``streams.classify.stages``; ``None`` for a classifier without them)."""
    router_behind_s: float | None = None
    """From the last reply until the router's group had no lag (``--lag``)."""
    tracker_behind_s: float | None = None
    """From the last reply until the batch tracker's group had no lag (``--lag``)."""

    @property
    def router_pace(self) -> float | None:
        return pace(self.seconds, self.router_behind_s)

    @property
    def tracker_pace(self) -> float | None:
        return pace(self.seconds, self.tracker_behind_s)

    @property
    def rps(self) -> float:
        return self.answered / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_batch(self) -> float | None:
        """Records per batch the classifier took in the phase.

        Under a burst of ``n`` every batch but the first few is full
        (``LANEWAY_CLASSIFIER_BATCH_MAX``), so this stays near that cap
        whatever the phase: ``n`` over ``ceil(n / cap)`` batches."""
        if not self.batches or self.taken is None:
            return None
        return self.taken / self.batches

    def stage_us(self) -> dict[str, float] | None:
        """Wall microseconds per answered request of each stage of the
        request loop, and ``left``: the rest of the phase's time per request
        (the consumer's fetch, the event loop between batches, the first
        request's way in and the last reply's way out)."""
        if self.stages is None or not self.answered:
            return None
        out = {stage: self.stages.get(stage, 0.0) / self.answered * 1e6 for stage in LOOP_STAGES}
        out["left"] = self.seconds / self.answered * 1e6 - sum(out.values())
        if "deliver" in self.stages:
            out["deliver"] = self.stages["deliver"] / self.answered * 1e6
        return out

    @property
    def cpu_us(self) -> float | None:
        """Classifier CPU per answered request, microseconds."""
        if self.cpu_s is None or not self.answered:
            return None
        return self.cpu_s / self.answered * 1e6


def phase_requests(phase: str, n: int, tag: str, batch_share: float = 0.0) -> list[dict[str, Any]]:
    """``n`` request bodies of one phase, ids unique to ``tag``; evenly
    spread, ``batch_share`` of them carry the batch id ``<tag>-batch``."""
    if phase == "rules":
        prompts = RULE_PROMPTS
    elif phase == "exact":
        prompts = EXACT_PROMPTS
    else:
        prompts = [asked for _, asked in SEMANTIC_PAIRS]
    bodies: list[dict[str, Any]] = [
        {"id": f"{tag}-{phase}-{i}", "prompt": prompts[i % len(prompts)], "max_tokens": 16}
        for i in range(n)
    ]
    for i, body in enumerate(bodies):
        if int((i + 1) * batch_share) > int(i * batch_share):
            body["batch_id"] = f"{tag}-batch"
    return bodies


def expected_kind(phase: str, result: InferenceResult) -> bool:
    model = result.model or ""
    if phase == "rules":
        return result.path == AnswerPath.RULES
    return model.startswith(f"cache:{phase}:")


def format_rows(rows: Sequence[PhaseRow]) -> str:
    head = (
        f"{'classifier':12} {'phase':9} {'sent':>6} {'answered':>8} {'as meant':>8} "
        f"{'req/s':>9} {'cpu us/req':>10} {'batch':>6} {'router x':>8} {'tracker x':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        cpu = f"{r.cpu_us:10.0f}" if r.cpu_us is not None else f"{'-':>10}"
        batch = f"{r.mean_batch:6.1f}" if r.mean_batch is not None else f"{'-':>6}"
        router = f"{r.router_pace:8.2f}" if r.router_pace is not None else f"{'-':>8}"
        tracker = f"{r.tracker_pace:9.2f}" if r.tracker_pace is not None else f"{'-':>9}"
        lines.append(
            f"{r.label:12} {r.phase:9} {r.sent:6d} {r.answered:8d} {r.expected:8d} "
            f"{r.rps:9.1f} {cpu} {batch} {router} {tracker}"
        )
    return "\n".join(lines)


_BREAKDOWN = (*LOOP_STAGES, "left")


def format_stages(rows: Sequence[PhaseRow]) -> str:
    """Where each phase's time went, per answered request: each stage of
    the classifier's request loop in microseconds and as a share of the
    phase's time per request (rows of a classifier without the stage
    counters are left out; empty when none has them)."""
    measured = [(r, us) for r in rows if (us := r.stage_us()) is not None]
    if not measured:
        return ""
    head = f"{'classifier':12} {'phase':9} {'us/req':>7} " + " ".join(
        f"{stage:>13}" for stage in _BREAKDOWN
    )
    head += f" {'deliver':>8}"
    lines = [head, "-" * len(head)]
    for r, us in measured:
        wall = r.seconds / r.answered * 1e6
        cells = " ".join(f"{us[stage]:7.1f} {us[stage] / wall:5.0%}" for stage in _BREAKDOWN)
        deliver = f"{us['deliver']:8.1f}" if "deliver" in us else f"{'-':>8}"
        lines.append(f"{r.label:12} {r.phase:9} {wall:7.1f} {cells} {deliver}")
    return "\n".join(lines)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux), else
    ``None`` (also for no process)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Counted:
    """What the classifier's /metrics counted so far."""

    batches: float | None = None
    """Batches taken (``laneway_classifier_batch_size_count``)."""
    taken: float | None = None
    """Records in them (``laneway_classifier_batch_size_sum``)."""
    stages: Mapping[str, float] | None = None
    """Seconds per stage (``laneway_classifier_stage_seconds_total``)."""

    def since(self, before: Counted) -> Counted:
        """What was counted after ``before``."""

        def less(now: float | None, then: float | None) -> float | None:
            return now - then if now is not None and then is not None else None

        stages = None
        if self.stages is not None and before.stages is not None:
            stages = {k: v - before.stages.get(k, 0.0) for k, v in self.stages.items()}
        return Counted(less(self.batches, before.batches), less(self.taken, before.taken), stages)


def counted(port: int) -> Counted:
    """The classifier's batch and stage counters from its /metrics (each
    ``None`` when it does not export them, e.g. an older baseline)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return Counted()
    batches = taken = None
    stages: dict[str, float] | None = None
    for family in text_string_to_metric_families(text):
        if family.name == "laneway_classifier_batch_size":
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    batches = sample.value
                elif sample.name.endswith("_sum"):
                    taken = sample.value
        elif family.name == "laneway_classifier_stage_seconds":
            stages = stages if stages is not None else {}
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    stages[sample.labels["stage"]] = sample.value
    return Counted(batches, taken, stages)


class BenchProcess:
    """One laneway process (``laneway <command>``) on topics and Redis keys
    of its own."""

    def __init__(
        self,
        settings: Settings,
        label: str,
        source: Path | None,
        tag: str | None = None,
        command: Sequence[str] = ("classifier",),
    ) -> None:
        """``tag``: topic prefix, Redis prefix and app id (consumer group); one
        of its own unless given (replicas of one process, and the processes
        of one stack, share it)."""
        self.command = tuple(command)
        self.name = " ".join(self.command)
        self.label = label
        self.source = source
        self.tag = tag or f"bench-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        kafka = settings.kafka.model_copy(update={"topic_prefix": self.tag})
        redis = settings.redis.model_copy(update={"key_prefix": self.tag})
        self.settings = settings.model_copy(
            update={"kafka": kafka, "redis": redis, "app_id": self.tag}
        )
        self.proc: subprocess.Popen[bytes] | None = None
        log_name = f"{self.tag}-{label}-{'-'.join(self.command)}.log"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / log_name

    def start(self, timeout_s: float = 180.0) -> None:
        env = {
            **os.environ,
            "LANEWAY_KAFKA_BOOTSTRAP": self.settings.kafka.bootstrap,
            "LANEWAY_KAFKA_TOPIC_PREFIX": self.tag,
            "LANEWAY_REDIS_URL": self.settings.redis.url,
            "LANEWAY_REDIS_KEY_PREFIX": self.tag,
            "LANEWAY_APP_ID": self.tag,
            "LANEWAY_HTTP_PORT": str(self.port),
            "LANEWAY_RATELIMIT_DEFAULT": _UNLIMITED,
            "LANEWAY_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
        cwd = None
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
            cwd = str(self.source)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streams.cli.main", *self.command],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        give_up = time.monotonic() + timeout_s
        while not is_ready(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > give_up:
                raise TimeoutError(f"{self.name} not ready after {timeout_s}s: {self.tail()}")
            time.sleep(0.2)

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Classifier(BenchProcess):
    """One classifier process on topics and Redis keys of its own."""

    def __init__(
        self, settings: Settings, label: str, source: Path | None, tag: str | None = None
    ) -> None:
        super().__init__(settings, label, source, tag)


async def _behind(follower: Follower, before: float, n: int, finished: float) -> float | None:
    """Seconds from ``finished`` until ``follower`` caught up with the ``n``
    requests of the phase; ``None`` when it did not within the timeout."""
    caught = await caught_up(follower, before + follower.per_request * n)
    return caught - finished if caught is not None else None


async def _seed_cache(settings: Settings) -> None:
    """Answers a model gave earlier, stored as a worker stores them (no vector:
    the classifier embeds them when it syncs its index)."""
    redis = settings.redis.client()
    try:
        cache = ResponseCache(
            redis, settings.cache, key_prefix=settings.redis.key_prefix, embedder=None
        )
        stored = [*EXACT_PROMPTS, *(original for original, _ in SEMANTIC_PAIRS)]
        for i, prompt in enumerate(stored):
            request = InferenceRequest(id=f"seed-{i}", prompt=prompt, max_tokens=16)
            result = InferenceResult(
                id=request.id,
                status="ok",
                output=f"answer {i}",
                path=AnswerPath.LIGHT,
                model="seed",
            )
            if not await cache.store(request, result):
                raise RuntimeError(f"could not seed the cache with {prompt!r}")
    finally:
        await redis.aclose()


class Replies:
    """A plain consumer on the replies topic, from its end."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.replies_topic
        self.consumer = AIOKafkaConsumer(
            enable_auto_commit=False, **settings.kafka.client_options()
        )
        self.seen: dict[str, tuple[float, InferenceResult]] = {}

    async def start(self) -> None:
        await self.consumer.start()
        partitions = None
        for _ in range(100):
            partitions = self.consumer.partitions_for_topic(self.topic)
            if partitions:
                break
            await self.consumer._client.force_metadata_update()
            await asyncio.sleep(0.1)
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions or ())]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)

    async def wait_for(self, ids: set[str], idle_timeout_s: float = 60.0) -> None:
        """Read until every id in ``ids`` was answered, or nothing came for a while."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not ids <= self.seen.keys() and loop.time() - last < idle_timeout_s:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=5000)
            now = time.perf_counter()
            for records in batch.values():
                for record in records:
                    result = InferenceResult.model_validate_json(record.value)
                    self.seen.setdefault(result.id, (now, result))
                    last = loop.time()

    async def stop(self) -> None:
        await self.consumer.stop()


async def _phase(
    classifier: Classifier,
    producer: AIOKafkaProducer,
    replies: Replies,
    phase: str,
    n: int,
    watched: Sequence[Follower] = (),
    batch_share: float = 0.0,
) -> PhaseRow:
    bodies = phase_requests(phase, n, f"{classifier.tag}-{uuid.uuid4().hex[:4]}", batch_share)
    # A follower without its counter (from a checkout older than it) is not measured.
    done_before = [(f, f.done()) for f in watched]
    topic = classifier.settings.topic("requests")
    ids = {body["id"] for body in bodies}
    pid = classifier.proc.pid if classifier.proc is not None else None
    cpu_before = cpu_seconds(pid)
    counted_before = counted(classifier.port)
    started = time.perf_counter()
    futures = [
        await producer.send(topic, json.dumps(body).encode(), key=body["id"].encode())
        for body in bodies
    ]
    await asyncio.gather(*futures)
    await replies.wait_for(ids)
    cpu_after = cpu_seconds(pid)
    in_phase = counted(classifier.port).since(counted_before)
    answered = [replies.seen[i] for i in ids if i in replies.seen]
    finished = max((at for at, _ in answered), default=started)
    behind: dict[str, float | None] = {}
    for follower, before in done_before:
        if before is not None:
            behind[follower.name] = await _behind(follower, before, n, finished)
    meant = sum(expected_kind(phase, result) for _, result in answered)
    cpu = cpu_after - cpu_before if cpu_after is not None and cpu_before is not None else None
    return PhaseRow(
        classifier.label,
        phase,
        n,
        len(answered),
        meant,
        finished - started,
        cpu,
        in_phase.batches,
        in_phase.taken,
        in_phase.stages,
        behind.get("router"),
        behind.get("tracker"),
    )


async def _measure(
    classifier: Classifier,
    n: int,
    watched: Sequence[Follower] = (),
    batch_share: float = 0.0,
) -> list[PhaseRow]:
    settings = classifier.settings
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap)
    replies = Replies(settings)
    await producer.start()
    await replies.start()
    try:
        # Warm up until every phase's kind is answered as meant: the index has
        # synced the seeded entries and every topic's metadata is known.
        give_up = time.monotonic() + 120
        while True:
            rows = [await _phase(classifier, producer, replies, p, 4) for p in PHASES]
            if all(r.expected == r.sent for r in rows) or time.monotonic() > give_up:
                break
            await asyncio.sleep(0.5)
        return [
            await _phase(classifier, producer, replies, p, n, watched, batch_share) for p in PHASES
        ]
    finally:
        await replies.stop()
        await producer.stop()


@contextlib.contextmanager
def _services(settings: Settings, external_broker: bool) -> Iterator[Settings]:
    broker = None if external_broker else EmbeddedBroker()
    redis = None if "url" in settings.redis.model_fields_set else EmbeddedRedis()
    try:
        if broker is not None:
            broker.start()
            kafka = settings.kafka.model_copy(update={"bootstrap": broker.bootstrap})
            settings = settings.model_copy(update={"kafka": kafka})
        if redis is not None:
            redis.start()
            settings = settings.model_copy(
                update={"redis": settings.redis.model_copy(update={"url": redis.url})}
            )
        yield settings
    finally:
        if broker is not None:
            broker.stop()
        if redis is not None:
            with contextlib.suppress(Exception):
                redis.stop()


def _run_one(
    settings: Settings,
    label: str,
    source: Path | None,
    n: int,
    with_lag: bool = False,
    batch_share: float = 0.0,
) -> list[PhaseRow]:
    classifier = Classifier(settings, label, source)
    beside = (
        [
            BenchProcess(settings, label, source, classifier.tag, command)
            for command in (("router",), ("batch", "tracker"))
        ]
        if with_lag
        else []
    )

    async def prepare() -> None:
        await wait_for_broker(classifier.settings)
        await create_topics(classifier.settings)
        await _seed_cache(classifier.settings)

    asyncio.run(prepare())
    started: list[BenchProcess] = []
    try:
        for process in (classifier, *beside):
            started.append(process)
            process.start()
        watched = followers(beside[0].port, beside[1].port) if beside else []
        return asyncio.run(_measure(classifier, n, watched, batch_share))
    finally:
        for process in started:
            process.stop()


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    """``laneway bench classifier``: this checkout's classifier alone."""
    return measure(settings, args)


def measure(
    settings: Settings,
    args: argparse.Namespace,
    *,
    baseline: Path | None = None,
    baseline_n: int | None = None,
) -> BenchRun:
    """Measure, print the table; 1 when a request went unanswered."""
    n = args.requests
    with_lag = bool(getattr(args, "lag", False))
    share = float(getattr(args, "batch_share", 0.0))
    external = bool(getattr(args, "bootstrap", None))
    rows: list[PhaseRow] = []
    with _services(settings, external) as running:
        if baseline is not None:
            rows += _run_one(running, "baseline", baseline, baseline_n or n, with_lag, share)
        rows += _run_one(running, "this", None, n, with_lag, share)
    beside = ", a router and a batch tracker beside it" if with_lag else ""
    print(f"\nlaneway bench classifier: one classifier process{beside}, {n} requests per phase")
    if with_lag:
        print(
            "router x / tracker x: time until it had done every record of the phase (its "
            "group's lag at zero), from the first request, over the classifier's time "
            f"({share:.0%} of requests batched)"
        )
    print(format_rows(rows))
    stages = format_stages(rows)
    if stages:
        print(
            "\nthe classifier's time per request, by stage of its request loop (us, share of "
            "the phase's time per request); left: the consumer and the event loop between "
            "batches; deliver: each batch's delivery (send, acks, sessions), in the background "
            "while the next batch is looked up\n"
        )
        print(stages)
    if baseline is not None:
        for phase in PHASES:
            before = next(r for r in rows if r.label == "baseline" and r.phase == phase)
            after = next(r for r in rows if r.label == "this" and r.phase == phase)
            ratio = after.rps / before.rps if before.rps else float("inf")
            print(f"{phase:9} {before.rps:9.1f} -> {after.rps:9.1f} req/s ({ratio:.1f}x)")
    figures = {
        f"{r.phase}_rps": Figure(r.rps, "req/s", f"{r.phase} answers per second, one classifier")
        for r in rows
        if r.label == "this"
    }
    for r in rows:
        if r.label == "this" and r.cpu_us is not None:
            figures[f"{r.phase}_cpu_us"] = Figure(
                round(r.cpu_us), "us", f"{r.phase}: the classifier's CPU per request"
            )
    figures.update(stage_figures([r for r in rows if r.label == "this"]))
    if with_lag:
        figures.update(lag_figures([r for r in rows if r.label == "this"]))
    late = with_lag and any(
        r.router_pace is None or r.tracker_pace is None for r in rows if r.label == "this"
    )
    return BenchRun(1 if late or any(r.answered < r.sent for r in rows) else 0, figures)


def stage_figures(rows: Sequence[PhaseRow]) -> dict[str, Figure]:
    """Each phase's mean batch and time per request by stage, as result figures."""
    figures = {}
    for r in rows:
        if r.mean_batch is not None:
            figures[f"{r.phase}_batch"] = Figure(
                round(r.mean_batch, 1), "records", f"{r.phase}: records per batch taken"
            )
        for stage, us in (r.stage_us() or {}).items():
            figures[f"{r.phase}_{stage}_us"] = Figure(
                round(us, 1),
                "us",
                f"{r.phase}: wall time per request in the classifier's {stage} stage",
            )
    return figures


def lag_figures(rows: Sequence[PhaseRow]) -> dict[str, Figure]:
    """Each phase's router and tracker pace (``--lag``), as result figures."""
    figures = {}
    for r in rows:
        for name, value in (("router", r.router_pace), ("tracker", r.tracker_pace)):
            figures[f"{r.phase}_{name}_pace"] = Figure(
                value,
                "x",
                f"{r.phase}: time until the {name}'s group had no lag, over the "
                "classifier's time for the phase",
            )
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_classifier", description=__doc__)
    parser.add_argument("-n", "--requests", type=int, default=5000)
    parser.add_argument("--bootstrap", help="use this broker instead of an embedded one")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure first")
    parser.add_argument("--baseline-n", type=int, help="requests per phase for the baseline")
    _add_lag_arguments(parser)
    args = parser.parse_args(argv)
    settings = Settings()
    if args.bootstrap:
        kafka = settings.kafka.model_copy(update={"bootstrap": args.bootstrap})
        settings = settings.model_copy(update={"kafka": kafka})
    return measure(settings, args, baseline=args.baseline, baseline_n=args.baseline_n).exit_code


if __name__ == "__main__":
    sys.exit(main())
