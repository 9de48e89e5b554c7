"""Model versions on the real stack: a canary at 50% gets about half the
traffic, a failing canary is rolled back automatically, shadow answers
never reach the client, and a student (SmolLM2-135M with a LoRA adapter)
serves as a shadow.

One stack for the module with only the bulk worker, serving the heavy path
in four versions from a registry file: Gemma-3-270M (active), SmolLM2-135M
as version ``smol``, version ``broken``, whose model file does not exist
(a real load failure: its requests fail with INF-502 there and the active
version answers them), and version ``student``, added to the file by the
real ``laneway models register`` (a canary at share 0) from the folder
the real ``laneway distill student`` trained: a LoRA on SmolLM2-135M from
eight teacher answers, two steps (``train_student``). Every test
sets the roll-out state it needs with the real ``laneway models`` command.
Cache off, tiny answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, QualityEvent
from schemas.settings import Settings
from streams.client import LanewayClient
from streams.rollout.assign import unit
from streams.rollout.state import RolloutStore

from .conftest import produce_to_lane, read_topic, registry_stack, routed_now

REGISTRY = """\
models:
  - {name: smollm2-135m, version: q4_1, backend: llamacpp, path: light,
     max_complexity: simple, cost_per_1k_tokens: 0.0002}
  - {name: gemma3-270m, version: q4_k_m, backend: llamacpp, path: heavy,
     cost_per_1k_tokens: 0.001}
  - {name: smollm2-135m, version: smol, state: canary, share: 0, backend: llamacpp,
     path: heavy}
  - {name: /nonexistent/broken.gguf, version: broken, state: canary, share: 0,
     backend: llamacpp, path: heavy}
"""


@pytest.fixture(scope="module")
def rollout_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A bulk-only stack with three heavy versions; yields the children's
    environment with the running broker and Redis in it."""
    env = {
        "LANEWAY_BULK_MAX_BATCH_SIZE": "8",
        "LANEWAY_BULK_MAX_WAIT_MS": "100",
        "LANEWAY_ROLLOUT_REFRESH_S": "0.5",
        "LANEWAY_ROLLOUT_MIN_EVENTS": "5",
        # Judged on success only: a canary's latency here is mostly its place in
        # the queue behind 40 requests at once (it was drained at 8.3 s against
        # 2.4 s in one CI run, the test's 50% share gone with it).
        "LANEWAY_ROLLOUT_LATENCY_MARGIN": "100",
    }
    folder = tmp_path_factory.mktemp("rollout")
    registry = folder / "registered.yaml"
    registry.write_text(REGISTRY)
    student = train_student(folder)
    added = models(
        {"LANEWAY_ROUTING_MODELS_FILE": str(registry)},
        *("register", "heavy", "student", "--adapter", str(student), "--state", "canary"),
        "--force",  # two steps on eight answers: most likely not offered
    )
    assert "heavy student: canary share 0" in added, added
    text = registry.read_text()
    for _, children in registry_stack(folder, "rollout", text, env, (Lane.BULK,)):
        yield children


TEACHER = [
    ("What is the capital of France?", "Paris."),
    ("Name a colour.", "Blue."),
    ("What colour is the sky?", "Blue, on a clear day."),
    ("Name a fruit.", "An apple."),
    ("What is two plus two?", "Four."),
    ("Which planet do we live on?", "Earth."),
    ("What do bees make?", "Honey."),
    ("How many days are in a week?", "Seven."),
]
"""The teacher's answers the student learns from (a fine-tune set)."""


def train_student(folder: Path) -> Path:
    """A student as ``laneway distill student`` trains it: a LoRA on the
    light model (SmolLM2-135M, the wheel's) from a chat JSONL fine-tune
    set, two steps; its folder (``adapter.gguf``, ``peft/``, ``student.json``)."""
    chat = folder / "finetune.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in TEACHER
    ]
    chat.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = folder / "student"
    command = ["distill", "student", str(chat), "-o", str(out), "--teacher", "gemma3-270m"]
    options = ["--steps", "2", "--min-rows", "4", "--held-out", "0.25", "--max-new-tokens", "8"]
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", *command, *options],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert {p.name for p in out.iterdir()} >= {"adapter.gguf", "peft", "student.json"}
    return out


@pytest.fixture
async def rollout(rollout_env: dict[str, str]) -> Settings:
    """The stack's settings, its roll-out state back to the registry file's."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in rollout_env.items():
            patch.setenv(name, value)
        settings = Settings()
    redis = aioredis.from_url(settings.redis.url)
    await RolloutStore(redis, settings.redis.key_prefix).clear()
    await redis.aclose()
    return settings


def models(env: dict[str, str], *args: str) -> str:
    """``laneway models ARGS`` as an operator runs it; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", "models", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


async def propagated(settings: Settings) -> None:
    """Long enough for every classifier to have re-read the roll-out state."""
    await asyncio.sleep(4 * settings.rollout.refresh_s)


def session_of(tag: str, i: int) -> str:
    return f"{tag}-session-{i}"


async def ask_all(
    client: LanewayClient, n: int, tag: str, sessions: str | None = None
) -> list[InferenceResult]:
    """``n`` requests on the bulk lane, each its own session (named after
    ``sessions``, else ``tag``), all in flight."""
    futures = [
        await client.submit(
            {
                "id": f"{tag}-{i}",
                "prompt": f"Name a colour, number {i}.",
                "max_tokens": 2,
                "lane": "bulk",
                "session_id": session_of(sessions or tag, i),
            }
        )
        for i in range(n)
    ]
    return list(await asyncio.wait_for(asyncio.gather(*futures), 600))


async def test_a_canary_at_half_gets_about_half_the_traffic(
    rollout: Settings, rollout_env: dict[str, str]
) -> None:
    assert "canary share 0.5" in models(rollout_env, "canary", "heavy", "smol", "--share", "0.5")
    await propagated(rollout)
    # Fixed session names, so the split is the hash's and the same every run
    # (20 of these 40 sessions fall under 0.5); with random names it was a
    # draw, and one CI run drew 30 of 40. Request ids stay unique per run.
    tag = f"half-{uuid.uuid4().hex[:6]}"
    expected = {
        f"{tag}-{i}": "smol"
        if unit(f"session:{session_of('half', i)}", "heavy") < 0.5
        else "q4_k_m"
        for i in range(40)
    }
    assert 16 <= list(expected.values()).count("smol") <= 24, expected
    async with LanewayClient(rollout.kafka, client_id=f"canary-{uuid.uuid4().hex[:6]}") as client:
        results = await ask_all(client, 40, tag, sessions="half")
    assert all(r.status == "ok" and r.path == "heavy" for r in results), results
    by_version = {v: [r for r in results if r.version == v] for v in ("smol", "q4_k_m")}
    # Every request answered by the version its session hashes to: never the
    # canary for an active one's session; the active version for at most two
    # canary sessions (a worker heartbeat missed on a busy machine takes the
    # canary off the board for a moment, and its requests go to the active).
    got = {r.id: r.version for r in results}
    assert not [i for i, v in got.items() if v == "smol" and expected[i] != "smol"], got
    assert len([i for i, v in got.items() if v != expected[i]]) <= 2, (got, expected)
    # Each version's answers came from its own model.
    assert {r.model for r in by_version["smol"]} == {"llamacpp:smollm2-135m"}
    assert {r.model for r in by_version["q4_k_m"]} == {"llamacpp:gemma3-270m"}
    listing = json.loads(models(rollout_env, "list", "--json"))
    smol = next(row for row in listing if row["version"] == "smol")
    assert smol["state"] == "canary" and smol["share"] == 0.5 and smol["workers"]
    broken = next(row for row in listing if row["version"] == "broken")
    assert broken["workers"] == []  # its model never loaded: it is not announced


async def test_a_failing_canary_is_rolled_back_automatically(
    rollout: Settings, rollout_env: dict[str, str]
) -> None:
    models(rollout_env, "canary", "heavy", "broken", "--share", "0.3")
    await propagated(rollout)
    # The classifier sends it nothing (no live worker serves it): requests
    # routed to it as a classifier that saw it would, on the real lane.
    reply_to = f"{rollout.replies_topic}.rollback-{uuid.uuid4().hex[:6]}"
    for i in range(8):
        request = InferenceRequest(
            id=f"broken-{uuid.uuid4().hex[:6]}-{i}", prompt="Hi", max_tokens=2
        )
        routed = routed_now(request, reply_to, path=AnswerPath.HEAVY, lane=Lane.BULK)
        await produce_to_lane(rollout, routed.model_copy(update={"version": "broken"}))
    store = RolloutStore(aioredis.from_url(rollout.redis.url), rollout.redis.key_prefix)
    live = None
    for _ in range(120):  # bounded: a minute
        overrides = await store.read() or {}
        live = overrides.get((AnswerPath.HEAVY, "broken"))
        if live is not None and live.by == "rollback":
            break
        await asyncio.sleep(0.5)
    assert live is not None and live.by == "rollback" and live.share == 0.0, live
    assert live.reason is not None and live.reason.startswith("success rate 0%"), live
    events = [
        QualityEvent.model_validate_json(r.value)
        for r in await read_topic(rollout, rollout.topic("quality"), timeout_s=10)
    ]
    rollbacks = [e for e in events if e.kind == "rollback" and e.version == "broken"]
    assert len(rollbacks) == 1 and rollbacks[0].reason == live.reason, rollbacks
    # Its clients were answered by the active version all along.
    answers = [
        InferenceResult.model_validate_json(r.value)
        for r in await read_topic(rollout, reply_to, timeout_s=10)
    ]
    assert {(a.status, a.version) for a in answers} == {("ok", "q4_k_m")}, answers
    listing = json.loads(models(rollout_env, "list", "--json"))
    row = next(row for row in listing if row["version"] == "broken")
    assert row["share"] == 0.0 and row["set_by"] == "rollback" and row["reason"] == live.reason


async def shadow_answers(rollout: Settings, tag: str, count: int) -> list[InferenceResult]:
    """The shadow answers on ``laneway.shadow`` to the requests whose ids
    start with ``tag``, once ``count`` of them are there (at most a minute,
    for the copies that wait behind the live work)."""
    shadows: list[InferenceResult] = []
    for _ in range(120):
        shadows = [
            InferenceResult.model_validate_json(r.value)
            for r in await read_topic(rollout, rollout.topic("shadow"), timeout_s=5)
        ]
        shadows = [s for s in shadows if s.id.startswith(tag)]
        if len({s.id for s in shadows}) == count:
            break
        await asyncio.sleep(0.5)
    return shadows


async def test_shadow_answers_are_recorded_and_never_reach_the_client(
    rollout: Settings, rollout_env: dict[str, str]
) -> None:
    assert "smol: shadow" in models(rollout_env, "shadow", "heavy", "smol")
    await propagated(rollout)
    client_id = f"shadow-{uuid.uuid4().hex[:6]}"
    tag = f"shadowed-{uuid.uuid4().hex[:6]}"
    async with LanewayClient(rollout.kafka, client_id=client_id) as client:
        results = await ask_all(client, 4, tag)
        assert {(r.status, r.version) for r in results} == {("ok", "q4_k_m")}, results
        shadows = await shadow_answers(rollout, tag, 4)
    assert {s.id for s in shadows} == {r.id for r in results}, shadows
    assert {(s.version, s.model) for s in shadows} == {("smol", "llamacpp:smollm2-135m")}
    # Nothing of the shadow's reached the client's reply topic or the results topic.
    replies = [
        InferenceResult.model_validate_json(r.value)
        for r in await read_topic(rollout, f"{rollout.replies_topic}.{client_id}", timeout_s=5)
    ]
    assert sorted(r.id for r in replies) == sorted(r.id for r in results), replies
    assert {r.version for r in replies} == {"q4_k_m"}
    everything = [
        InferenceResult.model_validate_json(r.value)
        for r in await read_topic(rollout, rollout.topic("results"), timeout_s=10)
    ]
    assert not [r for r in everything if r.id.startswith(tag) and r.version == "smol"]
    # The report compares them with MiniLM (loaded from its wheel: ~15 s here).
    report = json.loads(models(rollout_env, "report", "--json"))
    (row,) = [r for r in report if r["version"] == "smol"]
    assert row["compared"] >= 4 and row["shadow_p50_ms"] is not None, row
    assert row["cosine"] is not None and -1.0 <= row["cosine"] <= 1.0001, row


async def test_a_student_with_an_adapter_serves_as_a_shadow(
    rollout: Settings, rollout_env: dict[str, str]
) -> None:
    assert "student: shadow" in models(rollout_env, "shadow", "heavy", "student")
    await propagated(rollout)
    tag = f"student-{uuid.uuid4().hex[:6]}"
    async with LanewayClient(rollout.kafka, client_id=f"student-{uuid.uuid4().hex[:6]}") as client:
        results = await ask_all(client, 4, tag)
    assert {(r.status, r.version) for r in results} == {("ok", "q4_k_m")}, results
    shadows = await shadow_answers(rollout, tag, 4)
    assert {s.id for s in shadows} == {r.id for r in results}, shadows
    assert {(s.status, s.version, s.model) for s in shadows} == {
        ("ok", "student", "llamacpp:smollm2-135m")
    }, shadows
    # Listed with its adapter, its provenance and the worker that loaded it.
    listing = json.loads(models(rollout_env, "list", "--json"))
    row = next(row for row in listing if row["version"] == "student")
    assert row["workers"] and row["adapter"].endswith("student"), row
    assert row["student"]["teacher"] == "gemma3-270m", row
    rows = row["student"]["rows"]
    assert rows["train"] + rows["held_out"] == len(TEACHER) and rows["held_out"] >= 1, row
    text = models(rollout_env, "list")
    line = f"student of smollm2-135m from gemma3-270m: {rows['train']} rows"
    assert line in text, text
    said = "; offered" if row["student"]["offered"] else "; not offered: "
    assert said in text, text
