"""``laneway check`` with the real models: a missing model file fails the
check, naming the model; the shipped light model answers."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from schemas.messages import AnswerPath
from schemas.settings import BackendSettings, Settings
from workers.check import check_paths


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
