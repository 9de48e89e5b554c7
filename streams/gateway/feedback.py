"""``POST /v1/feedback``: what a client says of an answer, as laneway's
``Feedback`` wire message (pure). OpenAI has no such endpoint; this is
laneway's own::

    POST /v1/feedback
    {"id": "chatcmpl-gw-…", "score": 1}            # -1 (bad) .. +1 (good)
    {"id": "chatcmpl-gw-…", "thumbs": "down", "comment": "made up a date"}

``id`` is a completion's ``id`` (``chatcmpl-<request id>``), a batch output
line's ``id`` (``batch_req_<request id>``), or the request id itself
(``X-Laneway-Request-Id``). The gateway produces it with the SDK's own
``LanewayClient.feedback`` onto ``<p>.feedback``, keyed by request id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from schemas.messages import Feedback
from streams.gateway.errors import GatewayError

__all__ = ["MAX_COMMENT", "THUMBS", "parse_feedback", "request_id_of"]

MAX_COMMENT = 4000
THUMBS = {"up": 1.0, "down": -1.0}
_ID_PREFIXES = ("chatcmpl-", "batch_req_")
_FIELDS = frozenset({"id", "score", "thumbs", "comment"})


def request_id_of(answer_id: str) -> str:
    """laneway's request id of an answer id the gateway handed out."""
    for prefix in _ID_PREFIXES:
        if answer_id.startswith(prefix):
            return answer_id[len(prefix) :]
    return answer_id


def _bad(message: str, param: str | None) -> GatewayError:
    return GatewayError(400, message, "INF-400", param)


def parse_feedback(body: Mapping[str, Any]) -> Feedback:
    """The ``Feedback`` a body asks for, or a 400 saying what to fix."""
    unknown = set(body) - _FIELDS
    if unknown:
        raise _bad(f"unknown field(s): {', '.join(sorted(unknown))}", sorted(unknown)[0])
    answer_id = body.get("id")
    if not isinstance(answer_id, str) or not request_id_of(answer_id).strip():
        raise _bad("id: the completion's id (chatcmpl-…) or its request id is required", "id")
    score, thumbs = body.get("score"), body.get("thumbs")
    if (score is None) == (thumbs is None):
        raise _bad("give one of score (-1..1) and thumbs (up|down)", "score")
    if thumbs is not None:
        if thumbs not in THUMBS:
            raise _bad(f"thumbs must be 'up' or 'down', not {thumbs!r}", "thumbs")
        score = THUMBS[thumbs]
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise _bad(f"score must be a number from -1 to 1, not {score!r}", "score")
    comment = body.get("comment")
    if comment is not None and not isinstance(comment, str):
        raise _bad("comment must be a string", "comment")
    if comment is not None and len(comment) > MAX_COMMENT:
        raise _bad(f"comment is {len(comment)} characters, limit {MAX_COMMENT}", "comment")
    try:
        return Feedback(request_id=request_id_of(answer_id), score=float(score), comment=comment)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else None
        raise _bad(f"{field}: {first['msg']}", field) from None
