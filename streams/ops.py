"""Operations endpoints every process serves: ``/metrics`` (Prometheus),
``/healthz`` (the process is alive) and ``/readyz`` (it is doing its job).

The server runs in a daemon thread so it answers even while the event loop
is busy. So that ``/healthz`` still tells a wedged loop from a live one, the
loop beats (``heartbeat``, or a faust timer calling ``ProcessState.beat``)
and ``/healthz`` fails when the last beat is older than ``stall_s``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

__all__ = [
    "BACKLOG",
    "BATCH_SIZE",
    "FLOW_LEVEL",
    "LATENCY",
    "RECORDS",
    "REDIS_ERRORS",
    "RESULTS",
    "ROUTED",
    "TIME_PER_TOKEN",
    "TIME_TO_FIRST_TOKEN",
    "OpsServer",
    "ProcessState",
    "heartbeat",
]

log = logging.getLogger(__name__)

RECORDS = Counter(
    "laneway_records_total", "Records consumed, by component and outcome", ["component", "outcome"]
)
RESULTS = Counter(
    "laneway_results_total",
    "Terminal results produced, by lane, path and status",
    ["lane", "path", "status", "code"],
)
ROUTED = Counter(
    "laneway_routed_total",
    "Requests the classifier put on a lane, by lane, path and why the path was chosen",
    ["lane", "path", "choice"],
)
SPILLED = Counter(
    "laneway_spilled_total",
    "Model requests the classifier put on a lane, found it full and sent to another instead",
    ["from_lane", "to_lane"],
)
LATENCY = Histogram(
    "laneway_result_latency_seconds",
    "End-to-end latency from request produce time to result",
    ["lane", "path"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
TIME_TO_FIRST_TOKEN = Histogram(
    "laneway_time_to_first_token_seconds",
    "Streamed answers: from request produce time to the first chunk with text",
    ["lane", "path"],
    buckets=(0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
)
TIME_PER_TOKEN = Histogram(
    "laneway_time_per_output_token_seconds",
    "Streamed answers: from the first chunk to the last, per output token after the first",
    ["lane", "path"],
    buckets=(0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1),
)
BATCH_SIZE = Histogram(
    "laneway_batch_size", "Requests per worker batch", ["lane"], buckets=(1, 2, 4, 8, 16, 32, 64)
)

FLOW_LEVEL = Gauge("laneway_flow_level", "Flow controller load level (0 normal .. 3)")
BACKLOG = Gauge("laneway_lane_backlog", "Records waiting on a lane topic", ["lane"])

REDIS_ERRORS = Counter(
    "laneway_redis_errors_total", "Redis calls that failed (laneway went on without)", ["op"]
)


class ProcessState:
    """Liveness and readiness of one process, set by its main loop."""

    def __init__(self, stall_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.alive = True
        self.ready = False
        self.detail = "starting"
        self._stall_s = stall_s
        self._clock = clock
        self._last_beat: float | None = None

    def beat(self) -> None:
        """The event loop ran: called about once a second from the loop."""
        self._last_beat = self._clock()

    def health(self) -> tuple[bool, str]:
        """``(alive, why)``. Before the first beat the loop is still starting
        and counts as alive."""
        if not self.alive:
            return False, "dead"
        if self._last_beat is not None:
            silent = self._clock() - self._last_beat
            if silent > self._stall_s:
                return False, f"event loop stalled: no heartbeat for {silent:.0f}s"
        return True, "ok"


async def heartbeat(state: ProcessState, interval_s: float = 1.0) -> None:
    """Beat for ``state`` until cancelled."""
    while True:
        state.beat()
        await asyncio.sleep(interval_s)


class OpsServer:
    def __init__(self, host: str, port: int, state: ProcessState) -> None:
        state_ref = state

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    ok, why = state_ref.health()
                    self._send(200 if ok else 503, f"{why}\n".encode())
                elif self.path == "/readyz":
                    ok = state_ref.ready
                    self._send(200 if ok else 503, f"{state_ref.detail}\n".encode())
                else:
                    self._send(404, b"not found\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> OpsServer:
        self._thread.start()
        log.info("ops endpoints on http://%s:%s", *self._server.server_address[:2])
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
