"""A third model is one registry entry, on the real stack.

The registry file names three model paths: ``light`` (SmolLM2-135M, simple
work), ``mid`` (SmolLM2-135M again, as a model up to moderate work, at a
middle cost) and ``heavy`` (Gemma-3-270M). No other setting names ``mid``:
the medium worker serves every registry path by default, announces ``mid``
on the worker board, and the classifier's router sends moderate work there.
One stack for the module with only the medium worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from schemas.messages import AnswerPath, Lane
from schemas.settings import Settings
from streams.client import LanewayClient

from .conftest import registry_stack

REGISTRY = """\
models:
  - {name: smollm2-135m, version: q4_1, backend: llamacpp, path: light,
     max_complexity: simple, cost_per_1k_tokens: 0.0002, expected_latency_ms: 800}
  - {name: smollm2-135m, version: as-mid, backend: llamacpp, path: mid,
     max_complexity: moderate, cost_per_1k_tokens: 0.0005, expected_latency_ms: 1200}
  - {name: gemma3-270m, version: q4_k_m, backend: llamacpp, path: heavy,
     cost_per_1k_tokens: 0.001, expected_latency_ms: 2000}
"""


@pytest.fixture(scope="module")
def third(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, dict[str, str]]]:
    """A medium-only stack on the three-path registry: its settings and the
    children's environment."""
    folder = tmp_path_factory.mktemp("third")
    yield from registry_stack(folder, "third", REGISTRY, {}, (Lane.MEDIUM,))


def models_list(env: dict[str, str]) -> list[dict[str, object]]:
    """``laneway models list --json`` as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", "models", "list", "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


async def test_moderate_work_goes_to_the_third_path_and_each_class_to_its_own(
    third: tuple[Settings, dict[str, str]],
) -> None:
    settings, env = third
    tag = uuid.uuid4().hex[:6]
    asks = {
        f"simple-{tag}": "What is the capital of France?",
        f"moderate-{tag}": "Explain why the sky is blue.",
        f"complex-{tag}": "Calculate the square root of 144.",
    }
    async with LanewayClient(settings.kafka, client_id=f"third-{tag}") as client:
        futures = [
            await client.submit({"id": rid, "prompt": prompt, "lane": "medium", "max_tokens": 4})
            for rid, prompt in asks.items()
        ]
        results = {r.id: r for r in await asyncio.wait_for(asyncio.gather(*futures), 300)}
    assert all(r.status == "ok" and r.output for r in results.values()), results
    paths = {rid.split("-")[0]: (r.path, r.model, r.version) for rid, r in results.items()}
    assert paths == {
        "simple": (AnswerPath.LIGHT, "llamacpp:smollm2-135m", "q4_1"),
        "moderate": (AnswerPath("mid"), "llamacpp:smollm2-135m", "as-mid"),
        "complex": (AnswerPath.HEAVY, "llamacpp:gemma3-270m", "q4_k_m"),
    }, results
    assert not any(r.degraded for r in results.values()), results

    # The operator sees the third path as the other two: on the worker board.
    (mid,) = [row for row in models_list(env) if row["path"] == "mid"]
    assert mid["version"] == "as-mid" and mid["state"] == "active" and mid["workers"], mid
