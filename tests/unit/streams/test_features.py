import pytest

from schemas.messages import InferenceRequest
from schemas.settings import RoutingSettings
from streams.routing.features import (
    Complexity,
    complexity_of,
    detect_language,
    extract_features,
    text_traits,
)

ROUTING = RoutingSettings()


def features(prompt: str | None = None, messages: list[dict[str, str]] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    body: dict[str, object] = {"id": "r", **kw}
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    return extract_features(InferenceRequest.model_validate(body), ROUTING)


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("Where is my order?", "en"),
        ("¿Dónde está mi pedido?", "es"),
        ("Où est ma commande ?", "fr"),
        ("Wo ist meine Bestellung? Ich warte", "de"),
        ("我的订单在哪里", "zh"),
        ("注文はどこですか", "ja"),
        ("Где мой заказ?", "ru"),
        ("12345", "und"),
    ],
)
def test_language(text: str, language: str) -> None:
    assert detect_language(text) == language


def test_code_and_maths_are_seen() -> None:
    assert features("```python\nprint(1)\n```").has_code
    assert features("def add(a, b): return a + b").has_code
    assert features("What is 12 * 7?").has_math
    assert not features("What is the capital of France?").has_math
    assert not features("Where is my order?").has_code


def test_code_anywhere_in_the_conversation_counts() -> None:
    turns = [
        {"role": "user", "content": "def add(a, b): return a + b"},
        {"role": "assistant", "content": "A function."},
        {"role": "user", "content": "Is it right?"},
    ]
    assert features(messages=turns).has_code
    assert not features(messages=turns[2:]).has_code


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "Explain why 3 * 4 = 12, step by step"},
        {"prompt": "¿Dónde está mi pedido?", "tenant": "acme", "deadline_ms": 900},
        {
            "messages": [
                {"role": "user", "content": "import os"},
                {"role": "user", "content": "why?"},
            ]
        },
    ],
)
def test_traits_worked_out_before_give_the_same_features(body: dict[str, object]) -> None:
    request = InferenceRequest.model_validate({"id": "r", **body})
    alone = extract_features(request, ROUTING, intent="x", history_turns=2)
    known = text_traits(request.user_text())
    assert extract_features(request, ROUTING, intent="x", history_turns=2, traits=known) == alone
    other = text_traits("def f(): pass")  # another text's traits are not used
    assert extract_features(request, ROUTING, intent="x", history_turns=2, traits=other) == alone


def test_depth_counts_earlier_turns_and_history() -> None:
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and then?"},
    ]
    assert features(messages=turns).depth == 2
    request = InferenceRequest.model_validate({"id": "r", "prompt": "and then?"})
    assert extract_features(request, ROUTING, history_turns=8).depth == 8


def test_complexity_classes() -> None:
    assert complexity_of(features("What is the capital of France?"), ROUTING) is Complexity.SIMPLE
    assert complexity_of(features("Explain how tides work"), ROUTING) is Complexity.MODERATE
    assert complexity_of(features("Solve 3x + 4 = 10"), ROUTING) is Complexity.COMPLEX
    assert complexity_of(features("word " * 200), ROUTING) is Complexity.COMPLEX
    deep = InferenceRequest.model_validate({"id": "r", "prompt": "ok?"})
    many = extract_features(deep, ROUTING, history_turns=ROUTING.deep_dialogue + 1)
    assert complexity_of(many, ROUTING) is Complexity.MODERATE


def test_tier_comes_from_settings_not_the_request() -> None:
    routing = RoutingSettings(tenant_tiers={"acme": "premium"})
    acme = InferenceRequest.model_validate({"id": "r", "prompt": "x", "tenant": "acme"})
    other = InferenceRequest.model_validate({"id": "r", "prompt": "x", "tenant": "zed"})
    assert extract_features(acme, routing).tier == "premium"
    assert extract_features(other, routing).tier == "standard"
