"""What ``laneway doctor`` reads from a running stack, as plain data: the
diagnosis (``streams.doctor.diagnose``) is a pure function of these, and the
gathering (``streams.doctor.gather``) fills them in."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "DiskReading",
    "DriftAlarm",
    "GpuReading",
    "ProcessReading",
    "Readings",
    "Sample",
    "VersionChange",
]


@dataclass(frozen=True, slots=True)
class Sample:
    """One terminal result of a model, cache or rule, from the results topic."""

    ts_ms: int
    lane: str | None
    path: str | None
    total_ms: float
    queue_ms: float
    inference_ms: float
    ok: bool = True
    version: str | None = None
    intent: str | None = None
    """From the rule book's intent classifier, where the request was read."""
    prompt_tokens: int | None = None
    """The backend's count, else an estimate from the request's text."""

    @property
    def other_ms(self) -> float:
        """The rest of the total: from the end of inference until the result
        was produced (encoding, cache and session writes, the produce)."""
        return max(0.0, self.total_ms - self.queue_ms - self.inference_ms)


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """One process's ``/metrics`` (and ``/readyz``), read twice ``interval_s`` apart."""

    name: str
    url: str
    answered: bool
    ready: bool | None = None
    """``None``: /readyz not asked or not answered."""
    ready_detail: str = ""
    cpu_cores: float | None = None
    """CPU seconds per second between the two reads (1.0 = one core busy)."""
    rss_bytes: float | None = None
    drift_psi: dict[str, float] = field(default_factory=dict)
    """``laneway_drift_psi`` per feature (the classifier's)."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    name: str
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    processes: tuple[tuple[int, str, int], ...] = ()
    """``(pid, name, GPU memory in bytes)`` of each compute process on it."""

    @property
    def memory_share(self) -> float:
        return self.memory_used_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0


@dataclass(frozen=True, slots=True)
class DiskReading:
    what: str
    """Which setting named the folder (``LANEWAY_BACKEND_MODEL_DIR``, ...)."""
    path: str
    free_bytes: int
    total_bytes: int

    @property
    def free_share(self) -> float:
        return self.free_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass(frozen=True, slots=True)
class VersionChange:
    """A version's roll-out state set at ``at_ms`` (``laneway models ...``, or
    the quality loop's automatic rollback)."""

    path: str
    version: str
    state: str
    at_ms: int
    by: str = "cli"
    share: float | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class DriftAlarm:
    """A ``kind="drift"`` quality event: PSI per drifted feature."""

    ts_ms: int
    features: dict[str, float]


@dataclass(slots=True)
class Readings:
    """Everything the checks look at, for one window ending at ``now_ms``."""

    now_ms: int
    recent_ms: int
    """The recent part of the window: ``[now - recent, now]``."""
    window_ms: int
    """The whole window; its part before the recent one is the baseline."""
    samples: list[Sample] = field(default_factory=list)
    processes: list[ProcessReading] = field(default_factory=list)
    gpus: list[GpuReading] | None = None
    """``None``: no GPU visible (no NVML, no driver, no device)."""
    gpu_note: str = ""
    disks: list[DiskReading] = field(default_factory=list)
    workers_by_lane: dict[str, int] | None = None
    """Live lane workers per lane from the worker board; ``None``: unreadable."""
    changes: list[VersionChange] = field(default_factory=list)
    rollbacks: list[VersionChange] = field(default_factory=list)
    """``kind="rollback"`` quality events in the window."""
    drift: list[DriftAlarm] = field(default_factory=list)
    drift_threshold: float = 0.2
    notes: list[str] = field(default_factory=list)
    """What could not be read (a topic, Redis): said, never guessed."""

    @property
    def recent_since_ms(self) -> int:
        return self.now_ms - self.recent_ms

    @property
    def window_since_ms(self) -> int:
        return self.now_ms - self.window_ms
