"""Deterministic answers for intents that need no model.

A rule is a compiled pattern and an answer template; the first rule whose
pattern matches the request's user text answers it. The built-in set covers
small talk that would waste a model call; ``RuleBook`` takes any list of
rules (a YAML file of them comes with the hybrid engine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_RULES", "Rule", "RuleAnswer", "RuleBook"]


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    answer: str
    """``str.format`` template; named groups of ``pattern`` fill it."""

    @classmethod
    def of(cls, name: str, pattern: str, answer: str) -> Rule:
        return cls(name, re.compile(pattern, re.IGNORECASE), answer)


@dataclass(frozen=True, slots=True)
class RuleAnswer:
    rule: str
    text: str


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule.of(
        "greeting",
        r"^\s*(hi|hello|hey|good (morning|afternoon|evening))\b[\s!.,?]*(there)?[\s!.,?]*$",
        "Hello! How can I help you today?",
    ),
    Rule.of(
        "thanks",
        r"^\s*(thanks|thank you|thx|cheers)\b[\s\w!.,]{0,20}$",
        "You're welcome! Anything else I can help with?",
    ),
    Rule.of(
        "capabilities",
        r"^\s*(help|what can you do\??|who are you\??)\s*$",
        "I answer questions about your account, orders and our products. "
        "Ask in your own words; simple questions are answered instantly.",
    ),
    Rule.of("ping", r"^\s*ping\s*$", "pong"),
)


class RuleBook:
    def __init__(self, rules: tuple[Rule, ...] = DEFAULT_RULES) -> None:
        self.rules = rules

    def answer(self, text: str) -> RuleAnswer | None:
        """The first matching rule's answer, or ``None`` when no rule owns the text."""
        for rule in self.rules:
            match = rule.pattern.search(text)
            if match:
                return RuleAnswer(rule.name, rule.answer.format(**match.groupdict()))
        return None
