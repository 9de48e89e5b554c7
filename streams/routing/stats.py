"""Each model path's live record (latency, success, feedback quality),
kept by the quality loop (``streams.quality``), published through Redis
(``streams.classify.router.RouteBoard``) and read by the smart router and
the roll-out's rollback checks."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from schemas.errors import blames_path_code
from schemas.messages import QualityEvent

__all__ = ["PathStats", "ewma"]


@dataclass(slots=True)
class PathStats:
    """The live record of one model path, kept by the quality loop."""

    latency_ms: float
    """EWMA of terminal-result latency."""
    outcomes: list[int] = field(default_factory=list)
    """1/0 per recent terminal result, newest last, at most ``success_window``."""
    quality: float = 1.0
    """EWMA of client feedback mapped to 0..1 (1 = no complaints)."""
    n: int = 0
    updated_ms: int = 0

    @property
    def success_rate(self) -> float:
        return sum(self.outcomes) / len(self.outcomes) if self.outcomes else 1.0

    def observe(self, event: QualityEvent, *, alpha: float, window: int) -> None:
        """Fold one terminal result in. Results the path did not cause (a
        deadline that passed in the queue, a tenant over quota, a shed
        lane) say nothing about the path and only count in ``n``."""
        self.n += 1
        self.updated_ms = event.ts_ms
        if not blames_path_code(event.error_code):
            return
        self.outcomes.append(1 if event.success else 0)
        del self.outcomes[:-window]
        if event.success:
            self.latency_ms = (
                ewma(self.latency_ms, event.latency_ms, alpha) if self.n > 1 else (event.latency_ms)
            )

    def feedback(self, score: float, *, weight: float) -> None:
        """A client's -1..1 verdict moves quality towards (score+1)/2."""
        self.quality = ewma(self.quality, (score + 1) / 2, weight)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> PathStats:
        data = json.loads(raw)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def ewma(previous: float, sample: float, alpha: float) -> float:
    return alpha * sample + (1 - alpha) * previous
