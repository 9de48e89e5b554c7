"""Router versions (``streams.rollout.routers``): the learned router goes out
through canary, shadow and rollback as a model version does."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from schemas.messages import AnswerPath, InferenceRequest, QualityEvent, RoutedRequest
from schemas.settings import RolloutSettings, RoutingSettings, Settings
from streams.classify.classifier import Admitted, SourceRecord, admit, route
from streams.classify.policy import Found
from streams.classify.router import SmartRouter
from streams.quality.records import PartStats, merge_routers, router_field
from streams.rollout.assign import RolloutView, assignment_key, pick_version
from streams.rollout.rollback import RouterRecord, decide_router
from streams.rollout.routers import (
    RULE_VERSION,
    RouterCatalog,
    RouterVersion,
    ShadowTally,
    apply_router,
    canary_router,
    pick_router,
    promote_router,
    rollback_router,
    shadow_router,
)
from streams.rollout.state import RolloutError, VersionRollout, apply, canary
from streams.routing.learned import BASE_FEATURES, RouterArtifact, save_artifact
from streams.routing.registry import builtin_registry
from streams.routing.stats import PathStats

NOW = 1_700_000_000_000
RULES = RolloutSettings()


def artifact(version: str, intercept: float) -> RouterArtifact:
    """A features-only learned router whose every request gets the same
    ``p = sigmoid(intercept)`` that light is good enough: a large negative
    intercept sends everything heavy, a large positive one everything light."""
    names = list(BASE_FEATURES)
    zeros = [0.0] * len(names)
    return RouterArtifact(
        version=version,
        created="2026-12-03T00:00:00Z",
        features=names,
        mean=zeros,
        scale=[1.0] * len(names),
        heads={
            "features": {
                "inputs": "features",
                "coef": zeros,
                "intercept": intercept,
                "threshold": 0.5,
            }
        },
        heavy_share=1.0 if intercept < 0 else 0.0,
    )


@pytest.fixture
def router_dir(tmp_path: Path) -> Path:
    save_artifact(artifact("lr-heavy", -8.0), tmp_path / "heavy.json")
    save_artifact(artifact("lr-light", 8.0), tmp_path / "light.json")
    return tmp_path


def settings_with(router_dir: Path, **routing: object) -> Settings:
    return Settings(
        routing=RoutingSettings(exploration=0.0, learned_router_dir=router_dir, **routing)  # type: ignore[arg-type]
    )


def versions(**states: tuple[str, float | None]) -> list[RouterVersion]:
    out = [RouterVersion(RULE_VERSION, "active")]
    for name, (state, share) in states.items():
        out.append(RouterVersion(name, state, share))  # type: ignore[arg-type]
    return apply_router(out, {})


def admitted(settings: Settings, request_id: str, session: str | None = None) -> Admitted:
    body = {"id": request_id, "prompt": "What is the capital of France?"}
    if session is not None:
        body["session_id"] = session
    record = SourceRecord(json.dumps(body).encode(), None, NOW, "laneway.requests", 0, 0)
    out = admit(record, now_ms=NOW, settings=settings)
    assert isinstance(out, Admitted)
    return out


# -- assignment --------------------------------------------------------------------


def test_a_canary_router_decides_for_about_its_share_of_conversations() -> None:
    keys = [f"session:s{i}" for i in range(4000)]
    for share in (0.1, 0.5):
        live = versions(lr=("canary", share))
        got = sum(pick_router(live, k) == "lr" for k in keys) / len(keys)
        assert share - 0.04 < got < share + 0.04
    # A raised share keeps the conversations it had; a rollback sends them all back.
    small = {k for k in keys if pick_router(versions(lr=("canary", 0.05)), k) == "lr"}
    large = {k for k in keys if pick_router(versions(lr=("canary", 0.2)), k) == "lr"}
    assert small and small <= large
    assert all(pick_router(versions(lr=("canary", 0.0)), k) == RULE_VERSION for k in keys)


def test_router_assignment_is_independent_of_model_assignment() -> None:
    from schemas.settings import BackendSettings

    base = builtin_registry(BackendSettings())
    more = {"backend": "llamacpp", "path": "heavy", "name": "big2", "version": "2"}
    more["state"] = "retired"
    file = base.model_validate({"models": [m.model_dump() for m in base.models] + [more]})
    registry = apply(file, canary(file, "heavy", "2", 0.5, now_ms=NOW))
    routers = versions(lr=("canary", 0.5))
    keys = [f"session:s{i}" for i in range(4000)]
    model_canary = [k for k in keys if pick_version(registry.versions(AnswerPath.HEAVY), k) == "2"]
    both = sum(pick_router(routers, k) == "lr" for k in model_canary)
    assert 0.4 < len(model_canary) / len(keys) < 0.6
    assert 0.43 < both / len(model_canary) < 0.57  # about half, not all or none


def test_router_operations_refuse_what_cannot_be_done_and_name_the_known_versions() -> None:
    live = versions(lr=("retired", None))
    with pytest.raises(RolloutError, match=r"no router version 'nope'.*\['rule', 'lr'\]"):
        canary_router(live, "nope", 0.1, now_ms=NOW)
    with pytest.raises(RolloutError, match=r"outside 0\.\.1"):
        canary_router(live, "lr", 1.5, now_ms=NOW)
    with pytest.raises(RolloutError, match="active version"):
        shadow_router(live, RULE_VERSION, None, now_ms=NOW)
    with pytest.raises(RolloutError, match="no canary router"):
        rollback_router(live, now_ms=NOW)
    promoted = promote_router(live, "lr", now_ms=NOW)
    assert promoted["lr"].state == "active" and promoted[RULE_VERSION].state == "retired"
    drained = rollback_router(versions(lr=("canary", 0.3)), now_ms=NOW)
    assert drained == {"lr": VersionRollout("canary", 0.0, NOW)}


def test_overrides_that_leave_no_single_active_router_leave_the_defaults() -> None:
    defaults = versions(lr=("retired", None))
    two = {"lr": VersionRollout("active")}
    assert apply_router(defaults, two) == defaults
    swapped = apply_router(
        defaults, {"lr": VersionRollout("active"), RULE_VERSION: VersionRollout("retired")}
    )
    assert [(v.version, v.state) for v in swapped] == [(RULE_VERSION, "retired"), ("lr", "active")]


# -- the catalog ---------------------------------------------------------------------


def test_the_catalog_lists_rule_and_every_artifact_and_fails_open_on_a_bad_one(
    router_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (router_dir / "broken.json").write_text("{not json")
    catalog = RouterCatalog(RoutingSettings(learned_router_dir=router_dir))
    with caplog.at_level(logging.ERROR):
        listed = catalog.scan()
    assert [(v.version, v.state) for v in listed] == [
        (RULE_VERSION, "active"),
        ("broken", "retired"),
        ("lr-heavy", "retired"),
        ("lr-light", "retired"),
    ]
    assert "broken.json" in caplog.text
    assert catalog.learned("broken") is None and catalog.learned(RULE_VERSION) is None
    assert catalog.learned("lr-heavy") is not None
    # A file dropped in later is listed on the next scan.
    save_artifact(artifact("lr-3", 0.0), router_dir / "three.json")
    assert "lr-3" in [v.version for v in catalog.scan()]


def test_the_single_artifact_setting_is_the_active_router_version(router_dir: Path) -> None:
    routing = RoutingSettings(learned_router=router_dir / "heavy.json")
    catalog = RouterCatalog(routing)
    assert [(v.version, v.state) for v in catalog.scan()] == [
        (RULE_VERSION, "retired"),
        ("lr-heavy", "active"),
    ]


# -- the classifier -------------------------------------------------------------------


def view_of(settings: Settings, overrides: dict[str, VersionRollout]) -> RolloutView:
    catalog = RouterCatalog(settings.routing)
    catalog.scan()
    registry = builtin_registry(settings.backend)
    return RolloutView(registry, None, catalog.view(overrides))


def test_the_assigned_router_version_decides_and_is_named_on_the_lane_record(
    router_dir: Path,
) -> None:
    settings = settings_with(router_dir)
    router = SmartRouter(builtin_registry(settings.backend), settings.routing)
    canary_view = view_of(settings, {"lr-heavy": VersionRollout("canary", 0.5)})
    seen: dict[str, set[AnswerPath]] = {}
    for i in range(200):
        out = route(
            admitted(settings, f"r{i}", session=f"s{i}"),
            Found(),
            now_ms=NOW,
            settings=settings,
            router=router,
            rollout=canary_view,
        )
        routed = RoutedRequest.model_validate_json(out.records[0].value)
        assert routed.router_version is not None
        seen.setdefault(routed.router_version, set()).add(routed.path)
    # The rule sends a capital question light; the heavy artifact sends it heavy.
    assert seen == {RULE_VERSION: {AnswerPath.LIGHT}, "lr-heavy": {AnswerPath.HEAVY}}


def test_a_shadow_router_decides_without_changing_the_path_and_is_counted(
    router_dir: Path,
) -> None:
    settings = settings_with(router_dir)
    router = SmartRouter(builtin_registry(settings.backend), settings.routing)
    shadow_view = view_of(
        settings,
        {"lr-heavy": VersionRollout("shadow", None), "lr-light": VersionRollout("shadow", 0.5)},
    )
    plain_view = view_of(settings, {})
    tally = ShadowTally()
    for i in range(100):
        request = admitted(settings, f"r{i}")
        with_shadows = route(
            request, Found(), now_ms=NOW, settings=settings, router=router, rollout=shadow_view
        )
        without = route(
            request, Found(), now_ms=NOW, settings=settings, router=router, rollout=plain_view
        )
        assert with_shadows.records == without.records  # what is produced is the same
        shadows = dict(with_shadows.router_shadows)
        assert shadows["lr-heavy"] == AnswerPath.HEAVY
        assert shadows.get("lr-light", AnswerPath.LIGHT) == AnswerPath.LIGHT
        assert with_shadows.decision is not None
        for version, path in with_shadows.router_shadows:
            tally.note(version, with_shadows.decision.path, path)
    heavy, light = tally.counts["lr-heavy"], tally.counts["lr-light"]
    assert (heavy.n, heavy.agree, heavy.heavy, heavy.live_heavy) == (100, 0, 100, 0)
    assert 30 < light.n < 70 and light.agree == light.n and light.heavy == 0
    # Under load (level > 0) no shadow router judges.
    loaded = route(
        admitted(settings, "x"),
        Found(),
        now_ms=NOW,
        settings=settings,
        router=router,
        rollout=shadow_view,
        level=1,
    )
    assert loaded.router_shadows == ()


def test_an_unreadable_router_version_serves_the_rules_decision(router_dir: Path) -> None:
    (router_dir / "broken.json").write_text("[]")
    settings = settings_with(router_dir)
    router = SmartRouter(builtin_registry(settings.backend), settings.routing)
    view = view_of(settings, {"broken": VersionRollout("canary", 1.0)})
    out = route(
        admitted(settings, "r1"),
        Found(),
        now_ms=NOW,
        settings=settings,
        router=router,
        rollout=view,
    )
    routed = RoutedRequest.model_validate_json(out.records[0].value)
    assert routed.router_version == "broken" and routed.path == AnswerPath.LIGHT


def test_router_version_rides_from_the_lane_record_to_the_quality_event() -> None:
    from workers.answered import answer_from_cache

    request = InferenceRequest(id="r1", prompt="hi")
    routed = RoutedRequest(
        request=request,
        lane="realtime",  # type: ignore[arg-type]
        path=AnswerPath.HEAVY,
        reply_to="laneway.replies",
        produced_at_ms=NOW,
        routed_at_ms=NOW,
        router_version="lr-heavy",
    )
    result = answer_from_cache(routed, "hello", "cache:exact", routed.lane, NOW)
    event = QualityEvent.of(result, tenant=None, ts_ms=NOW)
    assert result.router_version == event.router_version == "lr-heavy"
    assert assignment_key(request) == "id:r1"


# -- the quality loop and rollback -------------------------------------------------------


def event(
    router_version: str, path: AnswerPath, ok: bool, ts: int, latency: float = 100.0
) -> QualityEvent:
    return QualityEvent(
        id=f"e{ts}",
        path=path,
        success=ok,
        latency_ms=latency,
        ts_ms=ts,
        router_version=router_version,
    )


def records(*events: QualityEvent, since: int = 0) -> dict[str, RouterRecord]:
    settings = Settings()
    parts: dict[str, PartStats] = {}
    for n, e in enumerate(events):
        assert e.router_version is not None
        key = router_field(e.router_version, n % 3)  # spread over three partitions
        part = parts.setdefault(key, PartStats(PathStats(latency_ms=e.latency_ms)))
        part.fold(e, settings)
        parts[key] = PartStats.from_json(part.to_json())  # as the table keeps it
    # A model version's record beside them is not a router's.
    parts["heavy~2@0"] = PartStats(PathStats(latency_ms=1.0))
    return merge_routers(parts, 100, 0.2, lambda version: since)


def test_router_records_keep_the_heavy_share_of_what_each_version_routed() -> None:
    got = records(
        *(event("rule", AnswerPath.LIGHT, True, t) for t in range(30)),
        *(
            event("lr", AnswerPath.HEAVY if t % 2 else AnswerPath.LIGHT, True, 100 + t)
            for t in range(40)
        ),
    )
    assert set(got) == {"rule", "lr"}
    assert got["rule"].heavy_share == 0.0 and len(got["rule"].stats.outcomes) == 30
    assert got["lr"].heavy_share == 0.5
    # Judged on the events since its share was set only.
    later = records(*(event("lr", AnswerPath.HEAVY, True, t) for t in range(40)), since=30)
    assert len(later["lr"].stats.outcomes) == 10 and later["lr"].heavy_share == 1.0
    assert RouterRecord.from_json(got["lr"].to_json()) == got["lr"]


def test_a_canary_router_that_sends_too_much_heavy_is_rolled_back_and_a_fair_one_is_not() -> None:
    active = records(
        *(
            event("rule", AnswerPath.HEAVY if t % 5 == 0 else AnswerPath.LIGHT, True, t)
            for t in range(50)
        )
    )["rule"]
    costly = records(*(event("lr", AnswerPath.HEAVY, True, t) for t in range(30)))["lr"]
    reason = decide_router(costly, active, RULES)
    assert reason is not None and reason.startswith("heavy share 100%") and "active 20%" in reason
    fair = records(
        *(
            event("lr", AnswerPath.HEAVY if t % 3 == 0 else AnswerPath.LIGHT, True, t)
            for t in range(30)
        )
    )["lr"]
    assert decide_router(fair, active, RULES) is None
    # Too few events: not judged yet, however it looks.
    young = records(*(event("lr", AnswerPath.HEAVY, False, t) for t in range(5)))["lr"]
    assert decide_router(young, active, RULES) is None
    failing = records(*(event("lr", AnswerPath.LIGHT, t % 2 == 0, t) for t in range(30)))["lr"]
    why = decide_router(failing, active, RULES)
    assert why is not None and why.startswith("success rate 50%")
    assert decide_router(None, active, RULES) is None


def test_the_quality_loop_drains_only_the_canary_routers_worse_than_the_active_one() -> None:
    from streams.rollout.rollback import routers_to_drain

    got = records(
        *(event("rule", AnswerPath.LIGHT, True, t) for t in range(30)),
        *(event("lr-costly", AnswerPath.HEAVY, True, 100 + t) for t in range(30)),
        *(event("lr-fair", AnswerPath.LIGHT, True, 200 + t) for t in range(30)),
        *(event("lr-off", AnswerPath.HEAVY, True, 300 + t) for t in range(30)),
        *(event("lr-shadow", AnswerPath.HEAVY, True, 400 + t) for t in range(30)),
    )
    live = versions(
        **{
            "lr-costly": ("canary", 0.1),
            "lr-fair": ("canary", 0.1),
            "lr-off": ("canary", 0.0),  # already drained: no traffic, not judged again
            "lr-shadow": ("shadow", None),  # a shadow routes nothing
        }
    )
    drained = routers_to_drain(live, got, RULES)
    assert [v for v, _ in drained] == ["lr-costly"]
    assert drained[0][1].startswith("heavy share 100%")
    # With the costly one active, the rule canaried against it is not drained for cost.
    swapped = apply_router(
        live, {"lr-costly": VersionRollout("active"), RULE_VERSION: VersionRollout("canary", 0.1)}
    )
    assert [v for v, _ in routers_to_drain(swapped, got, RULES)] == []
