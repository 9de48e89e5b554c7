"""The rules engine without services: matching, templates, the rule file's
checks, the intent classifier and hot reload. Redis is a small in-memory fake
here; tests/integration/test_rules_lookup.py reads a real one."""

from __future__ import annotations

import logging
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from streams.ops import REDIS_ERRORS
from streams.rules.engine import Rule, RuleBook, Template
from streams.rules.intents import MAX_CLASSIFY_CHARS, IntentIndex, IntentSpec, classify_intent
from streams.rules.rulefile import (
    EXAMPLE_RULES_FILE,
    RuleFileError,
    RuleSource,
    read_rule_file,
    read_rules,
)

EXAMPLE = read_rule_file(EXAMPLE_RULES_FILE)


def book(yaml_text: str) -> RuleBook:
    return read_rules(textwrap.dedent(yaml_text), source="test.yaml")


def refused(yaml_text: str) -> str:
    with pytest.raises(RuleFileError) as caught:
        book(yaml_text)
    return str(caught.value)


# --- built-in rules (what the classifier uses without a rule file) ----------


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("Hello!", "greeting"),
        ("good morning there", "greeting"),
        ("thanks a lot", "thanks"),
        ("help", "capabilities"),
        ("ping", "ping"),
        ("What is the capital of France?", None),
        ("hello, explain relativity", None),
    ],
)
def test_builtin_rules(text: str, rule: str | None) -> None:
    answer = RuleBook().answer(text)
    assert (answer.rule if answer else None) == rule


def test_one_pattern_rule_fills_named_groups() -> None:
    rules = RuleBook((Rule.of("echo", r"call me (?P<name>\w+)", "Hi {name}!"),))
    answer = rules.answer("please call me Ada")
    assert answer is not None and (answer.rule, answer.text) == ("echo", "Hi Ada!")


# --- matching ---------------------------------------------------------------


def test_patterns_named_groups_and_any_pattern_matches() -> None:
    rules = book(
        r"""
        rules:
          - name: refund
            patterns: ['refund (?:for )?(?P<item>\w+)', '(?P<item>\w+) refund']
            answer: "Refunds for {item} take 5 days."
        """
    )
    assert rules.answer("I want a refund for shoes").text == "Refunds for shoes take 5 days."  # type: ignore[union-attr]
    match = rules.match("socks refund")
    assert match is not None and match.groups == {"item": "socks"}
    assert rules.match("nothing here") is None


def test_keywords_must_all_appear_as_words() -> None:
    rules = book(
        """
        rules:
          - name: cancel_order
            keywords: [cancel, order]
            answer: Orders can be cancelled until they ship.
        """
    )
    assert rules.answer("How do I CANCEL my order?") is not None
    assert rules.answer("cancel both orders") is not None  # a plural is the same word
    assert rules.answer("cancel my subscription") is None  # one keyword missing
    assert rules.answer("cancellation of the reorder") is None  # not whole words


def test_keywords_guard_a_pattern_match() -> None:
    rules = book(
        r"""
        rules:
          - name: order_number
            patterns: ['#(?P<n>\d+)']
            keywords: [order]
            answer: "Order {n}"
        """
    )
    assert rules.answer("order #42").text == "Order 42"  # type: ignore[union-attr]
    assert rules.answer("ticket #42") is None


def test_priority_then_file_order() -> None:
    rules = book(
        """
        rules:
          - {name: first, keywords: [hours], answer: first}
          - {name: second, keywords: [hours], answer: second}
          - {name: urgent, keywords: [hours], answer: urgent, priority: 5}
          - {name: low, keywords: [hours], answer: low, priority: -1}
        """
    )
    assert [r.name for r in rules.rules] == ["urgent", "first", "second", "low"]
    assert rules.answer("opening hours?").rule == "urgent"  # type: ignore[union-attr]


def test_a_rule_without_the_groups_it_needs_gives_way() -> None:
    rules = book(
        r"""
        intents:
          order: {keywords: [order], examples: ["where is my order"]}
        rules:
          - name: with_number
            patterns: ['order (?P<n>\d+)']
            answer: "Order {n} is on its way."
            priority: 1
          - name: ask_number
            intent: order
            answer: What is your order number?
        """
    )
    assert rules.answer("where is order 77").text == "Order 77 is on its way."  # type: ignore[union-attr]
    found = rules.match("where is my order")
    assert found is not None and found.rule.name == "ask_number"
    assert (found.intent, found.confidence) == ("order", pytest.approx(1.0))


def test_optional_groups_fall_back_to_defaults() -> None:
    rules = book(
        r"""
        rules:
          - name: size
            patterns: ['shoe(?: in size (?P<size>\d+))?']
            answer: "Size {size} shoes are in stock."
            defaults: {size: most}
        """
    )
    assert rules.answer("a shoe in size 42").text == "Size 42 shoes are in stock."  # type: ignore[union-attr]
    assert rules.answer("a shoe").text == "Size most shoes are in stock."  # type: ignore[union-attr]


def test_min_confidence_asks_more_of_the_intent() -> None:
    yaml_text = """
        intents:
          hours: {keywords: [open], examples: ["when do you open"]}
        rules:
          - {name: hours, intent: hours, answer: "9 to 5", min_confidence: %s}
    """
    text = "are you open on sunday"
    _, confidence = book(yaml_text % 0.0).classify(text)
    assert 0.5 <= confidence < 0.99
    assert book(yaml_text % 0.0).answer(text) is not None
    assert book(yaml_text % 0.99).answer(text) is None


# --- templates ----------------------------------------------------------------


def test_template_renders_and_refuses_missing_values() -> None:
    template = Template("Order {id} is {status}; {{literal}}")
    assert template.fields == {"id", "status"}
    assert template.render({"id": "1", "status": "late"}) == "Order 1 is late; {literal}"
    assert template.render({"id": "1"}) is None  # never half a sentence


@pytest.mark.parametrize("bad", ["{}", "{0}", "{a.b}", "{a[0]}", "{a!r}", "{a:>5}", "{a", "a}"])
def test_template_allows_plain_names_only(bad: str) -> None:
    with pytest.raises(ValueError, match="template"):
        Template(bad)


# --- the rule file's checks ---------------------------------------------------


def test_placeholder_nothing_provides_is_refused_naming_the_rule() -> None:
    message = refused(
        r"""
        rules:
          - {name: ok, patterns: [ok], answer: ok}
          - name: order
            patterns: ['order (?P<id>\d+)']
            answer: "Order {id} ships {when}"
        """
    )
    assert "rule 'order' (rules[1])" in message and "{when}" in message


def test_intent_alone_cannot_build_a_lookup_key() -> None:
    message = refused(
        r"""
        intents:
          order: {examples: ["where is my order"]}
        rules:
          - name: order
            intent: order
            patterns: ['order (?P<id>\d+)']
            lookup: {key: "orders:{id}"}
            answer: "{status}"
        """
    )
    assert "rule 'order'" in message and "intent 'order'" in message and "{id}" in message


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("rules: [{name: r, patterns: ['(unclosed'], answer: x}]", "rule 'r' (rules[0])"),
        ("rules: [{name: r, patterns: ['(unclosed'], answer: x}]", "does not compile"),
        ("rules: [{name: r, intent: nope, answer: x}]", "intent 'nope' is not declared"),
        ("rules: [{name: r, answer: x}]", "at least one of patterns, keywords or intent"),
        ("rules: [{name: r, keywords: [a], answer: x, colour: red}]", "rule 'r' (rules[0]) colour"),
        ("rules: [{name: r, keywords: [a], answer: '{0}'}]", "plain name"),
        (
            "rules: [{name: r, keywords: [a], answer: x}, {name: r, keywords: [b], answer: y}]",
            "rule 'r' (rules[1]): a rule of this name comes earlier",
        ),
        ("intents: {x: {}}\nrules: [{name: r, keywords: [a], answer: x}]", "intent 'x'"),
        ("rules: []", "rules"),
        ("rules: [{name: r, keywords: [a], answer: x", "not valid YAML"),
        ("- just a list", "expected a mapping"),
    ],
)
def test_broken_files_say_what_and_where(yaml_text: str, expected: str) -> None:
    message = refused(yaml_text)
    assert message.startswith("test.yaml: ") and expected in message


def test_lookup_fields_are_checked_when_declared() -> None:
    lookup = r"""
        rules:
          - name: order
            patterns: ['order (?P<id>\d+)']
            lookup: {key: "orders:{id}", fields: %s}
            answer: "Order {id}: {status}"
    """
    assert "{status}" in refused(lookup % "[eta]")
    assert book(lookup % "[status]").rules[0].lookup is not None


# --- intents --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "intent"),
    [
        ("where is my order", "order_status"),
        ("when will my package arrive?", "order_status"),
        ("What time do you close today?", "opening_hours"),
        ("is the shop open on sundays", "opening_hours"),
        ("how can I reset my password please", "password_reset"),
        ("I can't log in", "password_reset"),
        ("can I speak to a human please", "human_agent"),
        ("What is the capital of France?", None),
        ("Explain why the sky is blue.", None),
        ("How do I open a file in python?", None),
        ("hello, explain quantum physics to me", None),
        ("", None),
    ],
)
def test_example_intents(text: str, intent: str | None) -> None:
    assert EXAMPLE.classify(text)[0] == intent


def test_classify_intent_scores_keywords_and_examples() -> None:
    index = IntentIndex(
        {
            "billing": IntentSpec(keywords=["invoice"], examples=["send me my invoice"]),
            "weather": IntentSpec(examples=["will it rain tomorrow"]),
        },
        threshold=0.5,
    )
    assert classify_intent("send me my invoice", index) == ("billing", pytest.approx(1.0))
    name, confidence = classify_intent("invoice", index)
    assert name == "billing" and 0.5 <= confidence < 1.0  # a keyword alone carries it
    assert classify_intent("is it going to rain tomorrow?", index)[0] == "weather"
    assert classify_intent("tell me a joke", index)[0] is None
    assert classify_intent("invoice " * MAX_CLASSIFY_CHARS, index) == (None, 0.0)


# --- the example file -------------------------------------------------------------


def test_example_file_rules() -> None:
    names = {r.name for r in EXAMPLE.rules}
    assert {"ping", "greeting", "thanks", "capabilities", "order_status"} <= names
    assert {"opening_hours", "password_reset", "order_status_needs_number"} <= names
    assert EXAMPLE.answer("ping").text == "pong"  # type: ignore[union-attr]
    assert EXAMPLE.answer("Where is my order?").rule == "order_status_needs_number"  # type: ignore[union-attr]
    assert "Forgot password" in EXAMPLE.answer("I forgot my password").text  # type: ignore[union-attr]
    found = EXAMPLE.match("what is the status of order 12345?")
    assert found is not None and found.rule.name == "order_status"
    assert found.groups == {"order_id": "12345"}
    assert EXAMPLE.answer("what is the status of order 12345?") is None  # needs Redis


# --- lookups against a fake Redis ---------------------------------------------------


class FakeRedis:
    def __init__(self, data: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.data = data or {}
        self.error = error
        self.calls = 0

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        self.calls += 1
        if self.error:
            raise self.error
        return {k.encode(): v.encode() for k, v in self.data.get(key, {}).items()}

    async def get(self, key: str) -> bytes | None:
        self.calls += 1
        if self.error:
            raise self.error
        value = self.data.get(key)
        return None if value is None else value.encode()


JSON_BOOK = r"""
    rules:
      - name: account
        patterns: ['account (?P<user>\w+)']
        lookup: {key: "users:{user}", format: json, missing: "No account {user}."}
        answer: "{user} has {points} points (vip: {vip}); plan {plan}"
        defaults: {plan: basic}
"""


async def test_json_lookup_renders_fields_and_missing() -> None:
    rules = book(JSON_BOOK)
    redis = FakeRedis({"p:users:ann": '{"points": 7, "vip": true, "plan": null}'})
    answer = await rules.respond("account ann", redis, "p")  # type: ignore[arg-type]
    assert answer is not None and answer.text == "ann has 7 points (vip: true); plan basic"
    absent = await rules.respond("account bob", redis, "p")  # type: ignore[arg-type]
    assert absent is not None and absent.text == "No account bob."
    assert await rules.respond("account ann", None, "p") is None  # no Redis, no answer


async def test_bad_values_fall_through(caplog: pytest.LogCaptureFixture) -> None:
    rules = book(JSON_BOOK)
    not_json = FakeRedis({"p:users:ann": "[1, 2]"})
    assert await rules.respond("account ann", not_json, "p") is None  # type: ignore[arg-type]
    wrong_type = FakeRedis(error=ResponseError("WRONGTYPE"))
    assert await rules.respond("account ann", wrong_type, "p") is None  # type: ignore[arg-type]
    assert "not a JSON object" in caplog.text and "WRONGTYPE" in caplog.text


async def test_redis_outage_is_logged_once_and_not_retried_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rules = book(JSON_BOOK)
    down = FakeRedis(error=RedisConnectionError("connection refused"))
    before = REDIS_ERRORS.labels("rules")._value.get()
    with caplog.at_level(logging.WARNING, logger="streams.rules.engine"):
        answers = [await rules.respond("account ann", down, "p") for _ in range(3)]  # type: ignore[arg-type]
    assert answers == [None, None, None]
    assert down.calls == 1  # the next requests skip Redis for failopen.REST_S
    assert caplog.text.count("Redis failed") == 1
    assert REDIS_ERRORS.labels("rules")._value.get() == before + 1


# --- hot reload -------------------------------------------------------------------------

V1 = "rules: [{name: v1, patterns: ['^ping$'], answer: one}]\n"
V2 = "rules: [{name: v2, patterns: ['^ping$'], answer: two}]\n"  # same size as V1
BROKEN = "rules: [{name: v3, patterns: ['^(ping$'], answer: three}]\n"


def test_reload_picks_up_changes_and_keeps_the_last_good_book(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(V1)
    source = RuleSource(path, reload_interval_s=0.1)
    assert source.book.answer("ping").text == "one"  # type: ignore[union-attr]
    assert source.reload_if_changed() is False  # nothing changed

    stat = path.stat()
    path.write_text(V2)  # same size, and the same mtime: only the content hash tells
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert source.reload_if_changed() is True
    assert source.book.answer("ping").text == "two"  # type: ignore[union-attr]

    path.write_text(BROKEN)
    with caplog.at_level(logging.ERROR, logger="streams.rules.engine"):
        assert source.reload_if_changed() is False
        assert source.reload_if_changed() is False  # logged once per broken content
    assert source.book.answer("ping").text == "two"  # type: ignore[union-attr]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "rule 'v3' (rules[0])" in errors[0] and "does not compile" in errors[0]
    assert "keeping the last good rules" in errors[0]

    path.unlink()
    assert source.reload_if_changed() is False
    assert source.book.answer("ping").text == "two"  # type: ignore[union-attr]
    path.write_text(V1)
    assert source.reload_if_changed() is True
    assert source.book.answer("ping").text == "one"  # type: ignore[union-attr]


def test_a_process_does_not_start_on_a_broken_or_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    with pytest.raises(RuleFileError, match="cannot read"):
        RuleSource(path)
    path.write_text(BROKEN)
    with pytest.raises(RuleFileError, match="rule 'v3'"):
        RuleSource(path)


def test_without_a_file_the_builtin_rules_serve() -> None:
    source = RuleSource(None)
    assert source.book.answer("ping").text == "pong"  # type: ignore[union-attr]
    assert source.reload_if_changed() is False
