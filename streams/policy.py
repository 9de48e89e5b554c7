"""The first lane/path policy: a pure function of the request and settings.

- a rule owns the intent        -> path ``rules`` (answered by the classifier)
- short, plain prompt           -> path ``light`` (small model)
- long prompt, code, math, or a question that asks for reasoning -> ``heavy``

Lane: the client's hint wins; else a batch job goes to ``bulk``, a tight
deadline or a light request to ``realtime``, the rest to ``medium``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schemas.messages import InferenceRequest, Lane, Path
from schemas.settings import RoutingSettings
from streams.rules import RuleAnswer, RuleBook

__all__ = ["Decision", "decide", "estimate_tokens", "looks_hard"]

_HARD = re.compile(
    r"```|\bdef |\bclass |[=<>^]\s*\d|\d\s*[-+*/^]\s*\d|\b(explain|why|compare|analy[sz]e|"
    r"prove|derive|step by step|complain\w*|refund|summari[sz]e|translate|write)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Decision:
    lane: Lane
    path: Path
    rule: RuleAnswer | None = None
    requested_path: Path | None = None
    """Set when flow control moved the request off the path the policy chose."""


def estimate_tokens(text: str) -> int:
    """Rough token count for routing (about four characters a token)."""
    return max(1, (len(text) + 3) // 4)


def looks_hard(text: str) -> bool:
    return bool(_HARD.search(text))


def decide(request: InferenceRequest, routing: RoutingSettings, rules: RuleBook) -> Decision:
    text = request.user_text()
    rule = rules.answer(text) if routing.rules_enabled else None
    if rule is not None:
        path = Path.RULES
    elif estimate_tokens(
        request.prompt or "".join(m.content for m in request.chat())
    ) > routing.light_max_prompt_tokens or looks_hard(text):
        path = Path.HEAVY
    else:
        path = Path.LIGHT

    if request.lane is not None:
        lane = request.lane
    elif request.batch_id is not None:
        lane = Lane.BULK
    elif (
        request.deadline_ms is not None and request.deadline_ms <= routing.realtime_max_deadline_ms
    ) or path in (Path.RULES, Path.LIGHT):
        lane = Lane.REALTIME
    else:
        lane = Lane.MEDIUM
    return Decision(lane=lane, path=path, rule=rule)
