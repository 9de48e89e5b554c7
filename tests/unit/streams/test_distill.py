"""The distillation loop without services: export joining and windowing on
records built here, labels, training and calibration on a synthetic set
whose labels follow its features, the artifact's round trip, the report."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from schemas.messages import (
    ErrorInfo,
    Feedback,
    InferenceRequest,
    InferenceResult,
    QualityEvent,
    Usage,
)
from schemas.settings import BackendSettings, Settings
from streams.distill.evaluate import curve, heavy_share_at_quality, point
from streams.distill.export import Collected, Window, join_rows
from streams.distill.labels import label_rows
from streams.distill.report import build_report, write_report
from streams.distill.rows import ExportRow, RowsError, parse_when, read_rows, write_rows
from streams.distill.train import (
    TrainError,
    _threshold,
    held_out,
    train_router,
    write_finetune,
)
from streams.routing.features import extract_features
from streams.routing.learned import (
    ArtifactError,
    LearnedRouter,
    RouterArtifact,
    feature_values,
)
from streams.routing.registry import builtin_registry

SETTINGS = Settings()
REGISTRY = builtin_registry(BackendSettings())
T0 = 1_800_000_000_000


def request(rid: str, prompt: str, **kw: object) -> bytes:
    return InferenceRequest(id=rid, prompt=prompt, max_tokens=8, **kw).model_dump_json().encode()


def result(rid: str, path: str, output: str | None = "ok", **kw: object) -> bytes:
    fields: dict[str, object] = {
        "id": rid,
        "status": "ok" if output is not None else "error",
        "output": output,
        "path": path,
        "lane": "realtime",
        "model": f"m-{path}",
        "usage": Usage(prompt_tokens=10, completion_tokens=5),
        **kw,
    }
    if output is None:
        fields["error"] = ErrorInfo(code="INF-503", message="late", retryable=True)
    return InferenceResult.model_validate(fields).model_dump_json().encode()


def quality(rid: str, path: str, latency_ms: float, kind: str = "result") -> bytes:
    return (
        QualityEvent.model_validate(
            {"id": rid, "kind": kind, "path": path, "success": True, "latency_ms": latency_ms}
            | {"ts_ms": T0}
        )
        .model_dump_json()
        .encode()
    )


def collected_window() -> tuple[Collected, Window]:
    c = Collected()
    window = Window(since_ms=T0, until_ms=T0 + 60_000)
    c.add_request(T0 - 1, request("before", "What is the capital of France?"))  # outside
    c.add_request(T0 + 10, request("a", "What is the capital of France?"))
    c.add_request(T0 + 20, request("b", "what is the  capital of france?"))  # same, folded
    c.add_request(T0 + 30, request("c", "Explain why the sky is blue."))
    c.add_request(T0 + 40, request("d", "Hello!"))
    c.add_request(T0 + 50, request("e", "Name a colour."))
    c.add_request(T0 + 55, request("g", "Name a fruit."))
    c.add_request(T0 + 60_000, request("after", "Name a fruit."))  # at until: outside
    c.add_request(T0 + 50, b"not json")
    c.add_request(T0 + 15, request("a", "resent copy"))  # a resend: the first one counts
    for raw in (
        result("before", "light"),
        result("a", "light", "Paris."),
        result("a", "light", "a duplicate result"),
        result("b", "heavy", "The capital is Paris."),
        result("c", "heavy", "Because of Rayleigh scattering."),
        result("d", "rules", "Hi!"),
        result("e", "light", None),
        result("after", "light"),
        result("g", "light", None),
        result("g", "light", "Apple."),  # retried under the same id: the answer wins
        result("g", "light", "a later duplicate"),
    ):
        c.add_result(raw)
    c.add_quality(quality("a", "light", 700.0))
    c.add_quality(quality("a", "light", 999.0, kind="attempt"))  # not a result event
    for rid, score in (("a", 1.0), ("a", 0.0), ("c", -1.0)):
        c.add_feedback(Feedback(request_id=rid, score=score).model_dump_json().encode())
    c.add_shadow(
        json.dumps({"id": "c", "path": "light", "status": "ok", "output": "It is blue."}).encode()
    )
    return c, window


def test_export_joins_by_id_within_the_window() -> None:
    collected, window = collected_window()
    rows, summary = join_rows(collected, window, settings=SETTINGS, registry=REGISTRY)
    by_id = {row.id: row for row in rows}
    assert sorted(by_id) == ["a", "b", "c", "e", "g"]  # d: rules; before/after: outside
    assert summary.requests == 6 and summary.answered_elsewhere == 1 and summary.rows == 5
    assert by_id["g"].success and by_id["g"].output == "Apple."
    assert summary.unreadable == {"requests": 1}
    assert summary.orphan_results == 2  # before and after
    a = by_id["a"]
    assert a.prompt == "What is the capital of France?" and a.output == "Paris."
    assert a.latency_ms == 700.0 and a.feedback == 0.5 and a.feedback_count == 2
    assert a.cost == pytest.approx(15 / 1000 * 0.0002)  # registry cost: no cost on the event
    assert a.features == feature_values(
        extract_features(InferenceRequest(id="a", prompt=a.prompt), SETTINGS.routing)
    )
    # The same prompt, folded, answered on both paths: both rows get both answers.
    for rid in ("a", "b"):
        assert by_id[rid].light_output == "Paris."
        assert by_id[rid].heavy_output == "The capital is Paris."
        assert by_id[rid].sources == ["window"]
    # A shadow answer fills the other path.
    assert by_id["c"].light_output == "It is blue." and by_id["c"].sources == ["shadow", "window"]
    e = by_id["e"]
    assert not e.success and e.error_code == "INF-503" and e.light_output is None


def test_parse_when() -> None:
    now = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)
    assert parse_when("2h", now) == now - timedelta(hours=2)
    assert parse_when("30m", now) == now - timedelta(minutes=30)
    assert parse_when("now", now) == now
    assert parse_when("2026-12-03T10:00:00", now) == datetime(2026, 12, 3, 10, tzinfo=UTC)
    assert parse_when("2026-12-03T10:00:00+01:00", now).hour == 10
    assert parse_when(str(T0), now) == datetime.fromtimestamp(T0 / 1000, UTC)
    with pytest.raises(RowsError, match="duration like 2h"):
        parse_when("yesterday", now)
    with pytest.raises(ValueError, match="window is empty"):
        Window.of(now, now - timedelta(hours=1))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rows_round_trip(tmp_path: Path, suffix: str) -> None:
    collected, window = collected_window()
    rows, _ = join_rows(collected, window, settings=SETTINGS, registry=REGISTRY)
    path = tmp_path / f"rows{suffix}"
    assert write_rows(rows, path) == len(rows)
    assert [r.as_dict() for r in read_rows(path)] == [r.as_dict() for r in rows]


def test_rows_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "x"}\n')
    with pytest.raises(RowsError, match=r"rows.jsonl:1: .*lacks"):
        list(read_rows(path))
    with pytest.raises(RowsError, match="no such file"):
        list(read_rows(tmp_path / "missing.jsonl"))


def row(rid: str, prompt: str, path: str = "light", **kw: object) -> ExportRow:
    features = feature_values(
        extract_features(InferenceRequest(id=rid, prompt=prompt), SETTINGS.routing)
    )
    fields: dict[str, object] = {"success": True, **kw}
    return ExportRow(id=rid, ts_ms=T0, prompt=prompt, features=features, path=path, **fields)  # type: ignore[arg-type]


def test_labels_feedback_then_agreement_then_success() -> None:
    rows = [
        row("f", "q1", feedback=-0.5, light_output="x", heavy_output="x"),  # feedback first
        row("g", "q2", light_output="Paris", heavy_output=" paris "),  # same folded text
        row("h", "q3", path="heavy", light_output="Paris", heavy_output="Rome"),
        row("i", "q4"),  # success
        row("j", "q5", path="heavy"),  # no label
    ]
    rows.append(row("k", "q6", success=False, error_code="INF-429"))  # not the path's fault
    rows.append(row("l", "q7", light_output="x", heavy_output=" "))  # the reference failed
    labels = label_rows(rows, embed=None)
    assert [(rows[x.row].id, x.good, x.source) for x in labels] == [
        ("f", False, "feedback"),
        ("g", True, "agreement"),
        ("i", True, "success"),
        ("l", True, "success"),
    ]  # h: different texts and no embedder -> no verdict (and it is a heavy row)

    def embed(texts: list[str]) -> np.ndarray:
        return np.array([[1.0, 0.0] if "Paris" in t else [0.0, 1.0] for t in texts])

    with_embedder = label_rows(rows, embed=embed)
    assert ("h", False, "agreement") in [(rows[x.row].id, x.good, x.source) for x in with_embedder]


EASY = ["What is the capital of {}?", "Name a city in {}.", "What colour is the flag of {}?"]
HARD = [
    "Explain why {} has its climate, step by step.",
    "Compare the economy of {} with its neighbours and analyse the differences.",
    "Calculate 17 * 23 + the population of {}.",
]
PLACES = ["France", "Peru", "Japan", "Kenya", "Norway", "Chile", "India", "Spain", "Egypt", "Italy"]


def synthetic_rows() -> list[ExportRow]:
    """Light is good on the easy questions and bad on the hard ones, except
    one easy and one hard question per ten (noise)."""
    rows = []
    n = 0
    for place in PLACES:
        for hard, templates in ((False, EASY), (True, HARD)):
            for template in templates:
                good = not hard
                if n % 10 == 3:
                    good = not good
                rows.append(row(f"r{n}", template.format(place), feedback=1.0 if good else -1.0))
                n += 1
    return rows


def toy_embed(texts: list[str]) -> np.ndarray:
    """A stand-in for MiniLM that carries the same signal as the words: one
    axis for reasoning words, one for the rest, normalised."""
    out = []
    for text in texts:
        hard = any(w in text for w in ("Explain", "Compare", "Calculate"))
        v = np.array([1.0 if hard else 0.1, 0.2, len(text) / 100], dtype=np.float64)
        out.append(v / np.linalg.norm(v))
    return np.array(out, dtype=np.float32)


def test_training_learns_and_calibrates_to_the_heavy_share() -> None:
    rows = synthetic_rows()
    trained = train_router(rows, embed=toy_embed, heavy_share=0.3)
    router = trained.router
    art = router.artifact
    assert art.labels == {"feedback": len(rows)} and art.rows == len(rows)
    assert set(art.heads) == {"full", "features"} and art.embedding_dim == 3
    # Calibration: the share of training rows below each threshold is the target.
    p_feat = router.probabilities([r.features for r in rows])
    p_full = router.probabilities([r.features for r in rows], toy_embed([r.prompt for r in rows]))
    # Rows with equal features tie (the features head), so there the share
    # is the nearest one the ties allow.
    for p, head in ((p_feat, "features"), (p_full, "full")):
        share = float(np.mean(p < art.heads[head].threshold))
        reachable = [float(np.mean(p < t)) for t in [*np.unique(p), 1.0]]
        assert abs(share - 0.3) == min(abs(s - 0.3) for s in reachable), (head, share)
    # And it learned: hard questions score below easy ones.
    hard = np.array(
        ["Explain" in r.prompt or "Compare" in r.prompt or "Calc" in r.prompt for r in rows]
    )
    assert p_feat[hard].mean() < p_feat[~hard].mean() - 0.3
    assert art.metrics["train_features"]["auc"] > 0.85
    assert art.metrics["cross_validated"]["folds"] >= 2
    assert art.version.startswith("lr-") and art.created.endswith("Z")


def test_threshold_meets_the_share_on_distinct_scores() -> None:
    p = np.linspace(0.05, 0.95, 100)
    for share in (0.0, 0.1, 0.3, 0.77, 1.0):
        assert float(np.mean(p < _threshold(p, share))) == pytest.approx(share)


def test_training_refuses_one_sided_labels() -> None:
    rows = [row(f"r{i}", f"What is {i}?", feedback=1.0) for i in range(10)]
    with pytest.raises(TrainError, match="10 good and 0 bad"):
        train_router(rows, embed=None)


def test_holdout_is_stable_and_kept_out() -> None:
    rows = synthetic_rows()
    held = [r.id for r in rows if held_out(r.id, 0.25)]
    assert 0 < len(held) < len(rows)
    assert held == [r.id for r in rows if held_out(r.id, 0.25)]
    trained = train_router(rows, embed=None, holdout=0.25)
    assert trained.router.artifact.rows == len(rows) - len(held)
    assert trained.router.artifact.holdout == 0.25


def test_artifact_round_trip_scores_the_same(tmp_path: Path) -> None:
    rows = synthetic_rows()
    router = train_router(rows, embed=toy_embed).router
    path = tmp_path / "router.json"
    router.save(path)
    loaded = LearnedRouter.from_file(path)
    assert loaded.artifact == router.artifact
    emb = toy_embed([r.prompt for r in rows])
    features = [r.features for r in rows]
    assert np.allclose(loaded.probabilities(features, emb), router.probabilities(features, emb))
    assert json.loads(path.read_text())["format"] == "laneway-learned-router/1"


def test_a_broken_artifact_is_refused(tmp_path: Path) -> None:
    router = train_router(synthetic_rows(), embed=None).router
    data = router.artifact.model_dump(mode="json")
    data["heads"]["features"]["coef"] = data["heads"]["features"]["coef"][:-1]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="weights, expected"):
        LearnedRouter.from_file(path)
    with pytest.raises(ArtifactError, match="cannot read"):
        LearnedRouter.from_file(tmp_path / "none.json")
    data = router.artifact.model_dump(mode="json") | {"features": ["log_tokens", "bogus"]}
    with pytest.raises(ValueError):
        RouterArtifact.model_validate(data)


def test_curve_and_points() -> None:
    good = np.array([True, True, False, False])
    p = np.array([0.9, 0.8, 0.2, 0.1])
    c = curve(p, good)
    assert list(c.heavy_share) == [0, 0.25, 0.5, 0.75, 1.0]
    assert list(c.quality) == [0.5, 0.75, 1.0, 1.0, 1.0]
    assert heavy_share_at_quality(c, 1.0) == 0.5
    pt = point(np.array([False, False, True, True]), good)
    assert (pt.heavy_share, pt.quality, pt.agreement) == (0.5, 1.0, 1.0)


def test_report_promotes_a_router_that_beats_the_rule(tmp_path: Path) -> None:
    rows = synthetic_rows()
    router = train_router(rows, embed=None, heavy_share=0.5).router
    report = build_report(
        router, rows, embed=None, routing=SETTINGS.routing, registry=REGISTRY, min_labels=20
    )
    # The rule sends every reasoning/maths question heavy: it is right on the
    # templates but also pays for the noise; the router matches it here.
    assert report.labelled == len(rows) and report.rule.heavy_share > 0
    assert report.learned_auc is not None and report.learned_auc > 0.8
    files = write_report(report, tmp_path / "out")
    assert all(f.stat().st_size > 0 for f in files)
    assert (tmp_path / "out" / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["promote"] == report.promote and data["reason"]
    few = build_report(
        router, rows[:5], embed=None, routing=SETTINGS.routing, registry=REGISTRY, min_labels=20
    )
    assert not few.promote and "only 5 labelled rows" in few.reason


def test_finetune_set(tmp_path: Path) -> None:
    rows = [
        row("a", "Q1", light_output="l", heavy_output="H1"),
        row("b", "q1", light_output="l", heavy_output="H1"),  # same prompt: once
        row("c", "Q2", path="heavy", light_output="l", heavy_output="H2"),  # heavy-answered
        row("d", "Q3"),
    ]
    path = tmp_path / "ft.jsonl"
    assert write_finetune(rows, path) == 1
    line = json.loads(path.read_text())
    assert line["messages"][1] == {"role": "assistant", "content": "H1"}


def test_the_cli_trains_and_reports_on_an_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from streams.cli.main import main

    rows_file = tmp_path / "rows.jsonl"
    write_rows(synthetic_rows(), rows_file)
    artifact, out = tmp_path / "router.json", tmp_path / "report"
    train = ["distill", "train", str(rows_file), "-o", str(artifact), "--holdout", "0.3"]
    assert main([*train, "--no-embedding", "--finetune-out", str(tmp_path / "ft.jsonl")]) == 0
    assert "learned router lr-" in capsys.readouterr().out
    assert LearnedRouter.from_file(artifact).artifact.holdout == 0.3
    report = ["distill", "report", "--artifact", str(artifact), str(rows_file), "--held-out"]
    assert main([*report, "-o", str(out), "--no-embedding", "--min-labels", "5"]) == 0
    assert "PROMOTE" in capsys.readouterr().out
    held = json.loads((out / "report.json").read_text())
    assert held["rows"] == sum(held_out(r.id, 0.3) for r in synthetic_rows())
    # Errors are one line and exit 2.
    assert main(["distill", "train", str(tmp_path / "none.jsonl"), "-o", str(artifact)]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = ["distill", "export", "--since", "yesterday", "-o", str(tmp_path / "x.jsonl")]
    assert main(bad) == 2
    assert "duration like 2h" in capsys.readouterr().err
