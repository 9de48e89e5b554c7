"""The classifier's batch pipeline without services: wave assembly keeps
per-key order, cheap checks come first, a bug on one record stays with it.

Redis is a real client whose server is gone (fail-open); no model runs."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane
from schemas.settings import FlowSettings, RedisSettings, RoutingSettings, Settings
from streams.cache.response import CacheHit, Probe
from streams.classify.batch import BatchClassifier, BatchLookups, Plan, semantic_wanted, waves
from streams.classify.classifier import Admitted, SourceRecord
from streams.classify.gate import RealtimeGate, RealtimeWorker
from streams.classify.router import SmartRouter
from streams.classify.stages import STAGE_SECONDS
from streams.devstack.embedded import free_port
from streams.routing.registry import builtin_registry
from streams.rules.engine import DEFAULT_RULES, Rule, RuleAnswer, RuleBook, Template
from streams.stores.ratelimit import Verdict

NOW = 1_700_000_000_000


# -- waves: per-key order -------------------------------------------------------------


def test_records_without_shared_keys_are_one_wave() -> None:
    assert waves([("a",), ("b",), (None,), ("c", "s1")]) == [[0, 1, 2, 3]]


def test_a_repeated_key_or_session_goes_to_a_later_wave_in_order() -> None:
    keys = [("k1", "s1"), ("k2", None), ("k1", None), ("k3", "s1"), ("k1", "s1"), ("k4", None)]
    assert waves(keys) == [[0, 1, 5], [2, 3], [4]]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([None, "s", "t"])), max_size=40))
def test_every_key_keeps_its_order_across_waves(keys: list[tuple[str, str | None]]) -> None:
    split = waves(keys)
    assert sorted(i for wave in split for i in wave) == list(range(len(keys)))
    wave_of = {i: n for n, wave in enumerate(split) for i in wave}
    for wave in split:
        assert wave == sorted(wave)  # in record order inside a wave
        for i in wave:  # nothing in a wave shares a key with another item of it
            assert not any(set(keys[i]) & set(keys[j]) - {None} for j in wave if j != i)
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            if set(keys[i]) & set(keys[j]) - {None}:
                assert wave_of[i] < wave_of[j]


# -- cheap checks first -------------------------------------------------------------


def _plan(prompt: str, **fields: object) -> Plan:
    request = InferenceRequest(id=f"r-{prompt}", prompt=prompt)
    record = SourceRecord(None, None, NOW, "t", 0, 0)
    plan = Plan(Admitted(request, "laneway.replies", record), prompt)
    plan.probe = Probe("key-" + prompt, "scope", prompt.lower(), request)
    for name, value in fields.items():
        setattr(plan, name, value)
    return plan


def test_only_requests_that_nothing_cheaper_answered_are_embedded() -> None:
    hit = CacheHit("cached", "exact", 1.0, "m", "light", "k")  # type: ignore[arg-type]
    plans = [
        _plan("hello", rule=RuleAnswer("greeting", "Hello!")),  # a rule owns it
        _plan("what is dns", hit=hit),  # exact hit
        _plan("over quota", verdict=Verdict(allowed=False, retry_after_ms=5)),
        _plan("bypassed", probe=None),  # the cache may not answer it
        _plan("a paraphrase"),
    ]
    assert semantic_wanted(plans) == [4]


# -- the pipeline, Redis gone ---------------------------------------------------------


class CountingEmbedder:
    """Vectors from a hash of the text; counts what it was asked to embed."""

    dim = 8

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.extend(texts)
        rows = np.ones((len(texts), self.dim), dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


class Exploding:
    """A rule pattern that fails on one text: a bug in one record's path."""

    def __init__(self, trigger: str) -> None:
        self.trigger = trigger

    def search(self, text: str) -> re.Match[str] | None:
        if self.trigger in text:
            raise RuntimeError("rule engine bug")
        return None


class FixedRules:
    """A rule source that never reloads."""

    def __init__(self, book: RuleBook) -> None:
        self.book = book


def _classifier(
    book: RuleBook, embedder: CountingEmbedder | None = None, gate: RealtimeGate | None = None
) -> BatchClassifier:
    dead = RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    settings = Settings(redis=dead, routing=RoutingSettings(exploration=0.0))
    source = FixedRules(book)
    lookups = BatchLookups(
        settings,
        settings.redis.client(),
        source,  # type: ignore[arg-type]
        embedder=embedder,
    )
    router = SmartRouter(builtin_registry(settings.backend), settings.routing)
    return BatchClassifier(settings, lookups, router, clock_ms=lambda: NOW, gate=gate)


def _record(offset: int, value: bytes, key: bytes | None = None) -> SourceRecord:
    return SourceRecord(value, key, NOW - 5, "laneway.requests", 1, offset)


def _body(request_id: str, prompt: str) -> bytes:
    return json.dumps({"id": request_id, "prompt": prompt}).encode()


async def test_a_bad_record_is_refused_alone_and_its_batch_mates_are_answered() -> None:
    buggy = Rule("buggy", Template("never"), patterns=(Exploding("boom"),))  # type: ignore[arg-type]
    classifier = _classifier(RuleBook((buggy, *DEFAULT_RULES)))
    records = [
        _record(10, _body("a", "hello")),
        _record(11, b'{"id": "bad", "prompt": 5}'),  # invalid: INF-400 and the DLQ
        _record(12, _body("c", "boom goes the rule engine")),  # a bug: the DLQ alone
        _record(13, _body("d", "ping")),
    ]
    out = await classifier.classify(records)
    assert [c.outcome for c in out] == ["answered", "rejected", "rejected", "answered"]
    assert out[0].result is not None and out[0].result.output == "Hello! How can I help you today?"
    assert out[3].result is not None and out[3].result.output == "pong"
    invalid = out[1]
    assert invalid.result is not None and invalid.result.error is not None
    assert invalid.result.error.code == "INF-400"
    assert invalid.records[0].topic == "laneway.dlq"
    (dead_letter,) = out[2].records
    assert dead_letter.topic == "laneway.dlq" and dead_letter.value == records[2].value
    assert dict(dead_letter.headers)["laneway-source-offset"] == b"12"


async def test_redis_gone_still_answers_by_rules_and_routes_the_rest() -> None:
    embedder = CountingEmbedder()
    classifier = _classifier(RuleBook(), embedder)
    out = await classifier.classify(
        [_record(i, _body(f"r{i}", p)) for i, p in enumerate(["hi", "Explain tides", "thanks"])]
    )
    assert [c.outcome for c in out] == ["answered", "routed", "answered"]
    assert embedder.texts == []  # the cache is resting: nothing to compare with


async def test_results_keep_the_record_order_across_waves() -> None:
    classifier = _classifier(RuleBook())
    records = [
        _record(0, _body("one", "hi"), key=b"s"),
        _record(1, _body("two", "thanks"), key=b"t"),
        _record(2, _body("three", "ping"), key=b"s"),  # same key as "one": the next wave
    ]
    out = await classifier.classify(records)
    ids = [InferenceResult.model_validate_json(c.records[0].value).id for c in out]
    assert ids == ["one", "two", "three"]


@pytest.mark.parametrize("size", [1, 3])
async def test_classify_waves_yields_each_record_once(size: int) -> None:
    classifier = _classifier(RuleBook())
    records = [_record(i, _body(f"w{i}", "hi"), key=b"same") for i in range(size)]
    seen = [i async for wave in classifier.classify_waves(records) for i, _ in wave]
    assert seen == list(range(size))


async def test_a_burst_in_one_wave_fills_the_realtime_lane_one_request_at_a_time() -> None:
    """The gate counts each realtime model request as it is routed: of six
    simple questions in one wave, the lane (an idle worker that runs 2 at
    once) takes 2 and medium the rest; one that asks for realtime after
    them is still taken, in the room kept up to twice that."""
    gate = RealtimeGate(FlowSettings(), clock_ms=lambda: NOW)
    gate.reported(0, None, at_ms=NOW - 1)
    gate.serving(2)
    classifier = _classifier(RuleBook(), gate=gate)
    countries = ["France", "Spain", "Italy", "Japan", "Peru", "Chile"]
    bodies = [_body(f"s{i}", f"What is the capital of {c}?") for i, c in enumerate(countries)]
    asked = json.dumps({"id": "asked", "prompt": "Name a fruit.", "lane": "realtime"}).encode()
    records = [_record(i, body) for i, body in enumerate([*bodies, asked])]
    (wave,) = [wave async for wave in classifier.classify_waves(records)]

    lanes = [c.decision.lane.value if c.decision else None for _, c in wave]
    assert lanes == ["realtime", "realtime", *["medium"] * 4, "realtime"]
    assert [c.decision.spilled_from for _, c in wave[2:6] if c.decision] == ["realtime"] * 4
    assert gate.waiting() == 3


async def test_realtime_model_requests_are_written_to_the_partitions_of_the_worker_with_room() -> (
    None
):
    """Worker "busy" (partition 0) has a full round waiting, "idle" (1 and 2)
    nothing: the lane's requests go to idle's partitions, in turn; what
    goes to medium, or is answered here, goes where its key hashes."""
    gate = RealtimeGate(FlowSettings(), clock_ms=lambda: NOW)
    gate.serving(4)
    light = frozenset({AnswerPath.LIGHT})
    gate.workers({"busy": RealtimeWorker(2, (0,), light), "idle": RealtimeWorker(2, (1, 2), light)})
    gate.reported(2, None, at_ms=NOW - 1)
    gate.worker_reported("busy", 2, None, at_ms=NOW - 1)
    gate.worker_reported("idle", 0, None, at_ms=NOW - 1)
    classifier = _classifier(RuleBook(), gate=gate)
    bodies = [
        _body(f"p{i}", f"What is the capital of {c}?") for i, c in enumerate(["France", "Peru"])
    ]
    bodies.append(_body("hard", "Explain why the sky is blue, step by step."))
    (wave,) = [
        wave
        async for wave in classifier.classify_waves([_record(i, b) for i, b in enumerate(bodies)])
    ]

    lanes = [(c.decision.lane.value, c.records[0].partition) for _, c in wave if c.decision]
    assert lanes[:2] == [("realtime", 2), ("realtime", 1)] or lanes[:2] == [
        ("realtime", 1),
        ("realtime", 2),
    ]
    assert lanes[2] == ("medium", None)


async def test_a_full_light_worker_spills_light_work_though_a_heavy_worker_idles() -> None:
    """The lane is judged for the path the request was given: the worker
    serving light has two rounds waiting, the one serving heavy nothing. A
    simple question (light) goes to medium instead of queueing behind the
    light worker's rounds."""
    gate = RealtimeGate(FlowSettings(), clock_ms=lambda: NOW)
    gate.serving(4)
    gate.workers(
        {
            "light": RealtimeWorker(2, (0,), frozenset({AnswerPath.LIGHT})),
            "heavy": RealtimeWorker(2, (1,), frozenset({AnswerPath.HEAVY})),
        }
    )
    gate.reported(4, None, at_ms=NOW - 1)
    gate.worker_reported("light", 4, None, at_ms=NOW - 1)
    gate.worker_reported("heavy", 0, None, at_ms=NOW - 1)
    classifier = _classifier(RuleBook(), gate=gate)
    records = [_record(0, _body("simple", "What is the capital of France?"))]
    ((_, out),) = [c async for wave in classifier.classify_waves(records) for c in wave]
    assert out.decision is not None
    assert (out.decision.lane, out.decision.spilled_from) == (Lane.MEDIUM, Lane.REALTIME)


# -- the delivery pipeline ---------------------------------------------------------


async def test_pipeline_steps_run_in_order_and_a_failure_stops_the_rest() -> None:
    from streams.classify.batch import Pipeline

    done: list[str] = []
    release = asyncio.Event()

    async def step(name: str, gate: asyncio.Event | None = None) -> None:
        if gate is not None:
            await gate.wait()
        done.append(name)

    pipeline = Pipeline()
    pipeline.chain(lambda: step("deliver 1", release), {"k1"})
    pipeline.chain(lambda: step("ack 1"))
    assert pipeline.keys == {"k1"}
    clear = asyncio.ensure_future(pipeline.clear_of({"k2"}))
    await asyncio.sleep(0)
    assert clear.done()  # no shared key: no wait
    blocked = asyncio.ensure_future(pipeline.clear_of({"k1"}))
    await asyncio.sleep(0.01)
    assert not blocked.done() and done == []
    release.set()
    await blocked
    assert done == ["deliver 1", "ack 1"] and pipeline.keys == set()

    async def broken() -> None:
        raise RuntimeError("broker gone mad")

    pipeline.chain(broken)
    pipeline.chain(lambda: step("ack 2"))  # must never run
    with pytest.raises(RuntimeError):
        await pipeline.wait()
    with pytest.raises(RuntimeError):
        pipeline.chain(lambda: step("deliver 3"))
    await asyncio.sleep(0.01)
    assert done == ["deliver 1", "ack 1"]


# -- where the time goes ------------------------------------------------------------


async def test_each_batch_gives_its_time_to_the_stages_it_went_through() -> None:
    classifier = _classifier(RuleBook())
    clock = classifier.clock
    clock.start()
    out = await classifier.classify([_record(i, _body(f"t{i}", "hi")) for i in range(5)])
    assert [c.outcome for c in out] == ["answered"] * 5
    spent = clock.spent()
    assert set(spent) == {"decode", "lookups", "route", "produce"}
    assert spent["decode"] > 0 and spent["lookups"] > 0 and spent["route"] > 0
    assert spent["produce"] == 0  # no delivery here to wait for
    before = STAGE_SECONDS.labels("lookups")._value.get()
    clock.flush()
    assert STAGE_SECONDS.labels("lookups")._value.get() == pytest.approx(before + spent["lookups"])
    assert all(seconds == 0 for seconds in clock.spent().values())
