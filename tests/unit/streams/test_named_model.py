"""A request that names its model (OpenAI's ``model``): checked against the
registry, sent down that model's path on a lane that serves it, answered by
no rule and by no other path's cache entry, never moved by flow control."""

from __future__ import annotations

import json

import pytest

from schemas.messages import AnswerPath, InferenceRequest, InferenceResult, Lane, RoutedRequest
from schemas.settings import RoutingSettings, Settings
from streams.cache.keys import cache_key, cache_scope
from streams.cache.response import CacheHit
from streams.classify.app import _choice
from streams.classify.classifier import (
    Admitted,
    Classified,
    SourceRecord,
    admit,
    classify_record,
    route,
)
from streams.classify.flow import LaneFull
from streams.classify.policy import Found, lane_serving
from streams.classify.router import SmartRouter
from streams.routing.registry import ModelRegistry, builtin_registry, lanes_serving
from streams.rules.engine import RuleBook

SETTINGS = Settings(routing=RoutingSettings(exploration=0.0))
NOW = 1_700_000_000_000
REGISTRY = builtin_registry(SETTINGS.backend)


def record(value: bytes) -> SourceRecord:
    return SourceRecord(
        value=value, key=b"k", timestamp_ms=NOW - 5, topic="laneway.requests", partition=0, offset=7
    )


def body(**fields: object) -> bytes:
    return json.dumps(
        {"id": "req-1", "prompt": "What is the capital of France?", **fields}
    ).encode()


def classify(value: bytes) -> Classified:
    return classify_record(record(value), now_ms=NOW, settings=SETTINGS, rules=RuleBook())


def routed_of(out: Classified) -> RoutedRequest:
    assert out.outcome == "routed", out
    return RoutedRequest.model_validate_json(out.records[0].value)


def admitted(**fields: object) -> Admitted:
    done = admit(record(body(**fields)), now_ms=NOW, settings=SETTINGS, registry=REGISTRY)
    assert isinstance(done, Admitted)
    return done


def test_the_registry_knows_each_model_by_path_name_and_result_name() -> None:
    assert REGISTRY.model_names == (
        "auto",
        "light",
        "heavy",
        "smollm2-135m",
        "llamacpp:smollm2-135m",
        "gemma3-270m",
        "llamacpp:gemma3-270m",
    )
    light = REGISTRY.named("light")
    assert light is not None and (light.path, light.version, light.name) == (
        "light",
        None,
        "smollm2-135m",
    )
    gemma = REGISTRY.named("llamacpp:gemma3-270m")
    assert gemma is not None and (gemma.path, gemma.version) == ("heavy", "q4_k_m")
    assert REGISTRY.named("auto") is None and REGISTRY.named("gpt-4o") is None


def test_without_a_model_or_with_auto_the_router_chooses() -> None:
    assert routed_of(classify(body())).path == "light"
    auto = classify(body(model="auto"))
    assert routed_of(auto).path == "light" and auto.decision is not None
    assert auto.decision.named is None and _choice(auto.decision) == "scored"


def test_a_named_path_is_the_path_run_on_a_lane_whose_workers_serve_it() -> None:
    # A simple question: the router would send it to light on realtime, whose
    # workers load only light; heavy is served on medium (and bulk).
    out = classify(body(model="heavy"))
    routed = routed_of(out)
    assert (routed.path, routed.lane, routed.version) == ("heavy", "medium", None)
    assert routed.request.model == "heavy"
    assert out.decision is not None and _choice(out.decision) == "named"
    assert routed.router_version is None  # the client chose it, not a router


def test_a_models_name_names_its_version_too() -> None:
    routed = routed_of(classify(body(model="gemma3-270m")))
    assert (routed.path, routed.version) == ("heavy", "q4_k_m")
    routed = routed_of(classify(body(model="llamacpp:smollm2-135m")))
    assert (routed.path, routed.lane, routed.version) == ("light", "realtime", "q4_1")


def test_an_unknown_model_is_inf_400_naming_the_models_there_are() -> None:
    out = classify(body(model="gpt-4o", reply_to="laneway.replies.acme"))
    assert out.outcome == "rejected"
    dlq, reply, _results, _quality = out.records
    assert dlq.topic == "laneway.dlq"
    assert dict(dlq.headers)["laneway-error-code"] == b"INF-400"
    result = InferenceResult.model_validate_json(reply.value)
    assert result.error is not None and result.error.code == "INF-400"
    assert result.error.message == (
        "model 'gpt-4o' is not served here: name one of auto, light, heavy, smollm2-135m, "
        "llamacpp:smollm2-135m, gemma3-270m, llamacpp:gemma3-270m"
    )
    assert reply.topic == "laneway.replies.acme"


def test_no_rule_answers_a_request_that_named_its_model() -> None:
    assert classify(body(prompt="hello")).outcome == "answered"  # the greeting rule
    routed = routed_of(classify(body(prompt="hello", model="light")))
    assert routed.path == "light"


def test_the_cache_keeps_a_named_models_answers_apart() -> None:
    def scope(**fields: object) -> str:
        request = InferenceRequest.model_validate_json(body(**fields))
        return cache_scope(request, SETTINGS.cache)

    assert scope() == scope(model="auto")  # keys of requests without a model are unchanged
    assert scope(model="heavy") != scope()
    assert scope(model="heavy") != scope(model="light")
    plain = InferenceRequest.model_validate_json(body())
    assert cache_key(plain, SETTINGS.cache) == cache_key(
        InferenceRequest.model_validate_json(body(model="auto")), SETTINGS.cache
    )


def test_a_cache_entry_of_the_named_model_still_answers() -> None:
    router = SmartRouter(REGISTRY, SETTINGS.routing)
    hit = CacheHit("Paris.", "exact", 1.0, "llamacpp:gemma3-270m", AnswerPath.HEAVY, "k", 3)
    out = route(
        admitted(model="heavy"), Found(hit=hit), now_ms=NOW, settings=SETTINGS, router=router
    )
    assert out.outcome == "answered" and out.result is not None
    assert out.result.model == "cache:exact:llamacpp:gemma3-270m"
    assert out.result.usage.completion_tokens == 3  # the entry's own count


def test_the_worker_board_decides_the_lane_when_it_says() -> None:
    router = SmartRouter(REGISTRY, SETTINGS.routing)
    both = {
        Lane.REALTIME: frozenset({AnswerPath.LIGHT, AnswerPath.HEAVY}),
        Lane.MEDIUM: frozenset(),
    }
    out = route(
        admitted(model="heavy"), Found(), now_ms=NOW, settings=SETTINGS, router=router, serving=both
    )
    assert routed_of(out).lane == "realtime"
    bulk_only = {
        Lane.REALTIME: frozenset({AnswerPath.LIGHT}),
        Lane.BULK: frozenset({AnswerPath.HEAVY}),
    }
    assert lane_serving(Lane.REALTIME, AnswerPath.HEAVY, bulk_only, (Lane.MEDIUM,)) is Lane.BULK
    assert (
        lane_serving(Lane.REALTIME, AnswerPath.HEAVY, None, (Lane.MEDIUM, Lane.BULK)) is Lane.MEDIUM
    )
    assert (
        lane_serving(Lane.BULK, AnswerPath.HEAVY, None, ()) is Lane.BULK
    )  # nowhere known: as asked


def test_configured_lanes_follow_the_lane_settings() -> None:
    assert lanes_serving(SETTINGS, REGISTRY, AnswerPath.HEAVY) == (Lane.MEDIUM, Lane.BULK)
    assert lanes_serving(SETTINGS, REGISTRY, AnswerPath.LIGHT) == (Lane.REALTIME, Lane.MEDIUM)
    heavy_everywhere = SETTINGS.model_copy(
        update={"realtime": SETTINGS.realtime.model_copy(update={"paths": (AnswerPath.HEAVY,)})}
    )
    assert Lane.REALTIME in lanes_serving(heavy_everywhere, REGISTRY, AnswerPath.HEAVY)


def test_load_never_moves_a_named_model_to_another_path() -> None:
    router = SmartRouter(REGISTRY, SETTINGS.routing)
    question = admitted(model="heavy", prompt="Explain why the sky is blue.")
    for level in (1, 2, 3):
        out = route(question, Found(), now_ms=NOW, settings=SETTINGS, router=router, level=level)
        routed = routed_of(out)
        assert routed.path == "heavy" and routed.requested_path is None
    unnamed = admitted(prompt="Explain why the sky is blue.", lane="medium")
    moved = routed_of(
        route(unnamed, Found(), now_ms=NOW, settings=SETTINGS, router=router, level=1)
    )
    assert moved.path == "light" and moved.requested_path == "heavy"  # as before


def test_a_full_realtime_lane_refuses_a_named_model_that_asked_for_it() -> None:
    router = SmartRouter(REGISTRY, SETTINGS.routing)
    full = LaneFull(Lane.REALTIME, waiting=99, retry_after_ms=200)
    out = route(
        admitted(model="light", lane="realtime"),
        Found(),
        now_ms=NOW,
        settings=SETTINGS,
        router=router,
        full=lambda path: full,
    )
    assert out.outcome == "shed"


def test_a_canary_can_be_named_and_a_retired_version_cannot() -> None:
    registry = ModelRegistry.model_validate(
        {
            "models": [
                {"name": "smollm2-135m", "backend": "llamacpp", "path": "light"},
                {
                    "name": "smollm2-360m",
                    "version": "2",
                    "state": "canary",
                    "share": 0.1,
                    "backend": "llamacpp",
                    "path": "light",
                },
                {
                    "name": "old-model",
                    "version": "0",
                    "state": "retired",
                    "backend": "llamacpp",
                    "path": "light",
                },
            ]
        }
    )
    canary = registry.named("smollm2-360m")
    assert canary is not None and (canary.path, canary.version) == ("light", "2")
    assert registry.named("old-model") is None
    assert "old-model" not in registry.model_names
    router = SmartRouter(registry, SETTINGS.routing)
    out = classify_record(
        record(body(model="smollm2-360m")),
        now_ms=NOW,
        settings=SETTINGS,
        rules=RuleBook(),
        router=router,
    )
    assert routed_of(out).version == "2"


@pytest.mark.parametrize("name", ["auto", "light", "llamacpp:gemma3-270m"])
def test_admit_accepts_every_name_the_registry_lists(name: str) -> None:
    assert admitted(model=name).request.model == name
