"""Router versions: the learned router goes out as a model version does.

A router version is ``rule`` (no learned router: the feature rule and the
live latency/cost/failure score alone) or a learned router artifact
(``streams.routing.learned``) named by its ``version``. ``RouterCatalog``
lists them: ``rule``, every ``*.json`` in ``LANEWAY_ROUTING_LEARNED_ROUTER_DIR``
and the file ``LANEWAY_ROUTING_LEARNED_ROUTER``. The file setting's version
starts active (else ``rule`` does); every other starts retired. Live states
and shares sit in the roll-out hash beside the models' (``state``, fields
``router:learned:<version>``), and are laid over those defaults the way a
model's are over its registry file (``apply_router``): an override naming
a version no artifact here lists is kept, and that version serves the
rule's decision (the quality loop judges router versions it has no
artifacts for); overrides that leave no single active version leave the
defaults in force.

Per request the router version is picked as a model version is
(``pick_router``): the assignment key (session, tenant, id) at its own point
``unit(key, "router:learned")``, so independent of every model version's;
canaries take consecutive slices as wide as their shares. Shadow router
versions are sampled per request id (``unit(id, "shadow:router:<version>")``
below the share): the classifier computes their decision too and only
counts whether it agrees with the one taken (``ShadowTally``, flushed to
``<prefix>:router:shadow``, read by ``laneway models report --routers``).

Loading fails open: an artifact that cannot be read is logged once and
its version serves the rule's decision (``RouterCatalog.learned`` is
``None`` for it), so rolling out a broken file changes no path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter
from redis.exceptions import RedisError

from schemas.messages import AnswerPath, InferenceRequest
from schemas.settings import RoutingSettings
from streams.rollout.assign import assignment_key, unit
from streams.rollout.state import RolloutError, VersionRollout
from streams.routing.learned import ArtifactError, LearnedRouter
from streams.routing.registry import VersionState

__all__ = [
    "ROUTER_KIND",
    "ROUTER_NAME",
    "ROUTER_SUBJECT",
    "RULE_VERSION",
    "RouterCatalog",
    "RouterVersion",
    "RouterView",
    "ShadowTally",
    "apply_router",
    "canary_router",
    "describe",
    "pick_router",
    "pick_router_shadows",
    "promote_router",
    "read_tally",
    "rollback_router",
    "shadow_router",
    "tally_key",
]

log = logging.getLogger(__name__)

ROUTER_KIND = "router"
ROUTER_NAME = "learned"
ROUTER_SUBJECT = "router"
"""What ``laneway models canary|shadow|promote|rollback`` take as PATH for routers."""
RULE_VERSION = "rule"
"""The router version with no learned router."""
_SALT = f"{ROUTER_KIND}:{ROUTER_NAME}"

SHADOW_DECISIONS = Counter(
    "laneway_router_shadow_decisions_total",
    "Decisions a shadow router version made without acting on them",
    ["version", "agree"],
)


@dataclass(frozen=True, slots=True)
class RouterVersion:
    version: str
    state: VersionState
    share: float | None = None
    source: str | None = None
    """The artifact file (``None`` for ``rule``)."""

    @property
    def traffic_share(self) -> float:
        if self.state == "canary":
            return self.share or 0.0
        if self.state == "shadow":
            return 1.0 if self.share is None else self.share
        return 1.0 if self.state == "active" else 0.0


def apply_router(
    defaults: Sequence[RouterVersion], overrides: Mapping[str, VersionRollout]
) -> list[RouterVersion]:
    """The listed versions with the live states laid over their defaults."""
    changed = [
        RouterVersion(v.version, overrides[v.version].state, overrides[v.version].share, v.source)
        if v.version in overrides
        else v
        for v in defaults
    ]
    active = [v.version for v in changed if v.state == "active"]
    if len(active) != 1:
        log.warning(
            "router roll-out state leaves %d active versions %s: the defaults apply",
            len(active),
            active,
        )
        return list(defaults)
    return changed


def pick_router(versions: Sequence[RouterVersion], key: str) -> str:
    """The router version that decides for ``key``'s requests."""
    active = next((v.version for v in versions if v.state == "active"), RULE_VERSION)
    canaries = sorted(
        (v for v in versions if v.state == "canary" and v.traffic_share > 0),
        key=lambda v: v.version,
    )
    if not canaries:
        return active
    point = unit(key, _SALT)
    edge = 0.0
    for entry in canaries:
        edge = min(1.0, edge + entry.traffic_share)
        if point < edge:
            return entry.version
    return active


def pick_router_shadows(versions: Sequence[RouterVersion], request_id: str) -> list[str]:
    """The shadow router versions that also judge the request ``request_id``."""
    return [
        v.version
        for v in versions
        if v.state == "shadow"
        and unit(f"id:{request_id}", f"shadow:{_SALT}:{v.version}") < v.traffic_share
    ]


# -- roll-out operations (pure: the fields to write) ---------------------------------


def _known(versions: Sequence[RouterVersion], version: str) -> RouterVersion:
    for v in versions:
        if v.version == version:
            return v
    raise RolloutError(
        f"no router version {version!r}: the known ones are {[v.version for v in versions]}"
    )


def promote_router(
    versions: Sequence[RouterVersion], version: str, *, now_ms: int
) -> dict[str, VersionRollout]:
    entry = _known(versions, version)
    current = next(v for v in versions if v.state == "active")
    if entry.version == current.version:
        raise RolloutError(f"router {version} is already the active version")
    return {
        entry.version: VersionRollout("active", None, now_ms),
        current.version: VersionRollout("retired", None, now_ms),
    }


def canary_router(
    versions: Sequence[RouterVersion], version: str, share: float, *, now_ms: int
) -> dict[str, VersionRollout]:
    entry = _known(versions, version)
    if not 0 <= share <= 1:
        raise RolloutError(f"share {share} is outside 0..1")
    if entry.state == "active":
        raise RolloutError(f"router {version} is the active version; canary another one")
    return {entry.version: VersionRollout("canary", share, now_ms)}


def shadow_router(
    versions: Sequence[RouterVersion], version: str, share: float | None, *, now_ms: int
) -> dict[str, VersionRollout]:
    entry = _known(versions, version)
    if share is not None and not 0 <= share <= 1:
        raise RolloutError(f"share {share} is outside 0..1")
    if entry.state == "active":
        raise RolloutError(f"router {version} is the active version; shadow another one")
    return {entry.version: VersionRollout("shadow", share, now_ms)}


def rollback_router(
    versions: Sequence[RouterVersion], *, now_ms: int, by: str = "cli", reason: str | None = None
) -> dict[str, VersionRollout]:
    live = [v for v in versions if v.state == "canary" and v.traffic_share]
    if not live:
        raise RolloutError("no canary router with traffic to roll back")
    return {v.version: VersionRollout("canary", 0.0, now_ms, by, reason) for v in live}


# -- what a classifier holds ---------------------------------------------------------


class RouterCatalog:
    """The router versions a process can roll out, their artifacts loaded
    once per file (and again when the file changes)."""

    def __init__(self, routing: RoutingSettings) -> None:
        self.directory = routing.learned_router_dir
        self.default_file = routing.learned_router
        self._loaded: dict[Path, tuple[float, LearnedRouter | None]] = {}
        self._by_version: dict[str, LearnedRouter | None] = {}
        self.defaults: list[RouterVersion] = [RouterVersion(RULE_VERSION, "active")]

    @property
    def enabled(self) -> bool:
        """Whether any learned router can be rolled out at all."""
        return self.directory is not None or self.default_file is not None

    def scan(self) -> list[RouterVersion]:
        """Re-list the artifacts (loading new or changed files) and return
        every version with its default state."""
        files: list[Path] = []
        if self.directory is not None:
            try:
                files = sorted(self.directory.glob("*.json"))
            except OSError as exc:
                log.warning("router directory %s unreadable: %s", self.directory, exc)
        if self.default_file is not None and self.default_file not in files:
            files.append(self.default_file)
        by_version: dict[str, LearnedRouter | None] = {RULE_VERSION: None}
        sources: dict[str, str] = {}
        default_version: str | None = None
        for path in files:
            learned, version = self._load(path)
            if version == RULE_VERSION:
                log.warning("router artifact %s calls itself %r: ignored", path, RULE_VERSION)
                continue
            if path == self.default_file:
                default_version = version
            if version in sources:
                log.warning("router version %s: %s, and %s too", version, sources[version], path)
                continue
            by_version[version] = learned
            sources[version] = str(path)
        active = default_version or RULE_VERSION
        self._by_version = by_version
        self.defaults = [
            RouterVersion(v, "active" if v == active else "retired", None, sources.get(v))
            for v in by_version
        ]
        return self.defaults

    def _load(self, path: Path) -> tuple[LearnedRouter | None, str]:
        """The artifact and its version (an unreadable one: None and the file's stem)."""
        try:
            mtime = path.stat().st_mtime
        except OSError as exc:
            log.warning("router artifact %s unreadable: %s", path, exc)
            return None, path.stem
        known = self._loaded.get(path)
        if known is not None and known[0] == mtime:
            learned = known[1]
            return learned, learned.version if learned is not None else path.stem
        try:
            learned = LearnedRouter.from_file(path)
        except ArtifactError as exc:
            log.error("%s; its version serves the rule's decision", exc)
            self._loaded[path] = (mtime, None)
            return None, path.stem
        log.info("router version %s loaded from %s", learned.version, path)
        self._loaded[path] = (mtime, learned)
        return learned, learned.version

    def learned(self, version: str) -> LearnedRouter | None:
        """The learned router of ``version`` (``None``: the rule decides)."""
        return self._by_version.get(version)

    def view(self, overrides: Mapping[str, VersionRollout]) -> RouterView:
        listed = {v.version for v in self.defaults}
        unlisted = [RouterVersion(v, "retired") for v in sorted(overrides) if v not in listed]
        return RouterView(tuple(apply_router([*self.defaults, *unlisted], overrides)), self)


@dataclass(frozen=True, slots=True)
class RouterView:
    """The router versions as one classifier replica last read them."""

    versions: tuple[RouterVersion, ...]
    catalog: RouterCatalog

    def version_for(self, request: InferenceRequest) -> str:
        return pick_router(self.versions, assignment_key(request))

    def shadows_for(self, request: InferenceRequest) -> list[str]:
        return pick_router_shadows(self.versions, request.id)

    def learned(self, version: str) -> LearnedRouter | None:
        return self.catalog.learned(version)


@dataclass(slots=True)
class _Count:
    n: int = 0
    agree: int = 0
    heavy: int = 0
    """Decisions of the shadow version that went heavy."""
    live_heavy: int = 0
    """Decisions actually taken for the same requests that went heavy."""


@dataclass(slots=True)
class ShadowTally:
    """Per shadow router version, how its decisions compare with those
    taken, since the last ``flush``."""

    counts: dict[str, _Count] = field(default_factory=dict)

    def note(self, version: str, taken: AnswerPath, shadow: AnswerPath) -> None:
        count = self.counts.setdefault(version, _Count())
        count.n += 1
        count.agree += taken == shadow
        count.heavy += shadow == AnswerPath.HEAVY
        count.live_heavy += taken == AnswerPath.HEAVY
        SHADOW_DECISIONS.labels(version, "yes" if taken == shadow else "no").inc()

    async def flush(self, redis: Any, key: str) -> None:
        """Add the counts to the hash ``key`` (fields ``<version>:<count>``);
        on a Redis error they are kept for the next flush."""
        if not self.counts:
            return
        pipe = redis.pipeline(transaction=False)
        for version, count in self.counts.items():
            for name in ("n", "agree", "heavy", "live_heavy"):
                pipe.hincrby(key, f"{version}:{name}", getattr(count, name))
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("shadow router counts not written: %s", exc)
            return
        self.counts.clear()


async def read_tally(redis: Any, key: str) -> dict[str, dict[str, int]]:
    """Per shadow router version, its counts (``n``, ``agree``, ``heavy``, ``live_heavy``)."""
    raw = await redis.hgetall(key)
    out: dict[str, dict[str, int]] = {}
    for name, value in raw.items():
        text = name.decode() if isinstance(name, bytes) else str(name)
        version, _, count = text.rpartition(":")
        if version and count:
            out.setdefault(version, {})[count] = int(value)
    return out


def tally_key(key_prefix: str) -> str:
    return f"{key_prefix}:router:shadow"


def describe(versions: Iterable[RouterVersion]) -> str:
    return ", ".join(
        f"{v.version}={v.state}" + (f"@{v.share:g}" if v.share is not None else "")
        for v in versions
    )
