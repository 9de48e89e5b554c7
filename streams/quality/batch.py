"""A batch of quality events folded at once, as pure data (``streams.quality.loop``
runs it once per batch it takes from ``laneway.quality``).

Folding a batch gives what folding its events one by one gave, with each
record read once and written once:

- ``record_fields``: the records one event is folded into (its path's, its
  model version's, its router version's), each ``...@<partition>``;
- ``fold_batch``: every record the batch touches, read once through
  ``read``, each of its events folded in in the batch's order (a record
  belongs to one partition, whose events come in offset order), so the
  loop writes each record to its table (and changelog) once per batch;
- ``count_events``: how many events of each ``(kind, path)`` label pair,
  for ``laneway_quality_events_total``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from schemas.messages import AnswerPath, QualityEvent
from schemas.settings import Settings
from streams.quality.records import PartStats, router_field, version_field
from streams.routing.stats import PathStats

__all__ = ["FOLDED_KINDS", "count_events", "fold_batch", "record_fields"]

FOLDED_KINDS = frozenset({"result", "attempt", "feedback"})
"""The kinds folded into records; ``drift`` and ``rollback`` are only counted."""


def record_fields(event: QualityEvent, path: AnswerPath, partition: int) -> list[str]:
    """The fields of the records ``event`` (read from ``partition``) is folded into."""
    fields = [f"{path.value}@{partition}"]
    if event.version is not None:
        fields.append(version_field(path, event.version, partition))
    if event.router_version is not None:
        fields.append(router_field(event.router_version, partition))
    return fields


def fold_batch(
    events: Iterable[tuple[QualityEvent, int]],
    read: Callable[[str], PartStats | None],
    settings: Settings,
) -> dict[tuple[str, int], PartStats]:
    """Every record ``events`` (each with the partition it was read from)
    touch, keyed ``(field, partition)``, with its events folded in order.
    ``read(field)``: the record as it stands (``None`` for a new one), asked
    once per field. Events with no path, and kinds not in ``FOLDED_KINDS``,
    touch nothing."""
    records: dict[tuple[str, int], PartStats] = {}
    for event, partition in events:
        path = event.path
        if path is None or event.kind not in FOLDED_KINDS:
            continue
        for name in record_fields(event, path, partition):
            key = (name, partition)
            part = records.get(key)
            if part is None:
                part = read(name) or PartStats(PathStats(latency_ms=event.latency_ms))
                records[key] = part
            part.fold(event, settings)
    return records


def count_events(events: Iterable[QualityEvent]) -> Counter[tuple[str, str]]:
    """Events per ``(kind, path)``, ``"none"`` for an event with no path."""
    return Counter((e.kind, str(e.path or "none")) for e in events)
