"""The OpenAI Batch API on laneway's batch jobs (aiohttp routes):

- ``POST /v1/files`` (multipart, ``purpose=batch``): the input, validated
  whole (``streams.gateway.files``); ``GET /v1/files/{id}``,
  ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``;
- ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``GET /v1/batches``,
  ``POST /v1/batches/{id}/cancel``.

Statuses, counts and the output and error files come from laneway's job of
the batch's id (``streams.gateway.batch_shapes``); the submission runs in
the background (``streams.gateway.submitter``). Everything is the tenant's
of the caller's key: another tenant's file or batch is a 404.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import BodyPartReader, web

from schemas.jobs import BatchCounts, BatchJob, BatchJobStatus
from schemas.messages import InferenceResult
from schemas.settings import Settings
from streams.client import LanewayClient
from streams.gateway.batch_shapes import (
    OUTPUT,
    BatchRecord,
    batch_object,
    result_file_of,
    result_files,
)
from streams.gateway.batch_store import BatchStore
from streams.gateway.bodies import json_object
from streams.gateway.errors import GatewayError
from streams.gateway.files import CHAT_URL, FileStore, validate_batch_file
from streams.gateway.submitter import BatchSubmitter
from streams.jobs.jsonl import parse_jsonl, parse_window, request_id
from streams.jobs.results import output_line
from streams.jobs.store import JobStore

__all__ = ["BatchApi"]

ENDPOINTS = (CHAT_URL,)
"""Batch endpoints served: the output lines' bodies are ``chat.completion``s."""
MAX_METADATA = 16
READ_CHUNK = 256 * 1024

TenantOf = Callable[[web.Request], str]


class BatchApi:
    """The Batch API's routes over Redis (files, batch records, jobs)."""

    def __init__(self, settings: Settings, client: LanewayClient, redis: Any, replica: str) -> None:
        self.settings = settings
        self.client = client
        prefix = settings.redis.key_prefix
        self.files = FileStore(redis, prefix, ttl_s=settings.gateway.files_ttl_s)
        self.batches = BatchStore(redis, prefix, retention_s=settings.batch.retention_s)
        self.jobs = JobStore(redis, prefix, retention_s=settings.batch.retention_s)
        self.submitter = BatchSubmitter(settings, client, self.batches, self.files, replica)
        self._tenant_of: TenantOf = lambda request: ""

    def add_routes(self, router: web.UrlDispatcher, tenant_of: TenantOf) -> None:
        """``tenant_of``: the caller's tenant (the gateway's key check)."""
        self._tenant_of = tenant_of
        router.add_post("/v1/files", self.upload)
        router.add_get("/v1/files/{file_id}", self.file)
        router.add_get("/v1/files/{file_id}/content", self.file_content)
        router.add_delete("/v1/files/{file_id}", self.delete_file)
        router.add_post("/v1/batches", self.create)
        router.add_get("/v1/batches", self.list_batches)
        router.add_get("/v1/batches/{batch_id}", self.retrieve)
        router.add_post("/v1/batches/{batch_id}/cancel", self.cancel)

    # -- files -----------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        tenant = self._tenant_of(request)
        if not request.content_type.startswith("multipart/"):
            raise GatewayError(400, "upload a file as multipart/form-data", "INF-400", "file")
        reader = await request.multipart()
        purpose, filename, data = None, "upload.jsonl", None
        async for part in _parts(reader):
            if part.name == "purpose":
                purpose = (await part.text()).strip()
            elif part.name == "file":
                filename = part.filename or filename
                data = await self._read_capped(part)
        if data is None:
            raise GatewayError(400, "the form has no 'file' part", "INF-400", "file")
        if purpose != "batch":
            raise GatewayError(
                400,
                f"purpose must be 'batch' (the only one served), not {purpose!r}",
                "INF-400",
                "purpose",
            )
        # A thread: checking 50,000 lines takes seconds, the other requests go on.
        parsed = await asyncio.to_thread(
            validate_batch_file, data, self.settings.request_limits(), self.settings.batch.max_lines
        )
        record = await self.files.put(tenant, filename, purpose, data, parsed)
        return web.json_response(record.as_openai())

    async def _read_capped(self, part: BodyPartReader) -> bytes:
        cap = self.settings.gateway.files_max_bytes
        chunks, size = [], 0
        while chunk := await part.read_chunk(READ_CHUNK):
            size += len(chunk)
            if size > cap:
                raise GatewayError(
                    413,
                    f"the file is over {cap} bytes (LANEWAY_GATEWAY_FILES_MAX_BYTES)",
                    "file_too_large",
                    "file",
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def _result_file(
        self, tenant: str, file_id: str
    ) -> tuple[str, str, BatchJob, bytes] | None:
        """``(batch id, kind, job, content)`` when ``file_id`` names a batch's
        output or error file (404 unless it is the tenant's and final);
        ``None`` when it names an upload."""
        found = result_file_of(file_id)
        if found is None:
            return None
        batch_id, kind = found
        record, job = await self._final_job(tenant, file_id, batch_id, kind)
        return batch_id, kind, job, await self._result_bytes(record, job, kind)

    async def file(self, request: web.Request) -> web.Response:
        tenant = self._tenant_of(request)
        file_id = request.match_info["file_id"]
        result = await self._result_file(tenant, file_id)
        if result is not None:
            batch_id, kind, job, body = result
            return web.json_response(
                {
                    "id": file_id,
                    "object": "file",
                    "bytes": len(body),
                    "created_at": (job.finished_at_ms or job.created_at_ms) // 1000,
                    "expires_at": None,
                    "filename": f"{batch_id}_{kind}.jsonl",
                    "purpose": "batch_output",
                    "status": "processed",
                    "status_details": None,
                }
            )
        upload = await self.files.get(tenant, file_id)
        if upload is None:
            raise _no_file(file_id)
        return web.json_response(upload.as_openai())

    async def file_content(self, request: web.Request) -> web.Response:
        tenant = self._tenant_of(request)
        file_id = request.match_info["file_id"]
        result = await self._result_file(tenant, file_id)
        if result is not None:
            body = result[3]
        else:
            content = await self.files.content(tenant, file_id)
            if content is None:
                raise _no_file(file_id)
            body = content
        return web.Response(body=body, content_type="application/octet-stream")

    async def delete_file(self, request: web.Request) -> web.Response:
        tenant = self._tenant_of(request)
        file_id = request.match_info["file_id"]
        if result_file_of(file_id) is not None:
            raise GatewayError(
                400, "a batch's output and error files go with the batch", "INF-400", "file_id"
            )
        if not await self.files.delete(tenant, file_id):
            raise _no_file(file_id)
        return web.json_response({"id": file_id, "object": "file", "deleted": True})

    async def _final_job(
        self, tenant: str, file_id: str, batch_id: str, kind: str
    ) -> tuple[BatchRecord, BatchJob]:
        """The batch and job whose results ``file_id`` is; 404 unless the
        job is final, the tenant's, and has such a file."""
        record = await self.batches.get(batch_id, tenant)
        if record is None:
            raise _no_file(file_id)
        job = await self.jobs.get(batch_id)
        output, errors = result_files(job)
        if job is None or (output if kind == OUTPUT else errors) != file_id:
            raise _no_file(file_id)
        return record, job

    async def _input_lines(
        self, record: BatchRecord, job: BatchJob
    ) -> AsyncIterator[list[tuple[int, str]]]:
        """The job's ``(line, custom_id)``s in input order; for a batch
        cancelled before its submission wrote them, its input file's."""
        written = False
        async for chunk in self.jobs.lines(job.id):
            written = True
            yield chunk
        if written:
            return
        data = await self.files.content(record.tenant, record.input_file_id)
        if data is not None:
            parsed = await asyncio.to_thread(
                parse_jsonl,
                data,
                self.settings.request_limits(),
                max_lines=self.settings.batch.max_lines,
            )
            yield [(line.line, line.custom_id) for line in parsed.lines]

    async def _result_bytes(self, record: BatchRecord, job: BatchJob, kind: str) -> bytes:
        """The output file (lines answered ok) or the error file (the rest),
        in input order, as OpenAI's Batch API writes them."""
        lines: list[str] = []
        openai_job = job.model_copy(update={"format": "openai"})
        async for chunk in self._input_lines(record, job):
            ids = [request_id(job.id, custom_id) for _, custom_id in chunk]
            found = await self.jobs.results(job.id, ids)
            for (line, custom_id), rid, raw in zip(chunk, ids, found, strict=True):
                result = None if raw is None else InferenceResult.model_validate_json(raw)
                row = output_line(openai_job, line, custom_id, rid, result)
                if (row["error"] is None) == (kind == OUTPUT):
                    lines.append(json.dumps(row, ensure_ascii=False))
        return "".join(line + "\n" for line in lines).encode()

    # -- batches ---------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        tenant = self._tenant_of(request)
        body = await json_object(request)
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str) or not input_file_id:
            raise _bad(
                "input_file_id: the id of a file uploaded with purpose=batch", "input_file_id"
            )
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise _bad(
                f"endpoint must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}", "endpoint"
            )
        window = body.get("completion_window", "24h")
        try:
            window_s = parse_window(str(window))
        except ValueError as exc:
            raise _bad(f"completion_window: {exc}", "completion_window") from None
        metadata = _metadata(body.get("metadata"))
        unknown = set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"}
        if unknown:
            raise _bad(f"unknown field(s): {', '.join(sorted(unknown))}", sorted(unknown)[0])
        upload = await self.files.get(tenant, input_file_id)
        if upload is None:
            raise _no_file(input_file_id, "input_file_id")
        if upload.purpose != "batch":
            raise _bad(
                f"file {input_file_id} has purpose {upload.purpose!r}, not 'batch'", "input_file_id"
            )
        others = sorted(set(upload.urls) - {endpoint})
        if others:
            raise _bad(
                f"the file's lines name {', '.join(others)}; a batch's lines must all name "
                f"its endpoint {endpoint}",
                "endpoint",
            )
        record = BatchRecord(
            id=f"batch_{uuid.uuid4().hex[:24]}",
            tenant=tenant,
            input_file_id=input_file_id,
            endpoint=str(endpoint),
            completion_window=str(window),
            window_s=window_s,
            created_at=int(time.time()),
            metadata=metadata,
            lines=upload.lines,
            content_sha256=upload.content_sha256,
        )
        await self.batches.create(record)
        self.submitter.submit(record.id)
        return web.json_response(batch_object(record, None))

    async def retrieve(self, request: web.Request) -> web.Response:
        record = await self._record(request)
        return web.json_response(batch_object(record, await self.jobs.get(record.id)))

    async def list_batches(self, request: web.Request) -> web.Response:
        tenant = self._tenant_of(request)
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            raise _bad("limit must be a whole number from 1 to 100", "limit") from None
        if not 1 <= limit <= 100:
            raise _bad("limit must be a whole number from 1 to 100", "limit")
        records, more = await self.batches.list_for(
            tenant, after=request.query.get("after"), limit=limit
        )
        data = [batch_object(r, await self.jobs.get(r.id)) for r in records]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": more,
            }
        )

    async def cancel(self, request: web.Request) -> web.Response:
        """Stop what has not started: requests already produced still run
        and are counted. A batch not yet submitted gets a cancelled job
        (its submission then finds it so and produces nothing)."""
        record = await self._record(request)
        job = await self.jobs.get(record.id)
        if job is not None and job.final:
            if job.status is BatchJobStatus.CANCELLED:
                return web.json_response(batch_object(record, job))
            raise GatewayError(
                409, f"batch {record.id} is {job.status}: it cannot be cancelled", "INF-400"
            )
        now = int(time.time())
        await self.batches.set_fields(record.id, cancel_at=now)
        record = await self._record(request)
        if job is None:
            created_ms = record.created_at * 1000
            await self.jobs.create(
                BatchJob(
                    id=record.id,
                    status=BatchJobStatus.VALIDATING,
                    tenant=record.tenant or None,
                    format="openai",
                    content_sha256=record.content_sha256 or None,
                    counts=BatchCounts(total=record.lines),
                    created_at_ms=created_ms,
                    expires_at_ms=created_ms + record.window_s * 1000,
                )
            )
        await self.client.cancel_batch(record.id, settings=self.settings)
        return web.json_response(batch_object(record, await self.jobs.get(record.id)))

    async def _record(self, request: web.Request) -> BatchRecord:
        tenant = self._tenant_of(request)
        batch_id = request.match_info["batch_id"]
        record = await self.batches.get(batch_id, tenant)
        if record is None:
            raise GatewayError(
                404, f"No batch found with id '{batch_id}'.", "not_found", "batch_id"
            )
        return record


async def _parts(reader: Any) -> AsyncIterator[BodyPartReader]:
    while True:
        part = await reader.next()
        if part is None:
            return
        if isinstance(part, BodyPartReader):
            yield part


def _metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's rule: at most 16 pairs, keys up to 64 characters, string
    values up to 512."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) > MAX_METADATA:
        raise _bad(f"metadata: an object of at most {MAX_METADATA} pairs", "metadata")
    for key, item in value.items():
        if (
            not isinstance(key, str)
            or len(key) > 64
            or not isinstance(item, str)
            or len(item) > 512
        ):
            raise _bad(
                "metadata: keys of at most 64 characters, string values of at most 512", "metadata"
            )
    return dict(value)


def _bad(message: str, param: str | None) -> GatewayError:
    return GatewayError(400, message, "INF-400", param)


def _no_file(file_id: str, param: str = "file_id") -> GatewayError:
    return GatewayError(404, f"No such File object: {file_id}", "not_found", param)
