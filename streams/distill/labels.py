"""Training labels: was the light path's answer good enough for the request?

Per export row, the first signal that exists decides (``source``):

1. ``feedback``: a light-path answer the client scored; good when the mean
   score is at least 0 (-1 bad .. +1 good).
2. ``agreement``: the prompt was answered by both paths (in the window, or
   by a shadow); good when the light answer agrees with the heavy one: the
   same text once case and spacing are folded, or a cosine similarity of
   their MiniLM embeddings of at least ``agree_at``. This labels heavy-path
   rows too. An empty heavy answer, or no embedder for two different
   texts, gives no verdict here.
3. ``success``: a light-path result; good when it succeeded. Errors that are
   not the path's doing (``LanewayError.blames_path`` false: ``INF-429`` shed
   or over quota, ``INF-400``) give no label, as the quality loop counts them.

A heavy-path row with neither answer pair has no label: a heavy answer says
nothing of what the light path would have done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from schemas.errors import blames_path_code
from streams.distill.rows import ExportRow, prompt_key

__all__ = ["Label", "LabelSource", "agreement_scores", "label_rows"]

LabelSource = Literal["feedback", "agreement", "success"]


@dataclass(frozen=True, slots=True)
class Label:
    row: int
    """Index of the row in the list labelled."""
    good: bool
    source: LabelSource
    similarity: float | None = None
    """The light/heavy answers' similarity, for ``agreement`` labels."""


def agreement_scores(
    pairs: Sequence[tuple[str, str]], embed: Callable[[list[str]], np.ndarray] | None
) -> np.ndarray:
    """Similarity of each ``(light, heavy)`` answer pair: 1 for the same
    folded text, else the cosine of their embeddings (unit rows). NaN (no
    verdict) without an embedder or when the heavy answer is empty (the
    reference failed); 0 when only the light answer is empty."""
    out = np.full(len(pairs), np.nan if embed is None else 0.0, dtype=np.float64)
    todo: list[int] = []
    for i, (light, heavy) in enumerate(pairs):
        if prompt_key(light) == prompt_key(heavy) and light.strip():
            out[i] = 1.0
        elif not heavy.strip():
            out[i] = np.nan
        elif not light.strip():
            out[i] = 0.0
        else:
            todo.append(i)
    if todo and embed is not None:
        texts = list(dict.fromkeys(t for i in todo for t in pairs[i]))
        vectors = embed(texts)
        at = {text: n for n, text in enumerate(texts)}
        for i in todo:
            light, heavy = pairs[i]
            out[i] = float(np.dot(vectors[at[light]], vectors[at[heavy]]))
    return out


def label_rows(
    rows: Sequence[ExportRow],
    *,
    embed: Callable[[list[str]], np.ndarray] | None,
    agree_at: float = 0.75,
) -> list[Label]:
    """The label of every row that has one (see the module's docstring)."""
    paired = [
        i
        for i, row in enumerate(rows)
        if row.light_output is not None
        and row.heavy_output is not None
        and not (row.path == "light" and row.feedback is not None)
    ]
    similarity = agreement_scores(
        [(rows[i].light_output or "", rows[i].heavy_output or "") for i in paired], embed
    )
    by_row = {i: s for i, s in zip(paired, similarity, strict=True) if not np.isnan(s)}
    labels: list[Label] = []
    for i, row in enumerate(rows):
        if row.path == "light" and row.feedback is not None:
            labels.append(Label(i, row.feedback >= 0, "feedback"))
        elif i in by_row:
            score = float(by_row[i])
            labels.append(Label(i, score >= agree_at, "agreement", round(score, 4)))
        elif row.path == "light" and blames_path_code(row.error_code):
            labels.append(Label(i, row.success, "success"))
    return labels
