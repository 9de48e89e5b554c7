"""``laneway check`` with the real models: a missing model file fails the
check, naming the model; the shipped light model answers; ``--tune``
measures it and keeps the result for this CPU."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from schemas.messages import AnswerPath, Lane
from schemas.settings import BackendSettings, Settings, TuneSettings
from streams.routing.registry import builtin_registry
from workers.check import check_paths
from workers.tune import lane_tuning, load_kept


async def test_a_missing_model_file_fails_the_check_by_name(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.gguf"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli.main",
        "check",
        "--path",
        "heavy",
        env={**os.environ, "LANEWAY_BACKEND_HEAVY_MODEL": str(missing)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 1, text
    assert f"FAIL  heavy  llamacpp:{missing}" in text
    assert "does not exist" in text
    assert text.strip().splitlines()[-1] == (
        f"laneway check: 1 of 1 models failed: heavy=llamacpp:{missing}"
    )


async def test_the_light_model_answers_and_a_missing_one_does_not() -> None:
    settings = Settings(
        backend=BackendSettings(light_model="smollm2-135m", heavy_model="/nowhere/model.gguf")
    )
    light, heavy = await check_paths(settings, [AnswerPath.LIGHT, AnswerPath.HEAVY])
    assert light.ok and light.detail and light.model == "smollm2-135m", light
    assert (
        not heavy.ok
        and heavy.detail.startswith("INF-502: ")
        and "/nowhere/model.gguf" in heavy.detail
    )


async def test_check_tune_measures_the_light_model_and_keeps_it_for_this_cpu(
    tmp_path: Path,
) -> None:
    """A short real tuning of the wheel's SmolLM2 (batch sizes 1 and 2, a
    few tokens, half a second each) through ``laneway check --tune``: the
    kept file is found for this CPU, and a realtime worker starts with it."""
    tune_dir = tmp_path / "tune"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli.main",
        "check",
        "--tune",
        "--path",
        "light",
        env={
            **os.environ,
            "LANEWAY_BACKEND_LIGHT_MODEL": "smollm2-135m",
            "LANEWAY_TUNE_DIR": str(tune_dir),
            "LANEWAY_TUNE_BATCH_SIZES": "[1, 2]",
            "LANEWAY_TUNE_INFLIGHT": "[1]",
            "LANEWAY_TUNE_SECONDS_PER_CANDIDATE": "0.5",
            "LANEWAY_TUNE_MAX_TOKENS": "4",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "smollm2-135m: kept at" in text and "per lane: realtime" in text, text
    backend = BackendSettings(light_model="smollm2-135m")
    tuning, where = load_kept(tune_dir, "smollm2-135m", backend)
    assert tuning is not None, where
    assert [(r.batch_size, r.inflight) for r in tuning.rates] == [(1, 1), (2, 1)]
    assert all(r.completion_tokens > 0 and not r.errors for r in tuning.rates)
    settings = Settings(backend=backend, tune=TuneSettings(dir=tune_dir))
    started = await lane_tuning(settings, Lane.REALTIME, builtin_registry(backend))
    pick = tuning.pick(settings.realtime.tune_tolerance)
    assert started.settings.realtime.max_batch_size == pick.batch_size
    assert any("tuned on this CPU" in note for note in started.notes), started.notes


async def test_a_worker_tunes_at_start_when_asked_and_nothing_is_kept(tmp_path: Path) -> None:
    """``LANEWAY_TUNE_AT_START``: no kept tuning, so the realtime worker's
    model is measured (one tiny candidate) and kept before it starts."""
    backend = BackendSettings(light_model="smollm2-135m")
    tune = TuneSettings(
        dir=tmp_path,
        at_start=True,
        batch_sizes=(2,),
        inflight=(1,),
        seconds_per_candidate=0.2,
        max_tokens=4,
    )
    settings = Settings(backend=backend, tune=tune)
    started = await lane_tuning(settings, Lane.REALTIME, builtin_registry(backend))
    assert any("tuning it now" in note for note in started.notes), started.notes
    assert started.settings.realtime.max_batch_size == 2
    entry = started.registry.for_path(AnswerPath.LIGHT)
    assert entry is not None and entry.max_batch == 2
    tuning, where = load_kept(tmp_path, "smollm2-135m", backend)
    assert tuning is not None, where
