"""Model versions: the registry's versions, the live roll-out state laid
over it, stable version assignment, and the rollback decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.messages import (
    AnswerPath,
    InferenceRequest,
    InferenceResult,
    Lane,
    QualityEvent,
    RoutedRequest,
)
from schemas.settings import BackendSettings, RolloutSettings, RoutingSettings, Settings
from streams.quality.records import PartStats, fold, merge_versions, version_field
from streams.rollout.assign import RolloutView, assignment_key, pick_shadows, pick_version, unit
from streams.rollout.report import aggregate, format_reports, pair
from streams.rollout.rollback import decide
from streams.rollout.state import (
    RolloutError,
    VersionRollout,
    apply,
    canary,
    promote,
    rollback,
    shadow,
)
from streams.routing.registry import ModelRegistry, RegistryError, builtin_registry, load_registry
from streams.routing.stats import PathStats

SETTINGS = Settings()
RULES = RolloutSettings()


def registry(*extra: dict[str, object]) -> ModelRegistry:
    """The built-in registry plus ``extra`` heavy versions."""
    base = builtin_registry(BackendSettings())
    more = [{"backend": "llamacpp", "path": "heavy", **e} for e in extra]
    return ModelRegistry.model_validate({"models": [m.model_dump() for m in base.models] + more})


def test_the_builtin_registry_keeps_todays_two_models_as_active_versions() -> None:
    builtin = builtin_registry(BackendSettings())
    assert [(m.path, m.name, m.state) for m in builtin.active_models] == [
        ("light", "smollm2-135m", "active"),
        ("heavy", "gemma3-270m", "active"),
    ]


def test_a_file_without_states_loads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  - {name: tiny, backend: llamacpp, path: light}\n"
        "  - {name: big, backend: llamacpp, path: heavy}\n"
        "  - {name: big2, version: '2', state: canary, share: 0.1, backend: llamacpp,"
        " path: heavy}\n"
    )
    loaded = load_registry(path, BackendSettings())
    assert (
        loaded.for_path(AnswerPath.HEAVY) is not None
        and loaded.for_path(AnswerPath.HEAVY).name == "big"
    )
    assert [m.version for m in loaded.versions(AnswerPath.HEAVY)] == ["1", "2"]
    assert loaded.version(AnswerPath.HEAVY, "2").traffic_share == 0.1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"name": "b", "version": "q4_k_m", "state": "canary"}, "versions must be unique"),
        ({"name": "b", "version": "2"}, "exactly one active version, got 2"),
    ],
)
def test_the_registry_refuses_duplicate_versions_and_two_actives(
    tmp_path: Path, extra: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        registry(extra)
    path = tmp_path / "m.yaml"
    path.write_text("models:\n  - {name: a, backend: llamacpp, path: light, state: canary}\n")
    with pytest.raises(RegistryError, match="exactly one active version, got 0"):
        load_registry(path, BackendSettings())


def test_a_shadow_gets_all_by_default_and_a_canary_nothing() -> None:
    reg = registry(
        {"name": "s", "version": "s", "state": "shadow"},
        {"name": "c", "version": "c", "state": "canary"},
    )
    assert reg.version(AnswerPath.HEAVY, "s").traffic_share == 1.0  # type: ignore[union-attr]
    assert reg.version(AnswerPath.HEAVY, "c").traffic_share == 0.0  # type: ignore[union-attr]


def test_ten_thousand_keys_at_share_one_tenth_give_a_tenth() -> None:
    reg = registry({"name": "smol", "version": "smol", "state": "canary", "share": 0.1})
    versions = reg.versions(AnswerPath.HEAVY)
    picked = [pick_version(versions, f"session:{i}") for i in range(10_000)]
    assert 0.09 <= picked.count("smol") / 10_000 <= 0.11
    assert set(picked) == {"smol", "q4_k_m"}


def test_assignment_is_stable_and_raising_a_share_moves_no_canary_key_back() -> None:
    low = registry({"name": "smol", "version": "smol", "state": "canary", "share": 0.1})
    high = registry({"name": "smol", "version": "smol", "state": "canary", "share": 0.3})
    keys = [f"session:s-{i}" for i in range(2_000)]
    first = [pick_version(low.versions(AnswerPath.HEAVY), k) for k in keys]
    assert first == [
        pick_version(low.versions(AnswerPath.HEAVY), k) for k in keys
    ]  # a pure function
    raised = [pick_version(high.versions(AnswerPath.HEAVY), k) for k in keys]
    assert all(r == "smol" for f, r in zip(first, raised, strict=True) if f == "smol")
    assert 0.27 <= raised.count("smol") / len(keys) <= 0.33


def test_a_conversation_keeps_its_version_and_the_key_falls_back_to_the_id() -> None:
    turn = InferenceRequest(id="a", prompt="x", session_id="s-1", tenant="acme")
    assert assignment_key(turn) == "session:s-1"
    assert assignment_key(turn.model_copy(update={"id": "b"})) == "session:s-1"
    assert assignment_key(InferenceRequest(id="a", prompt="x", tenant="acme")) == "tenant:acme"
    assert assignment_key(InferenceRequest(id="a", prompt="x")) == "id:a"
    assert unit("k", "heavy") != unit("k", "light")


def test_only_versions_a_live_worker_serves_get_traffic() -> None:
    reg = registry({"name": "smol", "version": "smol", "state": "canary", "share": 1.0})
    request = InferenceRequest(id="a", prompt="x")
    nobody = RolloutView(reg, {Lane.BULK: frozenset({(AnswerPath.HEAVY, "q4_k_m")})})
    assert nobody.version_for(request, AnswerPath.HEAVY, Lane.BULK) == "q4_k_m"
    served = RolloutView(reg, {Lane.BULK: frozenset({(AnswerPath.HEAVY, "smol")})})
    assert served.version_for(request, AnswerPath.HEAVY, Lane.BULK) == "smol"
    assert RolloutView(reg).version_for(request, AnswerPath.HEAVY, Lane.BULK) == "smol"  # not known
    assert served.version_for(request, AnswerPath.RULES, Lane.BULK) is None


def test_shadow_copies_are_sampled_and_ride_the_lowest_lane_serving_them() -> None:
    reg = registry({"name": "smol", "version": "smol", "state": "shadow", "share": 0.25})
    sampled = [pick_shadows(reg.versions(AnswerPath.HEAVY), f"id:{i}") for i in range(4_000)]
    assert 0.22 <= sum(1 for s in sampled if s) / 4_000 <= 0.28
    everyone = registry({"name": "smol", "version": "smol", "state": "shadow"})
    request = InferenceRequest(id="a", prompt="x")
    both = {lane: frozenset({(AnswerPath.HEAVY, "smol")}) for lane in (Lane.MEDIUM, Lane.BULK)}
    assert RolloutView(everyone, both).shadows_for(request, AnswerPath.HEAVY) == [
        ("smol", Lane.BULK)
    ]
    realtime_only = {Lane.REALTIME: frozenset({(AnswerPath.HEAVY, "smol")})}
    assert RolloutView(everyone, realtime_only).shadows_for(request, AnswerPath.HEAVY) == []


def test_the_live_state_overrides_the_file_and_a_broken_one_is_ignored() -> None:
    reg = registry({"name": "smol", "version": "smol", "state": "canary"})
    live = apply(reg, {(AnswerPath.HEAVY, "smol"): VersionRollout("canary", 0.5)})
    assert live.version(AnswerPath.HEAVY, "smol").traffic_share == 0.5  # type: ignore[union-attr]
    two_actives = apply(reg, {(AnswerPath.HEAVY, "smol"): VersionRollout("active")})
    assert two_actives.version(AnswerPath.HEAVY, "smol").state == "canary"  # type: ignore[union-attr]
    unknown = apply(reg, {(AnswerPath.HEAVY, "nope"): VersionRollout("active")})
    assert unknown.for_path(AnswerPath.HEAVY).version == "q4_k_m"  # type: ignore[union-attr]


def test_cli_operations_and_their_errors() -> None:
    reg = registry({"name": "smol", "version": "smol", "state": "canary"})
    changes = canary(reg, "heavy", "smol", 0.1, now_ms=5)
    assert changes == {(AnswerPath.HEAVY, "smol"): VersionRollout("canary", 0.1, 5)}
    live = apply(reg, changes)
    drained = rollback(live, "heavy", now_ms=6)
    assert drained[(AnswerPath.HEAVY, "smol")].share == 0.0
    promoted = apply(live, promote(live, "heavy", "smol", now_ms=7))
    assert promoted.for_path(AnswerPath.HEAVY).version == "smol"  # type: ignore[union-attr]
    assert promoted.version(AnswerPath.HEAVY, "q4_k_m").state == "retired"  # type: ignore[union-attr]
    assert (
        shadow(reg, "heavy", "smol", None, now_ms=8)[(AnswerPath.HEAVY, "smol")].state == "shadow"
    )
    with pytest.raises(RolloutError, match=r"unknown path 'medium'"):
        canary(reg, "medium", "smol", 0.1, now_ms=0)
    with pytest.raises(RolloutError, match=r"no version 'v9': it has \['q4_k_m', 'smol'\]"):
        canary(reg, "heavy", "v9", 0.1, now_ms=0)
    with pytest.raises(RolloutError, match=r"outside 0\.\.1"):
        canary(reg, "heavy", "smol", 1.5, now_ms=0)
    with pytest.raises(RolloutError, match="is the active version"):
        canary(reg, "heavy", "q4_k_m", 0.1, now_ms=0)
    with pytest.raises(RolloutError, match="no canary with traffic"):
        rollback(reg, "heavy", now_ms=0)


def event(ok: bool, latency_ms: float = 500.0, **kw: object) -> QualityEvent:
    return QualityEvent.model_validate(
        {
            "id": "r",
            "path": "heavy",
            "success": ok,
            "error_code": None if ok else "INF-502",
            "latency_ms": latency_ms,
            "ts_ms": 1,
            **kw,
        }
    )


def record(events: list[QualityEvent]) -> PathStats:
    stats = None
    for e in events:
        stats = fold(stats, e, SETTINGS)
    assert stats is not None
    return stats


def test_a_failing_canary_is_rolled_back_once_it_has_enough_events() -> None:
    active = record([event(True)] * 30)
    few = record([event(False)] * (RULES.min_events - 1))
    assert decide(few, active, RULES) is None  # too few events to judge
    failing = record([event(False)] * RULES.min_events)
    reason = decide(failing, active, RULES)
    assert reason is not None and reason.startswith("success rate 0%")


def test_a_canary_within_the_margins_stays() -> None:
    active = record([event(True, 1_000.0)] * 30)
    # 19 of 20 succeed (95%, within 10 points) at 1.4x the latency (within +50%).
    close = record([event(True, 1_400.0)] * 19 + [event(False)])
    assert decide(close, active, RULES) is None
    slow = record([event(True, 1_600.0)] * 20)
    assert (decide(slow, active, RULES) or "").startswith("latency 1600 ms")


def test_bad_feedback_rolls_a_canary_back() -> None:
    active = record([event(True)] * 30)
    liked = record([event(True)] * 20 + [event(True, kind="feedback", feedback=0.5)])
    assert decide(liked, active, RULES) is None
    disliked = record([event(True)] * 20 + [event(False, kind="feedback", feedback=-1.0)])
    assert (decide(disliked, active, RULES) or "").startswith("feedback quality 0.50")


def test_version_records_merge_per_version_and_count_from_the_share_change() -> None:
    parts: dict[str, PartStats] = {}
    for partition in (0, 1):
        part = PartStats(PathStats(latency_ms=100.0))
        for ts in (10, 20, 30):
            part.fold(event(ts != 30, ts_ms=ts, version="smol"), SETTINGS)
        parts[version_field(AnswerPath.HEAVY, "smol", partition)] = part
    parts["heavy@0"] = PartStats(PathStats(latency_ms=1.0))  # the path's own: not a version
    merged = merge_versions(parts, 50, 0.2)
    assert list(merged) == [(AnswerPath.HEAVY, "smol")]
    assert merged[(AnswerPath.HEAVY, "smol")].outcomes == [1, 1, 1, 1, 0, 0]
    recent = merge_versions(parts, 50, 0.2, since=lambda path, version: 25)
    assert recent[(AnswerPath.HEAVY, "smol")].outcomes == [0, 0]


def result(
    rid: str, output: str | None, *, version: str, ms: float, **kw: object
) -> InferenceResult:
    return InferenceResult.model_validate(
        {
            "id": rid,
            "status": "ok" if output is not None else "error",
            "output": output,
            "error": None
            if output is not None
            else {"code": "INF-502", "message": "x", "retryable": True},
            "path": "heavy",
            "version": version,
            "timings": {"inference_ms": ms},
            **kw,
        }
    )


def test_the_shadow_report_pairs_answers_by_id_and_counts_agreement() -> None:
    live = [
        result(f"r{i}", "Paris." if i else "Lyon", version="q4_k_m", ms=100.0) for i in range(3)
    ]
    shadows = [
        result("r0", "lyon ", version="smol", ms=40.0),  # alike once case and spaces fold
        result("r1", "It is Paris.", version="smol", ms=60.0),
        result("r1", "It is Paris.", version="smol", ms=60.0),  # redelivered: once
        result("r2", None, version="smol", ms=0.0),
        result("r9", "no live answer", version="smol", ms=10.0),
    ]
    pairs = pair(shadows, live)
    assert [(s.id, a is not None) for s, a in pairs] == [
        ("r0", True),
        ("r1", True),
        ("r2", True),
        ("r9", False),
    ]
    (report,) = aggregate(
        pairs, lambda a, b: [1.0 if x == y else 0.5 for x, y in zip(a, b, strict=True)]
    )
    assert (report.path, report.version, report.shadow_answers, report.shadow_errors) == (
        "heavy",
        "smol",
        4,
        1,
    )
    assert report.compared == 2 and report.exact == 0.5 and report.cosine == 0.5
    assert report.shadow_p50_ms == 60.0 and report.active_p50_ms == 100.0
    assert "smol" in format_reports([report])


def test_the_classifier_names_the_version_and_adds_shadow_copies_at_level_0() -> None:
    import json

    from streams.classify.classifier import SourceRecord, admit, route
    from streams.classify.policy import Found
    from streams.classify.router import SmartRouter

    settings = Settings(routing=RoutingSettings(exploration=0.0))
    reg = registry(
        {"name": "smol", "version": "smol", "state": "canary", "share": 1.0},
        {"name": "gem2", "version": "gem2", "state": "shadow"},
    )
    served = {Lane.BULK: frozenset({(AnswerPath.HEAVY, "smol"), (AnswerPath.HEAVY, "gem2")})}
    view = RolloutView(reg, served)
    value = json.dumps({"id": "r-1", "prompt": "Explain why the sky is blue.", "lane": "bulk"})
    record = SourceRecord(value.encode(), b"r-1", 1_000, "laneway.requests", 0, 1)
    admitted = admit(record, now_ms=1_005, settings=settings)
    assert not hasattr(admitted, "outcome")
    router = SmartRouter(reg, settings.routing)

    def routed_at(level: int) -> list[tuple[str, RoutedRequest]]:
        out = route(
            admitted,  # type: ignore[arg-type]
            Found(),
            now_ms=1_005,
            settings=settings,
            router=router,
            level=level,
            rollout=view,
        )
        return [(o.topic, RoutedRequest.model_validate_json(o.value)) for o in out.records]

    (live, copy) = routed_at(0)
    assert live[0] == "laneway.lane.bulk" and live[1].path == "heavy"
    assert (live[1].version, live[1].shadow) == ("smol", False)
    assert copy[0] == "laneway.lane.bulk"
    assert (copy[1].version, copy[1].shadow, copy[1].deadline_at_ms) == ("gem2", True, None)
    assert copy[1].request == live[1].request
    # Under load: moved to light (its active version) and no shadow copy.
    assert [(r.path, r.version) for _, r in routed_at(1)] == [("light", "q4_1")]
