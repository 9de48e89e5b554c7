"""A small intent classifier: keywords and example sentences, no model.

It runs on every request (the rules engine matches on it and the router uses
the intent as a feature), so it is pure Python, precompiled once per rule
file, and costs tens of microseconds on a short request.

How an intent is scored against a text:

- ``similarity``: the best squared cosine between the text and any one of
  the intent's examples, bags of words weighted by IDF over intents (a word
  in the examples of every intent tells nothing apart; a word in one
  intent's examples is a strong sign). Squared, so it reads as the share of
  weight in common: one telling word of three shared gives 0.33, not
  cosine's 0.58. Function words and numbers weigh little (``STOP_WEIGHT``);
  a word no example knows weighs as the rarest known word, so unrelated
  words dilute the score.
- ``keywords``: ``1 - 0.5 ** hits`` for the distinct keywords found (one hit
  0.5, two 0.75, ...), scaled by how much of the text the intent's vocabulary
  covers (function words aside): "hello" alone is a greeting, "hello,
  explain relativity" mostly is not.
- ``confidence = 1 - (1 - similarity) * (1 - keywords)``: either signal alone
  can carry an intent, both together are surer.

The best intent wins (the first declared on a tie); below ``threshold`` the
answer is ``None``. Texts longer than ``MAX_CLASSIFY_CHARS`` get ``None``
at once: an intent names a short request, and a 64 KiB prompt must not pay
for tokenizing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_CLASSIFY_CHARS",
    "STOPWORDS",
    "STOP_WEIGHT",
    "IntentIndex",
    "IntentSpec",
    "classify_intent",
    "keyword_regex",
    "tokenize",
]

MAX_CLASSIFY_CHARS = 1_000

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")


def _stem(token: str) -> str:
    """Fold the commonest English inflections so "orders" meets "order"."""
    if token.endswith("'s"):
        token = token[:-2]
    elif "'" in token:  # don't, can't, i'm: keep the word before the apostrophe
        token = token.split("'", 1)[0]
    if token in STOPWORDS:
        return token
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is")):
        return token[:-1]
    return token


def tokenize(text: str) -> list[str]:
    """Lower-cased, lightly stemmed word tokens."""
    return [_stem(word) for word in _WORD.findall(text.lower())]


def keyword_regex(keywords: Iterable[str]) -> re.Pattern[str]:
    """One case-insensitive pattern that finds any of ``keywords`` as whole
    words (a trailing plural ``s``/``es`` allowed; inner spaces match any
    whitespace). Boundaries are look-arounds, not ``\\b``, so keywords that
    end in punctuation ("c++") still work."""
    parts = sorted({k.strip().lower() for k in keywords if k.strip()}, key=len, reverse=True)
    if not parts:
        raise ValueError("no keywords")
    alternatives = "|".join(r"\s+".join(map(re.escape, k.split())) for k in parts)
    return re.compile(rf"(?<!\w)(?:{alternatives})(?:e?s)?(?!\w)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class IntentSpec:
    """An intent as a rule file declares it."""

    keywords: Sequence[str] = ()
    examples: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class _Compiled:
    name: str
    keywords: re.Pattern[str] | None
    vocabulary: frozenset[str]
    examples: range
    """Indexes of this intent's examples in the index's example list."""


STOPWORDS = frozenset(
    """a an the is are am was were be been do does did i me my we our you your it its
    to of in on at for with from and or but so can could would will should shall may
    what when where who whom how why which this that these those there here please
    just any some about up out if then than""".split()
)
"""Function words: they shape "what can you do" but tell little apart, so
they weigh ``STOP_WEIGHT`` wherever they appear (as do bare numbers)."""

STOP_WEIGHT = 0.3


class IntentIndex:
    """Intents compiled for fast scoring: keyword regexes, word weights and
    an inverted index from word to (example, weight). Immutable after build."""

    def __init__(self, intents: Mapping[str, IntentSpec], threshold: float = 0.5) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"intent threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self.names: tuple[str, ...] = tuple(intents)
        per_intent = [[set(tokenize(e)) for e in spec.examples] for spec in intents.values()]
        vocabularies = [set().union(*examples) for examples in per_intent]
        df: dict[str, int] = {}
        for vocabulary in vocabularies:
            for token in vocabulary:
                df[token] = df.get(token, 0) + 1
        n = len(self.names)
        # IDF over intents, not examples: a word every intent uses separates nothing.
        self._weights = {t: math.log((1 + n) / (1 + d)) + 1.0 for t, d in df.items()}
        self._rarest = max(self._weights.values(), default=1.0)
        for token in self._weights:
            if _is_filler(token):
                self._weights[token] = STOP_WEIGHT
        # token -> [(example id, the token's weight in that unit-length example)]
        self._postings: dict[str, list[tuple[int, float]]] = {}
        compiled = []
        example_id = 0
        for (name, spec), examples, vocabulary in zip(
            intents.items(), per_intent, vocabularies, strict=True
        ):
            first = example_id
            for tokens in examples:
                norm = math.sqrt(sum(self._weights[t] ** 2 for t in tokens)) or 1.0
                for token in tokens:
                    self._postings.setdefault(token, []).append(
                        (example_id, self._weights[token] / norm)
                    )
                example_id += 1
            for keyword in spec.keywords:
                vocabulary.update(tokenize(keyword))
            compiled.append(
                _Compiled(
                    name,
                    keyword_regex(spec.keywords) if spec.keywords else None,
                    frozenset(vocabulary),
                    range(first, example_id),
                )
            )
        self._example_count = example_id
        self._intents = tuple(compiled)

    def __len__(self) -> int:
        return len(self._intents)

    def _weight(self, token: str) -> float:
        weight = self._weights.get(token)
        if weight is None:  # a word no example uses: as telling as the rarest one
            weight = STOP_WEIGHT if _is_filler(token) else self._rarest
        return weight

    def scores(self, text: str) -> dict[str, float]:
        """Every intent's confidence for ``text`` (0 when it is too long)."""
        if len(text) > MAX_CLASSIFY_CHARS:
            return dict.fromkeys(self.names, 0.0)
        tokens = tokenize(text)
        if not tokens:
            return dict.fromkeys(self.names, 0.0)
        counts: dict[str, int] = {}
        for token in tokens:
            counts[token] = counts.get(token, 0) + 1
        query: dict[str, float] = {t: c * self._weight(t) for t, c in counts.items()}
        query_norm = math.sqrt(sum(w * w for w in query.values()))
        dots = [0.0] * self._example_count
        for token, weight in query.items():
            for example_id, example_weight in self._postings.get(token, ()):
                dots[example_id] += weight * example_weight
        content = [t for t in tokens if not _is_filler(t)] or tokens
        out: dict[str, float] = {}
        for intent in self._intents:
            cosine = max((dots[i] for i in intent.examples), default=0.0) / query_norm
            similarity = min(cosine, 1.0) ** 2
            keyword = 0.0
            if intent.keywords is not None:
                hits = {" ".join(tokenize(m.group())) for m in intent.keywords.finditer(text)}
                if hits:
                    coverage = sum(1 for t in content if t in intent.vocabulary) / len(content)
                    keyword = (1.0 - 0.5 ** len(hits)) * coverage
            out[intent.name] = 1.0 - (1.0 - similarity) * (1.0 - keyword)
        return out

    def classify(self, text: str) -> tuple[str | None, float]:
        """The best intent and its confidence; ``(None, best)`` below the threshold."""
        best_name: str | None = None
        best = 0.0
        for name, score in self.scores(text).items():
            if score > best:
                best_name, best = name, score
        if best_name is None or best < self.threshold:
            return None, best
        return best_name, best


def _is_filler(token: str) -> bool:
    return token in STOPWORDS or token.isdigit()


def classify_intent(text: str, intents: IntentIndex) -> tuple[str | None, float]:
    """``(intent, confidence)`` for ``text``; ``intent`` is ``None`` when no
    intent reaches the index's threshold. Pure; build ``intents`` once
    (``IntentIndex(...)`` or a loaded ``RuleBook.intents``) and reuse it."""
    return intents.classify(text)
