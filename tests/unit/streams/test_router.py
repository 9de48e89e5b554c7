import random
from pathlib import Path

import pytest

from schemas.messages import AnswerPath, Lane, QualityEvent
from schemas.settings import BackendSettings, RoutingSettings, Settings
from streams.classify.router import SmartRouter, score_paths
from streams.quality.records import LaneLatency, fold
from streams.routing.features import Complexity
from streams.routing.registry import ModelRegistry, RegistryError, builtin_registry, load_registry
from streams.routing.stats import PathStats, ewma

REGISTRY = builtin_registry(BackendSettings())
SETTINGS = Settings()


def event(path: AnswerPath, ok: bool, latency_ms: float = 500.0, **kw: object) -> QualityEvent:
    return QualityEvent.model_validate(
        {
            "id": "r",
            "path": path,
            "lane": "realtime",
            "success": ok,
            "error_code": None if ok else "INF-502",
            "latency_ms": latency_ms,
            "ts_ms": 1,
            **kw,
        }
    )


def test_ewma() -> None:
    assert ewma(100.0, 200.0, 0.2) == pytest.approx(120.0)
    value = 100.0
    for _ in range(50):
        value = ewma(value, 200.0, 0.2)
    assert value == pytest.approx(200.0, abs=0.01)


def test_stats_fold_latency_and_window() -> None:
    stats = None
    for latency in (100.0, 300.0):
        stats = fold(stats, event(AnswerPath.LIGHT, True, latency), SETTINGS)
    assert stats is not None
    assert stats.latency_ms == pytest.approx(ewma(100.0, 300.0, SETTINGS.routing.ewma_alpha))
    for _ in range(SETTINGS.routing.success_window):
        fold(stats, event(AnswerPath.LIGHT, False), SETTINGS)
    assert stats.success_rate == 0.0 and len(stats.outcomes) == SETTINGS.routing.success_window


def test_client_errors_say_nothing_about_a_path() -> None:
    stats = fold(None, event(AnswerPath.LIGHT, True), SETTINGS)
    fold(stats, event(AnswerPath.LIGHT, False, error_code="INF-429"), SETTINGS)
    assert stats.success_rate == 1.0 and stats.n == 2


def test_feedback_lowers_quality() -> None:
    stats = fold(None, event(AnswerPath.LIGHT, True), SETTINGS)
    fold(stats, event(AnswerPath.LIGHT, False, kind="feedback", feedback=-1.0), SETTINGS)
    assert stats.quality == pytest.approx(1 - SETTINGS.routing.feedback_weight)
    assert stats.success_rate == 1.0  # feedback is not an outcome


def test_stats_json_round_trip() -> None:
    stats = PathStats(latency_ms=12.5, outcomes=[1, 0, 1], quality=0.7, n=3, updated_ms=9)
    assert PathStats.from_json(stats.to_json()) == stats


def test_score_formula() -> None:
    routing = RoutingSettings(w_lat=0.4, w_cost=0.3, w_fail=0.3)
    stats = {
        AnswerPath.LIGHT: PathStats(latency_ms=500.0, outcomes=[1, 1, 0, 0]),
        AnswerPath.HEAVY: PathStats(latency_ms=1000.0, outcomes=[1, 1, 1, 1]),
    }
    scores = score_paths(REGISTRY.models, stats, routing)
    # light: 0.4*0.5 + 0.3*0.2 + 0.3*0.5; heavy: 0.4*1 + 0.3*1 + 0
    assert scores[AnswerPath.LIGHT] == pytest.approx(0.2 + 0.06 + 0.15)
    assert scores[AnswerPath.HEAVY] == pytest.approx(0.7)


def test_only_capable_models_are_eligible() -> None:
    router = SmartRouter(REGISTRY, RoutingSettings(exploration=0.0))
    assert router.choose(Complexity.COMPLEX, Lane.MEDIUM, {}).path is AnswerPath.HEAVY
    assert router.choose(Complexity.MODERATE, Lane.MEDIUM, {}).path is AnswerPath.HEAVY
    assert router.choose(Complexity.SIMPLE, Lane.REALTIME, {}).path is AnswerPath.LIGHT


def test_only_paths_a_live_worker_serves_are_chosen() -> None:
    router = SmartRouter(REGISTRY, RoutingSettings(exploration=1.0), random.Random(1))
    # Exploration at 1.0 would pick the other path every time, if it could.
    for _ in range(20):
        choice = router.choose(Complexity.SIMPLE, Lane.REALTIME, {}, served={AnswerPath.LIGHT})
        assert choice.path is AnswerPath.LIGHT and not choice.explored
    # Only heavy can answer a complex request; where only light is served,
    # light answers it rather than leaving it to a lane nobody consumes for heavy.
    only_light = router.choose(Complexity.COMPLEX, Lane.REALTIME, {}, served={AnswerPath.LIGHT})
    assert only_light.path is AnswerPath.LIGHT
    assert (
        router.choose(Complexity.COMPLEX, Lane.BULK, {}, served={AnswerPath.HEAVY}).path
        is AnswerPath.HEAVY
    )
    # Not known (no board, or no live worker yet): every eligible path counts.
    explored = {router.choose(Complexity.SIMPLE, Lane.MEDIUM, {}).path for _ in range(20)}
    assert explored == {AnswerPath.HEAVY}, "exploration leaves the best path for the other one"


def test_the_policy_reads_the_lanes_served_paths() -> None:
    from schemas.messages import InferenceRequest
    from streams.classify.policy import Found, decide

    router = SmartRouter(REGISTRY, RoutingSettings(exploration=0.0))
    request = InferenceRequest(id="r", prompt="Hi", lane=Lane.BULK)
    simple = decide(request, Found(), SETTINGS.routing, router, {})
    assert (simple.lane, simple.path) == (Lane.BULK, AnswerPath.LIGHT)
    served = decide(request, Found(), SETTINGS.routing, router, {}, {Lane.BULK: {AnswerPath.HEAVY}})
    assert (served.lane, served.path) == (Lane.BULK, AnswerPath.HEAVY)
    # A board that knows no worker on the lane does not stop routing.
    nobody = decide(
        request, Found(), SETTINGS.routing, router, {}, {Lane.REALTIME: {AnswerPath.LIGHT}}
    )
    assert nobody.path is AnswerPath.LIGHT


def test_a_failing_path_loses_traffic_and_wins_it_back_through_exploration() -> None:
    routing = RoutingSettings(exploration=0.1)
    router = SmartRouter(REGISTRY, routing, random.Random(7))
    stats: dict[AnswerPath, PathStats] = {}

    def serve(n: int, light_ok: bool) -> int:
        """Route n simple requests, feeding each outcome back; light's share."""
        on_light = 0
        for _ in range(n):
            choice = router.choose(Complexity.SIMPLE, Lane.REALTIME, stats)
            ok = light_ok if choice.path is AnswerPath.LIGHT else True
            latency = 400.0 if choice.path is AnswerPath.LIGHT else 1500.0
            stats[choice.path] = fold(
                stats.get(choice.path), event(choice.path, ok, latency), SETTINGS
            )
            on_light += choice.path is AnswerPath.LIGHT
        return on_light

    assert serve(200, light_ok=True) > 160  # healthy: light is cheaper and faster
    assert serve(200, light_ok=False) < 60  # failing: traffic moves to heavy
    assert stats[AnswerPath.LIGHT].success_rate < 0.5
    # Recovered: exploration keeps sampling light, its record heals, it wins again.
    serve(400, light_ok=True)
    assert serve(200, light_ok=True) > 160


def test_registry_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  - {name: tiny, backend: llamacpp, path: light, max_complexity: simple,"
        " cost_per_1k_tokens: 0.1, lanes: [realtime]}\n"
        "  - {name: big, version: '2', backend: vllm, path: heavy, cost_per_1k_tokens: 2.0}\n"
    )
    registry = load_registry(path, BackendSettings())
    assert isinstance(registry, ModelRegistry)
    assert [m.name for m in registry.eligible(Complexity.SIMPLE, Lane.BULK)] == ["big"]
    assert {m.name for m in registry.eligible(Complexity.SIMPLE, Lane.REALTIME)} == {"tiny", "big"}
    path.write_text("models:\n  - {name: x, backend: nope, path: light}\n")
    with pytest.raises(RegistryError, match=r"models\.yaml"):
        load_registry(path, BackendSettings())


def test_lane_p95() -> None:
    lanes = LaneLatency(size=100)
    for i in range(1, 101):
        lanes.add(Lane.REALTIME, float(i))
    assert lanes.p95() == {Lane.REALTIME: 96.0}


def test_a_lane_whose_traffic_stopped_has_no_p95() -> None:
    """A busy minute's p95 must not hold the flow controller's latency
    level up once the lane is quiet (it held bulk shed for good)."""
    now = [0.0]
    lanes = LaneLatency(size=100, max_age_s=30.0, clock=lambda: now[0])
    for i in range(10):
        lanes.add(Lane.REALTIME, 25_000.0)
        lanes.add(Lane.BULK, 1_000.0 + i)
    now[0] = 20.0
    lanes.add(Lane.BULK, 2_000.0)
    assert lanes.p95() == {Lane.REALTIME: 25_000.0, Lane.BULK: 2_000.0}
    now[0] = 31.0
    assert lanes.p95() == {Lane.BULK: 2_000.0}
    now[0] = 51.0
    assert lanes.p95() == {}


def test_a_lanes_capacity_counts_the_live_workers_that_serve_a_model() -> None:
    from streams.stores.workerboard import PathCard, WorkerCard, lane_capacity

    light = (PathCard(AnswerPath.LIGHT, "llamacpp", "smollm2", "cpu"),)
    cards = [
        WorkerCard("rt-1", Lane.REALTIME, light, 4),
        WorkerCard("rt-2", Lane.REALTIME, light, 4),
        WorkerCard("rt-3", Lane.REALTIME, (), 4),  # its model did not load: serves nothing
        WorkerCard("bulk-1", Lane.BULK, light, 64),
    ]
    assert lane_capacity(cards) == {Lane.REALTIME: 8, Lane.BULK: 64}
    assert lane_capacity([]) == {}
