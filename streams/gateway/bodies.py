"""Reading a request's JSON body, with a 400 that says what is wrong."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from streams.gateway.errors import GatewayError

__all__ = ["json_object"]


async def json_object(request: web.Request) -> Mapping[str, Any]:
    """The body as a JSON object, or a 400 (``INF-400``)."""
    try:
        body = await request.json()
    except ValueError as exc:
        raise GatewayError(400, f"the body is not JSON: {exc}", "INF-400") from None
    if not isinstance(body, Mapping):
        raise GatewayError(400, "the body must be a JSON object", "INF-400")
    return body
