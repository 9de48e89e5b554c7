"""The response cache's pure text and key functions: normalisation, scope,
the exact-match key, cache control, the entity and word-order guards and the
store policy.

No Redis, no asyncio, no numpy: everything here is a function of the request
(and result) alone. ``streams.cache.response`` re-exports the public names.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable

from schemas.messages import InferenceRequest, InferenceResult
from schemas.settings import CacheSettings

__all__ = [
    "cache_control",
    "cache_key",
    "cache_scope",
    "entities",
    "key_of",
    "normalise_prompt",
    "reordered",
    "request_entities",
    "store_refusal",
    "time_relative",
    "word_order",
]

_TRAILING = " \t\r\n.?!,;:\u2026\u3002\u3001"
"""Trailing characters that do not change what is asked (full-width ? and !
are plain ones after NFKC)."""

_KEY_VERSION = "v1"
"""Bumped when normalisation changes, so old entries are simply never found."""


def _clean(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(text.split()).rstrip(_TRAILING)


def normalise_prompt(request: InferenceRequest) -> str:
    """The request's text as the cache compares it, independent of the model
    that will answer: case-folded, whitespace collapsed, trailing punctuation
    trimmed. A prompt and a lone user message are the same question; longer
    chats become one ``role: content`` line per turn (contents never keep a
    newline, so turns cannot be forged from inside a message)."""
    chat = request.chat()
    if len(chat) == 1 and chat[0].role == "user":
        return _clean(chat[0].content)
    return "\n".join(f"{m.role}: {_clean(m.content)}" for m in chat)


def _max_tokens_class(max_tokens: int) -> str:
    """Budgets close enough to share an answer; a reply cut at 64 tokens is
    no answer to a request for 1000."""
    for bound in (64, 256, 1024):
        if max_tokens <= bound:
            return f"<={bound}"
    return ">1024"


def _temperature_class(temperature: float) -> str:
    if temperature == 0:
        return "0"
    return "low" if temperature <= 0.7 else "high"


def cache_scope(request: InferenceRequest, settings: CacheSettings, context: str = "") -> str:
    """Everything besides the text that must match for two requests to share
    an answer, stop strings included (they cut the answer), and the model a
    request named (``InferenceRequest.model``: it gets that model's answer,
    never one another path gave). A JSON list, so no tenant name can forge
    another scope. The seed and ``top_p`` are left out: only temperature-0
    answers are shared, and greedy decoding ignores them."""
    tenant = (request.tenant or "") if settings.per_tenant else "*"
    context_digest = hashlib.blake2b(context.encode(), digest_size=8).hexdigest() if context else ""
    scope: list[object] = [
        tenant,
        _max_tokens_class(request.max_tokens),
        _temperature_class(request.temperature),
        context_digest,
    ]
    if request.stop:  # only when given, so the keys of requests without stops stay the same
        scope.append(sorted(set(request.stop)))
    named = request.named_model()
    if named is not None:  # that model's answers only; keys without one stay the same
        scope.append({"model": named})
    return json.dumps(scope)


def key_of(scope: str, text: str) -> str:
    """The exact-match key of an already normalised text in ``scope``."""
    payload = json.dumps([_KEY_VERSION, scope, text]).encode()
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def cache_key(request: InferenceRequest, settings: CacheSettings, context: str = "") -> str:
    """The exact-match key: a hash of the normalised text and the scope.
    ``context`` is the conversation history the answer depended on ("" for none)."""
    return key_of(cache_scope(request, settings, context), normalise_prompt(request))


def cache_control(request: InferenceRequest) -> tuple[bool, bool]:
    """``(read, write)`` from ``metadata["cache"]``: ``"bypass"`` skips the
    lookup, ``"no-store"`` keeps the answer out. Several directives may be
    given comma-separated or as a list; anything else is ignored, so a typo
    never breaks a request."""
    value = request.metadata.get("cache")
    if isinstance(value, str):
        directives = {part.strip().lower() for part in value.split(",")}
    elif isinstance(value, list | tuple):
        directives = {str(part).strip().lower() for part in value}
    else:
        directives = set()
    return "bypass" not in directives, "no-store" not in directives


_PLAIN_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
_QUOTED = re.compile(r"\"([^\"]+)\"|`([^`]+)`|(?<!\w)'([^']+)'(?!\w)")
_EDGE_PUNCT = "\"'`()[]{}<>,.;:!?\u00bf\u00a1#"
_CLOSERS = "\"')]}"
_SENTENCE_END = (".", "!", "?", "\u2026")
_PRONOUN_I = frozenset({"i", "i'm", "i've", "i'll", "i'd"})
_DAYS = "monday tuesday wednesday thursday friday saturday sunday weekday weekend"
_MONTHS = "january february march april june july august september october november december"
_RELATIVE_DAYS = "today tonight tomorrow yesterday"
"""Days named from now: an entity (``_CLOSED_SETS``) and a time that moves
on (``time_relative``)."""
_CLOSED_SETS = {
    word: word
    for word in (
        _DAYS.split()
        + _MONTHS.split()  # not "may": a verb far more often than the month
        + _RELATIVE_DAYS.split()
        + "morning afternoon evening".split()
        + "two three four five six seven eight nine ten eleven twelve".split()
    )
} | {day + "s": day for day in _DAYS.split()}
"""Words of small closed sets that change what is asked whatever their
case, and that an embedding barely tells apart: "opening hours on monday"
and "... on tuesday" are 0.944 alike with MiniLM, "... today" and "...
tomorrow" 0.955 (the semantic threshold is 0.93). Each maps to the entity
it stands for ("mondays" is "monday"). Not "one": a pronoun too ("which
one")."""


def _is_specific(word: str) -> bool:
    """Specific wherever it stands: numbers and ids (a digit), emails, URLs,
    paths, file and identifier names, acronyms and CamelCase."""
    return (
        any(c.isdigit() for c in word)
        or any(c in "@/_." for c in word)
        or any(c.isupper() for c in word[1:])
    )


def entities(text: str) -> frozenset[str]:
    """The specifics a prompt is about, case-folded: anything with a digit
    (numbers, ids like A-123, order numbers, versions), emails, URLs, dotted
    or slashed names, quoted strings, acronyms, capitalised words that are
    not a sentence's first (names rather than sentence openers), and days,
    months, times of day and small numbers in words, in any case
    (``_CLOSED_SETS``).

    Used only to *refuse* semantic hits, so it errs towards finding too
    much: a spurious entity costs a model call, a missed one a wrong answer.
    Names typed in lower case are not found; the similarity threshold (and
    the word-order guard, ``reordered``) then guard alone. Measured with
    MiniLM, lower-case names mostly stay well under the threshold ("install
    python on windows" / "... on linux" 0.895, "... docker on ubuntu" / "...
    on debian" 0.866, "reset my iphone" / "... ipad" 0.754).
    """
    text = unicodedata.normalize("NFKC", text).translate(_PLAIN_QUOTES)
    found = {
        " ".join(next(g for g in m.groups() if g is not None).casefold().split())
        for m in _QUOTED.finditer(text)
    }
    sentence_start = True
    for raw in text.split():
        word = raw.strip(_EDGE_PUNCT)
        folded = word.casefold()
        if word and folded not in _PRONOUN_I:
            if folded in _CLOSED_SETS:
                found.add(_CLOSED_SETS[folded])
            elif _is_specific(word) or (word[0].isupper() and not sentence_start):
                found.add(folded)
        sentence_start = raw.rstrip(_CLOSERS).endswith(_SENTENCE_END)
    found.discard("")
    return frozenset(found)


def request_entities(request: InferenceRequest) -> frozenset[str]:
    """Entities of every message (each content starts a new sentence)."""
    found: frozenset[str] = frozenset()
    for message in request.chat():
        found |= entities(message.content)
    return found


_WORD = re.compile(r"\w+(?:'\w+)*")
_UNORDERED = frozenset(
    """a an the is are was were be been am do does did can could would should will
    shall may might must i i'm me my mine you your yours we us our it its this that
    these those there here what what's whats how how's why when where who whom which
    please tell explain show give me let's just""".split()
)
"""Words whose place in a question is free ("how do I ...?" / "..., how?"):
the word-order guard does not compare them."""


_RELATIVE_WORDS = frozenset(
    _RELATIVE_DAYS.split() + "now nowadays currently latest recently upcoming".split()
)
_RELATIVE_SPANS = re.compile(r"\b(?:this|next|last) (?:week|weekend|month|year)\b")


def time_relative(text: str) -> bool:
    """Whether a normalised text (``normalise_prompt``) asks about a time
    that moves on: "today", "tomorrow", "now", "the latest", "this week".
    Its answer may be wrong by the next day, so the cache keeps it for
    ``relative_time_ttl_s`` rather than the day-long ``ttl_s``. Errs towards
    finding too much ("how do I log in now"): that costs a model call an
    hour later, a miss would serve yesterday's "today". Not "current" or
    "recent": "my current password" and "recent orders" ask nothing of the
    date, and FAQ answers like theirs would lose their day in the cache."""
    words = {word.split("'", 1)[0] for word in _WORD.findall(text)}  # "today's": today
    return not _RELATIVE_WORDS.isdisjoint(words) or bool(_RELATIVE_SPANS.search(text))


def word_order(text: str) -> tuple[str, ...]:
    """The words of a normalised text (``normalise_prompt``) whose order the
    word-order guard compares, in the order they come: every word outside
    ``_UNORDERED``, a repeated one marked by its count ("to", then "to#2")."""
    seen: dict[str, int] = {}
    out = []
    for word in _WORD.findall(text):
        if word in _UNORDERED:
            continue
        n = seen[word] = seen.get(word, 0) + 1
        out.append(word if n == 1 else f"{word}#{n}")
    return tuple(out)


def reordered(query: tuple[str, ...], entry: tuple[str, ...]) -> bool:
    """Whether two words the texts share (``word_order`` of each) trade
    places around a third that stays between them: "convert celsius to
    fahrenheit" against "convert fahrenheit to celsius", "flights from paris
    to london" against "flights to paris from london", "is 3 bigger than 5"
    against "is 5 bigger than 3". An embedding scores such a pair as one
    question (0.99 with MiniLM for the first) and the entity guard cannot
    tell them apart (the same names), so a semantic hit is refused on it.
    Words that only move ("I forgot my password, how do I reset it?" against
    "how do I reset my password") are a paraphrase and pass. Like the entity
    guard it errs towards refusing: a refused paraphrase costs a model call,
    a swapped direction a wrong answer.

    In the entry's positions of the shared words, taken in the query's
    order, that is a run of three that falls (not necessarily adjacent)."""
    at = {word: i for i, word in enumerate(entry)}
    places = [at[word] for word in query if word in at]
    if len(places) < 3:
        return False
    lowest_after = places[:]
    for i in range(len(places) - 2, -1, -1):
        lowest_after[i] = min(places[i], lowest_after[i + 1])
    highest_before = places[0]
    for i in range(1, len(places) - 1):
        if highest_before > places[i] > lowest_after[i + 1]:
            return True
        highest_before = max(highest_before, places[i])
    return False


def store_refusal(request: InferenceRequest, result: InferenceResult) -> str | None:
    """Why ``result`` must not be replayed for ``request``, or ``None`` if it may.

    Only what a model said deterministically and in full is replayed: never an
    error (a router that cached upstream errors served them as successes),
    a rule or cache answer (their own source is cheaper and current), or a
    degraded fallback answer."""
    _, write = cache_control(request)
    reasons: Iterable[tuple[bool, str]] = (
        (not write, "client asked for no-store"),
        (result.id != request.id, f"result {result.id!r} is not for request {request.id!r}"),
        (result.status != "ok" or result.error is not None, "not a success"),
        (request.temperature != 0, "sampled (temperature > 0)"),
        (not (result.output or "").strip(), "empty output"),
        (result.degraded, "degraded answer"),
        (
            result.path is None or not result.path.is_model,
            f"path {result.path} is not a model path",
        ),
    )
    return next((why for refused, why in reasons if refused), None)
