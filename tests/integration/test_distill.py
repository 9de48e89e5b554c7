"""The distillation loop on the real stack: traffic of mixed difficulty and
client feedback, then ``laneway distill export`` -> ``train`` -> ``report``
through the CLI, and the artifact loaded into the SmartRouter.

The feedback is the signal to learn: light answers to capital-city
questions are scored +1, light answers to "who discovered/invented ..."
questions -1. The feature rule calls both simple (short, no reasoning
words) and sends both light; only the prompts' embeddings tell them apart,
so a router that learned from the feedback sends a new "who discovered"
question heavy and a new capital question light."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path as FsPath

import numpy as np

from schemas.messages import InferenceRequest, InferenceResult, Lane, Path
from schemas.settings import Settings
from streams.cache.embedding import MiniLMEmbedder
from streams.classify.features import Complexity, complexity_of, extract_features
from streams.classify.registry import builtin_registry
from streams.classify.router import SmartRouter
from streams.client import LanewayClient
from streams.distill.rows import read_rows
from streams.tools.cli import main

GOOD = [f"What is the capital of {c}?" for c in ("France", "Italy", "Spain", "Japan", "Egypt")]
GOOD += [
    f"What is the capital city of {c}?" for c in ("Peru", "Kenya", "Greece", "Norway", "India")
]
BAD = [
    "Who discovered penicillin?",
    "Who invented the telephone?",
    "Who discovered gravity?",
    "Who invented the light bulb?",
    "Who discovered radioactivity?",
    "Who invented the printing press?",
    "Who discovered the electron?",
    "Who invented the steam engine?",
    "Who discovered insulin?",
    "Who invented the radio?",
]
HARD = [
    "Explain why the sky is blue.",
    "Compare cats and dogs as pets.",
    "Explain how a bicycle stays upright.",
    "Write a Python function that reverses a string.",
]
NO_CACHE = {"cache": "bypass,no-store"}  # read none, and leave none for later tests


async def ask_all(client: LanewayClient, asks: list[tuple[str, str]]) -> list[InferenceResult]:
    """Each ``(prompt, lane)`` with a few in flight (the realtime lane refuses
    new work past 16 waiting), answers of at most 4 tokens, cache bypassed.
    A request shed under load (``INF-429``, a busy shared machine) is asked
    again after its ``retry_after_ms``, under a new id, as a client would."""
    gate = asyncio.Semaphore(6)

    async def one(prompt: str, lane: str) -> InferenceResult:
        for _ in range(30):
            async with gate:
                result = await client.ask(
                    prompt,
                    lane=lane,
                    max_tokens=4,
                    metadata=NO_CACHE,
                    timeout_s=180,
                    id=f"distill-{uuid.uuid4().hex[:10]}",
                )
            if result.error is None or result.error.code != "INF-429":
                break
            await asyncio.sleep(min(5.0, (result.error.retry_after_ms or 1000) / 1000))
        return result

    return list(await asyncio.gather(*(one(p, lane) for p, lane in asks)))


async def test_export_train_report_and_the_router_learns(
    client: LanewayClient, settings: Settings, minilm: MiniLMEmbedder, tmp_path: FsPath
) -> None:
    since = time.time() - 1
    # Light answers (the realtime lane serves only light) for feedback; the
    # same questions of a few and the hard ones on bulk (heavy only), so
    # some prompts have both answers; hard ones on medium too.
    heavy = [(p, "bulk") for p in (GOOD[:3] + BAD[:3] + HARD[:2])]
    heavy += [(p, "medium") for p in HARD[2:]]
    light = [(p, "realtime") for p in GOOD + BAD]
    asks = heavy + light
    results = await ask_all(client, heavy) + await ask_all(client, light)
    assert all(r.status == "ok" for r in results), [r.error for r in results if r.error]
    for (prompt, lane), result in zip(asks, results, strict=True):
        if lane == "realtime":
            assert result.path is Path.LIGHT, result
            await client.feedback(result.id, 1.0 if prompt in GOOD else -1.0)
    until = time.time() + 1
    await asyncio.sleep(1.5)  # until is in the past: the window is closed

    rows_file, artifact, out = tmp_path / "rows.jsonl", tmp_path / "router.json", tmp_path / "rep"
    boot = ["--bootstrap", settings.kafka.bootstrap, "distill"]
    window = ["--since", str(int(since * 1000)), "--until", str(int(until * 1000))]
    ids = {r.id for r in results}
    # The feedback reaches the export through the quality loop, which may lag
    # on a busy machine: export again (the same window) until it has come in.
    for _ in range(15):
        command = [*boot, "export", *window, "-o", str(rows_file)]
        assert await asyncio.to_thread(main, command) == 0
        rows = [r for r in read_rows(rows_file) if r.id.startswith("distill-")]
        scored = sum(r.feedback is not None for r in rows)
        if {r.id for r in rows} == ids and scored == len(GOOD + BAD):
            break
        await asyncio.sleep(2)
    # Requests shed before a model answered them (retried above) make no row.
    # Every row is one of these requests. In two clean-clone CI runs 2 of the
    # 34 answered requests had no row (exported once, before the retries above).
    assert {r.id for r in rows} <= ids, "a row for a request this test did not make"
    missing = ids - {r.id for r in rows}
    assert len(missing) <= len(ids) // 10, f"no row for {sorted(missing)}"
    by_id = {r.id: r for r in rows}
    for result in results:
        if result.id in missing:
            continue
        row = by_id[result.id]
        assert (row.path, row.output, row.model) == (result.path, result.output, result.model)
    assert sum(r.feedback is not None for r in rows) >= len(GOOD + BAD) - len(missing)
    both = [r for r in rows if r.light_output is not None and r.heavy_output is not None]
    assert {r.prompt for r in both} >= set(GOOD[:3] + BAD[:3])

    train = ["train", str(rows_file), "-o", str(artifact), "--heavy-share", "0.3"]
    assert await asyncio.to_thread(main, [*boot, *train]) == 0
    data = json.loads(artifact.read_text())
    assert data["labels"]["feedback"] >= len(GOOD + BAD)
    assert set(data["heads"]) == {"full", "features"}

    report = ["report", "--artifact", str(artifact), str(rows_file), "-o", str(out)]
    assert await asyncio.to_thread(main, [*boot, *report]) == 0
    for name in ("report.json", "report.md", "curve.png"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "report.json").read_text())["reason"]

    # The artifact loads into the SmartRouter through the setting, and moves
    # decisions the way the feedback pointed.
    routing = settings.routing.model_copy(update={"learned_router": artifact, "exploration": 0.0})
    registry = builtin_registry(settings.backend)
    plain = SmartRouter(registry, routing.model_copy(update={"learned_router": None}))
    learned = SmartRouter(registry, routing)
    assert learned.learned is not None and learned.learned.version == data["version"]
    fresh_bad, fresh_good = "Who discovered oxygen?", "What is the capital of Chile?"
    vectors = minilm.embed([fresh_bad, fresh_good])
    decisions = {}
    for prompt, vector in zip((fresh_bad, fresh_good), vectors, strict=True):
        f = extract_features(InferenceRequest(id="x", prompt=prompt), routing)
        assert complexity_of(f, routing) is Complexity.SIMPLE
        assert plain.choose(Complexity.SIMPLE, Lane.MEDIUM, {}, features=f).path is Path.LIGHT
        decisions[prompt] = learned.choose(
            Complexity.SIMPLE, Lane.MEDIUM, {}, features=f, embedding=np.asarray(vector)
        )
    assert decisions[fresh_bad].path is Path.HEAVY, decisions
    assert decisions[fresh_good].path is Path.LIGHT, decisions
    assert decisions[fresh_bad].learned_p < decisions[fresh_good].learned_p  # type: ignore[operator]
