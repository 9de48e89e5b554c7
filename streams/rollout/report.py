"""``laneway models report``: how each shadow version's answers compare with
the active answers to the same requests.

The shadow answers are on ``<p>.shadow``, the live ones on ``<p>.results``,
both keyed by request id. ``pair`` joins them (the first live result per id
that a model of the same path gave); ``aggregate`` is a pure function of the
pairs and a similarity function, per (path, shadow version): how many were
compared, how many answered alike exactly (whitespace and case folded), the
mean embedding cosine (all-MiniLM-L6-v2 in ``laneway models report``), and
both sides' median and p95 model time (``timings.inference_ms``: the shadow
rides a slower lane, so its queueing time says nothing of the version).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

from schemas.messages import InferenceResult

__all__ = ["ShadowReport", "aggregate", "format_reports", "pair"]

Similarity = Callable[[Sequence[str], Sequence[str]], Sequence[float]]
"""Cosine of each pair of texts (``a[i]``, ``b[i]``)."""


@dataclass(frozen=True, slots=True)
class ShadowReport:
    path: str
    version: str
    shadow_answers: int
    """Shadow results recorded (errors included)."""
    shadow_errors: int
    compared: int
    """Pairs where both the shadow and the live answer are ``ok``."""
    exact: float
    cosine: float | None
    shadow_p50_ms: float | None
    shadow_p95_ms: float | None
    active_p50_ms: float | None
    active_p95_ms: float | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def pair(
    shadows: Iterable[InferenceResult], results: Iterable[InferenceResult]
) -> list[tuple[InferenceResult, InferenceResult | None]]:
    """Each shadow answer (the first per id and version) with the live
    model answer to the same request on the same path, if there is one."""
    live: dict[str, InferenceResult] = {}
    for result in results:
        if result.path is not None and result.path.is_model and result.id not in live:
            live[result.id] = result
    seen: set[tuple[str, str | None]] = set()
    out = []
    for shadow in shadows:
        key = (shadow.id, shadow.version)
        if key in seen:
            continue  # a redelivered shadow copy
        seen.add(key)
        active = live.get(shadow.id)
        out.append((shadow, active if active is not None and active.path == shadow.path else None))
    return out


def aggregate(
    pairs: Sequence[tuple[InferenceResult, InferenceResult | None]],
    similarity: Similarity | None = None,
) -> list[ShadowReport]:
    groups: dict[tuple[str, str], list[tuple[InferenceResult, InferenceResult | None]]] = {}
    for shadow, active in pairs:
        groups.setdefault((str(shadow.path), shadow.version or "-"), []).append((shadow, active))
    reports = []
    for (path, version), items in sorted(groups.items()):
        both = [
            (s, a)
            for s, a in items
            if a is not None and s.status == "ok" and a.status == "ok" and s.output is not None
        ]
        texts_s = [s.output or "" for s, _ in both]
        texts_a = [a.output or "" for _, a in both if a is not None]
        exact = sum(_fold(x) == _fold(y) for x, y in zip(texts_s, texts_a, strict=True))
        cosines = list(similarity(texts_s, texts_a)) if similarity and both else []
        reports.append(
            ShadowReport(
                path=path,
                version=version,
                shadow_answers=len(items),
                shadow_errors=sum(1 for s, _ in items if s.status != "ok"),
                compared=len(both),
                exact=exact / len(both) if both else 0.0,
                cosine=statistics.fmean(cosines) if cosines else None,
                shadow_p50_ms=_quantile([s.timings.inference_ms for s, _ in both], 0.5),
                shadow_p95_ms=_quantile([s.timings.inference_ms for s, _ in both], 0.95),
                active_p50_ms=_quantile([a.timings.inference_ms for _, a in both if a], 0.5),
                active_p95_ms=_quantile([a.timings.inference_ms for _, a in both if a], 0.95),
            )
        )
    return reports


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def format_reports(reports: Sequence[ShadowReport]) -> str:
    if not reports:
        return "no shadow answers recorded"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [
        f"{'path':6} {'version':12} {'answers':>7} {'errors':>6} {'compared':>8} {'exact':>6} "
        f"{'cosine':>6}  {'shadow p50/p95 ms':>17}  {'active p50/p95 ms':>17}"
    ]
    for r in reports:
        cosine = "-" if r.cosine is None else f"{r.cosine:.3f}"
        lines.append(
            f"{r.path:6} {r.version:12} {r.shadow_answers:7} {r.shadow_errors:6} {r.compared:8} "
            f"{r.exact:6.0%} {cosine:>6}  "
            f"{ms(r.shadow_p50_ms) + '/' + ms(r.shadow_p95_ms):>17}  "
            f"{ms(r.active_p50_ms) + '/' + ms(r.active_p95_ms):>17}"
        )
    return "\n".join(lines)
