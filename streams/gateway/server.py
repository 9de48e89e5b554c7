"""The gateway process (``laneway gateway``): one ``LanewayClient`` on a
reply topic of its own, Redis for what replicas share (per-key limits,
files, batches, the roll-out state), the batch submitter, the aiohttp app
on ``LANEWAY_GATEWAY_PORT``, and the ops endpoints (``/metrics``, ``/healthz``, ``/readyz``) on
``LANEWAY_HTTP_PORT`` as in every laneway process; its trace spans
(``laneway-gateway``) exported as every process's are (``LANEWAY_TRACING_*``).

    async with GatewayServer(settings) as server:   # tests, embedding
        print(server.base_url)                      # http://127.0.0.1:8080/v1
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import signal
import socket

from aiohttp import web

from schemas.settings import Settings
from streams.client import LanewayClient
from streams.gateway.app import Gateway
from streams.gateway.batches import BatchApi
from streams.gateway.keys import KeyRing
from streams.gateway.shared_limits import SharedLimiter
from streams.kafka.otlp import server_spans_for
from streams.ops import ProcessState, heartbeat
from streams.rollout.board import RolloutBoard
from streams.routing.registry import load_registry

__all__ = ["GatewayServer", "gateway_client_id", "serve_gateway"]

log = logging.getLogger(__name__)

DRAIN_S = 10.0
"""On stop, requests in flight get this long to finish."""
STORE_TIMEOUT_S = 10.0
"""Socket timeout of the Redis client that keeps files and batches (a file
is up to ``LANEWAY_GATEWAY_FILES_MAX_BYTES`` in one value)."""


def gateway_client_id() -> str:
    """``gateway-<host>-<random>``: a reply topic of each replica's own."""
    host = socket.gethostname().split(".")[0] or "host"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"gateway-{host}-{secrets.token_hex(4)}")[:200]


class GatewayServer:
    """The gateway's client and HTTP server, started and closed together."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        gateway = settings.gateway
        self.keys = KeyRing(gateway.keys_file, gateway.keys_reload_s)
        self.registry = load_registry(settings.routing.models_file, settings.backend)
        self.client_id = gateway.client_id or gateway_client_id()
        self.client = LanewayClient(settings.kafka, client_id=self.client_id)
        self.spans = server_spans_for(settings.tracing, "gateway", self.client_id)
        # Limits and the roll-out board: short timeouts, they fail open.
        self.redis = settings.redis.client()
        # Files and batches: their record; a file's bytes may take a while.
        self.store_redis = settings.redis.model_copy(
            update={"timeout_s": max(settings.redis.timeout_s, STORE_TIMEOUT_S)}
        ).client()
        self.batches: BatchApi | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = gateway.port

    @property
    def base_url(self) -> str:
        host = self.settings.gateway.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{shown}:{self.port}/v1"

    async def start(self) -> GatewayServer:
        gateway = self.settings.gateway
        if self.keys.open:
            log.warning(
                "no API keys configured (LANEWAY_GATEWAY_KEYS_FILE unset): the gateway "
                "accepts any key, or none, as tenant %r; add keys with `laneway keys add` "
                "and name their file",
                gateway.default_tenant,
            )
        elif not len(self.keys):
            log.warning(
                "%s holds no API keys: every request is refused (401) until "
                "`laneway keys add` writes one",
                gateway.keys_file,
            )
        else:
            log.info("%d API keys from %s", len(self.keys), gateway.keys_file)
        await self.client.start()
        self.batches = BatchApi(self.settings, self.client, self.store_redis, self.client_id)
        prefix = self.settings.redis.key_prefix
        app = Gateway(
            gateway,
            self.client,
            self.keys,
            self.registry,
            SharedLimiter(self.redis, prefix),
            board=RolloutBoard(self.redis, prefix, self.registry),
            board_refresh_s=self.settings.rollout.refresh_s,
            batches=self.batches,
            default_tenant=gateway.default_tenant,
            spans=self.spans,
        ).app()
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=DRAIN_S
        )
        try:
            await self._runner.setup()
            self._site = web.TCPSite(self._runner, gateway.host, gateway.port)
            await self._site.start()
        except BaseException:
            await self.close()
            raise
        if self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])
        self.batches.submitter.start()  # resumes what a stopped replica left
        log.info("OpenAI API on %s (replies on %s)", self.base_url, self.client.reply_to)
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # stops listening, lets requests in flight end
            self._runner = None
        if self.batches is not None:
            await self.batches.submitter.close()  # resumed by the next sweep anywhere
            self.batches = None
        await self.client.close()
        await self.redis.aclose()
        await self.store_redis.aclose()
        await self.spans.aclose()  # what is queued, within the export timeout

    async def __aenter__(self) -> GatewayServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def serve_gateway(settings: Settings, state: ProcessState) -> None:
    """Run the gateway until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    beat = asyncio.create_task(heartbeat(state))
    try:
        async with GatewayServer(settings) as server:
            state.ready, state.detail = True, f"serving {server.base_url}"
            await stop.wait()
            state.ready, state.detail = False, "stopping"
            log.info("stopping: requests in flight get up to %.0fs", DRAIN_S)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
