"""The source article's diagnosis flow for a slow system (§4.1), as pure
functions of the readings (``streams.doctor.readings``):

1. **slower**: is every request type slow, or only some? Each lane, path,
   intent and prompt-length band, its recent median latency against its own
   baseline (the rest of the window).
2. **resources**: processes up and ready, their CPU and memory, the GPUs'
   utilisation and memory, free disk where the models live, live workers
   per lane.
3. **time**: where the time goes per lane and path: queue (produce to the worker
   taking it: the classifier, the broker, waiting for a batch), inference,
   and the rest (after inference until the result is produced).
4. **model**: version changes (roll-out state, the versions that answered,
   automatic rollbacks) and drift alarms in the window.

Each ``Finding`` is one line that says what is wrong and what to look at
next. Lines of ``level="info"`` describe; ``"warn"`` lines are what a check
found, and make ``laneway doctor`` exit 1.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from streams.doctor.readings import Readings, Sample

__all__ = [
    "STEPS",
    "Finding",
    "Report",
    "Thresholds",
    "band_of",
    "diagnose",
    "model_findings",
    "resource_findings",
    "slower_findings",
    "time_findings",
]

STEPS = ("slower", "resources", "time", "model")
"""The article's order."""

Step = Literal["slower", "resources", "time", "model"]

BANDS = ((64, "<64"), (256, "64-255"), (1024, "256-1023"))
"""Prompt-length bands in tokens; longer prompts are ``>=1024``."""

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Thresholds:
    slower_ratio: float = 1.5
    """A recent median this many times the baseline's is slower ..."""
    slower_min_ms: float = 100.0
    """... when it is also at least this many milliseconds more."""
    min_samples: int = 5
    """Fewer results than this, recent or baseline, are not judged."""
    cpu_busy_cores: float = 0.9
    """A process using this many cores: its event loop has no time to spare."""
    gpu_busy_pct: float = 90.0
    gpu_memory_share: float = 0.95
    """vLLM takes 0.8 of the GPU: a GPU fuller than this has lost its headroom."""
    disk_free_share: float = 0.10
    disk_free_bytes: int = 5 * GIB
    """Free disk below both the share and this is too little for a model."""


@dataclass(frozen=True, slots=True)
class Finding:
    step: Step
    subject: str
    """What the line is about: ``path heavy``, ``worker-bulk``, ``gpu 0``."""
    message: str
    next: str = ""
    """What to look at next."""
    level: Literal["warn", "info"] = "warn"

    def line(self) -> str:
        mark = "!!" if self.level == "warn" else "  "
        tail = f" -> {self.next}" if self.next else ""
        return f"{mark} {self.subject}: {self.message}{tail}"


@dataclass(slots=True)
class Report:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return any(f.level == "warn" for f in self.findings)

    def of(self, step: Step) -> list[Finding]:
        return [f for f in self.findings if f.step == step]


def band_of(tokens: int | None) -> str | None:
    if tokens is None:
        return None
    for bound, name in BANDS:
        if tokens < bound:
            return name
    return ">=1024"


def _ms(value: float) -> str:
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S")


def _split(readings: Readings) -> tuple[list[Sample], list[Sample]]:
    """``(baseline, recent)`` samples of the window."""
    since, cut = readings.window_since_ms, readings.recent_since_ms
    baseline = [s for s in readings.samples if since <= s.ts_ms < cut]
    recent = [s for s in readings.samples if s.ts_ms >= cut]
    return baseline, recent


_DIMENSIONS: tuple[tuple[str, Callable[[Sample], str | None], str], ...] = (
    ("lane", lambda s: s.lane, "step 3's split of this lane; its backlog and workers"),
    ("path", lambda s: s.path, "this path's backend: its breaker and latency in laneway top"),
    ("intent", lambda s: s.intent, "what these requests ask: longer answers, another path"),
    (
        "prompt band",
        lambda s: band_of(s.prompt_tokens),
        "long prompts: the prefill, the model's context, max_tokens",
    ),
)


def _groups(
    samples: Iterable[Sample], key: Callable[[Sample], str | None]
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        name = key(sample)
        if name is not None:
            out[name].append(sample.total_ms)
    return out


def slower_findings(readings: Readings, limits: Thresholds) -> list[Finding]:
    """Step 1: each lane, path, intent and prompt band whose recent median
    is ``slower_ratio`` times its baseline's and ``slower_min_ms`` more.
    When every lane is slower, one line says so: a shared cause (step 2)."""
    baseline, recent = _split(readings)
    found: list[Finding] = []
    if not recent:
        return [Finding("slower", "results", "none in the recent window", level="info")]
    if not baseline:
        return [
            Finding(
                "slower",
                "results",
                f"{len(recent)} recent, none before: no baseline to compare with yet",
                "run again later, or widen --window",
                level="info",
            )
        ]
    for dimension, key, look_at in _DIMENSIONS:
        before, now = _groups(baseline, key), _groups(recent, key)
        judged: list[str] = []
        slow: list[Finding] = []
        for name in sorted(now):
            enough = min(len(now[name]), len(before.get(name, ())))
            if enough < limits.min_samples:
                continue
            judged.append(name)
            was, is_ = statistics.median(before[name]), statistics.median(now[name])
            if is_ >= limits.slower_ratio * was and is_ - was >= limits.slower_min_ms:
                slow.append(
                    Finding(
                        "slower",
                        f"{dimension} {name}",
                        f"median {_ms(is_)} over {len(now[name])} recent results, "
                        f"{is_ / was:.1f}x its baseline {_ms(was)} ({len(before[name])} results)",
                        look_at,
                    )
                )
        if dimension == "lane" and len(judged) > 1 and len(slow) == len(judged):
            found.append(
                Finding(
                    "slower",
                    "every lane",
                    "all lanes are slower than their baselines: a shared cause",
                    "step 2: CPU, GPU and disk of the processes; the broker and Redis",
                )
            )
        found.extend(slow)
    return found


def resource_findings(readings: Readings, limits: Thresholds) -> list[Finding]:
    """Step 2: processes, GPUs, disk, live workers."""
    found: list[Finding] = []
    for proc in readings.processes:
        if not proc.answered:
            found.append(
                Finding(
                    "resources",
                    proc.name,
                    f"no answer on {proc.url}",
                    "is it running? its log; kubectl get pods / laneway up's console",
                )
            )
            continue
        if proc.ready is False:
            found.append(
                Finding(
                    "resources",
                    proc.name,
                    f"not ready: {proc.ready_detail or '/readyz failed'}",
                    "its log: a model that did not load, a broker it cannot reach",
                )
            )
        usage = []
        if proc.cpu_cores is not None:
            usage.append(f"CPU {proc.cpu_cores:.2f} cores")
        if proc.rss_bytes is not None:
            usage.append(f"RSS {proc.rss_bytes / 1024**2:.0f} MiB")
        busy = proc.cpu_cores is not None and proc.cpu_cores >= limits.cpu_busy_cores
        found.append(
            Finding(
                "resources",
                proc.name,
                ", ".join(usage) or "no process metrics",
                "more replicas, or fewer threads per model (LANEWAY_BACKEND_N_THREADS)"
                if busy
                else "",
                level="warn" if busy else "info",
            )
        )
    if readings.gpus is None:
        note = f" ({readings.gpu_note})" if readings.gpu_note else ""
        found.append(Finding("resources", "gpu", f"no GPU visible{note}: skipped", level="info"))
    for gpu in readings.gpus or ():
        full = gpu.memory_share >= limits.gpu_memory_share
        busy = gpu.utilization_pct >= limits.gpu_busy_pct
        nexts = []
        if busy:
            nexts.append("more GPU workers (KEDA scales on this), or smaller batches")
        if full:
            nexts.append(
                "memory past vLLM's share: another process on the GPU, or "
                "LANEWAY_BACKEND_VLLM_GPU_MEMORY_UTILIZATION above 0.8"
            )
        users = "".join(
            f"; pid {pid} {name} {used / GIB:.1f} GiB" for pid, name, used in gpu.processes
        )
        found.append(
            Finding(
                "resources",
                f"gpu {gpu.index}",
                f"{gpu.name}: {gpu.utilization_pct:.0f}% busy, memory "
                f"{gpu.memory_used_bytes / GIB:.1f} of {gpu.memory_total_bytes / GIB:.1f} GiB"
                f"{users}",
                "; ".join(nexts),
                level="warn" if busy or full else "info",
            )
        )
    for disk in readings.disks:
        low = disk.free_share < limits.disk_free_share and disk.free_bytes < limits.disk_free_bytes
        found.append(
            Finding(
                "resources",
                f"disk {disk.path}",
                f"{disk.free_bytes / GIB:.1f} GiB free of {disk.total_bytes / GIB:.1f} "
                f"({100 * disk.free_share:.0f}%, {disk.what})",
                "free space before the next model or version is written there" if low else "",
                level="warn" if low else "info",
            )
        )
    if readings.workers_by_lane is not None:
        baseline, recent = _split(readings)
        for lane in sorted({s.lane for s in baseline + recent if s.lane}):
            if readings.workers_by_lane.get(lane, 0) == 0:
                found.append(
                    Finding(
                        "resources",
                        f"lane {lane}",
                        "no live worker, though the lane served requests in the window",
                        "the lane's worker pods or processes: crashed, not started, not ready",
                    )
                )
    return found


_PARTS: tuple[tuple[str, Callable[[Sample], float], str], ...] = (
    (
        "queue",
        lambda s: s.queue_ms,
        "the lane's backlog and workers (laneway top), the classifier, the broker",
    ),
    (
        "inference",
        lambda s: s.inference_ms,
        "the model layer: its backend (step 2's CPU/GPU), step 4's version and inputs",
    ),
    (
        "produce",
        lambda s: s.other_ms,
        "after inference: the broker's produce latency, Redis (cache and session writes)",
    ),
)


def time_findings(readings: Readings, limits: Thresholds) -> list[Finding]:
    """Step 3: per lane and path, the median queue, inference and produce
    parts of the recent results, and the part that grew past its baseline
    (per path too: a lane's median hides one slow path among fast ones)."""
    baseline, recent = _split(readings)
    found: list[Finding] = []
    groups = sorted({(s.lane, s.path or "-") for s in recent if s.lane})
    for lane, path in groups:
        now = [s for s in recent if s.lane == lane and (s.path or "-") == path]
        before = [s for s in baseline if s.lane == lane and (s.path or "-") == path]
        subject = f"lane {lane}/{path}"
        parts = {name: statistics.median(pick(s) for s in now) for name, pick, _ in _PARTS}
        split = ", ".join(f"{name} {_ms(value)}" for name, value in parts.items())
        found.append(Finding("time", subject, f"{split} (median of {len(now)})", level="info"))
        if len(now) < limits.min_samples or len(before) < limits.min_samples:
            continue
        for name, pick, look_at in _PARTS:
            was = statistics.median(pick(s) for s in before)
            is_ = parts[name]
            if is_ - was >= limits.slower_min_ms and is_ >= limits.slower_ratio * max(was, 1.0):
                found.append(
                    Finding(
                        "time",
                        f"{subject} {name}",
                        f"{_ms(is_)}, was {_ms(was)}: the time went here",
                        look_at,
                    )
                )
    return found


def model_findings(readings: Readings, limits: Thresholds) -> list[Finding]:
    """Step 4: version changes and drift alarms in the window."""
    found: list[Finding] = []
    since = readings.window_since_ms
    for change in sorted(readings.changes, key=lambda c: c.at_ms):
        if change.at_ms < since:
            continue
        share = f" at {100 * change.share:.0f}%" if change.share is not None else ""
        why = f" ({change.reason})" if change.reason else ""
        found.append(
            Finding(
                "model",
                f"path {change.path}",
                f"version {change.version} set {change.state}{share} at "
                f"{_clock(change.at_ms)} by {change.by}{why}",
                "compare before and after: laneway models list; "
                f"laneway models rollback {change.path} if it is the cause",
            )
        )
    for event in readings.rollbacks:
        found.append(
            Finding(
                "model",
                f"path {event.path}",
                f"version {event.version} rolled back at {_clock(event.at_ms)}"
                + (f": {event.reason}" if event.reason else ""),
                "the version's results in laneway models list; its model's log",
            )
        )
    baseline, recent = _split(readings)
    seen_before: dict[str, set[str]] = defaultdict(set)
    for sample in baseline:
        if sample.path and sample.version:
            seen_before[sample.path].add(sample.version)
    new: dict[tuple[str, str], int] = defaultdict(int)
    for sample in recent:
        if sample.path and sample.version and sample.path in seen_before:
            if sample.version not in seen_before[sample.path]:
                new[(sample.path, sample.version)] += 1
    for (path, version), count in sorted(new.items()):
        before = ", ".join(sorted(seen_before[path]))
        found.append(
            Finding(
                "model",
                f"path {path}",
                f"answered by version {version} ({count} recent results), by {before} before",
                "an unexpected version change: laneway models list, the registry file",
            )
        )
    alarms = sorted((a for a in readings.drift if a.ts_ms >= since), key=lambda a: a.ts_ms)
    if alarms:
        # The classifier repeats its alarm every interval while the drift
        # lasts: one line, with each feature's largest PSI.
        worst: dict[str, float] = {}
        for alarm in alarms:
            for name, psi in alarm.features.items():
                worst[name] = max(worst.get(name, 0.0), psi)
        features = ", ".join(f"{name} PSI {psi:.2f}" for name, psi in sorted(worst.items()))
        when = _clock(alarms[0].ts_ms)
        if len(alarms) > 1:
            when = f"{len(alarms)} alarms from {when} to {_clock(alarms[-1].ts_ms)}"
        found.append(
            Finding(
                "model",
                "inputs",
                f"drift ({when}): {features}",
                "what changed in the traffic (a client, a tenant, a release); "
                "the router's thresholds may no longer fit",
            )
        )
    live: dict[str, float] = {}
    for proc in readings.processes:
        for name, psi in proc.drift_psi.items():
            live[name] = max(live.get(name, 0.0), psi)
    drifted = {n: v for n, v in live.items() if v > readings.drift_threshold}
    if drifted and not any(a.ts_ms >= since for a in readings.drift):
        features = ", ".join(f"{n} PSI {v:.2f}" for n, v in sorted(drifted.items()))
        found.append(
            Finding(
                "model",
                "inputs",
                f"drifted now (laneway_drift_psi): {features}",
                "what changed in the traffic; the drift alarms on laneway.quality",
            )
        )
    return found


_CHECKS: Sequence[Callable[[Readings, Thresholds], list[Finding]]] = (
    slower_findings,
    resource_findings,
    time_findings,
    model_findings,
)


def diagnose(readings: Readings, limits: Thresholds | None = None) -> Report:
    """Every step's findings, in the article's order."""
    limits = limits or Thresholds()
    report = Report(notes=list(readings.notes))
    for check in _CHECKS:
        report.findings.extend(check(readings, limits))
    return report
