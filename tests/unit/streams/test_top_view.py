"""``laneway top``'s view, from metrics text written by prometheus_client
itself (the format the processes serve)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from schemas.messages import AnswerPath, Lane
from streams.routing.stats import PathStats
from streams.stores.workerboard import PathCard, WorkerCard
from streams.top.view import Scrape, quantile, snapshot


class Process:
    """One process's metrics, under the names laneway's processes use."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.results = Counter(
            "laneway_results_total", "", ["lane", "path", "status", "code"], registry=r
        )
        self.latency = Histogram(
            "laneway_result_latency_seconds",
            "",
            ["lane", "path"],
            buckets=(0.1, 0.5, 1, 5),
            registry=r,
        )
        self.batch = Histogram("laneway_batch_size", "", ["lane"], buckets=(1, 4, 16), registry=r)
        self.backlog = Gauge("laneway_lane_backlog", "", ["lane"], registry=r)
        self.breaker = Gauge("laneway_backend_breaker_state", "", ["lane", "path"], registry=r)
        self.lookups = Counter("laneway_cache_lookups_total", "", ["result"], registry=r)
        self.records = Counter("laneway_records_total", "", ["component", "outcome"], registry=r)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_quantiles_interpolate_inside_their_bucket() -> None:
    buckets = [(0.1, 0.0), (0.5, 50.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.5)
    assert quantile(0.25, buckets) == pytest.approx(0.3)
    assert quantile(0.95, buckets) == pytest.approx(0.95)
    assert quantile(0.5, []) is None
    assert quantile(0.99, [(1.0, 1.0), (float("inf"), 10.0)]) == 1.0  # the last bound we know


def test_two_scrapes_give_rates_percentiles_shares_and_breakers() -> None:
    worker, classifier = Process(), Process()
    classifier.backlog.labels("bulk").set(7)
    worker.backlog.labels("bulk").set(3)  # a stale view elsewhere: the largest counts
    older = Scrape.parse([worker.text(), classifier.text()], at_s=10.0)

    for _ in range(20):
        worker.results.labels("medium", "heavy", "ok", "").inc()
        worker.latency.labels("medium", "heavy").observe(0.3)
    for _ in range(10):
        classifier.results.labels("realtime", "cache", "ok", "").inc()
        classifier.latency.labels("realtime", "cache").observe(0.01)
        classifier.records.labels("classifier", "ok").inc()
    worker.batch.labels("medium").observe(4)
    worker.batch.labels("medium").observe(8)
    worker.breaker.labels("medium", "heavy").set(2)
    classifier.lookups.labels("exact").inc(3)
    classifier.lookups.labels("semantic").inc(1)
    classifier.lookups.labels("miss").inc(4)
    classifier.lookups.labels("bypass").inc(100)  # never asked the cache: not in the ratio
    newer = Scrape.parse([worker.text(), classifier.text()], at_s=12.0)

    card = WorkerCard("w1", Lane.MEDIUM, (PathCard(AnswerPath.HEAVY, "llamacpp", "g", "cpu"),), 8)
    stats = {AnswerPath.HEAVY: PathStats(latency_ms=900.0, outcomes=[1, 1, 0, 1], n=4)}
    view = snapshot(older, newer, workers=[card], stats=stats)

    lanes = {row.lane: row for row in view.lanes}
    assert lanes[Lane.MEDIUM].per_s == pytest.approx(10.0)  # 20 results in 2 s
    assert lanes[Lane.MEDIUM].batch_mean == pytest.approx(6.0)
    assert lanes[Lane.MEDIUM].workers == 1 and lanes[Lane.BULK].workers == 0
    assert 100 < (lanes[Lane.MEDIUM].p50_ms or 0) < 500
    assert (lanes[Lane.REALTIME].p95_ms or 0) < 100
    assert lanes[Lane.BULK].backlog == 7
    assert lanes[Lane.BULK].p50_ms is None and lanes[Lane.BULK].per_s == 0.0
    assert lanes[Lane.MEDIUM].in_flight is None  # no process reports it: unknown, not 0

    paths = {row.path: row for row in view.paths}
    assert paths[AnswerPath.HEAVY].share == pytest.approx(20 / 30)
    assert paths[AnswerPath.CACHE].share == pytest.approx(10 / 30)
    assert paths[AnswerPath.HEAVY].breaker == "open" and paths[AnswerPath.LIGHT].breaker == "-"
    assert paths[AnswerPath.HEAVY].success == pytest.approx(0.75)
    assert paths[AnswerPath.HEAVY].latency_ms == 900.0
    assert paths[AnswerPath.LIGHT].success is None  # never measured

    assert view.cache_hit_ratio == pytest.approx(4 / 8)
    assert view.classifier_per_s == pytest.approx(5.0)
    assert view.workers_alive == 1 and view.sources == 2 and view.window_s == 2.0
    assert view.notes == []


def test_without_an_older_scrape_there_are_no_rates_and_nothing_answered_says_so() -> None:
    view = snapshot(None, Scrape.parse([], at_s=1.0), workers=None, stats={})
    assert all(row.per_s is None for row in view.lanes)
    assert view.workers_alive is None
    assert len(view.notes) == 2


def test_a_registry_path_beyond_light_and_heavy_has_its_row() -> None:
    worker = Process()
    older = Scrape.parse([worker.text()], at_s=10.0)
    for _ in range(4):
        worker.results.labels("medium", "mid", "ok", "").inc()
    newer = Scrape.parse([worker.text()], at_s=12.0)
    card = WorkerCard("w1", Lane.MEDIUM, (PathCard(AnswerPath("mid"), "llamacpp", "q", "cpu"),), 8)
    stats = {AnswerPath("mid"): PathStats(latency_ms=700.0, outcomes=[1, 1], n=2)}
    view = snapshot(older, newer, workers=[card], stats=stats)
    paths = [row.path for row in view.paths]
    assert paths == [
        AnswerPath.CACHE,
        AnswerPath.RULES,
        AnswerPath.LIGHT,
        AnswerPath.HEAVY,
        AnswerPath("mid"),
    ]
    mid = view.paths[-1]
    assert mid.share == pytest.approx(1.0) and mid.latency_ms == 700.0 and mid.success == 1.0
