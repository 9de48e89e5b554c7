"""The rule file: its YAML schema, compiling it into a ``RuleBook``, and
hot reload.

A rule file is refused whole at load when any rule could not render: a regex
that does not compile, a placeholder nothing provides, an unknown intent. The
format is documented in ``streams/rules/rules.example.yaml``; the runtime (matching,
templates, lookups) is ``streams.rules.engine``.

``RuleSource`` keeps the current book and hot-reloads the file: a broken
edit is logged (naming the rule and what is wrong) and the last good book
stays. At startup a broken file is an error: a process should not serve
without the rules its operator gave it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from streams.rules.engine import Lookup, Rule, RuleBook, Template
from streams.rules.intents import IntentIndex, IntentSpec, keyword_regex

if TYPE_CHECKING:
    from schemas.settings import RulesSettings

__all__ = ["EXAMPLE_RULES_FILE", "RuleFileError", "RuleSource", "read_rule_file", "read_rules"]

# Same logger as the runtime: rule-file messages kept their name across the split.
log = logging.getLogger("streams.rules.engine")

EXAMPLE_RULES_FILE = Path(__file__).with_name("rules.example.yaml")


class RuleFileError(ValueError):
    """A rule file that cannot be used; the message names the file, the rule
    and what to fix."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _IntentSpec(_Spec):
    keywords: list[str] = Field(default_factory=list)
    examples: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _keywords_or_examples(self) -> _IntentSpec:
        if not any(k.strip() for k in self.keywords) and not any(self.examples):
            raise ValueError("an intent needs keywords or examples")
        return self


class _LookupSpec(_Spec):
    key: str = Field(min_length=1)
    format: Literal["hash", "json"] = "hash"
    fields: list[str] | None = None
    missing: str | None = None


class _RuleSpec(_Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    intent: str | None = None
    patterns: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    answer: str
    lookup: _LookupSpec | None = None
    priority: int = 0
    min_confidence: float = Field(default=0.0, ge=0.0, le=1.0)
    defaults: dict[str, str] = Field(default_factory=dict)

    def compile(self) -> Rule:
        """The compiled rule; ``ValueError`` says what is wrong with it."""
        if not (self.patterns or self.keywords or self.intent):
            raise ValueError("give at least one of patterns, keywords or intent")
        patterns = []
        for source in self.patterns:
            try:
                patterns.append(re.compile(source, re.IGNORECASE))
            except re.error as exc:
                raise ValueError(f"pattern {source!r} does not compile: {exc}") from None
        keywords = tuple(keyword_regex([k]) for k in self.keywords if k.strip())
        if len(keywords) != len(self.keywords):
            raise ValueError("keywords may not be blank")
        answer = Template(self.answer)
        lookup = None
        needed = set(answer.fields) - set(self.defaults)
        key_fields: frozenset[str] = frozenset()
        if self.lookup is not None:
            spec = self.lookup
            missing = Template(spec.missing) if spec.missing is not None else None
            fields = frozenset(spec.fields) if spec.fields is not None else None
            lookup = Lookup(Template(spec.key), spec.format, fields, missing)
            key_fields = lookup.key.fields
            # Answer names the lookup may fill: the declared fields, or any when undeclared.
            needed = set() if fields is None else needed - fields
            if missing is not None:
                needed |= missing.fields - set(self.defaults)
        required = key_fields | needed
        # Every way the rule can match must bring what it needs to render.
        triggers: list[tuple[str, set[str]]] = [
            (f"pattern {p.pattern!r}", set(p.groupindex)) for p in patterns
        ]
        if self.intent is not None:
            triggers.append((f"intent {self.intent!r}", set()))
        if not patterns and self.intent is None:
            triggers.append(("keywords alone", set()))
        for trigger, provides in triggers:
            lacking = sorted(key_fields - provides) + sorted(needed - provides - key_fields)
            if lacking:
                raise ValueError(
                    f"matched by {trigger}, nothing provides "
                    + ", ".join(f"{{{n}}}" for n in lacking)
                    + " (name a group (?P<name>...) in the pattern, add it to defaults"
                    + (", or declare it in lookup.fields" if self.lookup else "")
                    + ")"
                )
        return Rule(
            name=self.name,
            answer=answer,
            patterns=tuple(patterns),
            keywords=keywords,
            intent=self.intent,
            lookup=lookup,
            priority=self.priority,
            min_confidence=self.min_confidence,
            defaults=dict(self.defaults),
            required=frozenset(required),
        )


class _FileSpec(_Spec):
    version: Literal[1] = 1
    intent_threshold: float = Field(default=0.5, gt=0.0, le=1.0)
    intents: dict[str, _IntentSpec] = Field(default_factory=dict)
    rules: list[_RuleSpec] = Field(min_length=1)


def read_rules(text: str | bytes, *, source: str = "<string>") -> RuleBook:
    """Parse and compile a rule file's content; ``RuleFileError`` says why not."""
    rules, intents = _compile_file(text, source=source)
    return RuleBook(rules, intents, source=source)


def read_rule_file(path: Path) -> RuleBook:
    """The rules of the file at ``path``; ``RuleFileError`` says why not."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RuleFileError(f"{path}: cannot read the rule file: {exc}") from exc
    return read_rules(data, source=str(path))


def _compile_file(text: str | bytes, *, source: str) -> tuple[list[Rule], IntentIndex]:
    """Parse, validate and compile a rule file, or raise ``RuleFileError``."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleFileError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise RuleFileError(f"{source}: expected a mapping with 'rules:' (and 'intents:')")
    try:
        spec = _FileSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_describe(raw, e) for e in exc.errors())
        raise RuleFileError(f"{source}: {problems}") from None
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, rule_spec in enumerate(spec.rules):
        where = f"{source}: rule {rule_spec.name!r} (rules[{index}])"
        if rule_spec.name in seen:
            raise RuleFileError(f"{where}: a rule of this name comes earlier")
        seen.add(rule_spec.name)
        if rule_spec.intent is not None and rule_spec.intent not in spec.intents:
            raise RuleFileError(
                f"{where}: intent {rule_spec.intent!r} is not declared under 'intents:' "
                f"(declared: {sorted(spec.intents)})"
            )
        try:
            rules.append(rule_spec.compile())
        except ValueError as exc:
            raise RuleFileError(f"{where}: {exc}") from None
    intents = IntentIndex(
        {name: IntentSpec(i.keywords, i.examples) for name, i in spec.intents.items()},
        threshold=spec.intent_threshold,
    )
    return rules, intents


def _describe(raw: Mapping[str, Any], error: Any) -> str:
    """One validation error, located by rule or intent name, not just index."""
    loc = list(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    where = ".".join(str(p) for p in loc) or "file"
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
        entries = raw.get("rules")
        entry = entries[loc[1]] if isinstance(entries, list) and loc[1] < len(entries) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        rest = ".".join(str(p) for p in loc[2:])
        where = f"rule {name!r} (rules[{loc[1]}])" + (f" {rest}" if rest else "")
    elif len(loc) >= 2 and loc[0] == "intents":
        rest = ".".join(str(p) for p in loc[2:])
        where = f"intent {loc[1]!r}" + (f" {rest}" if rest else "")
    return f"{where}: {message}"


class RuleSource:
    """The current ``RuleBook``, hot-reloaded from a YAML file.

    ``reload_if_changed()`` is cheap (one ``stat``) and is meant to be called
    on a timer. A change is noticed by mtime, size and inode, then confirmed
    by a content hash; within ``RACY_S`` of a write the file is hashed on
    every call, since a same-size rewrite inside one mtime tick would
    otherwise go unseen."""

    RACY_S = 2.0

    def __init__(self, path: Path | None, reload_interval_s: float = 1.0) -> None:
        """Raises ``RuleFileError`` when ``path`` cannot be loaded."""
        self.path = path
        self.reload_interval_s = reload_interval_s
        self._signature: tuple[int, int, int] | None = None
        self._digest: str | None = None
        self._bad_digest: str | None = None
        self._unreadable = False
        if path is None:
            self._book = RuleBook()
            return
        stat = _stat(path)
        data = _read(path)
        self._book = read_rules(data, source=str(path))
        self._signature = stat
        self._digest = hashlib.sha256(data).hexdigest()
        log.info("rules: %d rules, %d intents from %s", *self._counts(), path)

    @classmethod
    def from_settings(cls, settings: RulesSettings) -> RuleSource:
        return cls(settings.file, settings.reload_interval_s)

    @property
    def book(self) -> RuleBook:
        return self._book

    def _counts(self) -> tuple[int, int]:
        return len(self._book.rules), len(self._book.intents)

    def reload_if_changed(self) -> bool:
        """Load the file again if it changed; ``True`` when a new book is in
        place. Never raises: a broken or vanished file is logged once and the
        last good book stays."""
        if self.path is None:
            return False
        try:
            stat = _stat(self.path)
            if stat == self._signature and time.time() - stat[0] / 1e9 > self.RACY_S:
                return False
            data = _read(self.path)
        except RuleFileError as exc:
            if not self._unreadable:
                self._unreadable = True
                log.error("rules: %s; keeping the last good rules", exc)
            return False
        self._unreadable = False
        self._signature = stat
        digest = hashlib.sha256(data).hexdigest()
        if digest in (self._digest, self._bad_digest):
            return False
        try:
            book = read_rules(data, source=str(self.path))
        except RuleFileError as exc:
            self._bad_digest = digest
            rules, intents = self._counts()
            log.error(
                "rules: not reloaded, %s; keeping the last good rules (%d rules, %d intents)",
                exc,
                rules,
                intents,
            )
            return False
        self._book, self._digest, self._bad_digest = book, digest, None
        log.info("rules: reloaded %d rules, %d intents from %s", *self._counts(), self.path)
        return True

    async def watch(self) -> None:
        """Call ``reload_if_changed`` every ``reload_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.reload_interval_s)
            try:
                self.reload_if_changed()
            except Exception:  # a bug here must not end hot reload for good
                log.exception("rules: reload check failed")


def _stat(path: Path) -> tuple[int, int, int]:
    try:
        st = path.stat()
    except OSError as exc:
        raise RuleFileError(f"{path}: cannot read the rule file: {exc}") from exc
    return st.st_mtime_ns, st.st_size, st.st_ino


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise RuleFileError(f"{path}: cannot read the rule file: {exc}") from exc
