"""Request features and the complexity class they give: pure functions of
the request and settings, so the classifier's choices are testable without
services.

Features (``RequestFeatures``): estimated prompt tokens, intent (from the
rules engine's intent classifier), language, code and maths present,
reasoning asked for, deadline, tenant tier, conversation depth. The
complexity class says which models are capable of the request; the lane
says how soon it must be answered.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import IntEnum

from schemas.messages import InferenceRequest, Lane
from schemas.settings import RoutingSettings

__all__ = [
    "Complexity",
    "RequestFeatures",
    "TextTraits",
    "asks_realtime",
    "complexity_of",
    "detect_language",
    "estimate_tokens",
    "extract_features",
    "lane_for",
    "text_traits",
]

_CODE = re.compile(
    r"```|\bdef \w+\(|\bclass \w+|\bimport \w+|#include|\bfunction\s*\w*\(|=>|;\s*$|\{\s*$"
    r"|\b(SELECT|INSERT|UPDATE)\b .* \b(FROM|INTO|SET)\b",
    re.MULTILINE,
)
_MATH = re.compile(
    r"\d\s*[-+*/^\u00d7\u00f7]\s*\d|[=<>≤≥]\s*-?\d|\b(integral|derivative|equation|solve for|"
    r"square root|probability|percent of|how many|calculate)\b|[∑∫√π]",
    re.IGNORECASE,
)
_REASONING = re.compile(
    r"\b(explain|why|compare|analy[sz]e|prove|derive|step by step|pros and cons|"
    r"complain\w*|refund|summari[sz]e|translate|write|draft|plan|evaluate|design)\b",
    re.IGNORECASE,
)
_WORD = re.compile(r"[a-zà-ÿ']+")

# A few of each language's commonest words; enough to tell the languages
# laneway's users write in apart on a sentence, with no model to load.
_STOPWORDS: dict[str, frozenset[str]] = {
    "en": frozenset("the is are was what where how why my your you i to of and a in it".split()),
    "es": frozenset("el la los las es dónde donde qué cómo mi tu de y en un una por".split()),
    "fr": frozenset("le la les est où que quoi comment mon ma vous je de et un une pour".split()),
    "de": frozenset("der die das ist wo was wie mein meine ich du und ein eine nicht zu".split()),
    "pt": frozenset("o a os as é onde que como meu minha você de e um uma para não".split()),
}


class Complexity(IntEnum):
    """How capable a model must be. Ordered: a model that handles a class
    handles every class below it."""

    SIMPLE = 1
    MODERATE = 2
    COMPLEX = 3

    @classmethod
    def named(cls, name: str) -> Complexity:
        return cls[name.upper()]


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    tokens: int
    intent: str | None
    language: str
    has_code: bool
    has_math: bool
    reasoning: bool
    deadline_ms: int | None
    tier: str
    depth: int
    """Conversation turns before this one: earlier messages plus session history."""

    def as_dict(self) -> dict[str, float | int | bool | str | None]:
        """For drift detection and logs."""
        return asdict(self)


def estimate_tokens(text: str) -> int:
    """Rough token count for routing (about four characters a token)."""
    return max(1, (len(text) + 3) // 4)


def detect_language(text: str) -> str:
    """A coarse language tag: script first (CJK, Cyrillic, Arabic, ...), then
    stopword overlap for Latin-script text; ``"und"`` when nothing tells."""
    counts = {"zh": 0, "ja": 0, "ko": 0, "ru": 0, "ar": 0, "latin": 0}
    for ch in text[:2000]:
        code = ord(ch)
        if 0x3040 <= code <= 0x30FF:
            counts["ja"] += 1
        elif 0x4E00 <= code <= 0x9FFF:
            counts["zh"] += 1
        elif 0xAC00 <= code <= 0xD7AF:
            counts["ko"] += 1
        elif 0x0400 <= code <= 0x04FF:
            counts["ru"] += 1
        elif 0x0600 <= code <= 0x06FF:
            counts["ar"] += 1
        elif ch.isalpha() and code < 0x250:
            counts["latin"] += 1
    script = max(counts, key=lambda k: counts[k])
    if counts[script] == 0:
        return "und"
    if script == "zh" and counts["ja"]:
        return "ja"  # kana beside kanji
    if script != "latin":
        return script
    words = _WORD.findall(text[:2000].lower())
    best, hits = "und", 0
    for language, stop in _STOPWORDS.items():
        n = sum(1 for w in words if w in stop)
        if n > hits:
            best, hits = language, n
    return best if hits else "en"


@dataclass(frozen=True, slots=True)
class TextTraits:
    """The features that are functions of the asked text alone: a batch
    works them out once per distinct text (``streams.classify.batch``)."""

    text: str
    language: str
    has_code: bool
    has_math: bool
    reasoning: bool


def text_traits(text: str) -> TextTraits:
    return TextTraits(
        text,
        language=detect_language(text),
        has_code=bool(_CODE.search(text)),
        has_math=bool(_MATH.search(text)),
        reasoning=bool(_REASONING.search(text)),
    )


def extract_features(
    request: InferenceRequest,
    routing: RoutingSettings,
    *,
    intent: str | None = None,
    history_turns: int = 0,
    traits: TextTraits | None = None,
) -> RequestFeatures:
    """``traits``: ``text_traits`` of the request's ``user_text()``, if
    already known (worked out here otherwise)."""
    text = request.user_text()
    if traits is None or traits.text != text:
        traits = text_traits(text)
    messages = request.messages
    if messages is None:  # a prompt: the whole request is the text
        whole, earlier = text, 0
    else:
        whole, earlier = "\n".join(m.content for m in messages), max(0, len(messages) - 1)
    return RequestFeatures(
        tokens=estimate_tokens(whole),
        intent=intent,
        language=traits.language,
        has_code=traits.has_code if whole == text else bool(_CODE.search(whole)),
        has_math=traits.has_math,
        reasoning=traits.reasoning,
        deadline_ms=request.deadline_ms,
        tier=routing.tenant_tiers.get(request.tenant or "", "standard"),
        depth=earlier + history_turns,
    )


def complexity_of(features: RequestFeatures, routing: RoutingSettings) -> Complexity:
    """Code, maths and long prompts need the most capable model; reasoning,
    long conversations and prompts a little over the light limit need more
    than the smallest one; the rest is simple."""
    limit = routing.light_max_prompt_tokens
    if features.has_code or features.has_math or features.tokens > 4 * limit:
        return Complexity.COMPLEX
    if features.reasoning or features.tokens > limit or features.depth > routing.deep_dialogue:
        return Complexity.MODERATE
    return Complexity.SIMPLE


def asks_realtime(features: RequestFeatures, routing: RoutingSettings) -> bool:
    """A deadline only the realtime lane keeps (``realtime_max_deadline_ms``)."""
    deadline = features.deadline_ms
    return deadline is not None and deadline <= routing.realtime_max_deadline_ms


def lane_for(
    request: InferenceRequest,
    features: RequestFeatures,
    complexity: Complexity,
    routing: RoutingSettings,
) -> Lane:
    """The client's hint wins; a batch job rides bulk; a tight deadline, a
    premium tenant or simple work goes realtime; free-tier complex work and
    the rest go to medium or bulk."""
    if request.lane is not None:
        return request.lane
    if request.batch_id is not None:
        return Lane.BULK
    if asks_realtime(features, routing):
        return Lane.REALTIME
    if features.tier == "premium" or complexity is Complexity.SIMPLE:
        return Lane.REALTIME
    if (
        features.tier == "free"
        and complexity is Complexity.COMPLEX
        and features.deadline_ms is None
    ):
        return Lane.BULK
    return Lane.MEDIUM
