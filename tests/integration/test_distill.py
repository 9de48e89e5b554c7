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
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaProducer

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane
from schemas.settings import Settings
from streams.cache.embedding import MiniLMEmbedder
from streams.classify.router import SmartRouter
from streams.cli.main import main
from streams.client import LanewayClient
from streams.distill.export import Window, collect
from streams.distill.rows import read_rows
from streams.routing.features import Complexity, complexity_of, extract_features
from streams.routing.registry import builtin_registry

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
    client: LanewayClient, settings: Settings, minilm: MiniLMEmbedder, tmp_path: Path
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
            assert result.path is AnswerPath.LIGHT, result
            await client.feedback(result.id, 1.0 if prompt in GOOD else -1.0)
    until = time.time() + 1
    await asyncio.sleep(1.5)  # until is in the past: the window is closed

    rows_file, artifact, out = tmp_path / "rows.jsonl", tmp_path / "router.json", tmp_path / "rep"
    boot = ["--bootstrap", settings.kafka.bootstrap, "distill"]
    window = ["--since", str(int(since * 1000)), "--until", str(int(until * 1000))]
    ids = {r.id for r in results}
    command = [*boot, "export", *window, "-o", str(rows_file)]
    assert await asyncio.to_thread(main, command) == 0
    rows = [r for r in read_rows(rows_file) if r.id.startswith("distill-")]
    # Every answered request has its row; any other row is a first try that
    # was shed under load (asked again under a new id), which failed.
    by_id = {r.id: r for r in rows}
    assert ids <= set(by_id), f"no row for {sorted(ids - set(by_id))}"
    assert not any(r.success for r in rows if r.id not in ids)
    for result in results:
        row = by_id[result.id]
        assert (row.path, row.output, row.model) == (result.path, result.output, result.model)
    assert sum(r.feedback is not None for r in rows) == len(GOOD + BAD)
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
        assert plain.choose(Complexity.SIMPLE, Lane.MEDIUM, {}, features=f).path is AnswerPath.LIGHT
        decisions[prompt] = learned.choose(
            Complexity.SIMPLE, Lane.MEDIUM, {}, features=f, embedding=np.asarray(vector)
        )
    assert decisions[fresh_bad].path is AnswerPath.HEAVY, decisions
    assert decisions[fresh_good].path is AnswerPath.LIGHT, decisions
    assert decisions[fresh_bad].learned_p < decisions[fresh_good].learned_p  # type: ignore[operator]


async def test_export_reads_requests_the_broker_indexes_late(settings: Settings) -> None:
    """Two ways a broker's offsets are not exact, and every record of the
    window is still read: a producer's clock may run ahead of the broker's
    (Tansu indexes times by when a batch arrived, not by the record's
    timestamp: requests stamped 5 s ahead), and Tansu's end offset counts
    one record of the partition's last batch (a burst of 20 in one batch,
    which is how 2 of 30 requests went missing in a CI run)."""
    scoped = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"topic_prefix": f"w{uuid.uuid4().hex[:8]}"})
        }
    )
    producer = AIOKafkaProducer(**scoped.kafka.client_options())
    await producer.start()
    now_ms = int(time.time() * 1000)
    ahead = [f"ahead-{i}" for i in range(3)]
    burst = [f"burst-{i}" for i in range(20)]
    try:
        for rid in ahead:
            request = InferenceRequest(id=rid, prompt="What is the capital of Peru?")
            await producer.send_and_wait(
                scoped.topic("requests"),
                request.model_dump_json().encode(),
                partition=0,
                timestamp_ms=now_ms + 5000,
            )
        sends = [
            await producer.send(
                scoped.topic("requests"),
                InferenceRequest(id=rid, prompt="Who invented the radio?")
                .model_dump_json()
                .encode(),
                partition=0,
            )
            for rid in burst
        ]
        await asyncio.gather(*sends)
        for rid in ahead + burst:
            result = InferenceResult(
                id=rid, status="ok", output="Lima", path=AnswerPath.LIGHT, model="m"
            )
            await producer.send_and_wait(
                scoped.topic("results"), result.model_dump_json().encode(), partition=0
            )
    finally:
        await producer.stop()
    # The window starts after the broker received the ahead requests, as an
    # export of "the last few seconds" from the producers' clock would.
    window = Window(since_ms=now_ms + 4000, until_ms=now_ms + 6000)
    collected, _ = await collect(scoped, window)
    assert set(ahead) <= set(collected.requests)
    window = Window(since_ms=now_ms - 1000, until_ms=now_ms + 60_000)
    collected, _ = await collect(scoped, window)
    assert set(collected.requests) == set(ahead + burst)
    assert set(collected.results) == set(ahead + burst)
