"""Router versions on a classifier-only setup: the batch classifier against
real Redis and the real all-MiniLM-L6-v2, its roll-out board re-reading the
state ``laneway models ... router ...`` writes, no broker and no workers
(nothing here needs a model to answer).

- A canary router at 50% (a learned router artifact that sends every
  request heavy, against the rule that sends these capital questions light)
  decides for about half of the distinct sessions, and every turn of a
  session stays with the version it got.
- A shadow router's decisions never change the path taken, and ``laneway
  models report --routers`` shows how often it agreed and its heavy share.
- Inside a running classifier (broker, Redis, classifier and quality loop,
  no workers): the same canary share on the lane records, and an artifact
  copied into the router directory while it runs is loaded and shadowed;
  the quality loop drains a canary router whose requests went heavy far
  more often than the rule's (from the result events workers would emit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from schemas.messages import AnswerPath, Lane, QualityEvent, RoutedRequest
from schemas.settings import RateLimitSettings, RedisSettings, RoutingSettings, Settings
from streams.cache.embedding import MiniLMEmbedder
from streams.classify.batch import BatchClassifier, BatchLookups
from streams.classify.classifier import SourceRecord
from streams.classify.router import SmartRouter
from streams.cli.main import build_parser
from streams.cli.models import run_models
from streams.rollout.board import RolloutBoard
from streams.rollout.routers import (
    RULE_VERSION,
    RouterCatalog,
    RouterVersion,
    ShadowTally,
    pick_router,
    tally_key,
)
from streams.routing.learned import BASE_FEATURES, RouterArtifact, save_artifact
from streams.routing.registry import load_registry
from streams.rules.rulefile import RuleSource

from .conftest import own_stack, produce_raw, read_topic


def heavy_artifact(version: str, dim: int) -> RouterArtifact:
    """A learned router that predicts light is never good enough (``p`` ~
    0.0003 on both heads, threshold 0.5): every request it judges goes heavy."""
    names = list(BASE_FEATURES)
    zeros = [0.0] * len(names)
    return RouterArtifact(
        version=version,
        created="2026-12-03T00:00:00Z",
        features=names,
        mean=zeros,
        scale=[1.0] * len(names),
        embedding_model="all-MiniLM-L6-v2",
        embedding_dim=dim,
        heads={
            "features": {"inputs": "features", "coef": zeros, "intercept": -8.0, "threshold": 0.5},
            "full": {
                "inputs": "features+embedding",
                "coef": zeros + [0.0] * dim,
                "intercept": -8.0,
                "threshold": 0.5,
            },
        },
        heavy_share=1.0,
    )


@pytest.fixture
def settings(redis_url: str, prefix: str, tmp_path: Path, minilm: MiniLMEmbedder) -> Settings:
    routers = tmp_path / "routers"
    save_artifact(heavy_artifact("lr-heavy", minilm.dim), routers / "heavy.json")
    return Settings(
        redis=RedisSettings(url=redis_url, key_prefix=prefix, timeout_s=2),
        routing=RoutingSettings(exploration=0.0, learned_router_dir=routers),
        # 120 requests of one tenant in well under a second would pass the
        # default limit's burst of 100 on a fast run: this test is about routing.
        ratelimit=RateLimitSettings(enabled=False),
    )


async def cli(settings: Settings, *args: str) -> int:
    parsed: argparse.Namespace = build_parser().parse_args(["models", *args])
    return await asyncio.to_thread(run_models, settings, parsed)


def records(requests: list[tuple[str, str]], start: int = 0) -> list[SourceRecord]:
    """One request record per ``(id, session)``, distinct capital questions."""
    out = []
    for n, (request_id, session) in enumerate(requests):
        body = {
            "id": request_id,
            "session_id": session,
            "prompt": f"What is the capital of country number {start + n}?",
        }
        out.append(
            SourceRecord(json.dumps(body).encode(), session.encode(), 0, "requests", 0, start + n)
        )
    return out


def routed_of(classified: list) -> list[RoutedRequest]:  # type: ignore[type-arg]
    out = []
    for c in classified:
        assert c.outcome == "routed", c
        out.append(RoutedRequest.model_validate_json(c.records[0].value))
    return out


async def test_a_canary_router_decides_for_about_half_and_a_shadow_router_changes_nothing(
    settings: Settings,
    redis_client: aioredis.Redis,
    minilm: MiniLMEmbedder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry = load_registry(settings.routing.models_file, settings.backend)
    router = SmartRouter(registry, settings.routing)
    lookups = BatchLookups(settings, redis_client, RuleSource(None), embedder=minilm)
    catalog = RouterCatalog(settings.routing)
    board = RolloutBoard(redis_client, settings.redis.key_prefix, registry, routers=catalog)
    tally = ShadowTally()
    classifier = BatchClassifier(
        settings,
        lookups,
        router,
        rollout=lambda: board.current,
        tally=tally,
        clock_ms=lambda: 1,
    )

    # Unknown router versions are refused with the known ones.
    assert await cli(settings, "canary", "router", "lr-nope", "--share", "0.5") == 2
    assert "['rule', 'lr-heavy']" in capsys.readouterr().err

    assert await cli(settings, "canary", "router", "lr-heavy", "--share", "0.5") == 0
    await board.refresh()
    sessions = [f"s{i}" for i in range(40)]
    first = routed_of(await classifier.classify(records([(f"a{s}", s) for s in sessions])))
    by_session = {r.request.session_id: r for r in first}
    canaried = {s for s, r in by_session.items() if r.router_version == "lr-heavy"}
    assert 10 <= len(canaried) <= 30  # about half of 40 sessions (p < 0.002 outside)
    for r in first:  # each version decided as it does: the artifact heavy, the rule light
        assert r.path == (AnswerPath.HEAVY if r.router_version == "lr-heavy" else AnswerPath.LIGHT)
        assert r.router_version in ("lr-heavy", RULE_VERSION)
    # A second turn of every session stays with the version its session got.
    again = routed_of(await classifier.classify(records([(f"b{s}", s) for s in sessions], 40)))
    assert {r.request.session_id for r in again if r.router_version == "lr-heavy"} == canaried

    capsys.readouterr()
    assert await cli(settings, "list", "--json") == 0
    rows = {r["version"]: r for r in json.loads(capsys.readouterr().out) if r["path"] == "router"}
    assert rows["lr-heavy"]["state"] == "canary" and rows["lr-heavy"]["share"] == 0.5
    assert rows[RULE_VERSION]["state"] == "active" and rows["lr-heavy"]["loaded"]
    assert await cli(settings, "list") == 0
    table = capsys.readouterr().out
    assert any(line.split()[:2] == ["router", "lr-heavy"] for line in table.splitlines())

    # The canary goes; the same artifact is shadowed: it decides, nothing follows it.
    assert await cli(settings, "rollback", "router") == 0
    assert await cli(settings, "shadow", "router", "lr-heavy") == 0
    await board.refresh()
    shadowed = routed_of(await classifier.classify(records([(f"c{s}", s) for s in sessions], 80)))
    assert all(r.router_version == RULE_VERSION for r in shadowed)
    assert all(r.path == AnswerPath.LIGHT for r in shadowed)  # the rule's path, every one
    await tally.flush(redis_client, tally_key(settings.redis.key_prefix))

    capsys.readouterr()
    assert await cli(settings, "report", "--routers", "--json") == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["router_version"] == "lr-heavy" and report["decisions"] == 40
    assert report["agreement"] == 0.0  # it would have sent every one heavy
    assert report["shadow_heavy_share"] == 1.0 and report["taken_heavy_share"] == 0.0
    assert await cli(settings, "report", "--routers") == 0
    assert "lr-heavy" in capsys.readouterr().out


# -- inside a running classifier ------------------------------------------------------


@pytest.fixture(scope="module")
def router_stack(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, minilm: MiniLMEmbedder
) -> Iterator[Settings]:
    """Broker, Redis, a classifier and the quality loop; no lane workers. The
    router directory holds one artifact when the classifier starts."""
    prefix = f"routers-{uuid.uuid4().hex[:8]}"
    routers = tmp_path_factory.mktemp("routers")
    save_artifact(heavy_artifact("lr-heavy", minilm.dim), routers / "heavy.json")
    env = {
        "LANEWAY_APP_ID": prefix,
        "LANEWAY_REDIS_KEY_PREFIX": prefix,
        "LANEWAY_REDIS_URL": redis_url,
        "LANEWAY_ROUTING_EXPLORATION": "0",
        "LANEWAY_ROUTING_LEARNED_ROUTER_DIR": str(routers),
        "LANEWAY_ROLLOUT_REFRESH_S": "0.5",
    }
    for stack in own_stack(tmp_path_factory.mktemp("router-stack"), env, lanes=()):
        yield stack.settings


async def _send(settings: Settings, values: list[tuple[str, dict[str, str]]]) -> None:
    producer = AIOKafkaProducer(**settings.kafka.client_options())
    await producer.start()
    try:
        sent = [
            await producer.send(settings.topic("requests"), json.dumps(v).encode(), key=k.encode())
            for k, v in values
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def _routed(settings: Settings, ids: set[str]) -> dict[str, RoutedRequest]:
    """The lane records of ``ids`` (waits, up to about a minute, for all of them)."""
    found: dict[str, RoutedRequest] = {}
    for _ in range(60):
        for lane in Lane:
            for record in await read_topic(settings, settings.lane_topic(lane), timeout_s=1.0):
                routed = RoutedRequest.model_validate_json(record.value)
                if routed.request.id in ids:
                    found[routed.request.id] = routed
        if set(found) == ids:
            break
        await asyncio.sleep(0.5)
    return found


async def test_inside_a_classifier_a_canary_router_takes_half_and_a_new_artifact_is_shadowed(
    router_stack: Settings, minilm: MiniLMEmbedder, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = router_stack
    tag = uuid.uuid4().hex[:6]
    assert await cli(settings, "canary", "router", "lr-heavy", "--share", "0.5") == 0
    # A session the canary owns (by the hash): wait until the classifier has read the change.
    live = [RouterVersion(RULE_VERSION, "active"), RouterVersion("lr-heavy", "canary", 0.5)]
    probe_session = next(
        f"p{n}-{tag}" for n in range(100) if pick_router(live, f"session:p{n}-{tag}") == "lr-heavy"
    )
    for attempt in range(40):
        rid = f"probe-{tag}-{attempt}"
        body = {"id": rid, "session_id": probe_session, "prompt": "What is the capital of Peru?"}
        await _send(settings, [(probe_session, body)])
        got = await _routed(settings, {rid})
        if got[rid].router_version == "lr-heavy":
            break
    else:
        pytest.fail("the classifier never assigned the canary router")

    # Fixed session names, so the split is the hash's and the same every run
    # (random ones made it a draw: outside 10-30 of 40 once in ~500 runs).
    sessions = [f"rs{i}" for i in range(40)]
    bodies = [
        (s, {"id": f"a-{s}-{tag}", "session_id": s, "prompt": f"What is the capital of land {i}?"})
        for i, s in enumerate(sessions)
    ]
    await _send(settings, bodies)
    routed = await _routed(settings, {b["id"] for _, b in bodies})
    canaried = [r for r in routed.values() if r.router_version == "lr-heavy"]
    assert 10 <= len(canaried) <= 30, len(canaried)  # about half of 40 sessions
    # Each session decided by the router version its hash names.
    for r in routed.values():
        assert r.router_version == pick_router(live, f"session:{r.request.session_id}"), r
    for r in routed.values():
        assert r.path == (AnswerPath.HEAVY if r.router_version == "lr-heavy" else AnswerPath.LIGHT)

    # A second artifact dropped in the directory is listed and shadowed: the
    # classifier loads it, decides with it, and the paths stay the rule's.
    assert await cli(settings, "rollback", "router") == 0
    for attempt in range(40):  # until the classifier has read the rollback
        rid = f"back-{tag}-{attempt}"
        body = {"id": rid, "session_id": probe_session, "prompt": "What is the capital of Peru?"}
        await _send(settings, [(probe_session, body)])
        if (await _routed(settings, {rid}))[rid].router_version == RULE_VERSION:
            break
    else:
        pytest.fail("the classifier never read the rollback")
    assert settings.routing.learned_router_dir is not None
    save_artifact(
        heavy_artifact("lr-heavy-2", minilm.dim), settings.routing.learned_router_dir / "h2.json"
    )
    assert await cli(settings, "shadow", "router", "lr-heavy-2") == 0
    report: dict[str, Any] = {}
    for attempt in range(40):
        rid = f"shadowed-{tag}-{attempt}"
        await _send(settings, [(rid, {"id": rid, "prompt": "What is the capital of Chile?"})])
        got = await _routed(settings, {rid})
        assert got[rid].path == AnswerPath.LIGHT and got[rid].router_version == RULE_VERSION
        capsys.readouterr()
        assert await cli(settings, "report", "--routers", "--json") == 0
        rows = {r["router_version"]: r for r in json.loads(capsys.readouterr().out)}
        if rows.get("lr-heavy-2", {}).get("decisions"):
            report = rows["lr-heavy-2"]
            break
    assert report, "no shadow router decision was ever counted"
    assert report["agreement"] == 0.0 and report["shadow_heavy_share"] == 1.0


async def test_the_quality_loop_drains_a_canary_router_that_sends_too_much_heavy(
    router_stack: Settings, minilm: MiniLMEmbedder
) -> None:
    """The result events a worker emits for the requests each router version
    routed (all successes: the rule's light, the canary's heavy): the loop's
    records of the canary show a heavy share far above the rule's, so it is
    drained to 0% with a ``rollback`` event naming the router version."""
    settings = router_stack
    assert settings.routing.learned_router_dir is not None
    tag = uuid.uuid4().hex[:6]
    version = f"lr-costly-{tag}"
    save_artifact(
        heavy_artifact(version, minilm.dim), settings.routing.learned_router_dir / f"{tag}.json"
    )
    assert await cli(settings, "canary", "router", version, "--share", "0.3") == 0
    redis = settings.redis.client()
    field = f"router:learned:{version}"
    key = f"{settings.redis.key_prefix}:models:rollout"
    try:
        since = json.loads(await redis.hget(key, field))["at_ms"]
        events = [
            QualityEvent(
                id=f"{tag}-{who}-{n}",
                lane=Lane.REALTIME,
                path=path,
                success=True,
                latency_ms=200.0,
                ts_ms=since + 1 + n,
                router_version=who,
            )
            for n in range(30)
            for who, path in ((RULE_VERSION, AnswerPath.LIGHT), (version, AnswerPath.HEAVY))
        ]
        for e in events:
            await produce_raw(
                settings, settings.topic("quality"), e.model_dump_json().encode(), e.id
            )
        drained: dict[str, Any] = {}
        for _ in range(120):  # the loop judges every weights_refresh_s
            drained = json.loads(await redis.hget(key, field))
            if drained["by"] == "rollback":
                break
            await asyncio.sleep(0.5)
    finally:
        await redis.aclose()
    assert drained["state"] == "canary" and drained["share"] == 0.0 and drained["by"] == "rollback"
    assert drained["reason"].startswith("heavy share 100%"), drained
    quality = await read_topic(settings, settings.topic("quality"))
    notices = [
        QualityEvent.model_validate_json(r.value)
        for r in quality
        if json.loads(r.value).get("kind") == "rollback"
    ]
    mine = [n for n in notices if n.router_version == version]
    assert len(mine) == 1 and mine[0].path is None and mine[0].reason == drained["reason"]
