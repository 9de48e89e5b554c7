"""The live roll-out state: which version of each path is active, canary
(with its share) or shadow, kept in Redis and laid over the registry file.

The registry file (``streams.routing.registry``) says what versions exist
and how each starts; ``laneway models ...`` writes changes to the Redis hash
``<prefix>:models:rollout``, one field per version
(``<kind>:<path>:<version>``, kind ``model``; a learned router's versions
can sit beside them under a kind of their own) whose value is the JSON of a
``VersionRollout``. Every classifier replica re-reads the hash every
``LANEWAY_ROLLOUT_REFRESH_S`` and applies it to the file (``apply``); an
override that names a version the file does not list is ignored, and a
path whose overrides leave it without exactly one active version keeps the
file's states (both logged).

The operations (``promote``, ``canary``, ``shadow``, ``rollback``) are pure
functions of the effective registry that return the fields to write, or
raise ``RolloutError`` saying what is wrong (an unknown path or version,
a share out of range).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from schemas.messages import AnswerPath
from streams.routing.registry import ModelEntry, ModelRegistry, VersionState
from streams.stores.failopen import FailOpen

__all__ = [
    "MODEL_KIND",
    "Overrides",
    "RolloutError",
    "RolloutStore",
    "VersionRollout",
    "apply",
    "canary",
    "field_name",
    "parse_field",
    "promote",
    "rollback",
    "shadow",
    "since",
]

log = logging.getLogger(__name__)

MODEL_KIND = "model"
"""The kind of the roll-out fields of model versions."""

Overrides = dict[tuple[AnswerPath, str], "VersionRollout"]
"""Per (path, version), the live state laid over the registry file's."""


class RolloutError(ValueError):
    """A roll-out change that cannot be made; the message says why."""


@dataclass(frozen=True, slots=True)
class VersionRollout:
    """One version's live state."""

    state: VersionState
    share: float | None = None
    at_ms: int = 0
    """When it was set (epoch ms): the quality loop judges a canary on the
    events since then only."""
    by: str = "cli"
    """``cli`` or ``rollback`` (the quality loop drained it)."""
    reason: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> VersionRollout:
        data = json.loads(raw)
        state = data["state"]
        if state not in ("active", "canary", "shadow", "retired"):
            raise ValueError(f"unknown state {state!r}")
        share = data.get("share")
        if share is not None and not 0 <= float(share) <= 1:
            raise ValueError(f"share {share} outside 0..1")
        return cls(
            state,
            None if share is None else float(share),
            int(data.get("at_ms", 0)),
            str(data.get("by", "cli")),
            data.get("reason"),
        )


def field_name(subject: AnswerPath | str, version: str, kind: str = MODEL_KIND) -> str:
    """``<kind>:<subject>:<version>``: ``model:heavy:2``."""
    return f"{kind}:{subject}:{version}"


def parse_field(name: str) -> tuple[str, str, str] | None:
    """``(kind, subject, version)`` of a field: the subject is a model path
    for kind ``model``, whatever the kind names otherwise (a router)."""
    kind, _, rest = name.partition(":")
    subject, _, version = rest.partition(":")
    if not kind or not subject or not version:
        return None
    return kind, subject, version


def apply(
    registry: ModelRegistry, overrides: Mapping[tuple[AnswerPath, str], VersionRollout]
) -> ModelRegistry:
    """The registry file with the live states and shares laid over it."""
    if not overrides:
        return registry
    models: list[ModelEntry] = []
    for path in dict.fromkeys(m.model_path for m in registry.models):
        versions = registry.versions(path)
        changed = [
            _overridden(m, overrides[(path, m.version)]) if (path, m.version) in overrides else m
            for m in versions
        ]
        active = [m.version for m in changed if m.state == "active"]
        if len(active) != 1:
            log.warning(
                "roll-out state of %s leaves %d active versions %s: the file's states apply",
                path,
                len(active),
                active,
            )
            changed = list(versions)
        models.extend(changed)
    unknown = sorted(f"{p}:{v}" for p, v in overrides if registry.version(p, v) is None)
    if unknown:
        log.debug("roll-out state names versions the registry does not list: %s", unknown)
    try:
        return ModelRegistry(models=tuple(models))
    except ValidationError as exc:  # cannot happen after the checks above; the file wins
        log.warning("roll-out state not applied: %s", exc)
        return registry


def _overridden(entry: ModelEntry, live: VersionRollout) -> ModelEntry:
    return entry.model_copy(update={"state": live.state, "share": live.share})


def _entry(registry: ModelRegistry, path: str, version: str | None = None) -> ModelEntry:
    known = {m.path for m in registry.models}
    if path not in known:
        raise RolloutError(f"unknown path {path!r}: the registry has {sorted(known)}")
    if version is None:
        entry = registry.for_path(AnswerPath(path))
        assert entry is not None
        return entry
    entry = registry.version(AnswerPath(path), version)
    if entry is None:
        versions = [m.version for m in registry.versions(AnswerPath(path))]
        raise RolloutError(f"path {path} has no version {version!r}: it has {versions}")
    return entry


def promote(
    registry: ModelRegistry, path: str, version: str, *, now_ms: int
) -> dict[tuple[AnswerPath, str], VersionRollout]:
    """``version`` becomes the path's active version; the one before it retires."""
    entry = _entry(registry, path, version)
    current = _entry(registry, path)
    if entry.version == current.version:
        raise RolloutError(f"{path} {version} is already the active version")
    return {
        (entry.model_path, entry.version): VersionRollout("active", None, now_ms),
        (current.model_path, current.version): VersionRollout("retired", None, now_ms),
    }


def canary(
    registry: ModelRegistry, path: str, version: str, share: float, *, now_ms: int
) -> dict[tuple[AnswerPath, str], VersionRollout]:
    """``version`` gets ``share`` of the path's traffic."""
    entry = _entry(registry, path, version)
    if not 0 <= share <= 1:
        raise RolloutError(f"share {share} is outside 0..1")
    if entry.state == "active":
        raise RolloutError(f"{path} {version} is the active version; canary another one")
    return {(entry.model_path, entry.version): VersionRollout("canary", share, now_ms)}


def shadow(
    registry: ModelRegistry, path: str, version: str, share: float | None, *, now_ms: int
) -> dict[tuple[AnswerPath, str], VersionRollout]:
    """``version`` gets a copy of ``share`` of the path's requests (all when ``None``)."""
    entry = _entry(registry, path, version)
    if share is not None and not 0 <= share <= 1:
        raise RolloutError(f"share {share} is outside 0..1")
    if entry.state == "active":
        raise RolloutError(f"{path} {version} is the active version; shadow another one")
    return {(entry.model_path, entry.version): VersionRollout("shadow", share, now_ms)}


def rollback(
    registry: ModelRegistry, path: str, *, now_ms: int, by: str = "cli", reason: str | None = None
) -> dict[tuple[AnswerPath, str], VersionRollout]:
    """Every canary of ``path`` with traffic goes back to share 0."""
    _entry(registry, path)
    live = [
        m for m in registry.versions(AnswerPath(path)) if m.state == "canary" and m.traffic_share
    ]
    if not live:
        raise RolloutError(f"path {path} has no canary with traffic to roll back")
    return {
        (m.model_path, m.version): VersionRollout("canary", 0.0, now_ms, by, reason) for m in live
    }


_DRAIN = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  local ok, value = pcall(cjson.decode, current)
  if ok and value['state'] == 'canary' and (value['share'] or 0) == 0 then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


class RolloutStore:
    """The roll-out hash in Redis. Reads fail open: ``None`` when Redis
    cannot say (the caller keeps what it knew)."""

    def __init__(self, redis: Any, key_prefix: str) -> None:
        self._redis = redis
        self.key = f"{key_prefix}:models:rollout"
        self._failopen = FailOpen("roll-out state", log=log, label="rollout")

    async def read(self) -> Overrides | None:
        """The model versions' live states (``None``: Redis cannot say)."""
        fields = await self.read_kind(MODEL_KIND)
        if fields is None:
            return None
        return {(AnswerPath(s), v): live for (s, v), live in fields.items() if AnswerPath.valid(s)}

    async def read_kind(self, kind: str) -> dict[tuple[str, str], VersionRollout] | None:
        """Every live state of ``kind`` by (subject, version): the same hash
        carries other kinds of versions (a learned router's) beside the models'."""
        try:
            raw = await self._redis.hgetall(self.key)
        except (RedisError, OSError) as exc:
            self._failopen.failed("read", exc)
            return None
        self._failopen.answered()
        out: dict[tuple[str, str], VersionRollout] = {}
        for name, value in raw.items():
            parsed = parse_field(name.decode() if isinstance(name, bytes) else name)
            if parsed is None or parsed[0] != kind:
                continue
            try:
                out[(parsed[1], parsed[2])] = VersionRollout.from_json(value)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("roll-out field %r unreadable: %s", name, exc)
        return out

    async def write(
        self,
        changes: Mapping[tuple[AnswerPath, str], VersionRollout]
        | Mapping[tuple[str, str], VersionRollout],
        kind: str = MODEL_KIND,
    ) -> None:
        """Set every field of ``changes`` (by subject and version) at once
        (raises on a Redis error: the CLI says the change was not made)."""
        mapping = {field_name(p, v, kind): r.to_json() for (p, v), r in changes.items()}
        if mapping:
            await self._redis.hset(self.key, mapping=mapping)

    async def drain(
        self,
        path: AnswerPath | str,
        version: str,
        reason: str,
        *,
        now_ms: int,
        kind: str = MODEL_KIND,
    ) -> bool:
        """Set a canary to share 0 because of ``reason``; ``True`` only for
        the caller that drained it (a canary already at 0 is left alone), so
        of several quality-loop replicas one reports the rollback."""
        drained = VersionRollout("canary", 0.0, now_ms, "rollback", reason)
        try:
            done = await self._redis.eval(
                _DRAIN, 1, self.key, field_name(path, version, kind), drained.to_json()
            )
        except (RedisError, OSError) as exc:
            self._failopen.failed("drain", exc)
            return False
        return bool(done)

    async def clear(self) -> None:
        await self._redis.delete(self.key)


def since(
    overrides: Mapping[tuple[AnswerPath, str], VersionRollout], path: AnswerPath, version: str
) -> int:
    """When ``version``'s live state was last set (0: never, the file's)."""
    live = overrides.get((path, version))
    return live.at_ms if live is not None else 0
