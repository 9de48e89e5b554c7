"""The current-stack file: where a running ``laneway up`` (or ``laneway
demo``) can be reached, so that every other command finds it.

``laneway up`` writes it once the stack is ready and removes it when the
stack stops: ``~/.cache/laneway/stack.json``, or ``LANEWAY_STACK_FILE``.
It holds the Kafka bootstrap, the Redis URL, each child's metrics port, the
gateway's URL, the supervisor's pid and the start time. A file whose pid is
no longer alive is stale: it is ignored, with a one-line note.

``apply_stack`` is the one place a process's settings take these addresses,
below the environment: a ``LANEWAY_KAFKA_BOOTSTRAP`` or ``LANEWAY_REDIS_URL``
that is set wins over the file (what a pydantic-settings source of lower
priority than the environment would do, decided on the built ``Settings``
by the fields the environment set).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.settings import Settings

__all__ = [
    "DEFAULT_STACK_FILE",
    "STACK_FILE_ENV",
    "CurrentStack",
    "FoundStack",
    "apply_stack",
    "find_stack",
    "pid_alive",
    "remove_stack_file",
    "stack_file_path",
    "write_stack_file",
]

STACK_FILE_ENV = "LANEWAY_STACK_FILE"
DEFAULT_STACK_FILE = Path("~/.cache/laneway/stack.json")


class CurrentStack(BaseModel):
    """What ``laneway up`` records about itself (the file's content)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_: str = Field(default="laneway.stack/1", alias="schema")
    kafka_bootstrap: str
    """The embedded broker's bootstrap address."""
    redis_url: str
    """The stack's Redis (its embedded Valkey, or the external one it was given)."""
    topic_prefix: str = "laneway"
    """Its topics' prefix (``LANEWAY_KAFKA_TOPIC_PREFIX``)."""
    redis_key_prefix: str = "laneway"
    """Its Redis keys' prefix (``LANEWAY_REDIS_KEY_PREFIX``)."""
    redis_cluster: bool = False
    """Whether ``redis_url`` names a node of a Redis Cluster (``LANEWAY_REDIS_CLUSTER``)."""
    metrics: dict[str, int]
    """Each child's name and the port of its ``/metrics``, ``/healthz`` and ``/readyz``."""
    gateway_url: str | None = None
    """The OpenAI-compatible API (``None``: started without a gateway)."""
    pid: int
    """The supervisor's process id: the file is stale once it is gone."""
    started_at: float
    """When the stack was ready (epoch seconds)."""

    def metrics_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}/metrics" for port in self.metrics.values()]


@dataclass(frozen=True, slots=True)
class FoundStack:
    """What ``find_stack`` found at ``path``: a live stack, or why none."""

    path: Path
    stack: CurrentStack | None
    note: str | None = None
    """One line for the user when a file was there but is not used."""


def stack_file_path(environ: Mapping[str, str] | None = None) -> Path:
    """``LANEWAY_STACK_FILE``, else ``~/.cache/laneway/stack.json``."""
    env = os.environ if environ is None else environ
    chosen = env.get(STACK_FILE_ENV)
    return Path(chosen).expanduser() if chosen else DEFAULT_STACK_FILE.expanduser()


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks, sends nothing)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def write_stack_file(path: Path, stack: CurrentStack) -> None:
    """Write ``stack`` to ``path`` atomically, readable by its owner only
    (the Redis URL may hold a password)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(stack.model_dump_json(by_alias=True, indent=2) + "\n")
    os.replace(partial, path)


def remove_stack_file(path: Path, pid: int) -> bool:
    """Remove ``path`` if it is the record of the stack of ``pid`` (a
    newer stack's file is left alone). Returns whether it was removed."""
    try:
        recorded = CurrentStack.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return False
    if recorded.pid != pid:
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def find_stack(path: Path) -> FoundStack:
    """The stack recorded at ``path`` when its supervisor is alive."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return FoundStack(path, None)
    except OSError as exc:
        return FoundStack(path, None, f"cannot read the stack file {path}: {exc}; ignored")
    try:
        stack = CurrentStack.model_validate_json(raw)
    except (ValidationError, ValueError):
        return FoundStack(path, None, f"the stack file {path} is not a laneway stack; ignored")
    if not pid_alive(stack.pid):
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(stack.started_at))
        note = (
            f"the stack file {path} is stale (pid {stack.pid}, started {started}, "
            "is not running); ignored"
        )
        return FoundStack(path, None, note)
    return FoundStack(path, stack)


def apply_stack(settings: Settings, stack: CurrentStack | None) -> Settings:
    """``settings`` with the stack's Kafka bootstrap, Redis URL and
    prefixes wherever the environment did not set them (the environment
    wins, field by field)."""
    if stack is None:
        return settings
    kafka = {"bootstrap": stack.kafka_bootstrap, "topic_prefix": stack.topic_prefix}
    redis = {
        "url": stack.redis_url,
        "key_prefix": stack.redis_key_prefix,
        "cluster": stack.redis_cluster,
    }
    kafka = {k: v for k, v in kafka.items() if k not in settings.kafka.model_fields_set}
    redis = {k: v for k, v in redis.items() if k not in settings.redis.model_fields_set}
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update=kafka),
            "redis": settings.redis.model_copy(update=redis),
        }
    )


def as_json(found: FoundStack) -> dict[str, object]:
    """``found`` as ``laneway status --json`` shows it (no password)."""
    if found.stack is None:
        return {"path": str(found.path), "found": False, "note": found.note}
    return {"path": str(found.path), "found": True, **json.loads(found.stack.model_dump_json())}
