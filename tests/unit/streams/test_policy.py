import pytest

from schemas.messages import InferenceRequest, Lane, Path
from schemas.settings import RoutingSettings
from streams.policy import decide, estimate_tokens, looks_hard
from streams.rules import Rule, RuleBook

ROUTING = RoutingSettings()
RULES = RuleBook()


def request(prompt: str, **fields: object) -> InferenceRequest:
    return InferenceRequest.model_validate({"id": "r", "prompt": prompt, **fields})


@pytest.mark.parametrize(
    ("prompt", "path", "lane"),
    [
        ("Hello!", Path.RULES, Lane.REALTIME),
        ("thanks a lot", Path.RULES, Lane.REALTIME),
        ("ping", Path.RULES, Lane.REALTIME),
        ("What is the capital of France?", Path.LIGHT, Lane.REALTIME),
        ("Explain why the sky is blue.", Path.HEAVY, Lane.MEDIUM),
        ("What is 12 * 7?", Path.HEAVY, Lane.MEDIUM),
        ("```python\nprint(1)\n```", Path.HEAVY, Lane.MEDIUM),
        ("word " * 60, Path.HEAVY, Lane.MEDIUM),
    ],
)
def test_path_and_lane(prompt: str, path: Path, lane: Lane) -> None:
    decision = decide(request(prompt), ROUTING, RULES)
    assert (decision.path, decision.lane) == (path, lane)


def test_hint_wins_over_policy() -> None:
    assert decide(request("Explain it", lane="realtime"), ROUTING, RULES).lane is Lane.REALTIME
    assert decide(request("hi there", lane="bulk"), ROUTING, RULES).lane is Lane.BULK


def test_batch_jobs_ride_bulk_and_tight_deadlines_realtime() -> None:
    assert decide(request("Name a colour", batch_id="b1"), ROUTING, RULES).lane is Lane.BULK
    hard = request("Explain relativity", deadline_ms=ROUTING.realtime_max_deadline_ms)
    assert decide(hard, ROUTING, RULES).lane is Lane.REALTIME
    relaxed = request("Explain relativity", deadline_ms=ROUTING.realtime_max_deadline_ms + 1)
    assert decide(relaxed, ROUTING, RULES).lane is Lane.MEDIUM


def test_rules_can_be_switched_off() -> None:
    decision = decide(request("Hello"), RoutingSettings(rules_enabled=False), RULES)
    assert decision.path is Path.LIGHT and decision.rule is None


def test_light_threshold_is_a_setting() -> None:
    prompt = "What colour is a ripe banana usually?"
    assert decide(request(prompt), ROUTING, RULES).path is Path.LIGHT
    tight = RoutingSettings(light_max_prompt_tokens=estimate_tokens(prompt) - 1)
    assert decide(request(prompt), tight, RULES).path is Path.HEAVY


def test_messages_are_measured_whole() -> None:
    long_history = [{"role": "user", "content": "word " * 100}, {"role": "user", "content": "ok?"}]
    req = InferenceRequest.model_validate({"id": "r", "messages": long_history})
    assert decide(req, ROUTING, RULES).path is Path.HEAVY


def test_rule_templates_fill_named_groups() -> None:
    book = RuleBook((Rule.of("order", r"order (?P<order>\d+)", "Looking up order {order}."),))
    answer = book.answer("where is order 123?")
    assert answer is not None and answer.text == "Looking up order 123." and answer.rule == "order"
    assert book.answer("where is my parcel") is None


def test_estimates() -> None:
    assert estimate_tokens("") == 1
    assert estimate_tokens("abcdefgh") == 2
    assert looks_hard("please compare these") and not looks_hard("what colour is the sky")
