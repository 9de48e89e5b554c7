"""PSI, binning and the drift monitor's lifecycle."""

from __future__ import annotations

import random
import time
from bisect import bisect_right

import pytest

from schemas.settings import DriftSettings
from streams.classify.drift import DRIFT_PSI, DriftMonitor, Value, numeric_bins, psi


def test_psi_of_identical_distributions_is_zero() -> None:
    assert psi([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]) == pytest.approx(0.0)
    assert psi([2, 3, 5], [20, 30, 50]) == pytest.approx(0.0)  # counts are normalised


def test_psi_of_a_clear_shift_is_major() -> None:
    assert psi([0.5, 0.3, 0.2], [0.2, 0.3, 0.5]) > 0.25
    assert 0 < psi([0.5, 0.5], [0.55, 0.45]) < 0.1


def test_psi_survives_empty_bins_and_rejects_mismatched_ones() -> None:
    score = psi([1.0, 0.0], [0.0, 1.0])
    assert score > 10 and score < 100
    with pytest.raises(ValueError, match="bins differ"):
        psi([1.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="empty"):
        psi([0, 0], [1, 1])


def test_numeric_bins_are_baseline_quantiles() -> None:
    edges = numeric_bins([float(v) for v in range(1, 101)], n=4)
    assert edges == pytest.approx([25.75, 50.5, 75.25])
    assert numeric_bins([]) == []
    assert numeric_bins([float("nan"), 3.0]) == [3.0, pytest.approx(3.0)]


def test_a_point_mass_gets_a_bin_of_its_own() -> None:
    # Everyone sends max_tokens=128: 256 must not land in 128's bin.
    edges = numeric_bins([128.0] * 90 + [64.0] * 10)
    assert bisect_right(edges, 128.0) != bisect_right(edges, 256.0)
    assert bisect_right(edges, 128.0) != bisect_right(edges, 100.0)


def settings(**fields: object) -> DriftSettings:
    base: dict[str, object] = {"baseline_size": 100, "window": 50, "threshold": 0.2}
    return DriftSettings.model_validate({**base, **fields})


def test_monitor_lifecycle_baseline_then_window() -> None:
    rng = random.Random(1)
    monitor = DriftMonitor(settings(baseline_size=100, window=80))
    assert monitor.min_window == 50
    for _ in range(99):
        monitor.observe({"x": rng.gauss(0, 1), "kind": "a"})
    assert not monitor.baseline_ready and monitor.scores() == {}
    monitor.observe({"x": rng.gauss(0, 1), "kind": "a"})
    assert monitor.baseline_ready and monitor.features == ("kind", "x")
    for _ in range(49):
        monitor.observe({"x": rng.gauss(0, 1), "kind": "a"})
    assert monitor.scores() == {}  # too few to tell drift from sampling noise
    monitor.observe({"x": rng.gauss(0, 1), "kind": "a"})
    scores = monitor.scores()
    assert set(scores) == {"kind", "x"}
    assert scores["kind"] == pytest.approx(0.0)
    for _ in range(200):
        monitor.observe({"x": rng.gauss(0, 1), "kind": "a"})
    assert monitor.window_size == 80  # bounded: the last `window` observations only
    assert DriftMonitor(settings(baseline_size=100, window=20)).min_window == 20


def test_a_shifted_numeric_feature_drifts_and_a_stable_one_does_not() -> None:
    rng = random.Random(2)
    monitor = DriftMonitor(settings(baseline_size=500, window=500))
    for _ in range(500):
        monitor.observe({"stable": rng.gauss(0, 1), "moving": rng.gauss(0, 1)})
    for _ in range(500):
        monitor.observe({"stable": rng.gauss(0, 1), "moving": rng.gauss(1.5, 1)})
    scores = monitor.scores()
    assert scores["stable"] < 0.1
    assert scores["moving"] > 0.25
    assert set(monitor.drifted()) == {"moving"}


def test_the_window_slides_back_to_normal() -> None:
    rng = random.Random(3)
    monitor = DriftMonitor(settings(baseline_size=500, window=200))
    for _ in range(500):
        monitor.observe({"x": rng.gauss(0, 1)})
    for _ in range(200):
        monitor.observe({"x": rng.gauss(5, 1)})
    assert "x" in monitor.drifted()
    for _ in range(200):
        monitor.observe({"x": rng.gauss(0, 1)})
    assert monitor.drifted() == {}


def test_a_new_category_lands_in_other_and_drifts() -> None:
    monitor = DriftMonitor(settings())
    for i in range(100):
        monitor.observe({"tenant": "acme" if i % 2 else "globex"})
    for i in range(50):
        monitor.observe({"tenant": "initech" if i % 2 else "globex"})
    assert monitor.scores()["tenant"] > 0.25


def test_missing_values_and_wrong_types_are_their_own_bin() -> None:
    monitor = DriftMonitor(settings())
    for i in range(100):
        monitor.observe({"deadline_ms": 1000 + i, "hard": i % 3 == 0})
    for i in range(50):
        monitor.observe({"hard": i % 3 == 0} if i % 2 else {"deadline_ms": "soon", "hard": None})
    scores = monitor.scores()
    assert scores["deadline_ms"] > 1
    assert scores["hard"] > 0.25


def test_publish_sets_the_gauge_and_returns_the_drifted() -> None:
    monitor = DriftMonitor(settings())
    for _ in range(100):
        monitor.observe({"pub_a": 1.0, "pub_b": "x"})
    for _ in range(50):
        monitor.observe({"pub_a": 1.0, "pub_b": "y"})
    drifted = monitor.publish()
    assert set(drifted) == {"pub_b"}
    assert DRIFT_PSI.labels("pub_b")._value.get() == pytest.approx(drifted["pub_b"])
    assert DRIFT_PSI.labels("pub_a")._value.get() == pytest.approx(0.0)


def test_disabled_monitor_observes_nothing() -> None:
    monitor = DriftMonitor(settings(enabled=False))
    for _ in range(500):
        monitor.observe({"x": 1})
    assert not monitor.baseline_ready and monitor.scores() == {}


def test_observe_and_score_are_cheap() -> None:
    """Budget for the hot path: the classifier observes every request. The
    rows have the shape of ``streams.routing.features.RequestFeatures.as_dict()``."""
    rng = random.Random(4)
    rows: list[dict[str, Value]] = [
        {
            "tokens": rng.randint(1, 400),
            "intent": rng.choice([None, "order_status", "greeting", "refund"]),
            "language": rng.choice(["en", "en", "en", "de", "es"]),
            "has_code": rng.random() < 0.1,
            "has_math": rng.random() < 0.1,
            "reasoning": rng.random() < 0.3,
            "deadline_ms": rng.choice([None, 500, 2000]),
            "tier": rng.choice(["free", "standard", "premium"]),
            "depth": rng.choice([0, 0, 1, 2, 5]),
        }
        for _ in range(1000)
    ]
    monitor = DriftMonitor(DriftSettings(baseline_size=500, window=500))
    for row in rows[:500]:
        monitor.observe(row)
    start = time.perf_counter()
    for _ in range(5):
        for row in rows:
            monitor.observe(row)
    observe_us = (time.perf_counter() - start) / 5000 * 1e6
    start = time.perf_counter()
    for _ in range(100):
        scores = monitor.scores()
    score_us = (time.perf_counter() - start) / 100 * 1e6
    print(f"observe {observe_us:.1f} us ({len(rows[0])} features), scores {score_us:.1f} us")
    assert max(scores.values()) < 0.2  # same traffic: no drift
    assert observe_us < 200 and score_us < 5000  # generous: 2 shared cores
