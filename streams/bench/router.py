"""``laneway bench router``: the learned router against today's feature
rule on a labelled set, cross-validated.

**The set** (``streams/distill/prompts.jsonl``, 201 prompts, written for
this bench by laneway's developers): 106 easy questions with one short
right answer (capitals, colours, one-step arithmetic, counts, opposites,
animal sounds, single facts, "name a ...", word forms) and 95 hard ones
(explanations, comparisons, multi-step word problems and algebra, code to
write or read, reasoning, planning, drafting, translation, summaries,
open knowledge questions). Each line: ``{"prompt", "kind": "easy"|"hard",
"topic"}``; ``kind`` is only described, never used as a label.

**The rubric**: both embedded models answer every prompt, called directly
through ``workers.backends`` (greedy, ``--router-max-tokens`` tokens, the
worker's system prompt): SmolLM2-135M as the light path, Gemma-3-270M as
the heavy one. The light answer is *good enough* when it agrees with the
heavy answer (``streams.distill.labels``): the same text once case and
spacing are folded, or a cosine similarity of their all-MiniLM-L6-v2
embeddings of at least ``--agree-at`` (0.75). The heavy answer is the
reference, as GPT-4's is in RouteLLM; with models this small "agrees with
the heavy model" is a proxy, not correctness. Answers are cached in
``~/.cache/laneway/bench-router-answers.json`` by model, max_tokens and
prompt, so a rerun costs only the embeddings and the fits.

**The comparison**: 5-fold stratified cross-validation. In each fold the
learned router (``streams.distill.train.fit_heads``: the ``full`` head on
features + the prompt's MiniLM embedding, and the ``features`` head) is
fitted on four fifths and scores the fifth with the serving code
(``LearnedRouter.probabilities``). The pooled out-of-fold scores give the
quality/heavy-share curve (RouteLLM's quality model: a heavy call is good,
a light call is as labelled). Today's rule (complexity above the light
model's ``max_complexity`` goes heavy) is one point on that plane. Printed:
the learned router's heavy share at the rule's quality, its quality at the
rule's heavy share, the heavy share each needs for 95% of all-heavy quality,
and RouteLLM's published anchor for scale: over 85% cost reduction on MT
Bench at 95% of GPT-4's quality (Ong et al., "RouteLLM: Learning to Route
LLMs with Preference Data", 2024) — a different task, different models and
labels from human preferences, so a reference, not a like-for-like figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schemas.messages import ChatMessage, InferenceRequest
from schemas.settings import BackendSettings, Settings
from streams.bench.results import BenchRun, Figure, Series

__all__ = ["HELP", "add_arguments", "load_prompts", "run"]

HELP = "the learned router against the feature rule on a labelled set, cross-validated"

PROMPTS_FILE = Path(__file__).parents[1] / "distill" / "prompts.jsonl"
ROUTELLM_ANCHOR = (
    "RouteLLM (Ong et al. 2024): over 85% cost reduction on MT Bench at 95% of GPT-4 quality"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length")
    parser.add_argument("--agree-at", type=float, default=0.75, help="agreement cosine")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    parser.add_argument(
        "--out",
        default=None,
        help="folder for the curve and figures (default ~/.cache/laneway/bench-router)",
    )


@dataclass(frozen=True, slots=True)
class Prompt:
    prompt: str
    kind: str
    topic: str


def load_prompts(path: Path = PROMPTS_FILE) -> list[Prompt]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            out.append(Prompt(data["prompt"], data["kind"], data["topic"]))
    return out


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "laneway" / "bench-router-answers.json"


async def _answers(
    backend_settings: BackendSettings, model: str, prompts: Sequence[str], max_tokens: int
) -> list[str]:
    """Greedy answers of ``model`` to ``prompts``: batches of 8, two in flight."""
    from schemas.errors import LanewayError
    from workers.backends.base import Generation, GenerationInput, create_backend

    settings = backend_settings.model_copy(
        update={"llamacpp_max_sequences": max(16, backend_settings.llamacpp_max_sequences)}
    )
    backend = create_backend("llamacpp", model, settings)
    await backend.load()
    system = [ChatMessage(role="system", content=settings.system_prompt)]
    inputs = [
        GenerationInput([*system, ChatMessage(role="user", content=p)], max_tokens, 0.0)
        for p in prompts
    ]
    out: list[str] = [""] * len(inputs)
    slots = asyncio.Semaphore(2)

    async def one(at: int) -> None:
        async with slots:
            outcomes = await backend.infer_batch(inputs[at : at + 8])
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, Generation):
                out[at + i] = outcome.text
            elif isinstance(outcome, LanewayError):
                raise outcome

    try:
        await asyncio.gather(*(one(at) for at in range(0, len(inputs), 8)))
    finally:
        await backend.close()
    return out


def cached_answers(
    backend_settings: BackendSettings,
    models: Sequence[str],
    prompts: Sequence[str],
    max_tokens: int,
) -> dict[str, list[str]]:
    """Each model's answers, generated only where the cache file has none."""
    path = _cache_file()
    cache: dict[str, str] = json.loads(path.read_text()) if path.is_file() else {}
    out: dict[str, list[str]] = {}
    for model in models:
        key = f"{model}|{max_tokens}|{{}}"
        missing = [p for p in prompts if key.format(p) not in cache]
        if missing:
            started = time.perf_counter()
            print(f"generating {len(missing)} answers with {model} ...", flush=True)
            texts = asyncio.run(_answers(backend_settings, model, missing, max_tokens))
            cache.update({key.format(p): t for p, t in zip(missing, texts, strict=True)})
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache, ensure_ascii=False, indent=0))
            print(f"  {time.perf_counter() - started:.0f} s", flush=True)
        out[model] = [cache[key.format(p)] for p in prompts]
    return out


def _oof(
    raw: np.ndarray,
    embeddings: np.ndarray | None,
    good: np.ndarray,
    folds: int,
    heavy_share: float,
    names: Sequence[str],
) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold ``p`` and heavy decisions (each fold's own calibrated threshold)."""
    from sklearn.model_selection import StratifiedKFold

    from streams.distill.train import fit_heads
    from streams.routing.learned import LearnedRouter, RouterArtifact

    p = np.zeros(len(good))
    heavy = np.zeros(len(good), dtype=bool)
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=0)
    head = "full" if embeddings is not None else "features"
    for train_at, test_at in splitter.split(raw, good):
        emb_train = embeddings[train_at] if embeddings is not None else None
        mean, scale, heads = fit_heads(
            raw[train_at],
            emb_train,
            list(range(len(train_at))),
            good[train_at],
            heavy_share=heavy_share,
        )
        router = LearnedRouter(
            RouterArtifact(
                version="cv",
                created="",
                features=list(names),
                mean=mean,
                scale=scale,
                embedding_model="all-MiniLM-L6-v2" if embeddings is not None else None,
                embedding_dim=embeddings.shape[1] if embeddings is not None else 0,
                heads=heads,
                heavy_share=heavy_share,
            )
        )
        emb_test = embeddings[test_at] if embeddings is not None else None
        p[test_at] = router.probabilities(raw[test_at], emb_test)
        heavy[test_at] = p[test_at] < heads[head].threshold
    return p, heavy


def _boosting_auc(x: np.ndarray, good: np.ndarray, folds: int) -> float | None:
    """Out-of-fold AUC of gradient boosting on the same inputs (to see whether
    it would be worth its serving cost)."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.model_selection import StratifiedKFold

    from streams.distill.evaluate import auc

    p = np.zeros(len(good))
    for train_at, test_at in StratifiedKFold(folds, shuffle=True, random_state=0).split(x, good):
        model = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, random_state=0)
        model.fit(x[train_at], good[train_at])
        p[test_at] = model.predict_proba(x[test_at])[:, 1]
    return auc(p, good)


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    from streams.cache.embedding import MiniLMEmbedder
    from streams.distill.evaluate import auc, curve, heavy_share_at_quality, point, rule_heavy
    from streams.distill.labels import label_rows
    from streams.distill.report import Report, plot_curve
    from streams.distill.rows import ExportRow
    from streams.routing.features import extract_features
    from streams.routing.learned import feature_names, feature_values, vectorise
    from streams.routing.registry import load_registry
    from streams.rules.rulefile import RuleSource
    from workers.models import KNOWN_MODELS

    prompts = load_prompts()
    texts = [p.prompt for p in prompts]
    light_model, heavy_model = KNOWN_MODELS
    answers = cached_answers(settings.backend, [light_model, heavy_model], texts, args.max_tokens)
    book = RuleSource.from_settings(settings.rules).book
    registry = load_registry(settings.routing.models_file, settings.backend)
    rows = []
    for i, p in enumerate(prompts):
        request = InferenceRequest(id=f"b{i}", prompt=p.prompt, max_tokens=args.max_tokens)
        features = extract_features(request, settings.routing, intent=book.classify(p.prompt)[0])
        rows.append(
            ExportRow(
                id=f"b{i}",
                ts_ms=0,
                prompt=p.prompt,
                features=feature_values(features),
                path="light",
                success=True,
                output=answers[light_model][i],
                light_output=answers[light_model][i],
                heavy_output=answers[heavy_model][i],
            )
        )
    embedder = MiniLMEmbedder()
    labels = label_rows(rows, embed=embedder.embed, agree_at=args.agree_at)
    # A prompt the heavy model answered with nothing has no reference: left out.
    agreed = [label for label in labels if label.source == "agreement"]
    left_out = len(rows) - len(agreed)
    keep = [label.row for label in agreed]
    rows = [rows[i] for i in keep]
    prompts = [prompts[i] for i in keep]
    texts = [texts[i] for i in keep]
    good = np.array([label.good for label in agreed], dtype=bool)
    similarity = np.array([label.similarity or 0.0 for label in agreed])
    embeddings = embedder.embed(texts)
    features_list = [row.features for row in rows]
    names = feature_names(features_list)
    raw = vectorise(names, features_list)
    rule = rule_heavy(features_list, settings.routing, registry)
    rule_point = point(rule, good)
    kinds = np.array([q.kind for q in prompts])
    heavy_share = float(rule.mean())  # calibrate the learned router to the rule's share
    out_dir = Path(args.out or _cache_file().with_name("bench-router"))
    lines = [
        f"laneway bench router: {len(rows)} prompts ({int((kinds == 'easy').sum())} easy, "
        f"{int((kinds == 'hard').sum())} hard), answers of up to {args.max_tokens} "
        f"tokens, light {light_model} vs heavy {heavy_model}, agreement at cosine "
        f">= {args.agree_at}, {args.folds}-fold cross-validation; {left_out} prompts left out "
        "(empty heavy answer: no reference)",
        f"light answer good enough (agrees with heavy): {good.mean():.3f} of all, "
        f"{good[kinds == 'easy'].mean():.3f} of easy, {good[kinds == 'hard'].mean():.3f} of hard; "
        f"answer similarity median {np.median(similarity):.3f}",
        "",
        f"{'router':<26} {'AUC':>6} {'heavy':>6} {'quality':>8} {'agree':>6} "
        f"{'heavy@rule q':>12} {'q@rule heavy':>12} {'heavy@0.95q':>11}",
    ]
    lines.append("-" * len(lines[-1]))
    lines.append(
        f"{'feature rule (today)':<26} {'-':>6} {rule_point.heavy_share:6.3f} "
        f"{rule_point.quality:8.3f} {rule_point.agreement:6.3f} {rule_point.heavy_share:12.3f} "
        f"{rule_point.quality:12.3f} {'-':>11}"
    )
    figures: dict[str, Any] = {"rule": rule_point.as_dict()}
    for head, emb in (("features+embedding", embeddings), ("features only", None)):
        scores, heavy = _oof(raw, emb, good, args.folds, heavy_share, names)
        c = curve(scores, good)
        at_rule_q = heavy_share_at_quality(c, rule_point.quality)
        calibrated = point(heavy, good)
        at_95 = heavy_share_at_quality(c, 0.95)
        head_auc = auc(scores, good)
        lines.append(
            f"{'learned, ' + head:<26} {head_auc or 0:6.3f} {calibrated.heavy_share:6.3f} "
            f"{calibrated.quality:8.3f} {calibrated.agreement:6.3f} {at_rule_q:12.3f} "
            f"{c.quality_at(rule_point.heavy_share):12.3f} {at_95:11.3f}"
        )
        figures[head] = {
            "auc": head_auc,
            "calibrated": calibrated.as_dict(),
            "heavy_share_at_rule_quality": at_rule_q,
            "quality_at_rule_heavy_share": c.quality_at(rule_point.heavy_share),
            "heavy_share_at_0.95_quality": at_95,
        }
        if emb is not None:
            report = Report(
                version="bench router (out of fold)",
                head="full",
                rows=len(rows),
                labelled=len(rows),
                label_sources={"agreement": len(rows)},
                traffic_heavy_share={
                    "learned": calibrated.heavy_share,
                    "rule": rule_point.heavy_share,
                },
                learned=calibrated,
                rule=rule_point,
                learned_auc=head_auc,
                learned_share_at_rule_quality=at_rule_q,
                learned_quality_at_rule_share=c.quality_at(rule_point.heavy_share),
                curve=c,
                random_light_quality=float(good.mean()),
                promote=False,
                reason="",
            )
            plot_curve(report, out_dir / "curve.png", title="laneway bench router (5-fold OOF)")
            table = report.table()
    x_full = np.hstack([(raw - raw.mean(0)) / np.where(raw.std(0) > 0, raw.std(0), 1), embeddings])
    boosted = _boosting_auc(x_full, good, args.folds)
    full = figures["features+embedding"]
    saved = 1 - full["heavy_share_at_rule_quality"] / max(rule_point.heavy_share, 1e-9)
    lines += [
        "",
        "heavy share -> quality, learned (features+embedding, out of fold) and a random split:",
        *(f"  {s:.1f}  {q:.3f}  {r:.3f}" for s, q, r in table),
        "",
        f"at the rule's quality ({rule_point.quality:.3f}) the learned router makes "
        f"{full['heavy_share_at_rule_quality']:.3f} heavy calls against the rule's "
        f"{rule_point.heavy_share:.3f} ({saved:.0%} fewer)",
        f"gradient boosting on the same inputs, out-of-fold AUC: {boosted or 0:.3f} "
        f"(logistic regression: {full['auc'] or 0:.3f})",
        f"anchor: {ROUTELLM_ANCHOR}",
        f"curve: {out_dir / 'curve.png'}",
    ]
    figures["boosting_auc"] = boosted
    figures["good_share"] = float(good.mean())
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    print("\n".join(lines))
    results = {
        "rule_heavy_share": Figure(rule_point.heavy_share, "share", "feature rule: heavy share"),
        "rule_quality": Figure(rule_point.quality, "share", "feature rule: quality"),
        "learned_auc": Figure(full["auc"], "AUC", "learned router, out of fold"),
        "learned_heavy_share_at_rule_quality": Figure(
            full["heavy_share_at_rule_quality"], "share", "learned: heavy share at rule quality"
        ),
        "heavy_calls_saved": Figure(saved, "share", "fewer heavy calls at the rule's quality"),
        "boosting_auc": Figure(boosted, "AUC", "gradient boosting, out of fold"),
        "good_share": Figure(float(good.mean()), "share", "light answer good enough"),
    }
    series = {
        "quality_vs_heavy_share": Series(
            "heavy share",
            "share",
            "quality (learned, out of fold)",
            "share",
            [(float(s), float(q)) for s, q, _ in table],
        )
    }
    return BenchRun(0, results, series)
