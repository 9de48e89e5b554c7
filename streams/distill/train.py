"""``laneway distill train``: a RouteLLM-style learned router from export rows.

From each labelled row (``streams.distill.labels``) it learns whether the
light path's answer is good enough, with two scikit-learn logistic
regressions (L2, ``C``): the ``features`` head on the router's standardised
request features, and the ``full`` head on those plus the prompt's MiniLM
embedding. A linear head is scored with one dot product in the classifier
(numpy, ``streams.routing.learned``) and saved as plain JSON, never a pickle.

Calibration: each head's threshold is the ``heavy_share`` quantile of its
``p`` over every training row — the traffic as it came, labelled or not —
so that share of it goes heavy. A ``holdout`` share of rows (by a hash of
the request id, so ``report`` finds the same ones) is kept out of training.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from streams.distill.evaluate import auc, point
from streams.distill.labels import Label, label_rows
from streams.distill.rows import ExportRow, prompt_key
from streams.routing.learned import (
    Head,
    LearnedRouter,
    RouterArtifact,
    feature_names,
    vectorise,
)

__all__ = [
    "TrainError",
    "Trained",
    "fit_heads",
    "held_out",
    "train_router",
    "write_finetune",
]

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
MIN_PER_CLASS = 2


class TrainError(ValueError):
    """The rows cannot train a router; the message says what is missing."""


def held_out(request_id: str, share: float) -> bool:
    """Whether a row is in the held-out share: a hash of its id, so the
    same rows are held out by ``train`` and evaluated by ``report``."""
    if share <= 0:
        return False
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


@dataclass(frozen=True, slots=True)
class Trained:
    router: LearnedRouter
    labels: list[Label]
    """Labels of the training rows (indices into the rows trained on)."""


def _fit(x: np.ndarray, y: np.ndarray, c: float, seed: int) -> tuple[list[float], float]:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=c, max_iter=2000, random_state=seed)
    model.fit(x, y)
    return [float(v) for v in model.coef_[0]], float(model.intercept_[0])


def _threshold(p: np.ndarray, heavy_share: float) -> float:
    """The threshold whose share of rows below it (``p < t``: heavy) is the
    closest to ``heavy_share``; rows with equal ``p`` go the same way, so the
    share met is the nearest one the ties allow."""
    ordered = np.sort(p)
    candidates = np.concatenate([np.unique(ordered), [ordered[-1] + 1e-9]])
    shares = np.searchsorted(ordered, candidates, side="left") / len(ordered)
    best = float(candidates[int(np.argmin(np.abs(shares - heavy_share)))])
    return min(max(best, 1e-9), 1 - 1e-9)


def fit_heads(
    raw: np.ndarray,
    embeddings: np.ndarray | None,
    labelled: Sequence[int],
    good: np.ndarray,
    *,
    heavy_share: float,
    c: float = 1.0,
    seed: int = 0,
) -> tuple[list[float], list[float], dict[str, Head]]:
    """Scaler and heads fitted on ``raw[labelled]`` / ``good``; thresholds
    calibrated on every row of ``raw``. Returns ``(mean, scale, heads)``."""
    mean = raw.mean(axis=0)
    scale = raw.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    x = (raw - mean) / scale
    idx = np.asarray(labelled, dtype=int)
    heads: dict[str, Head] = {}
    inputs: list[tuple[str, np.ndarray]] = [("features", x)]
    if embeddings is not None:
        inputs.append(("full", np.hstack([x, embeddings.astype(np.float64)])))
    for name, matrix in inputs:
        coef, intercept = _fit(matrix[idx], good.astype(int), c, seed)
        z = matrix @ np.asarray(coef) + intercept
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))
        heads[name] = Head(
            inputs="features+embedding" if name == "full" else "features",
            coef=coef,
            intercept=intercept,
            threshold=_threshold(p, heavy_share),
        )
    return [float(v) for v in mean], [float(v) for v in scale], heads


def _cv_metrics(
    raw: np.ndarray,
    embeddings: np.ndarray | None,
    labelled: list[int],
    good: np.ndarray,
    names: Sequence[str],
    heavy_share: float,
    c: float,
    seed: int,
) -> dict[str, Any]:
    """Out-of-fold AUC per head (stratified k-fold, k up to 5)."""
    from sklearn.model_selection import StratifiedKFold

    per_class = min(int(good.sum()), int((~good).sum()))
    folds = min(5, per_class)
    if folds < 2:
        return {"folds": 0}
    p_out: dict[str, np.ndarray] = {}
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    labelled_arr = np.asarray(labelled)
    for train_at, test_at in splitter.split(labelled_arr, good):
        rows_train = labelled_arr[train_at]
        mean, scale, heads = fit_heads(
            raw,
            embeddings,
            list(rows_train),
            good[train_at],
            heavy_share=heavy_share,
            c=c,
            seed=seed,
        )
        router = _router(names, mean, scale, heads, embeddings, heavy_share)
        rows_test = labelled_arr[test_at]
        for head in heads:
            emb = embeddings[rows_test] if head == "full" and embeddings is not None else None
            p = router.probabilities(raw[rows_test], emb)
            p_out.setdefault(head, np.zeros(len(labelled)))[test_at] = p
    out: dict[str, Any] = {"folds": folds}
    for head, p in p_out.items():
        out[head] = {"auc": _round(auc(p, good))}
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _router(
    names: Sequence[str],
    mean: list[float],
    scale: list[float],
    heads: dict[str, Head],
    embeddings: np.ndarray | None,
    heavy_share: float,
    **meta: Any,
) -> LearnedRouter:
    artifact = RouterArtifact(
        version=meta.pop("version", "cv"),
        created=meta.pop("created", ""),
        features=list(names),
        mean=mean,
        scale=scale,
        embedding_model=EMBEDDING_MODEL if embeddings is not None else None,
        embedding_dim=embeddings.shape[1] if embeddings is not None else 0,
        heads=heads,
        heavy_share=heavy_share,
        **meta,
    )
    return LearnedRouter(artifact)


def train_router(
    rows: Sequence[ExportRow],
    *,
    embed: Callable[[list[str]], np.ndarray] | None,
    heavy_share: float = 0.3,
    holdout: float = 0.0,
    agree_at: float = 0.75,
    c: float = 1.0,
    seed: int = 0,
    window: dict[str, str | None] | None = None,
    now: datetime | None = None,
) -> Trained:
    """Fit, calibrate and describe a learned router (see the module's docstring).
    ``embed``: texts to unit rows (MiniLM); ``None`` trains the features head only."""
    if not 0 <= heavy_share <= 1:
        raise TrainError(f"--heavy-share {heavy_share} is not within 0..1")
    training = [row for row in rows if not held_out(row.id, holdout)]
    if not training:
        raise TrainError(f"no rows to train on ({len(rows)} rows, holdout {holdout})")
    labels = label_rows(training, embed=embed, agree_at=agree_at)
    good = np.array([label.good for label in labels], dtype=bool)
    n_good, n_bad = int(good.sum()), int((~good).sum())
    if n_good < MIN_PER_CLASS or n_bad < MIN_PER_CLASS:
        sources = dict(Counter(label.source for label in labels))
        raise TrainError(
            f"{len(labels)} labelled rows of {len(training)} ({sources}): {n_good} good and "
            f"{n_bad} bad light answers; training needs at least {MIN_PER_CLASS} of each "
            "(send feedback, or answer some prompts on both paths)"
        )
    features = [row.features for row in training]
    names = feature_names(features)
    raw = vectorise(names, features)
    embeddings = _embed_prompts([row.prompt for row in training], embed) if embed else None
    labelled = [label.row for label in labels]
    mean, scale, heads = fit_heads(
        raw, embeddings, labelled, good, heavy_share=heavy_share, c=c, seed=seed
    )
    created = (now or datetime.now(UTC)).replace(microsecond=0)
    digest = hashlib.sha256(
        json.dumps({k: h.model_dump() for k, h in heads.items()}, sort_keys=True).encode()
    ).hexdigest()[:8]
    metrics: dict[str, Any] = {
        "labelled": len(labels),
        "good": n_good,
        "bad": n_bad,
        "cross_validated": _cv_metrics(
            raw, embeddings, labelled, good, names, heavy_share, c, seed
        ),
    }
    router = _router(
        names,
        mean,
        scale,
        heads,
        embeddings,
        heavy_share,
        version=f"lr-{created.strftime('%Y%m%dT%H%M%SZ')}-{digest}",
        created=created.isoformat().replace("+00:00", "Z"),
        labels=dict(Counter(label.source for label in labels)),
        window=window or {},
        metrics=metrics,
        holdout=holdout,
        rows=len(training),
    )
    for head in heads:
        emb = embeddings[labelled] if head == "full" and embeddings is not None else None
        p = router.probabilities(raw[labelled], emb)
        decided = p < router.threshold(emb is not None)
        metrics[f"train_{head}"] = {"auc": _round(auc(p, good)), **point(decided, good).as_dict()}
    final = router.artifact.model_copy(update={"metrics": metrics})
    return Trained(LearnedRouter(final), labels)


def _embed_prompts(prompts: Sequence[str], embed: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """One embedding per prompt, each distinct prompt embedded once."""
    unique = list(dict.fromkeys(prompts))
    vectors = embed(unique)
    at = {text: i for i, text in enumerate(unique)}
    return np.asarray(vectors[[at[p] for p in prompts]], dtype=np.float32)


def write_finetune(rows: Sequence[ExportRow], path: Path) -> int:
    """Chat JSONL for the light model: the heavy answer to each prompt the
    light path answered, where a heavy answer to it exists (once per prompt)."""
    seen: set[str] = set()
    lines = []
    for row in rows:
        key = prompt_key(row.prompt)
        if row.path != "light" or not row.heavy_output or key in seen:
            continue
        seen.add(key)
        lines.append(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": row.prompt},
                        {"role": "assistant", "content": row.heavy_output},
                    ]
                },
                ensure_ascii=False,
            )
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return len(lines)
