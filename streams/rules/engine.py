"""Deterministic answers for requests that need no model.

A rule owns a request when one of its regex ``patterns`` matches the text or
the text classifies as its ``intent`` (``streams.rules.intents``); ``keywords``,
when given, must all appear as well (alone they are the trigger). Rules are
tried by ``priority``, highest first, then in file order. The answer is a
template filled from the pattern's named groups and, for a rule with a
``lookup``, from a Redis hash or JSON document (order status and the like).

Everything is compiled when a rule file loads, so ``RuleBook.match`` costs a
few regex searches and one intent classification per request. Loading,
checking and hot-reloading rule files (``read_rules``, ``read_rule_file``,
``RuleSource``, ``RuleFileError``, ``EXAMPLE_RULES_FILE``) live in
``streams.rules.rulefile``, which builds the ``RuleBook`` s defined here.
"""

from __future__ import annotations

import json
import logging
import re
import string
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from redis.exceptions import RedisError, ResponseError

from streams.rules.intents import IntentIndex
from streams.stores.failopen import FailOpen

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = [
    "DEFAULT_RULES",
    "Lookup",
    "Rule",
    "RuleAnswer",
    "RuleBook",
    "RuleMatch",
    "Template",
]

log = logging.getLogger(__name__)


class Template:
    """A ``{name}`` answer template, parsed once. Only plain names are
    allowed (no positional ``{}``, attribute access or format specs), so a
    template can always be checked against what will fill it; ``{{`` and
    ``}}`` are literal braces."""

    __slots__ = ("fields", "pieces", "source")

    def __init__(self, source: str) -> None:
        pieces: list[tuple[str, str | None]] = []
        try:
            parsed = list(string.Formatter().parse(source))
        except ValueError as exc:
            raise ValueError(f"template {source!r}: {exc}") from None
        for literal, name, spec, conversion in parsed:
            if name is not None and not name.isidentifier():
                raise ValueError(
                    f"template {source!r}: placeholder {{{name}}} must be a plain name"
                )
            if spec or conversion:
                raise ValueError(
                    f"template {source!r}: {{{name}}} may not carry a format spec or conversion"
                )
            pieces.append((literal, name))
        self.source = source
        self.pieces = tuple(pieces)
        self.fields = frozenset(name for _, name in pieces if name is not None)

    def render(self, values: Mapping[str, str]) -> str | None:
        """The filled text, or ``None`` when a placeholder has no value (the
        caller falls through to a model rather than send a broken sentence)."""
        out: list[str] = []
        for literal, name in self.pieces:
            out.append(literal)
            if name is not None:
                value = values.get(name)
                if value is None:
                    return None
                out.append(value)
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.source!r})"


@dataclass(frozen=True, slots=True)
class Lookup:
    """Where a rule's facts live in Redis: ``{key_prefix}:{key}``."""

    key: Template
    format: Literal["hash", "json"] = "hash"
    fields: frozenset[str] | None = None
    """The fields the answer may use; ``None`` when not declared."""
    missing: Template | None = None
    """The answer when the key is absent; ``None`` falls through to a model."""


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    name: str
    answer: Template
    patterns: tuple[re.Pattern[str], ...] = ()
    keywords: tuple[re.Pattern[str], ...] = ()
    intent: str | None = None
    lookup: Lookup | None = None
    priority: int = 0
    min_confidence: float = 0.0
    """Confidence this rule's intent needs; the classifier's threshold applies
    first, so this can only ask for more."""
    defaults: Mapping[str, str] = field(default_factory=dict)
    """Values for placeholders that a match or lookup left empty."""
    required: frozenset[str] = frozenset()
    """Names a match must supply from pattern groups (or ``defaults``) to be usable."""

    @classmethod
    def of(cls, name: str, pattern: str, answer: str) -> Rule:
        """A one-pattern rule whose answer uses the pattern's named groups."""
        template = Template(answer)
        return cls(
            name, template, patterns=(re.compile(pattern, re.IGNORECASE),), required=template.fields
        )

    def groups_for(self, text: str, intent: str | None, confidence: float) -> dict[str, str] | None:
        """The named groups this rule matched ``text`` with, or ``None``."""
        if self.keywords and not all(k.search(text) for k in self.keywords):
            return None
        found: dict[str, str] | None = None
        for pattern in self.patterns:
            hit = pattern.search(text)
            if hit:
                found = {k: v for k, v in hit.groupdict().items() if v is not None}
                break
        if found is None:
            if self.intent is not None and intent == self.intent:
                found = {} if confidence >= self.min_confidence else None
            elif not self.patterns and self.intent is None:
                found = {}  # keywords alone
        if found is None:
            return None
        if any(name not in found and name not in self.defaults for name in self.required):
            return None  # e.g. an order question without a number: the next rule asks for it
        return found


@dataclass(frozen=True, slots=True)
class RuleMatch:
    rule: Rule
    groups: Mapping[str, str]
    intent: str | None = None
    """The text's classified intent (``None`` when none or the book has no intents)."""
    confidence: float = 0.0


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

_KEY_VALUE = re.compile(r"[^\s\x00-\x1f*?\[\]]{1,200}")
"""What a matched group may look like to go into a Redis key."""


class RuleBook:
    """Compiled rules and intents. The rules never change after build (a
    reload swaps whole books); the only state is whether Redis lookups are
    failing, so an outage is logged once and not paid for on every request."""

    def __init__(
        self,
        rules: Sequence[Rule] = DEFAULT_RULES,
        intents: IntentIndex | None = None,
        *,
        source: str = "built-in",
    ) -> None:
        self.intents = intents or IntentIndex({})
        unknown = {r.intent for r in rules if r.intent is not None} - set(self.intents.names)
        if unknown:
            raise ValueError(f"rules name unknown intents: {sorted(unknown)}")
        self.rules: tuple[Rule, ...] = tuple(sorted(rules, key=lambda r: -r.priority))
        self.source = source
        self._failopen = FailOpen("rule lookups", log=log, label="rules")

    def classify(self, text: str) -> tuple[str | None, float]:
        """The text's intent by this book's intents (see ``streams.rules.intents``)."""
        return self.intents.classify(text)

    def match(
        self, text: str, *, classified: tuple[str | None, float] | None = None
    ) -> RuleMatch | None:
        """The first usable rule for ``text`` by priority, or ``None``. Pass
        ``classified`` when the caller already ran ``classify(text)``."""
        if classified is None:
            classified = self.intents.classify(text) if len(self.intents) else (None, 0.0)
        intent, confidence = classified
        for rule in self.rules:
            groups = rule.groups_for(text, intent, confidence)
            if groups is not None:
                return RuleMatch(rule, groups, intent, confidence)
        return None

    def answer(self, text: str) -> RuleAnswer | None:
        """The answer of the first matching rule, when it needs no lookup.
        ``None`` when no rule owns the text or the owner needs Redis (use
        ``respond`` or ``match`` + ``resolve`` for those)."""
        found = self.match(text)
        if found is None or found.rule.lookup is not None:
            return None
        return self._render(found.rule, found.rule.answer, found.groups)

    async def respond(
        self, text: str, redis: aioredis.Redis | None, key_prefix: str
    ) -> RuleAnswer | None:
        """``match`` then ``resolve``: the answer to ``text``, lookups included."""
        found = self.match(text)
        return None if found is None else await self.resolve(found, redis, key_prefix)

    async def resolve(
        self, match: RuleMatch, redis: aioredis.Redis | None, key_prefix: str
    ) -> RuleAnswer | None:
        """The match's answer, reading its lookup from Redis when it has one.
        Absent key: the rule's ``missing`` answer, else ``None``. Redis down
        or a bad stored value: ``None`` (a model answers instead); never raises."""
        rule = match.rule
        if rule.lookup is None:
            return self._render(rule, rule.answer, match.groups)
        if redis is None:
            return None
        read = self.lookup_read(match, key_prefix)
        if read is None:
            return None
        key, form = read
        try:
            if form == "hash":
                raw: Any = await cast(Awaitable[Mapping[Any, Any]], redis.hgetall(key))
            else:
                raw = await cast(Awaitable[Any], redis.get(key))
        except Exception as exc:  # judged by resolve_read, as a pipelined read's error is
            raw = exc
        return self.resolve_read(match, key, raw)

    def lookup_read(self, match: RuleMatch, key_prefix: str) -> tuple[str, str] | None:
        """What the match's lookup reads: ``(key, "hash" | "json")``; ``None``
        when it needs no read, or must not or cannot be asked now (a matched
        value unfit for a key, Redis resting after a failure). The batch
        classifier pipelines these reads; ``resolve_read`` judges the answer."""
        lookup = match.rule.lookup
        if lookup is None:
            return None
        values = {**match.rule.defaults, **match.groups}
        if not all(_KEY_VALUE.fullmatch(values.get(n, "")) for n in lookup.key.fields):
            return None  # not a value to put into a key; let a model handle it
        if self._failopen.resting():
            return None
        return f"{key_prefix}:{lookup.key.render(values)}", lookup.format

    def lookup_failed(self, exc: BaseException) -> None:
        """The round trip that carried this book's lookups failed as a whole."""
        self._failopen.failed("lookup", exc)

    def resolve_read(self, match: RuleMatch, key: str, raw: Any) -> RuleAnswer | None:
        """The match's answer from what its lookup read at ``key``: a hash's
        fields (``HGETALL``), a JSON document (``GET``), or the exception the
        read raised. Never raises."""
        rule, lookup = match.rule, match.rule.lookup
        if lookup is None:
            return self._render(rule, rule.answer, match.groups)
        if isinstance(raw, ResponseError):  # Redis is up; the key holds the wrong kind of value
            log.warning("rule %r: cannot read %r as %s: %s", rule.name, key, lookup.format, raw)
            return None
        if isinstance(raw, RedisError | OSError | TimeoutError):
            self._failopen.failed("lookup", raw)
            return None
        if isinstance(raw, BaseException):
            log.warning("rule %r: the lookup of %r failed: %s", rule.name, key, raw)
            return None
        try:
            if lookup.format == "hash":
                found = {_text(k): _text(v) for k, v in raw.items()} if raw else None
            else:
                found = None if raw is None else _json_fields(raw)
        except ValueError as exc:
            log.warning("rule %r: the value at %r is not a JSON object: %s", rule.name, key, exc)
            return None
        self._failopen.answered()
        values = {**rule.defaults, **match.groups}
        if found is None:
            if lookup.missing is None:
                return None
            return self._render(rule, lookup.missing, values)
        return self._render(rule, rule.answer, {**values, **found})

    @staticmethod
    def _render(rule: Rule, template: Template, groups: Mapping[str, str]) -> RuleAnswer | None:
        text = template.render({**rule.defaults, **groups})
        if text is None:
            missing = sorted(
                n for n in template.fields if n not in groups and n not in rule.defaults
            )
            log.debug("rule %r has no value for %s; falling through", rule.name, missing)
            return None
        return RuleAnswer(rule.name, text)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _json_fields(document: bytes | str) -> dict[str, str]:
    """Top-level fields of a JSON object as strings (``null`` counts as absent)."""
    data = json.loads(document)
    if not isinstance(data, dict):
        raise ValueError(f"got {type(data).__name__}")
    out: dict[str, str] = {}
    for name, value in data.items():
        if value is None:
            continue
        if isinstance(value, str):
            out[name] = value
        else:  # numbers, booleans, nested values as they read in JSON
            out[name] = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return out
