"""What ``laneway doctor`` reads from a running stack (the thin, I/O side;
``streams.doctor.diagnose`` decides):

- the window's ``<p>.results`` (timings per lane, path and version), joined
  with ``<p>.requests`` (intent, prompt length) and ``<p>.quality`` (drift
  alarms, automatic rollbacks), read by time as ``laneway distill export``
  reads them;
- every process's ``/metrics`` twice (CPU between the reads, RSS, the drift
  gauge) and ``/readyz``;
- the Redis boards ``laneway top`` reads (live workers) and the roll-out
  state (when each version's state was set);
- the GPUs through NVML (``nvidia-ml-py``), skipped where none is visible,
  and the free disk where the models live.

Whatever cannot be read is said in ``Readings.notes`` and left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from redis.exceptions import RedisError

from schemas.messages import InferenceRequest, InferenceResult, QualityEvent
from schemas.settings import Settings
from streams.distill.export import read_window
from streams.doctor.readings import (
    DiskReading,
    DriftAlarm,
    GpuReading,
    ProcessReading,
    Readings,
    Sample,
    VersionChange,
)
from streams.rollout.state import RolloutStore
from streams.routing.features import estimate_tokens
from streams.stores.workerboard import WorkerBoard

__all__ = ["UP_NAMES", "gather", "read_disks", "read_gpus", "read_processes", "read_topics"]

log = logging.getLogger(__name__)

UP_NAMES = (
    "classifier",
    "worker-realtime",
    "worker-medium",
    "worker-bulk",
    "router",
    "batch-tracker",
)
"""The processes ``laneway up`` serves on its ports 9400-9405, in order."""


def _process_values(text: str) -> dict[str, Any]:
    cpu = rss = None
    psi: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "process_cpu_seconds_total":
                cpu = sample.value
            elif sample.name == "process_resident_memory_bytes":
                rss = sample.value
            elif sample.name == "laneway_drift_psi" and "feature" in sample.labels:
                psi[sample.labels["feature"]] = sample.value
    return {"cpu": cpu, "rss": rss, "psi": psi}


async def read_processes(
    urls: Sequence[str], names: Sequence[str] | None = None, interval_s: float = 1.0
) -> list[ProcessReading]:
    """Each process's ``/metrics`` twice, ``interval_s`` apart, and its ``/readyz``."""

    async def get(client: httpx.AsyncClient, url: str) -> httpx.Response | None:
        try:
            return await client.get(url)
        except httpx.HTTPError:
            return None

    async with httpx.AsyncClient(timeout=2.0) as client:
        first = await asyncio.gather(*(get(client, url) for url in urls))
        started = time.monotonic()
        await asyncio.sleep(interval_s)
        second = await asyncio.gather(*(get(client, url) for url in urls))
        elapsed = time.monotonic() - started
        ready = await asyncio.gather(
            *(get(client, url.rsplit("/metrics", 1)[0] + "/readyz") for url in urls)
        )
    out = []
    for i, url in enumerate(urls):
        name = names[i] if names and i < len(names) else url.split("//")[-1].split("/")[0]
        one, two, readyz = first[i], second[i], ready[i]
        if one is None or two is None or one.status_code != 200 or two.status_code != 200:
            out.append(ProcessReading(name=name, url=url, answered=False))
            continue
        before, after = _process_values(one.text), _process_values(two.text)
        cpu = None
        if before["cpu"] is not None and after["cpu"] is not None and elapsed > 0:
            cpu = max(0.0, after["cpu"] - before["cpu"]) / elapsed
        out.append(
            ProcessReading(
                name=name,
                url=url,
                answered=True,
                ready=None if readyz is None else readyz.status_code == 200,
                ready_detail="" if readyz is None else readyz.text.strip(),
                cpu_cores=cpu,
                rss_bytes=after["rss"],
                drift_psi=after["psi"],
            )
        )
    return out


def read_gpus() -> tuple[list[GpuReading] | None, str]:
    """Every GPU NVML sees: ``(None, why)`` where there is none to see."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML: {exc}"
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(
                GpuReading(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    utilization_pct=float(rates.gpu),
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                    processes=_gpu_processes(pynvml, handle),
                )
            )
        return (found or None), "" if found else "NVML lists no device"
    except Exception as exc:
        return None, f"NVML: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _gpu_processes(pynvml: Any, handle: Any) -> tuple[tuple[int, str, int], ...]:
    """The compute processes on a GPU: pid, name (from /proc, where this
    process sees it: the same host or pod) and GPU memory."""
    try:
        running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # NVML_ERROR_NOT_SUPPORTED on some boards and drivers
        return ()
    out = []
    for proc in running:
        try:
            name = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        except OSError:
            name = "?"
        out.append((int(proc.pid), name, int(proc.usedGpuMemory or 0)))
    return tuple(out)


def read_disks(settings: Settings) -> list[DiskReading]:
    """Free disk of every folder a model is read from (the nearest existing
    folder above it, when it is not there yet)."""
    folders = [("LANEWAY_BACKEND_MODEL_DIR", settings.backend.model_dir)]
    if settings.backend.vllm_model_dir is not None:
        folders.append(("LANEWAY_BACKEND_VLLM_MODEL_DIR", settings.backend.vllm_model_dir))
    out = []
    for what, folder in folders:
        existing = Path(folder)
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        try:
            usage = shutil.disk_usage(existing)
        except OSError:
            continue
        out.append(DiskReading(what, str(folder), usage.free, usage.total))
    return out


class _Window:
    """The requests, results and quality events of one window."""

    def __init__(self, intent_of: Any) -> None:
        self.requests: dict[str, tuple[str | None, int]] = {}
        self.results: list[tuple[int, InferenceResult]] = []
        self.drift: list[DriftAlarm] = []
        self.rollbacks: list[VersionChange] = []
        self.unreadable = 0
        self._intent_of = intent_of

    def add_request(self, ts_ms: int, raw: bytes | None) -> None:
        try:
            request = InferenceRequest.model_validate_json(raw or b"")
        except ValidationError:
            self.unreadable += 1
            return
        text = request.user_text()
        self.requests[request.id] = (self._intent_of(text), estimate_tokens(text))

    def add_result(self, ts_ms: int, raw: bytes | None) -> None:
        try:
            self.results.append((ts_ms, InferenceResult.model_validate_json(raw or b"")))
        except ValidationError:
            self.unreadable += 1

    def add_quality(self, ts_ms: int, raw: bytes | None) -> None:
        try:
            event = QualityEvent.model_validate_json(raw or b"")
        except ValidationError:
            self.unreadable += 1
            return
        if event.kind == "drift" and event.drift:
            self.drift.append(DriftAlarm(event.ts_ms, dict(event.drift)))
        elif event.kind == "rollback" and event.path is not None:
            self.rollbacks.append(
                VersionChange(
                    path=str(event.path),
                    version=event.version or event.router_version or "?",
                    state="rolled back",
                    at_ms=event.ts_ms,
                    by="rollback",
                    reason=event.reason,
                )
            )

    def samples(self) -> list[Sample]:
        out = []
        for ts_ms, result in self.results:
            intent, estimated = self.requests.get(result.id, (None, None))
            tokens = result.usage.prompt_tokens or estimated
            out.append(
                Sample(
                    ts_ms=ts_ms,
                    lane=None if result.lane is None else str(result.lane),
                    path=None if result.path is None else str(result.path),
                    total_ms=result.timings.total_ms,
                    queue_ms=result.timings.queue_ms,
                    inference_ms=result.timings.inference_ms,
                    ok=result.status == "ok",
                    version=result.version,
                    intent=intent,
                    prompt_tokens=tokens or None,
                )
            )
        return out


async def read_topics(
    settings: Settings, since_ms: int, until_ms: int, intent_of: Any = lambda text: None
) -> tuple[_Window, list[str]]:
    """The window's requests, results and quality events."""
    window = _Window(intent_of)
    notes: list[str] = []
    consumer = AIOKafkaConsumer(
        enable_auto_commit=False,
        fetch_max_wait_ms=settings.kafka.fetch_max_wait_ms,
        **settings.kafka.client_options(),
    )
    await consumer.start()
    try:
        plan = (
            ("requests", window.add_request),
            ("results", window.add_result),
            ("quality", window.add_quality),
        )
        # Every topic's partitions now, before the first assign(): from then
        # on the client refreshes the metadata of its assigned topics only.
        await consumer.topics()
        partitions = {name: consumer.partitions_for_topic(settings.topic(name)) for name, _ in plan}
        for name, take in plan:
            topic = settings.topic(name)
            if not partitions[name]:
                notes.append(f"topic {topic} not found: its checks are skipped")
                continue
            tps = [TopicPartition(topic, p) for p in sorted(partitions[name] or ())]
            await read_window(consumer, tps, since_ms, until_ms, take)
    finally:
        await consumer.stop()
    if window.unreadable:
        notes.append(f"{window.unreadable} records could not be read and were skipped")
    return window, notes


async def _read_redis(settings: Settings, readings: Readings) -> None:
    redis = settings.redis.client()
    prefix = settings.redis.key_prefix
    try:
        board = WorkerBoard(redis, prefix, stale_s=3 * settings.worker_heartbeat_s)
        try:
            cards = await board.live()
        except (RedisError, OSError) as exc:
            readings.notes.append(f"the worker board could not be read: {exc}")
        else:
            if cards is None:
                readings.notes.append("the worker board could not be read")
            else:
                counts: dict[str, int] = {}
                for card in cards:
                    counts[str(card.lane)] = counts.get(str(card.lane), 0) + 1
                readings.workers_by_lane = counts
        try:
            overrides = await RolloutStore(redis, prefix).read()
        except (RedisError, OSError) as exc:
            overrides = None
            readings.notes.append(f"the roll-out state could not be read: {exc}")
        else:
            if overrides is None:
                readings.notes.append("the roll-out state could not be read")
        for (path, version), live in (overrides or {}).items():
            readings.changes.append(
                VersionChange(
                    path=str(path),
                    version=version,
                    state=str(live.state),
                    at_ms=live.at_ms,
                    by=live.by,
                    share=live.share,
                    reason=live.reason,
                )
            )
    finally:
        with contextlib.suppress(RedisError, OSError):
            await redis.aclose()


async def gather(
    settings: Settings,
    urls: Sequence[str],
    *,
    names: Sequence[str] | None = None,
    recent_s: float = 3600.0,
    window_s: float = 86_400.0,
    interval_s: float = 1.0,
    intents: bool = True,
    until_ms: int | None = None,
) -> Readings:
    """Every reading for the window ``[until - window_s, until]`` (``until``:
    now, unless given). Processes, GPUs and disk are read now whatever it is."""
    now_ms = int(time.time() * 1000) if until_ms is None else until_ms
    readings = Readings(
        now_ms=now_ms,
        recent_ms=int(recent_s * 1000),
        window_ms=int(window_s * 1000),
        drift_threshold=settings.drift.threshold,
    )
    intent_of: Any = lambda text: None  # noqa: E731
    if intents:
        from streams.rules.rulefile import RuleSource

        try:
            book = RuleSource.from_settings(settings.rules).book
            intent_of = lambda text: book.classify(text)[0]  # noqa: E731
        except Exception as exc:  # a rule file that does not load: no intents, said so
            readings.notes.append(f"the rule file could not be read, no intents: {exc}")
    try:
        window, notes = await read_topics(settings, readings.window_since_ms, now_ms + 1, intent_of)
    except Exception as exc:  # KafkaError, a broker that does not answer
        readings.notes.append(f"the topics could not be read: {exc}")
    else:
        readings.samples = window.samples()
        readings.drift = window.drift
        readings.rollbacks = window.rollbacks
        readings.notes.extend(notes)
    readings.processes = await read_processes(urls, names, interval_s)
    readings.gpus, readings.gpu_note = read_gpus()
    readings.disks = read_disks(settings)
    await _read_redis(settings, readings)
    return readings
