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

from schemas.messages import Path
from streams.classify.registry import ModelRegistry
from streams.rollout.assign import RolloutView
from streams.rollout.state import Overrides, RolloutStore, apply
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
    ) -> None:
        self.store = RolloutStore(redis, key_prefix)
        self.file = registry
        self.workers = workers
        self.overrides: Overrides = {}
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
        self.current = RolloutView(apply(self.file, self.overrides), served)
        return self.current

    def since_ms(self, path: Path, version: str) -> int:
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
