"""Where the classifier's request loop spends its time, per stage.

The request loop (``streams.classify.app``) handles one batch at a time,
and its time on a batch is one line of stages that follow each other:

- ``decode``: raw records to validated requests (``admit``);
- ``lookups``: the batch's Redis round (rate limits, sessions, exact cache
  entries, rule lookups, in one pipelined round trip; a second one only for
  sessions with history), the semantic cache and the router's embedding;
- ``route``: rules and routing, pure CPU, with the records each answer
  becomes (``classifier.route`` builds them);
- ``produce``: trace headers on every record, and the waits for the previous
  batch's delivery (one batch in flight at most).

``StageClock.lap`` gives the time since the last lap to a stage: a few
``perf_counter`` calls a batch, added to ``laneway_classifier_stage_seconds``
once per batch (``flush``). The time between batches is not a stage: the
consumer's fetch and whatever else the event loop ran then (faust's timers,
the previous batch's delivery while the loop waited for records);
``laneway bench classifier`` reports it as what is left of the phase's time.

``deliver`` is counted apart: a batch's delivery (send, every ack, the
sessions it joins, its metrics) runs in the background while the next
batch is looked up, so its time overlaps the stages above.
"""

from __future__ import annotations

import time

from prometheus_client import Counter

__all__ = ["LOOP_STAGES", "STAGE_SECONDS", "StageClock"]

LOOP_STAGES = ("decode", "lookups", "route", "produce")
"""The request loop's stages, in the order a batch goes through them."""

STAGE_SECONDS = Counter(
    "laneway_classifier_stage_seconds",
    "Seconds the classifier's request loop spent in each stage of its batches "
    "(decode, lookups, route, produce); deliver: the background delivery of each "
    "batch, which overlaps the next batch's stages",
    ["stage"],
)


class StageClock:
    """Seconds per stage of the batch in hand, for one request loop."""

    __slots__ = ("_last", "_spent")

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._spent = dict.fromkeys(LOOP_STAGES, 0.0)

    def start(self) -> None:
        """A batch starts: the time since the last lap belongs to no stage."""
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        """The time since the last lap (or ``start``) was spent in ``stage``."""
        now = time.perf_counter()
        self._spent[stage] += now - self._last
        self._last = now

    def spent(self) -> dict[str, float]:
        """Seconds per stage not yet flushed."""
        return dict(self._spent)

    def flush(self) -> None:
        """Add the batch's seconds to ``laneway_classifier_stage_seconds``."""
        for stage, seconds in self._spent.items():
            if seconds:
                STAGE_SECONDS.labels(stage).inc(seconds)
                self._spent[stage] = 0.0
