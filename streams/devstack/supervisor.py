"""``laneway up``: the embedded broker, Redis, the topics, and the
classifier, the lane workers and the quality/router agent as supervised
child processes.

A child that dies is restarted (with a growing pause if it keeps dying);
each child's output is prefixed with its name; SIGTERM/SIGINT stops every
child (SIGTERM first, so workers drain their batch), then the broker.

With a ``log_path`` (what ``laneway up`` and ``laneway demo`` do unless
``-v``), the children's output goes to that file and the console gets short
status lines: each step of the start, each process as it gets ready, a
restart, and the last lines of a process that failed.
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
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pydantic import TypeAdapter

from schemas.messages import Lane
from schemas.settings import Settings
from streams.devstack.embedded import EmbeddedBroker, EmbeddedRedis, free_port
from streams.devstack.stackfile import (
    CurrentStack,
    find_stack,
    remove_stack_file,
    write_stack_file,
)
from streams.kafka.topics import create_topics, wait_for_broker

__all__ = ["Child", "Stack", "is_ready", "recorded", "without_password"]

log = logging.getLogger(__name__)


@dataclass
class Child:
    name: str
    args: list[str]
    http_port: int
    env: dict[str, str] = field(default_factory=dict)
    """Settings of this child alone (the gateway's port)."""
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    _pump: threading.Thread | None = field(default=None, repr=False)
    last_lines: deque[str] = field(default_factory=lambda: deque(maxlen=20), repr=False)
    """The end of its output, shown when it fails to start."""

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
        log_path: Path | None = None,
        gateway_port: int | None = None,
        replicas: int = 1,
    ) -> None:
        """``lanes``: a worker for each (a lane named twice gets two, in
        one consumer group). ``replicas``: how many classifiers, routers
        and batch trackers (the second of each is named ``classifier-2``,
        and so on; each kind shares one consumer group). ``workers_only``:
        the lane workers alone, no classifier, router or batch tracker (a
        benchmark of the workers' share). ``log_path``: the
        children's output goes there, and ``out`` gets status lines only.
        ``gateway_port``: also the OpenAI-compatible gateway, its API on
        that port (0: a free one)."""
        self.broker = EmbeddedBroker(
            kafka_port, log_path=log_dir / "tansu.log" if log_dir else None
        )
        self.redis = None if use_external_redis else EmbeddedRedis(redis_port)
        self._base_settings = settings
        self.out = out or sys.stdout
        self.log_path = log_path
        self._log: IO[str] | None = None
        self._lock = threading.Lock()
        ports = (
            [http_port_base + i for i in range(len(lanes) + 3)]
            if http_port_base
            else [free_port() for _ in range(len(lanes) + 3)]
        )
        self.children = [
            Child("classifier", ["classifier"], ports[0]),
            *(
                Child(_worker_name(lanes, i), ["worker", "--lane", str(lane)], ports[i + 1])
                for i, lane in enumerate(lanes)
            ),
            # The quality loop that keeps the router's statistics (DESIGN: 9404).
            Child("router", ["router"], ports[len(lanes) + 1]),
            # Counts batch jobs' results (streams.jobs.tracker): 9405.
            Child("batch-tracker", ["batch", "tracker"], ports[len(lanes) + 2]),
        ]
        self.gateway_port: int | None = None
        if gateway_port is not None and not workers_only:
            # The OpenAI-compatible HTTP gateway (streams.gateway): ops on 9406.
            self.gateway_port = gateway_port or free_port()
            gateway_env = {"LANEWAY_GATEWAY_PORT": str(self.gateway_port)}
            ops_port = http_port_base + len(lanes) + 3 if http_port_base else free_port()
            self.children.append(Child("gateway", ["gateway"], ops_port, env=gateway_env))
        if replicas < 1:
            raise ValueError(f"replicas must be 1 or more, not {replicas}")
        for nth in range(2, replicas + 1):
            for name, args in (
                ("classifier", ["classifier"]),
                ("router", ["router"]),
                ("batch-tracker", ["batch", "tracker"]),
            ):
                port = http_port_base + len(self.children) if http_port_base else free_port()
                self.children.append(Child(f"{name}-{nth}", args, port))
        if workers_only:
            self.children = [c for c in self.children if c.name.startswith("worker-")]
        self._stopping = False
        self.ready_at: float | None = None
        """When ``start`` found every child ready (epoch seconds)."""
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
        begun = time.monotonic()
        try:
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log = open(self.log_path, "a", buffering=1)
                self._status(f"logs: {self.log_path}")
            self._status("starting the broker")
            self.broker.start()
            if self.redis is not None:
                self._status("starting Valkey")
                self.redis.start()
            settings = self.settings
            self._status("creating topics")
            asyncio.run(self._prepare(settings))
            names = ", ".join(child.name for child in self.children)
            self._status(f"starting {names}; the workers load their models first")
            for child in self.children:
                self._spawn(child)
            self.wait_ready(ready_timeout_s, announce=True)
        except BaseException as exc:
            self._explain(exc)
            self.stop()
            raise
        self._status(f"ready in {time.monotonic() - begun:.0f} s")
        self._status(f"bootstrap: {settings.kafka.bootstrap}")
        self._status(f"redis: {without_password(settings.redis.url)}")
        for child in self.children:
            self._detail(f"{child.name}: http://127.0.0.1:{child.http_port}/metrics")
        if self.gateway_url is not None:
            self._status(f"openai: {self.gateway_url}")
        self.ready_at = time.time()
        return self

    @property
    def gateway_url(self) -> str | None:
        """The OpenAI-compatible API's base URL (``None``: no gateway)."""
        if not any(child.name == "gateway" for child in self.children):
            return None
        host = self._base_settings.gateway.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{shown}:{self.gateway_port}/v1"

    def record(self) -> CurrentStack:
        """Where this started stack can be reached, supervised by this
        process: what ``laneway up`` writes to the current-stack file."""
        settings = self.settings
        return CurrentStack(
            kafka_bootstrap=settings.kafka.bootstrap,
            redis_url=settings.redis.url,
            # What the children run with: their own environment may set a prefix.
            topic_prefix=self._child_env.get(
                "LANEWAY_KAFKA_TOPIC_PREFIX", settings.kafka.topic_prefix
            ),
            redis_key_prefix=self._child_env.get(
                "LANEWAY_REDIS_KEY_PREFIX", settings.redis.key_prefix
            ),
            redis_cluster=TypeAdapter(bool).validate_python(
                self._child_env.get("LANEWAY_REDIS_CLUSTER", settings.redis.cluster)
            ),
            metrics={child.name: child.http_port for child in self.children},
            gateway_url=self.gateway_url,
            pid=os.getpid(),
            started_at=self.ready_at or time.time(),
        )

    def _explain(self, exc: BaseException) -> None:
        """What a person needs after a failed start: what failed and the end
        of the output of any child that died."""
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            return
        self._status(f"failed to start: {exc}")
        if self._log is None:
            return  # the children's output is on the console already
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None and child.last_lines:
                self._status(f"last lines of {child.name}:")
                for line in child.last_lines:
                    self._status(f"  {line}")
        self._status(f"full logs: {self.log_path}")

    @staticmethod
    async def _prepare(settings: Settings) -> None:
        await wait_for_broker(settings)
        await create_topics(settings)

    def _env(self, child: Child) -> dict[str, str]:
        settings = self.settings
        return {
            **os.environ,
            # The stack's own prefixes, so a child never takes another stack's
            # from a current-stack file (the environment wins over the file).
            "LANEWAY_KAFKA_TOPIC_PREFIX": settings.kafka.topic_prefix,
            "LANEWAY_REDIS_KEY_PREFIX": settings.redis.key_prefix,
            **self._child_env,
            **child.env,
            "LANEWAY_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
            "LANEWAY_REDIS_URL": settings.redis.url,
            "LANEWAY_HTTP_PORT": str(child.http_port),
            "PYTHONUNBUFFERED": "1",
        }

    def _spawn(self, child: Child) -> None:
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli.main", *child.args],
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
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            child.last_lines.append(line)
            self._detail(f"[{child.name}] {line}")

    def _status(self, line: str) -> None:
        """A line for the console (and the log file, when there is one)."""
        with self._lock:
            print(line, file=self.out, flush=True)
            if self._log is not None:
                print(f"[supervisor] {line}", file=self._log)

    def _detail(self, line: str) -> None:
        """A line for the log file; the console gets it only without one."""
        with self._lock:
            print(line, file=self._log or self.out, flush=self._log is None)

    def wait_ready(
        self, timeout_s: float, names: list[str] | None = None, *, announce: bool = False
    ) -> None:
        """Wait until the children (``names``, or all) answer ``/readyz``;
        ``announce``: say on the console as each one gets there."""
        begun = time.monotonic()
        give_up = begun + timeout_s
        waiting = [c for c in self.children if names is None or c.name in names]
        while waiting:
            for c in [c for c in waiting if is_ready(c.http_port)]:
                waiting.remove(c)
                if announce:
                    self._status(f"  {c.name} ready ({time.monotonic() - begun:.0f} s)")
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
            self._status(f"{child.name} exited with {code}; restarting in {pause:.1f}s")
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

    @contextlib.contextmanager
    def supervising(self, every_s: float = 0.5) -> Iterator[Stack]:
        """Restart dead children every ``every_s`` from a thread while the
        block runs (``run`` without the signal handlers, for a stack that a
        benchmark breaks on purpose)."""
        stop = threading.Event()

        def supervise() -> None:
            while not stop.wait(every_s):
                self.supervise_once()

        thread = threading.Thread(target=supervise, name="supervisor", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=35)  # a restart pause is at most 30 s

    def wait_restarted(self, child: Child, restarts: int, timeout_s: float) -> None:
        """Wait until ``child`` has been restarted since it had ``restarts``
        restarts, and answers ``/readyz`` (a worker: its models loaded)."""
        give_up = time.monotonic() + timeout_s
        while not (child.restarts > restarts and child.alive() and is_ready(child.http_port)):
            if time.monotonic() > give_up:
                raise TimeoutError(
                    f"{child.name} not restarted and ready within {timeout_s:.0f} s "
                    f"(restarts {child.restarts}, alive {child.alive()})"
                )
            time.sleep(0.2)

    def metric_total(self, name: str, children: str = "") -> float:
        """The sum of metric ``name`` over the children whose name starts
        with ``children`` (``metric_total``; 0 for those without it)."""
        found = [
            metric_total(child.http_port, name)
            for child in self.children
            if child.name.startswith(children)
        ]
        return sum(value for value in found if value is not None)

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
                self._status(f"{child.name} did not stop in time; killing it")
                child.proc.kill()
                child.proc.wait()
        for child in self.children:
            if child._pump is not None:
                child._pump.join(timeout=5)  # the child's last words are printed
        self.broker.stop()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.stop()
        with self._lock:
            log_file, self._log = self._log, None
        if log_file is not None:
            log_file.close()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def recorded(stack: Stack, stack_file: Path, *, replace: bool = True) -> Iterator[Path]:
    """Start ``stack`` and record it in ``stack_file`` (the current-stack
    file of ``laneway up`` and ``laneway demo``) while the block runs; then
    remove the file and stop the stack. ``replace=False``: a live stack
    already recorded there keeps its place (``demo`` beside an ``up``).
    Stacks a test starts itself are never recorded: only these commands
    call this."""
    wrote = False
    try:
        stack.start()
        if replace or find_stack(stack_file).stack is None:
            write_stack_file(stack_file, stack.record())
            wrote = True
        yield stack_file
    finally:
        if wrote:
            remove_stack_file(stack_file, os.getpid())
        stack.stop()


def _worker_name(lanes: tuple[Lane, ...], i: int) -> str:
    """``worker-<lane>``, and ``-2``, ``-3`` for a lane's second and third worker."""
    nth = lanes[: i + 1].count(lanes[i])
    return f"worker-{lanes[i]}" + (f"-{nth}" if nth > 1 else "")


def without_password(url: str) -> str:
    """``url`` with its password shown as ``***`` (for the console)."""
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


def metric_total(port: int, name: str) -> float | None:
    """The sum of every sample of ``name`` (all its labels) on the /metrics
    of the laneway process serving ``port``; ``None`` when it does not
    answer or does not export it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name} ", f"{name}{{"))
    ]
    return sum(values) if values else None
