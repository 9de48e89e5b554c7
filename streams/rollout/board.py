"""The roll-out as a process sees it: the registry file with the live
state from Redis laid over it, and which versions live workers serve.

``refresh`` re-reads both (a classifier calls it on a timer, every
``LANEWAY_ROLLOUT_REFRESH_S``). It fails open: when Redis cannot be read,
the last state read stays in force, and before any was read, the file's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from schemas.messages import AnswerPath
from streams.rollout.assign import RolloutView
from streams.rollout.routers import ROUTER_KIND, ROUTER_NAME, RouterCatalog, describe
from streams.rollout.state import Overrides, RolloutStore, VersionRollout, apply
from streams.routing.registry import ModelRegistry
from streams.stores.workerboard import WorkerBoard, served_versions

__all__ = ["RolloutBoard"]

log = logging.getLogger(__name__)


class RolloutBoard:
    def __init__(
        self,
        redis: Any,
        key_prefix: str,
        registry: ModelRegistry,
        workers: WorkerBoard | None = None,
        routers: RouterCatalog | None = None,
    ) -> None:
        """``routers``: the router versions to roll out too (``None``: none)."""
        self.store = RolloutStore(redis, key_prefix)
        self.file = registry
        self.workers = workers
        self.routers = routers
        self.overrides: Overrides = {}
        self.router_overrides: dict[str, VersionRollout] = {}
        self.current = RolloutView(registry)
        self.read_at = 0.0

    async def refresh(self) -> RolloutView:
        overrides = await self.store.read()
        if overrides is not None:
            if overrides != self.overrides:
                log.info("roll-out state: %s", _describe(overrides))
            self.overrides = overrides
            self.read_at = time.monotonic()
        served = None
        if self.workers is not None:
            cards = await self.workers.live()
            served = None if cards is None else served_versions(cards)
        router_view = None
        if self.routers is not None:
            await self._refresh_routers()
            router_view = self.routers.view(self.router_overrides)
        self.current = RolloutView(apply(self.file, self.overrides), served, router_view)
        return self.current

    async def _refresh_routers(self) -> None:
        assert self.routers is not None
        self.routers.scan()  # new artifacts are listed (and loaded) here
        fields = await self.store.read_kind(ROUTER_KIND)
        if fields is None:
            return  # Redis cannot say: the last state read stays in force
        overrides = {v: live for (name, v), live in fields.items() if name == ROUTER_NAME}
        if overrides != self.router_overrides:
            view = self.routers.view(overrides)
            log.info("router roll-out state: %s", describe(view.versions))
        self.router_overrides = overrides

    def router_since_ms(self, version: str) -> int:
        live = self.router_overrides.get(version)
        return live.at_ms if live is not None else 0

    def since_ms(self, path: AnswerPath, version: str) -> int:
        live = self.overrides.get((path, version))
        return live.at_ms if live is not None else 0


def _describe(overrides: Overrides) -> str:
    return (
        ", ".join(
            f"{p}:{v}={r.state}" + (f"@{r.share:g}" if r.share is not None else "")
            for (p, v), r in sorted(overrides.items())
        )
        or "none (the registry file's)"
    )
