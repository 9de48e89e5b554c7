"""``laneway doctor``'s decisions, from readings built here: each step of the
article's flow names what it should, and nothing when nothing changed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from schemas.settings import BackendSettings, Settings
from streams.devstack.embedded import free_port
from streams.doctor.cli import (
    as_json,
    format_report,
    metrics_targets,
    parse_duration,
    parse_time,
    span,
)
from streams.doctor.diagnose import (
    Thresholds,
    band_of,
    diagnose,
    model_findings,
    resource_findings,
    slower_findings,
    time_findings,
)
from streams.doctor.gather import read_disks, read_gpus, read_processes
from streams.doctor.readings import (
    DiskReading,
    DriftAlarm,
    GpuReading,
    ProcessReading,
    Readings,
    Sample,
    VersionChange,
)
from streams.ops import OpsServer, ProcessState

NOW = 1_800_000_000_000
HOUR = 3_600_000
GIB = 1024**3


def sample(
    ago_ms: int,
    *,
    lane: str = "medium",
    path: str = "light",
    total: float = 200.0,
    queue: float = 20.0,
    version: str | None = "1",
    intent: str | None = None,
    tokens: int | None = 20,
) -> Sample:
    return Sample(
        ts_ms=NOW - ago_ms,
        lane=lane,
        path=path,
        total_ms=total,
        queue_ms=queue,
        inference_ms=total - queue - 5,
        version=version,
        intent=intent,
        prompt_tokens=tokens,
    )


def readings(samples: list[Sample], **extra: object) -> Readings:
    return Readings(now_ms=NOW, recent_ms=HOUR, window_ms=24 * HOUR, samples=samples, **extra)  # type: ignore[arg-type]


def steady(path: str = "light", n: int = 10, **kw: object) -> list[Sample]:
    """``n`` results an hour ago or more, and ``n`` recent, alike."""
    return [sample(2 * HOUR + i, path=path, **kw) for i in range(n)] + [  # type: ignore[arg-type]
        sample(HOUR // 2 + i, path=path, **kw)  # type: ignore[arg-type]
        for i in range(n)
    ]


def subjects(found: list) -> set[str]:  # type: ignore[type-arg]
    return {f.subject for f in found if f.level == "warn"}


def test_nothing_changed_nothing_found() -> None:
    report = diagnose(readings(steady("light") + steady("heavy", total=900.0)))
    assert not report.found, [f.line() for f in report.findings]


def test_one_slow_path_is_named_and_the_other_is_not() -> None:
    slow = [sample(HOUR // 3 + i, path="heavy", total=2500.0) for i in range(8)]
    base = steady("light") + [sample(3 * HOUR + i, path="heavy", total=600.0) for i in range(8)]
    found = slower_findings(readings(base + slow), Thresholds())
    assert "path heavy" in subjects(found)
    assert "path light" not in subjects(found)
    line = next(f for f in found if f.subject == "path heavy").line()
    assert "4.2x" in line and "->" in line


def test_a_slower_group_needs_enough_results_on_both_sides() -> None:
    few = [sample(HOUR // 3, path="heavy", total=5000.0)] + [
        sample(3 * HOUR + i, path="heavy") for i in range(8)
    ]
    assert "path heavy" not in subjects(slower_findings(readings(few), Thresholds()))


def test_a_small_absolute_change_is_not_slower() -> None:
    # 3x, but 40 ms more: below slower_min_ms.
    base = [sample(3 * HOUR + i, total=20.0, queue=1.0) for i in range(8)]
    now = [sample(HOUR // 3 + i, total=60.0, queue=1.0) for i in range(8)]
    assert not subjects(slower_findings(readings(base + now), Thresholds()))


def test_intents_and_prompt_bands_are_judged_too() -> None:
    base = [sample(3 * HOUR + i, intent="billing", tokens=600) for i in range(6)]
    now = [sample(HOUR // 3 + i, intent="billing", tokens=600, total=900.0) for i in range(6)]
    found = subjects(slower_findings(readings(base + now), Thresholds()))
    assert {"intent billing", "prompt band 256-1023"} <= found


def test_every_lane_slower_says_a_shared_cause() -> None:
    base, now = [], []
    for lane in ("realtime", "bulk"):
        base += [sample(3 * HOUR + i, lane=lane) for i in range(6)]
        now += [sample(HOUR // 3 + i, lane=lane, total=900.0) for i in range(6)]
    found = slower_findings(readings(base + now), Thresholds())
    assert "every lane" in subjects(found)


def test_without_a_baseline_it_says_so_and_finds_nothing() -> None:
    found = slower_findings(readings([sample(HOUR // 3)]), Thresholds())
    assert not subjects(found)
    assert "no baseline" in found[0].message


@pytest.mark.parametrize(
    ("tokens", "band"),
    [(None, None), (0, "<64"), (63, "<64"), (64, "64-255"), (1023, "256-1023"), (5000, ">=1024")],
)
def test_prompt_bands(tokens: int | None, band: str | None) -> None:
    assert band_of(tokens) == band


def test_the_part_that_grew_is_named_per_lane_and_path() -> None:
    base = [sample(3 * HOUR + i, total=300.0, queue=50.0) for i in range(6)]
    # The queue grew from 50 ms to 1.5 s; inference stayed.
    now = [sample(HOUR // 3 + i, total=1745.0, queue=1500.0) for i in range(6)]
    found = time_findings(readings(base + now), Thresholds())
    assert subjects(found) == {"lane medium/light queue"}
    split = next(f for f in found if f.subject == "lane medium/light")
    assert "queue 1.50 s" in split.message and "inference 240 ms" in split.message


def test_resources_name_a_silent_process_a_busy_one_and_a_full_gpu() -> None:
    processes = [
        ProcessReading("classifier", "http://x:9400/metrics", True, True, "", 0.2, 300e6),
        ProcessReading("worker-bulk", "http://x:9403/metrics", True, True, "", 0.97, 900e6),
        ProcessReading("router", "http://x:9404/metrics", False),
        ProcessReading("worker-medium", "http://x:9402/metrics", True, False, "model missing"),
    ]
    gpus = [
        GpuReading(0, "H100", 99.0, int(78 * GIB), int(80 * GIB), ((4242, "laneway", 64 * GIB),)),
        GpuReading(1, "H100", 20.0, int(40 * GIB), int(80 * GIB)),
    ]
    disks = [DiskReading("LANEWAY_BACKEND_MODEL_DIR", "/models", 1 * GIB, 100 * GIB)]
    found = resource_findings(
        readings([], processes=processes, gpus=gpus, disks=disks), Thresholds()
    )
    assert subjects(found) == {"worker-bulk", "router", "worker-medium", "gpu 0", "disk /models"}
    assert any("model missing" in f.message for f in found)
    first = next(f for f in found if f.subject == "gpu 0")
    assert "99% busy" in first.message and "pid 4242 laneway 64.0 GiB" in first.message
    assert "memory past vLLM's share" in first.next


def test_no_gpu_is_skipped_cleanly() -> None:
    found = resource_findings(readings([], gpu_note="NVML: driver not loaded"), Thresholds())
    assert not subjects(found)
    assert any("no GPU visible" in f.message and "driver" in f.message for f in found)


def test_a_lane_that_served_without_a_live_worker_now() -> None:
    rows = steady()
    found = resource_findings(readings(rows, workers_by_lane={"bulk": 1}), Thresholds())
    assert "lane medium" in subjects(found)


def test_version_changes_and_drift_in_the_window() -> None:
    base = [sample(3 * HOUR + i, path="heavy", version="v1") for i in range(6)]
    now = [sample(HOUR // 3 + i, path="heavy", version="v2") for i in range(6)]
    changes = [
        VersionChange("heavy", "v2", "active", NOW - HOUR // 2),
        VersionChange("heavy", "v0", "retired", NOW - 30 * 24 * HOUR),  # long before
    ]
    drift = [
        DriftAlarm(NOW - HOUR // 4, {"tokens": 1.7, "has_code": 0.4}),
        DriftAlarm(NOW - HOUR // 5, {"tokens": 1.2, "has_code": 0.9}),
    ]
    found = model_findings(readings(base + now, changes=changes, drift=drift), Thresholds())
    lines = [f.line() for f in found]
    assert sum("version v2 set active" in line for line in lines) == 1
    assert not any("v0" in line for line in lines)
    assert any("answered by version v2" in line and "by v1 before" in line for line in lines)
    drifts = [line for line in lines if "drift (2 alarms" in line]
    assert len(drifts) == 1  # one line, each feature's largest PSI
    assert "tokens PSI 1.70" in drifts[0] and "has_code PSI 0.90" in drifts[0]


def test_a_drift_gauge_above_the_threshold_without_an_alarm() -> None:
    proc = ProcessReading("classifier", "u", True, drift_psi={"tokens": 0.6, "lang": 0.01})
    found = model_findings(readings([], processes=[proc]), Thresholds())
    assert [f.subject for f in found] == ["inputs"]
    assert "tokens PSI 0.60" in found[0].message and "lang" not in found[0].message


def test_the_report_prints_the_steps_in_order_and_json_parses() -> None:
    taken = readings(steady(), notes=["topic laneway.quality not found"])
    report = diagnose(taken)
    text = format_report(report, taken)
    heads = [text.index(h) for h in ("1. what got", "2. resources", "3. where", "4. the model")]
    assert heads == sorted(heads)
    assert "note: topic laneway.quality not found" in text
    body = json.loads(as_json(report, taken))
    assert body["found"] is False and body["window"]["results"] == 20


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("1d", 86400)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1h", "0"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_times() -> None:
    assert parse_time("1800000000") == 1_800_000_000_000
    assert parse_time("2027-01-15T08:00:00Z") == parse_time("2027-01-15T08:00:00")
    assert parse_time("2027-01-15T09:00:00+01:00") == parse_time("2027-01-15T08:00:00Z")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time("yesterday")


def test_one_slow_path_is_not_hidden_in_its_lanes_median() -> None:
    fast = [sample(3 * HOUR + i, total=300.0) for i in range(6)]
    fast += [sample(HOUR // 3 + i, total=300.0) for i in range(6)]
    heavy = [sample(3 * HOUR + i, path="heavy", total=400.0) for i in range(6)]
    heavy += [sample(HOUR // 3 + i, path="heavy", total=2400.0) for i in range(6)]
    found = time_findings(readings(fast + heavy), Thresholds())
    assert subjects(found) == {"lane medium/heavy inference"}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(45, "45 s"), (720, "12 min"), (5400, "90 min"), (9000, "2.5 h"), (172_800, "2 d")],
)
def test_spans(seconds: float, text: str) -> None:
    assert span(seconds) == text


def test_metrics_targets_named_or_not() -> None:
    urls, names = metrics_targets(
        ["worker-gpu=http://gpu:9406/metrics", "http://10.0.0.7:9400/metrics"], 9400
    )
    assert urls == ["http://gpu:9406/metrics", "http://10.0.0.7:9400/metrics"]
    assert names == ["worker-gpu", "10.0.0.7:9400"]
    urls, names = metrics_targets(None, 9500)
    assert urls[0] == "http://127.0.0.1:9500/metrics" and names[0] == "classifier"


def test_gpus_are_read_or_skipped_cleanly() -> None:
    """NVML on this machine: a GPU's readings, or none and why (no driver,
    no library, no device), never an error."""
    gpus, why = read_gpus()
    if gpus is None:
        assert why
    else:
        assert all(0 <= g.utilization_pct <= 100 and g.memory_total_bytes > 0 for g in gpus)


def test_disks_where_the_models_live(tmp_path: Path) -> None:
    settings = Settings(
        backend=BackendSettings(model_dir=tmp_path / "not-yet", vllm_model_dir=tmp_path)
    )
    disks = read_disks(settings)
    assert [d.what for d in disks] == [
        "LANEWAY_BACKEND_MODEL_DIR",
        "LANEWAY_BACKEND_VLLM_MODEL_DIR",
    ]
    assert all(0 < d.free_bytes <= d.total_bytes for d in disks)


async def test_processes_are_read_from_their_endpoints() -> None:
    """A real ops server (what every laneway process serves), one that is not
    ready, and an address nobody answers on."""
    state = ProcessState()
    state.detail = "bulk worker not ready: heavy: model missing"
    server = OpsServer("127.0.0.1", 0, state).start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        silent = f"http://127.0.0.1:{free_port()}/metrics"
        live, dead = await read_processes([url, silent], ["worker-bulk"], interval_s=0.2)
    finally:
        server.close()
    assert live.name == "worker-bulk" and live.answered and live.ready is False
    assert "model missing" in live.ready_detail
    assert live.rss_bytes and live.rss_bytes > 0 and live.cpu_cores is not None
    assert not dead.answered and dead.name == silent.split("//")[1].split("/")[0]
