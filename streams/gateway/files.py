"""Uploaded files (``POST /v1/files``, ``purpose=batch``), kept in Redis so
that every gateway replica finds them. ``<r>`` is ``LANEWAY_REDIS_KEY_PREFIX``:

- ``<r>:gateway:file:<id>``       hash: the File object's fields and its tenant
- ``<r>:gateway:file:<id>:data``  string: the file's bytes

Both expire ``LANEWAY_GATEWAY_FILES_TTL_S`` after the upload; a file is at
most ``LANEWAY_GATEWAY_FILES_MAX_BYTES``. A file belongs to the tenant of
the key that uploaded it: another tenant's key is answered 404, as for a
file that does not exist.

A batch input file is validated whole on upload with laneway's own batch
file parser (``streams.jobs.jsonl``), every bad line listed in one 400.
The Batch API takes OpenAI's line shape only (``custom_id``, ``method``,
``url``, ``body``): its output lines are OpenAI's.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from schemas.messages import RequestLimits
from streams.gateway.errors import GatewayError
from streams.jobs.jsonl import ParsedFile, parse_jsonl
from streams.stores.keyspace import own_slot

__all__ = ["FileRecord", "FileStore", "line_urls", "validate_batch_file"]

MAX_ERRORS_SHOWN = 20
"""Bad lines named in a 400's message (all of them are in ``laneway.errors``)."""
CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int
    lines: int = 0
    """Requests in the file (its valid lines: an accepted file has no other)."""
    urls: tuple[str, ...] = ()
    """The ``url`` its lines name (a batch's ``endpoint`` must be the only one)."""
    content_sha256: str = ""

    def as_openai(self) -> dict[str, Any]:
        """OpenAI's File object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def validate_batch_file(data: bytes, limits: RequestLimits, max_lines: int) -> ParsedFile:
    """The parsed file, or a 400 that lists its bad lines (line numbers
    1-based, at most ``MAX_ERRORS_SHOWN`` in the message, every one in the
    error's ``laneway.errors``)."""
    parsed = parse_jsonl(data, limits, max_lines=max_lines)
    errors = [e.as_dict() for e in parsed.errors]
    for line in parsed.lines:
        if line.shape != "openai":
            errors.append(
                {
                    "line": line.line,
                    "custom_id": line.custom_id,
                    "error": "the Batch API takes OpenAI's line shape: "
                    '{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}',
                }
            )
    errors.sort(key=lambda e: e["line"])
    if not parsed.lines and not errors:
        raise GatewayError(400, "the file has no requests (no non-blank line)", "INF-400", "file")
    if errors:
        shown = "; ".join(f"line {e['line']}: {e['error']}" for e in errors[:MAX_ERRORS_SHOWN])
        more = len(errors) - MAX_ERRORS_SHOWN
        raise GatewayError(
            400,
            f"{len(errors)} invalid line(s) in the batch file, nothing was stored: {shown}"
            + (f"; and {more} more" if more > 0 else ""),
            "invalid_batch_file",
            "file",
            extra={"errors": errors},
        )
    return parsed


def line_urls(parsed: ParsedFile) -> tuple[str, ...]:
    """The endpoints the file's lines name (laneway's parser keeps a chat
    line's ``messages`` and a completions line's ``prompt``)."""
    urls = {CHAT_URL if "messages" in line.body else COMPLETIONS_URL for line in parsed.lines}
    return tuple(sorted(urls))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class FileStore:
    def __init__(self, redis: Any, key_prefix: str, *, ttl_s: int) -> None:
        self.redis = redis
        self.key_prefix = key_prefix
        self.ttl_s = ttl_s

    def key(self, file_id: str, part: str | None = None) -> str:
        # A file's record and its bytes in one slot: one transaction writes both.
        base = own_slot(f"{self.key_prefix}:gateway:file", file_id)
        return base if part is None else f"{base}:{part}"

    async def put(
        self, tenant: str, filename: str, purpose: str, data: bytes, parsed: ParsedFile
    ) -> FileRecord:
        now = int(time.time())
        record = FileRecord(
            id=f"file-{uuid.uuid4().hex[:24]}",
            tenant=tenant,
            filename=filename,
            purpose=purpose,
            bytes=len(data),
            created_at=now,
            expires_at=now + self.ttl_s,
            lines=len(parsed.lines),
            urls=line_urls(parsed),
            content_sha256=parsed.content_sha256,
        )
        fields = {
            "id": record.id,
            "tenant": tenant,
            "filename": filename,
            "purpose": purpose,
            "bytes": record.bytes,
            "created_at": record.created_at,
            "expires_at": record.expires_at,
            "lines": record.lines,
            "urls": json.dumps(record.urls),
            "content_sha256": record.content_sha256,
        }
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self.key(record.id, "data"), data, ex=self.ttl_s)
        pipe.hset(self.key(record.id), mapping=fields)
        pipe.expire(self.key(record.id), self.ttl_s)
        await pipe.execute()
        return record

    async def get(self, tenant: str, file_id: str) -> FileRecord | None:
        """The file, ``None`` when it does not exist or is another tenant's."""
        raw = await self.redis.hgetall(self.key(file_id))
        if not raw:
            return None
        data = {_text(k): _text(v) for k, v in raw.items()}
        if data.get("tenant", "") != tenant:
            return None
        return FileRecord(
            id=data["id"],
            tenant=data["tenant"],
            filename=data["filename"],
            purpose=data["purpose"],
            bytes=int(data["bytes"]),
            created_at=int(data["created_at"]),
            expires_at=int(data["expires_at"]),
            lines=int(data.get("lines", 0)),
            urls=tuple(json.loads(data.get("urls", "[]"))),
            content_sha256=data.get("content_sha256", ""),
        )

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        if await self.get(tenant, file_id) is None:
            return None
        data = await self.redis.get(self.key(file_id, "data"))
        return None if data is None else bytes(data)

    async def delete(self, tenant: str, file_id: str) -> bool:
        if await self.get(tenant, file_id) is None:
            return False
        await self.redis.delete(self.key(file_id), self.key(file_id, "data"))
        return True
