import random

import pytest

from schemas.messages import AnswerPath, InferenceRequest, Lane
from schemas.settings import BackendSettings, RoutingSettings
from streams.classify.policy import Decision, Found, decide
from streams.classify.router import SmartRouter
from streams.routing.features import Complexity, estimate_tokens
from streams.routing.registry import builtin_registry
from streams.rules.engine import Rule, RuleBook

ROUTING = RoutingSettings(exploration=0.0)
RULES = RuleBook()


def request(prompt: str, **fields: object) -> InferenceRequest:
    return InferenceRequest.model_validate({"id": "r", "prompt": prompt, **fields})


def decide_on(req: InferenceRequest, routing: RoutingSettings = ROUTING) -> Decision:
    router = SmartRouter(builtin_registry(BackendSettings()), routing, random.Random(1))
    rule = RULES.answer(req.user_text()) if routing.rules_enabled else None
    return decide(req, Found(rule=rule), routing, router, {})


@pytest.mark.parametrize(
    ("prompt", "path", "lane", "complexity"),
    [
        ("Hello!", AnswerPath.RULES, Lane.REALTIME, Complexity.SIMPLE),
        ("thanks a lot", AnswerPath.RULES, Lane.REALTIME, Complexity.SIMPLE),
        ("ping", AnswerPath.RULES, Lane.REALTIME, Complexity.SIMPLE),
        ("What is the capital of France?", AnswerPath.LIGHT, Lane.REALTIME, Complexity.SIMPLE),
        ("Explain why the sky is blue.", AnswerPath.HEAVY, Lane.MEDIUM, Complexity.MODERATE),
        ("What is 12 * 7?", AnswerPath.HEAVY, Lane.MEDIUM, Complexity.COMPLEX),
        ("```python\nprint(1)\n```", AnswerPath.HEAVY, Lane.MEDIUM, Complexity.COMPLEX),
        ("word " * 60, AnswerPath.HEAVY, Lane.MEDIUM, Complexity.MODERATE),
    ],
)
def test_path_lane_and_complexity(
    prompt: str, path: AnswerPath, lane: Lane, complexity: Complexity
) -> None:
    decision = decide_on(request(prompt))
    assert (decision.path, decision.lane, decision.complexity) == (path, lane, complexity)


def test_hint_wins_over_policy() -> None:
    assert decide_on(request("Explain it", lane="realtime")).lane is Lane.REALTIME
    assert decide_on(request("hi there", lane="bulk")).lane is Lane.BULK


def test_batch_jobs_ride_bulk_and_tight_deadlines_realtime() -> None:
    assert decide_on(request("Name a colour", batch_id="b1")).lane is Lane.BULK
    hard = request("Explain relativity", deadline_ms=ROUTING.realtime_max_deadline_ms)
    assert decide_on(hard).lane is Lane.REALTIME
    relaxed = request("Explain relativity", deadline_ms=ROUTING.realtime_max_deadline_ms + 1)
    assert decide_on(relaxed).lane is Lane.MEDIUM


def test_tenant_tier_moves_lanes() -> None:
    tiers = RoutingSettings(exploration=0.0, tenant_tiers={"vip": "premium", "cheap": "free"})
    assert decide_on(request("Explain relativity", tenant="vip"), tiers).lane is Lane.REALTIME
    assert decide_on(request("Solve 3x + 4 = 10", tenant="cheap"), tiers).lane is Lane.BULK
    assert decide_on(request("Solve 3x + 4 = 10", tenant="other"), tiers).lane is Lane.MEDIUM


def test_rules_can_be_switched_off() -> None:
    decision = decide_on(request("Hello"), RoutingSettings(rules_enabled=False, exploration=0))
    assert decision.path is AnswerPath.LIGHT and decision.rule is None


def test_light_threshold_is_a_setting() -> None:
    prompt = "What colour is a ripe banana usually?"
    assert decide_on(request(prompt)).path is AnswerPath.LIGHT
    tight = RoutingSettings(light_max_prompt_tokens=estimate_tokens(prompt) - 1, exploration=0)
    assert decide_on(request(prompt), tight).path is AnswerPath.HEAVY


def test_messages_are_measured_whole() -> None:
    long_history = [{"role": "user", "content": "word " * 100}, {"role": "user", "content": "ok?"}]
    req = InferenceRequest.model_validate({"id": "r", "messages": long_history})
    assert decide_on(req).path is AnswerPath.HEAVY


def test_force_path_skips_rules_and_router() -> None:
    forced = RoutingSettings(force_path="heavy")
    decision = decide_on(request("Hello"), forced)
    assert decision.path is AnswerPath.HEAVY and decision.rule is None


def test_rule_templates_fill_named_groups() -> None:
    book = RuleBook((Rule.of("order", r"order (?P<order>\d+)", "Looking up order {order}."),))
    answer = book.answer("where is order 123?")
    assert answer is not None and answer.text == "Looking up order 123." and answer.rule == "order"
    assert book.answer("where is my parcel") is None
