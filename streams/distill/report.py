"""``laneway distill report``: a learned router against today's feature rule
on rows it was not trained on (a later window's export, or the held-out
share of the export it was trained on).

Written to ``--out``: ``report.json`` (every figure), ``report.md`` (the
same as tables) and ``curve.png`` (quality against heavy-call share: the
learned router's curve, its calibrated operating point, today's rule, and
the straight line a random split would give).

Verdict: **promote** when at least ``min_labels`` rows are labelled, the
learned router reaches the rule's quality with a smaller heavy share, and
its decisions agree with the labels at least as often as the rule's;
otherwise **do not promote**, saying which test failed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from schemas.settings import RoutingSettings
from streams.distill.evaluate import (
    Curve,
    Point,
    auc,
    curve,
    heavy_share_at_quality,
    point,
    rule_heavy,
)
from streams.distill.labels import label_rows
from streams.distill.rows import ExportRow
from streams.routing.learned import LearnedRouter
from streams.routing.registry import ModelRegistry

__all__ = ["Report", "build_report", "plot_curve", "write_report"]

SHARES = tuple(round(0.1 * i, 1) for i in range(11))


@dataclass(slots=True)
class Report:
    version: str
    head: str
    rows: int
    labelled: int
    label_sources: dict[str, int]
    traffic_heavy_share: dict[str, float]
    """Heavy share over every row (labelled or not): learned and rule."""
    learned: Point
    rule: Point
    learned_auc: float | None
    learned_share_at_rule_quality: float
    learned_quality_at_rule_share: float
    curve: Curve
    random_light_quality: float
    """Quality with every request light (the random line starts there)."""
    promote: bool
    reason: str
    notes: list[str] = field(default_factory=list)

    def table(self) -> list[tuple[float, float, float]]:
        """``(heavy share, learned quality, random split quality)`` per tenth."""
        q0 = self.random_light_quality
        return [(s, self.curve.quality_at(s), q0 + s * (1 - q0)) for s in SHARES]

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "head": self.head,
            "rows": self.rows,
            "labelled": self.labelled,
            "label_sources": self.label_sources,
            "traffic_heavy_share": self.traffic_heavy_share,
            "learned": self.learned.as_dict(),
            "rule": self.rule.as_dict(),
            "learned_auc": None if self.learned_auc is None else round(self.learned_auc, 4),
            "learned_heavy_share_at_rule_quality": round(self.learned_share_at_rule_quality, 4),
            "learned_quality_at_rule_heavy_share": round(self.learned_quality_at_rule_share, 4),
            "curve": [
                {"heavy_share": s, "learned": round(q, 4), "random": round(r, 4)}
                for s, q, r in self.table()
            ],
            "promote": self.promote,
            "reason": self.reason,
            "notes": self.notes,
        }


def build_report(
    router: LearnedRouter,
    rows: Sequence[ExportRow],
    *,
    embed: Callable[[list[str]], np.ndarray] | None,
    routing: RoutingSettings,
    registry: ModelRegistry,
    agree_at: float = 0.75,
    min_labels: int = 20,
) -> Report:
    """Evaluate ``router`` on ``rows`` (see the module's docstring)."""
    notes: list[str] = []
    if not rows:
        raise ValueError("no rows to report on")
    use_embedding = embed is not None and router.uses_embedding
    if router.uses_embedding and not use_embedding:
        notes.append("no embedder: the features head was evaluated, not the full one")
    embeddings = None
    if use_embedding:
        assert embed is not None
        unique = list(dict.fromkeys(row.prompt for row in rows))
        vectors = embed(unique)
        at = {text: i for i, text in enumerate(unique)}
        embeddings = np.asarray(vectors[[at[row.prompt] for row in rows]])
    p = router.probabilities([row.features for row in rows], embeddings)
    threshold = router.threshold(embeddings is not None)
    learned_heavy = p < threshold
    rule = rule_heavy([row.features for row in rows], routing, registry)
    labels = label_rows(rows, embed=embed, agree_at=agree_at)
    idx = np.array([label.row for label in labels], dtype=int)
    good = np.array([label.good for label in labels], dtype=bool)
    learned_point = point(learned_heavy[idx], good)
    rule_point = point(rule[idx], good)
    c = curve(p[idx], good)
    share_at = heavy_share_at_quality(c, rule_point.quality)
    quality_at = c.quality_at(rule_point.heavy_share)
    promote, reason = _verdict(
        len(labels), min_labels, learned_point, rule_point, share_at, quality_at
    )
    return Report(
        version=router.version,
        head=router.head_for(embeddings is not None),
        rows=len(rows),
        labelled=len(labels),
        label_sources=dict(Counter(label.source for label in labels)),
        traffic_heavy_share={
            "learned": round(float(learned_heavy.mean()), 4),
            "rule": round(float(rule.mean()), 4),
        },
        learned=learned_point,
        rule=rule_point,
        learned_auc=auc(p[idx], good),
        learned_share_at_rule_quality=share_at,
        learned_quality_at_rule_share=quality_at,
        curve=c,
        random_light_quality=float(good.mean()) if len(good) else 0.0,
        promote=promote,
        reason=reason,
        notes=notes,
    )


def _verdict(
    labelled: int,
    min_labels: int,
    learned: Point,
    rule: Point,
    share_at: float,
    quality_at: float,
) -> tuple[bool, str]:
    if labelled < min_labels:
        return False, f"only {labelled} labelled rows, at least {min_labels} are needed to judge"
    if share_at >= rule.heavy_share:
        return False, (
            f"to reach the rule's quality {rule.quality:.3f} the learned router needs a heavy "
            f"share of {share_at:.3f}, not less than the rule's {rule.heavy_share:.3f}"
        )
    if learned.agreement < rule.agreement:
        return False, (
            f"its decisions agree with the labels less often than the rule's "
            f"({learned.agreement:.3f} < {rule.agreement:.3f})"
        )
    return True, (
        f"at the rule's quality {rule.quality:.3f} it sends {share_at:.3f} of the requests "
        f"heavy instead of {rule.heavy_share:.3f} (at the rule's heavy share its quality is "
        f"{quality_at:.3f}), and agrees with the labels {learned.agreement:.3f} against "
        f"{rule.agreement:.3f}"
    )


def markdown(report: Report) -> str:
    verdict = "PROMOTE" if report.promote else "DO NOT PROMOTE"
    lines = [
        f"# Learned router {report.version}",
        "",
        f"**{verdict}**: {report.reason}.",
        "",
        f"{report.rows} rows, {report.labelled} labelled ({report.label_sources}); "
        f"head `{report.head}`; AUC "
        + ("n/a" if report.learned_auc is None else f"{report.learned_auc:.3f}"),
        "",
        "| router | heavy share (all rows) | heavy share (labelled) | quality | agreement |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, p in (("learned", report.learned), ("feature rule", report.rule)):
        key = "learned" if name == "learned" else "rule"
        lines.append(
            f"| {name} | {report.traffic_heavy_share[key]:.3f} | {p.heavy_share:.3f} | "
            f"{p.quality:.3f} | {p.agreement:.3f} |"
        )
    lines += [
        "",
        f"Learned heavy share at the rule's quality: {report.learned_share_at_rule_quality:.3f}; "
        f"learned quality at the rule's heavy share: {report.learned_quality_at_rule_share:.3f}.",
        "",
        "| heavy share | learned quality | random split |",
        "| ---: | ---: | ---: |",
        *(f"| {s:.1f} | {q:.3f} | {r:.3f} |" for s, q, r in report.table()),
    ]
    lines += [f"- {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def plot_curve(report: Report, path: Path, title: str | None = None) -> None:
    """The quality/cost curve as a PNG (matplotlib, Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    try:
        ax.plot(report.curve.heavy_share, report.curve.quality, label="learned router", lw=2)
        q0 = report.random_light_quality
        ax.plot([0, 1], [q0, 1], ls="--", color="grey", label="random split")
        ax.scatter(
            [report.rule.heavy_share],
            [report.rule.quality],
            color="red",
            zorder=3,
            label="feature rule (today)",
        )
        ax.scatter(
            [report.learned.heavy_share],
            [report.learned.quality],
            color="green",
            marker="s",
            zorder=3,
            label="learned, calibrated threshold",
        )
        ax.set_xlabel("share of heavy calls (cost)")
        ax.set_ylabel("share of good answers (quality)")
        ax.set_xlim(0, 1)
        ax.set_ylim(max(0.0, q0 - 0.05), 1.01)  # the curve rises from q0 at share 0
        ax.set_title(title or f"learned router {report.version}")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)


def write_report(report: Report, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.json", out / "report.md", out / "curve.png"]
    written[0].write_text(json.dumps(report.as_dict(), indent=1) + "\n")
    written[1].write_text(markdown(report))
    plot_curve(report, written[2])
    return written
