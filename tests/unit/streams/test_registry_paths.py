"""Model paths are registry data: a third model is one more registry entry.

The ``AnswerPath`` type (any well-formed name, ``cache`` and ``rules`` reserved),
the registry's derived fallbacks, cheapest and most capable paths, the lane
workers' default paths, and the router, flow control and executor using
them for a path the code does not name.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, RoutedRequest
from schemas.settings import BackendSettings, RoutingSettings, Settings
from streams.classify.flow import apply_level
from streams.classify.policy import Decision
from streams.classify.router import SmartRouter
from streams.routing.features import Complexity
from streams.routing.registry import (
    ModelRegistry,
    RegistryError,
    builtin_registry,
    load_registry,
    worker_paths,
)
from tests.unit.workers.test_execution import Exploding, Named, rules_slot, slot_of
from workers.execution import Executor, backend_slots

THREE = """\
models:
  - {name: smollm2-135m, backend: llamacpp, path: light, max_complexity: simple,
     cost_per_1k_tokens: 0.0002, expected_latency_ms: 800}
  - {name: qwen-0.5b, backend: llamacpp, path: mid, max_complexity: moderate,
     cost_per_1k_tokens: 0.0005, expected_latency_ms: 1200}
  - {name: gemma3-270m, backend: llamacpp, path: heavy, cost_per_1k_tokens: 0.001,
     expected_latency_ms: 2000}
"""


@pytest.fixture
def three(tmp_path: Path) -> ModelRegistry:
    file = tmp_path / "models.yaml"
    file.write_text(THREE)
    return load_registry(file, BackendSettings())


def test_a_path_is_any_well_formed_name_and_shared_per_name() -> None:
    assert AnswerPath("light") is AnswerPath.LIGHT and AnswerPath("mid") is AnswerPath("mid")
    assert AnswerPath("mid") == "mid" and {AnswerPath("mid"): 1}["mid"] == 1
    assert str(AnswerPath("mid")) == f"{Path('mid')}" == AnswerPath("mid").value == "mid"
    assert pickle.loads(pickle.dumps(AnswerPath("mid"))) is AnswerPath("mid")
    assert AnswerPath("mid").is_model and AnswerPath.HEAVY.is_model
    assert not AnswerPath.CACHE.is_model and not AnswerPath.RULES.is_model
    for bad in ("", "Mid", "mid model", "9th", "x" * 33, "mid\n"):
        with pytest.raises(ValueError, match="not a path name"):
            AnswerPath(bad)
    assert AnswerPath.names_model("mid") and not AnswerPath.names_model("rules")
    assert not AnswerPath.names_model("No pe") and not AnswerPath.names_model(None)


def test_a_result_on_a_registry_path_round_trips_on_the_wire() -> None:
    result = InferenceResult(id="r", status="ok", output="x", path="mid", requested_path="heavy")
    again = InferenceResult.model_validate_json(result.model_dump_json())
    assert again == result and again.path is AnswerPath("mid")
    assert '"path":"mid"' in result.model_dump_json()
    with pytest.raises(ValidationError):
        InferenceResult(id="r", status="ok", path="Mid Path")


def test_cache_and_rules_are_not_registry_paths() -> None:
    for reserved in ("cache", "rules"):
        with pytest.raises(ValidationError, match="not a model path"):
            ModelRegistry.model_validate(
                {"models": [{"name": "m", "backend": "llamacpp", "path": reserved}]}
            )


def test_fallbacks_are_derived_nearest_capability_first(three: ModelRegistry) -> None:
    builtin = builtin_registry(BackendSettings())
    assert builtin.fallbacks(AnswerPath.LIGHT) == (AnswerPath.HEAVY,)
    assert builtin.fallbacks(AnswerPath.HEAVY) == (AnswerPath.LIGHT,)
    assert three.model_paths == (AnswerPath.LIGHT, AnswerPath("mid"), AnswerPath.HEAVY)
    assert three.fallbacks(AnswerPath.LIGHT) == (AnswerPath("mid"), AnswerPath.HEAVY)
    assert three.fallbacks(AnswerPath("mid")) == (
        AnswerPath.HEAVY,
        AnswerPath.LIGHT,
    )  # a tie: the more capable
    assert three.fallbacks(AnswerPath.HEAVY) == (AnswerPath("mid"), AnswerPath.LIGHT)
    assert three.fallbacks(AnswerPath("nowhere")) == ()


def test_a_fallback_may_be_given_and_must_name_another_path() -> None:
    entries = [
        {"name": "a", "backend": "llamacpp", "path": "light", "fallback": []},
        {"name": "b", "backend": "llamacpp", "path": "heavy", "fallback": ["light"]},
    ]
    registry = ModelRegistry.model_validate({"models": entries})
    assert registry.fallbacks(AnswerPath.LIGHT) == () and registry.fallbacks(AnswerPath.HEAVY) == (
        AnswerPath.LIGHT,
    )
    entries[1]["fallback"] = ["mid"]
    with pytest.raises(ValidationError, match=r"fallback \['mid'\] is not another path"):
        ModelRegistry.model_validate({"models": entries})


def test_lane_workers_default_to_the_registry_paths(three: ModelRegistry) -> None:
    settings = Settings()
    builtin = builtin_registry(settings.backend)
    assert worker_paths(settings, Lane.REALTIME, builtin) == (AnswerPath.LIGHT,)
    assert worker_paths(settings, Lane.MEDIUM, builtin) == (AnswerPath.LIGHT, AnswerPath.HEAVY)
    assert worker_paths(settings, Lane.BULK, builtin) == (AnswerPath.HEAVY,)
    # A third entry is served by the medium workers without another setting.
    assert worker_paths(settings, Lane.MEDIUM, three) == (
        AnswerPath.LIGHT,
        AnswerPath("mid"),
        AnswerPath.HEAVY,
    )
    assert three.cheapest(Lane.REALTIME) == AnswerPath.LIGHT
    assert three.most_capable(Lane.BULK) == AnswerPath.HEAVY


def test_lane_paths_and_the_forced_path_must_be_registry_paths(
    three: ModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANEWAY_BULK_PATHS", '["mid"]')
    assert worker_paths(Settings(), Lane.BULK, three) == (AnswerPath("mid"),)
    with pytest.raises(RegistryError, match=r"\['mid'\], which the model registry does not name"):
        worker_paths(Settings(), Lane.BULK, builtin_registry(BackendSettings()))
    monkeypatch.setenv("LANEWAY_ROUTING_FORCE_PATH", "heavy")
    assert worker_paths(Settings(), Lane.BULK, three) == (AnswerPath.HEAVY,)
    monkeypatch.setenv("LANEWAY_BULK_PATHS", '["Mid"]')
    with pytest.raises(ValidationError):
        Settings()


def test_the_router_sends_moderate_work_to_the_third_path(three: ModelRegistry) -> None:
    router = SmartRouter(three, RoutingSettings(exploration=0.0))
    assert router.choose(Complexity.SIMPLE, Lane.MEDIUM, {}).path == AnswerPath.LIGHT
    assert router.choose(Complexity.MODERATE, Lane.MEDIUM, {}).path == AnswerPath("mid")
    assert router.choose(Complexity.COMPLEX, Lane.MEDIUM, {}).path == AnswerPath.HEAVY
    # Not served on the lane: the lane's served paths compete instead.
    served = {AnswerPath.LIGHT, AnswerPath.HEAVY}
    assert router.choose(Complexity.MODERATE, Lane.MEDIUM, {}, served).path == AnswerPath.HEAVY


def decision(path: AnswerPath, complexity: Complexity = Complexity.MODERATE) -> Decision:
    return Decision(Lane.MEDIUM, path, complexity)


def test_under_load_dearer_paths_move_to_the_cheapest(three: ModelRegistry) -> None:
    cheapest = three.cheapest(Lane.MEDIUM)
    for dearer in (AnswerPath("mid"), AnswerPath.HEAVY):
        moved = apply_level(decision(dearer), 1, 1000, cheapest=cheapest)
        assert isinstance(moved, Decision)
        assert moved.path == AnswerPath.LIGHT and moved.requested_path == dearer
    kept = apply_level(decision(AnswerPath("mid"), Complexity.COMPLEX), 1, 1000, cheapest=cheapest)
    assert isinstance(kept, Decision) and kept.path == AnswerPath("mid")  # complex stays at level 1
    assert apply_level(decision(AnswerPath("mid")), 0, 1000, cheapest=cheapest) == decision(
        AnswerPath("mid")
    )


def routed(path: AnswerPath) -> RoutedRequest:
    now = int(time.time() * 1000)
    return RoutedRequest(
        request=InferenceRequest(id="r", prompt="ping"),
        lane=Lane.MEDIUM,
        path=path,
        reply_to="laneway.replies",
        produced_at_ms=now,
        routed_at_ms=now,
    )


async def test_a_failing_third_path_falls_back_as_the_registry_says(
    three: ModelRegistry,
) -> None:
    mid = Exploding(RuntimeError("connection refused"))
    slots = {
        AnswerPath("mid"): slot_of(mid),
        AnswerPath.HEAVY: slot_of(Named("gemma")),
        AnswerPath.RULES: rules_slot(),
    }
    fallbacks = {path: three.fallbacks(path) for path in three.model_paths}
    executor = Executor(Lane.MEDIUM, slots, fallbacks=fallbacks)
    (done,) = await executor.execute([routed(AnswerPath("mid"))])
    result = done.result
    assert result.status == "ok" and result.path == AnswerPath.HEAVY and result.degraded
    assert result.requested_path == AnswerPath("mid") and len(mid.seen) == 1
    # Given no fallback, nothing else is tried.
    alone = Executor(
        Lane.MEDIUM, {AnswerPath("mid"): slot_of(mid)}, fallbacks={AnswerPath("mid"): ()}
    )
    (done,) = await alone.execute([routed(AnswerPath("mid"))])
    assert done.result.error is not None and done.result.error.code == "INF-502"


def test_backend_slots_load_every_registry_path_and_refuse_unknown_ones(
    three: ModelRegistry,
) -> None:
    slots = backend_slots(BackendSettings(), None, three)
    assert list(slots) == [AnswerPath.LIGHT, AnswerPath("mid"), AnswerPath.HEAVY, AnswerPath.RULES]
    assert slots[AnswerPath("mid")].label == "mid=llamacpp:qwen-0.5b@1"
    with pytest.raises(ValueError, match="no model path nowhere in the registry"):
        backend_slots(BackendSettings(), [AnswerPath("nowhere")], three)
