"""``laneway up``: the embedded broker, Redis, the topics, and the
classifier, the lane workers and the quality/router agent as supervised
child processes.

A child that dies is restarted (with a growing pause if it keeps dying);
each child's output is prefixed with its name; SIGTERM/SIGINT stops every
child (SIGTERM first, so workers drain their batch), then the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from schemas.messages import Lane
from schemas.settings import Settings
from streams.kafka.topics import create_topics, wait_for_broker
from streams.tools.embedded import EmbeddedBroker, EmbeddedRedis, free_port

__all__ = ["Child", "Stack", "is_ready"]

log = logging.getLogger(__name__)


@dataclass
class Child:
    name: str
    args: list[str]
    http_port: int
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    _pump: threading.Thread | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Stack:
    """The whole embedded deployment of laneway in one object."""

    def __init__(
        self,
        settings: Settings,
        *,
        kafka_port: int | None = None,
        redis_port: int | None = None,
        use_external_redis: bool = False,
        http_port_base: int | None = 9400,
        lanes: tuple[Lane, ...] = tuple(Lane),
        out: IO[str] | None = None,
        log_dir: Path | None = None,
        child_env: dict[str, str] | None = None,
        workers_only: bool = False,
    ) -> None:
        """``workers_only``: the lane workers alone, no classifier, router or
        batch tracker (a benchmark of the workers' share)."""
        self.broker = EmbeddedBroker(
            kafka_port, log_path=log_dir / "tansu.log" if log_dir else None
        )
        self.redis = None if use_external_redis else EmbeddedRedis(redis_port)
        self._base_settings = settings
        self.out = out or sys.stdout
        self._lock = threading.Lock()
        ports = (
            [http_port_base + i for i in range(len(lanes) + 3)]
            if http_port_base
            else [free_port() for _ in range(len(lanes) + 3)]
        )
        self.children = [
            Child("classifier", ["classifier"], ports[0]),
            *(
                Child(f"worker-{lane}", ["worker", "--lane", str(lane)], ports[i + 1])
                for i, lane in enumerate(lanes)
            ),
            # The quality loop that keeps the router's statistics (DESIGN: 9404).
            Child("router", ["router"], ports[len(lanes) + 1]),
            # Counts batch jobs' results (streams.jobs.tracker): 9405.
            Child("batch-tracker", ["batch", "tracker"], ports[len(lanes) + 2]),
        ]
        if workers_only:
            self.children = [c for c in self.children if c.name.startswith("worker-")]
        self._stopping = False
        self._child_env = child_env or {}

    @property
    def settings(self) -> Settings:
        """The settings of the running stack (its real bootstrap and Redis URL)."""
        kafka = self._base_settings.kafka.model_copy(update={"bootstrap": self.broker.bootstrap})
        redis = self._base_settings.redis
        if self.redis is not None:
            redis = redis.model_copy(update={"url": self.redis.url})
        return self._base_settings.model_copy(update={"kafka": kafka, "redis": redis})

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    # -- lifecycle ---------------------------------------------------------

    def start(self, ready_timeout_s: float = 180.0) -> Stack:
        """Start everything and wait until every child is ready. On failure
        whatever was started is stopped again before the error propagates."""
        try:
            self.broker.start()
            if self.redis is not None:
                self.redis.start()
            settings = self.settings
            asyncio.run(self._prepare(settings))
            for child in self.children:
                self._spawn(child)
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        self._say(f"bootstrap: {settings.kafka.bootstrap}")
        self._say(f"redis: {_without_password(settings.redis.url)}")
        for child in self.children:
            self._say(f"{child.name}: http://127.0.0.1:{child.http_port}/metrics")
        return self

    @staticmethod
    async def _prepare(settings: Settings) -> None:
        await wait_for_broker(settings)
        await create_topics(settings)

    def _env(self, child: Child) -> dict[str, str]:
        settings = self.settings
        return {
            **os.environ,
            **self._child_env,
            "LANEWAY_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
            "LANEWAY_REDIS_URL": settings.redis.url,
            "LANEWAY_HTTP_PORT": str(child.http_port),
            "PYTHONUNBUFFERED": "1",
        }

    def _spawn(self, child: Child) -> None:
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "streams.tools.cli", *child.args],
            env=self._env(child),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        child.started_at = time.monotonic()
        child._pump = threading.Thread(target=self._pump, args=(child, child.proc), daemon=True)
        child._pump.start()

    def _pump(self, child: Child, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._say(f"[{child.name}] {line.decode(errors='replace').rstrip()}")

    def _say(self, line: str) -> None:
        with self._lock:
            print(line, file=self.out, flush=True)

    def wait_ready(self, timeout_s: float, names: list[str] | None = None) -> None:
        give_up = time.monotonic() + timeout_s
        waiting = [c for c in self.children if names is None or c.name in names]
        while waiting:
            waiting = [c for c in waiting if not is_ready(c.http_port)]
            for c in waiting:
                if c.proc is not None and c.proc.poll() is not None:
                    raise RuntimeError(f"{c.name} exited with {c.proc.returncode} while starting")
            if time.monotonic() > give_up:
                raise TimeoutError(f"not ready after {timeout_s}s: {[c.name for c in waiting]}")
            time.sleep(0.2)

    def supervise_once(self) -> None:
        """Restart every child that has died (called in a loop by ``run``)."""
        for child in self.children:
            if self._stopping or child.alive() or child.proc is None:
                continue
            code = child.proc.returncode
            uptime = time.monotonic() - child.started_at
            pause = 0.0 if uptime > 30 else min(30.0, 0.5 * 2 ** min(child.restarts, 6))
            self._say(f"[supervisor] {child.name} exited with {code}; restarting in {pause:.1f}s")
            time.sleep(pause)
            child.restarts += 1
            self._spawn(child)

    def run(self) -> None:
        """Supervise until SIGINT/SIGTERM."""
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(0.5):
            self.supervise_once()

    def stop(self, timeout_s: float = 45.0) -> None:
        """SIGTERM every child and wait (workers drain up to 30 s), then
        SIGKILL what is left; then the broker and Valkey."""
        self._stopping = True
        for child in self.children:
            if child.alive():
                assert child.proc is not None
                child.proc.send_signal(signal.SIGTERM)
        give_up = time.monotonic() + timeout_s
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.1, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._say(f"[supervisor] {child.name} did not stop in time; killing it")
                child.proc.kill()
                child.proc.wait()
        for child in self.children:
            if child._pump is not None:
                child._pump.join(timeout=5)  # the child's last words are printed
        self.broker.stop()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.stop()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _without_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def is_ready(port: int) -> bool:
    """Whether the laneway process serving ``port`` answers ``/readyz`` with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False
