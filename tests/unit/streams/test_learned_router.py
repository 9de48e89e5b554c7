"""The learned router as one more signal in the SmartRouter, on a small
artifact written here by hand (so the expected ``p`` can be worked out)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from schemas.messages import AnswerPath, InferenceRequest, Lane, RoutedRequest
from schemas.settings import BackendSettings, RoutingSettings, Settings
from streams.classify.classifier import SourceRecord, classify_record
from streams.classify.router import SmartRouter
from streams.routing.features import Complexity, RequestFeatures, complexity_of, extract_features
from streams.routing.learned import BASE_FEATURES, LearnedRouter, RouterArtifact, save_artifact
from streams.routing.registry import builtin_registry
from streams.rules.engine import RuleBook

REGISTRY = builtin_registry(BackendSettings())
ROUTING = RoutingSettings(exploration=0.0)
LONG = "Tell me about the history of the old lighthouse on the northern coast, " * 3


def artifact() -> RouterArtifact:
    """p = sigmoid(1 - 3*reasoning [- 4*e0 with an embedding]); threshold 0.5:
    light is good enough unless the request asks for reasoning (or its
    embedding points along e0)."""
    names = [*BASE_FEATURES, "language=en"]
    coef = [0.0] * len(names)
    coef[names.index("reasoning")] = -3.0
    heads = {
        "features": {"inputs": "features", "coef": coef, "intercept": 1.0, "threshold": 0.5},
        "full": {
            "inputs": "features+embedding",
            "coef": [*coef, -4.0, 0.0],
            "intercept": 1.0,
            "threshold": 0.5,
        },
    }
    return RouterArtifact.model_validate(
        {
            "version": "lr-test",
            "created": "2026-12-03T16:00:00Z",
            "features": names,
            "mean": [0.0] * len(names),
            "scale": [1.0] * len(names),
            "embedding_model": "test",
            "embedding_dim": 2,
            "heads": heads,
            "heavy_share": 0.3,
        }
    )


def features(prompt: str) -> RequestFeatures:
    return extract_features(InferenceRequest(id="r", prompt=prompt), ROUTING)


def test_scoring_is_the_artifact_formula() -> None:
    router = LearnedRouter(artifact())
    p, margin = router.margin(features("Explain why the sky is blue."))
    assert p == pytest.approx(1 / (1 + math.exp(2)))  # 1 - 3
    assert margin == pytest.approx(math.log(p / (1 - p)))  # logit(0.5) = 0
    p_plain, _ = router.margin(features("Name a colour."))
    assert p_plain == pytest.approx(1 / (1 + math.exp(-1)))
    p_full, margin_full = router.margin(features("Name a colour."), np.array([1.0, 0.0]))
    assert p_full == pytest.approx(1 / (1 + math.exp(3))) and margin_full < 0
    with pytest.raises(ValueError, match="embeddings of shape"):
        router.probabilities([features("x")], np.zeros((1, 3)))


def test_without_an_artifact_routing_is_unchanged() -> None:
    plain = SmartRouter(REGISTRY, ROUTING)
    assert plain.learned is None
    for prompt in ("Name a colour.", "Explain why the sky is blue.", LONG):
        f = features(prompt)
        c = complexity_of(f, ROUTING)
        for lane in Lane:
            assert (
                plain.choose(c, lane, {}, features=f, embedding=np.ones(2)).path
                == plain.choose(c, lane, {}).path
            )


def test_the_learned_term_moves_decisions_both_ways() -> None:
    plain = SmartRouter(REGISTRY, ROUTING)
    learned = SmartRouter(REGISTRY, ROUTING, learned=LearnedRouter(artifact()))
    # Simple by the rule, light both ways on features alone...
    colour = features("Name a colour.")
    assert complexity_of(colour, ROUTING) is Complexity.SIMPLE
    assert plain.choose(Complexity.SIMPLE, Lane.MEDIUM, {}).path is AnswerPath.LIGHT
    choice = learned.choose(Complexity.SIMPLE, Lane.MEDIUM, {}, features=colour)
    assert choice.path is AnswerPath.LIGHT and choice.learned_p is not None
    # ...but heavy once the embedding says light is not good enough.
    heavy = learned.choose(
        Complexity.SIMPLE, Lane.MEDIUM, {}, features=colour, embedding=np.array([1.0, 0.0])
    )
    assert heavy.path is AnswerPath.HEAVY and heavy.scores["light"] > heavy.scores["heavy"]
    # A long prompt is moderate by the rule (heavy); the learned router judges
    # it light enough, and every model serving the lane competes.
    long = features(LONG)
    assert complexity_of(long, ROUTING) is Complexity.MODERATE
    assert plain.choose(Complexity.MODERATE, Lane.MEDIUM, {}).path is AnswerPath.HEAVY
    assert (
        learned.choose(Complexity.MODERATE, Lane.MEDIUM, {}, features=long).path is AnswerPath.LIGHT
    )
    # A reasoning request: heavy either way.
    why = features("Explain why the sky is blue.")
    assert (
        learned.choose(Complexity.MODERATE, Lane.MEDIUM, {}, features=why).path is AnswerPath.HEAVY
    )


def test_scope_and_weight_settings() -> None:
    long = features(LONG)
    only_simple = RoutingSettings(exploration=0.0, learned_max_complexity="simple")
    router = SmartRouter(REGISTRY, only_simple, learned=LearnedRouter(artifact()))
    choice = router.choose(Complexity.MODERATE, Lane.MEDIUM, {}, features=long)
    assert choice.path is AnswerPath.HEAVY and choice.learned_p is None
    off = SmartRouter(
        REGISTRY, RoutingSettings(exploration=0.0, w_learned=0), learned=LearnedRouter(artifact())
    )
    assert off.choose(Complexity.MODERATE, Lane.MEDIUM, {}, features=long).path is AnswerPath.HEAVY
    # The lane's served paths still bound the choice.
    router = SmartRouter(REGISTRY, ROUTING, learned=LearnedRouter(artifact()))
    colour = features("Name a colour.")
    served = router.choose(
        Complexity.SIMPLE,
        Lane.REALTIME,
        {},
        {AnswerPath.LIGHT},
        features=colour,
        embedding=np.ones(2),
    )
    assert served.path is AnswerPath.LIGHT


def test_the_setting_loads_the_artifact_and_the_classifier_uses_it(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    save_artifact(artifact(), path)
    settings = Settings().model_copy(
        update={"routing": RoutingSettings(exploration=0.0, learned_router=path)}
    )
    router = SmartRouter(REGISTRY, settings.routing)
    assert router.learned is not None and router.learned.version == "lr-test"
    raw = json.dumps({"id": "q", "prompt": LONG, "lane": "medium"}).encode()
    record = SourceRecord(raw, None, 1_000, "laneway.requests", 0, 0)
    out = classify_record(record, now_ms=1_000, settings=settings, rules=RuleBook(), router=router)
    routed = RoutedRequest.model_validate_json(out.records[0].value)
    assert routed.path is AnswerPath.LIGHT  # the rule alone would send it heavy
    plain = classify_record(record, now_ms=1_000, settings=Settings(), rules=RuleBook())
    assert RoutedRequest.model_validate_json(plain.records[0].value).path is AnswerPath.HEAVY
