"""The batch-size tuner's decisions, without a model: choosing from measured
rates, keeping and finding a tuning (a changed model file or another CPU
is not used), and what a lane worker starts with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.messages import AnswerPath, Lane
from schemas.settings import (
    BackendSettings,
    BulkLaneSettings,
    RealtimeLaneSettings,
    Settings,
    TuneSettings,
)
from streams.routing.registry import ModelRegistry, builtin_registry
from workers.measure import Rate
from workers.tune import ModelFile, Tuning, choose, keep, kept_path, lane_tuning, load_kept

CPU = {"model": "AMD EPYC 9B45", "family": 26, "model_number": 2, "cores": 2}
OTHER_CPU = {
    "model": "Intel(R) Xeon(R) Platinum 8481C",
    "family": 6,
    "model_number": 143,
    "cores": 2,
}


def rate(batch: int, inflight: int, tokens_per_s: float, errors: int = 0) -> Rate:
    """A measured candidate: ``tokens_per_s`` over 10 seconds."""
    return Rate("m", batch, inflight, 8, int(tokens_per_s * 10), 10.0, 9.0, errors)


# What the issue measured on a Zen 5 EPYC for Gemma-3-270M: batching costs
# throughput until 16 with two in flight.
ZEN5 = [
    rate(1, 1, 86.0),
    rate(1, 2, 84.0),
    rate(2, 1, 80.0),
    rate(4, 1, 70.0),
    rate(8, 1, 61.5),
    rate(8, 2, 76.6),
    rate(16, 1, 80.0),
    rate(16, 2, 98.7),
]


def test_the_best_tokens_per_s_wins_without_tolerance() -> None:
    best = choose(ZEN5)
    assert (best.batch_size, best.inflight) == (16, 2)


def test_a_tolerance_takes_the_fewest_sequences_within_it_of_the_best() -> None:
    # 98.7 * 0.85 = 83.9: batch 1 alone (86) is within 15% and runs one sequence.
    within = choose(ZEN5, 0.15)
    assert (within.batch_size, within.inflight) == (1, 1)
    # Within 5% only the best itself.
    assert (choose(ZEN5, 0.05).batch_size, choose(ZEN5, 0.05).inflight) == (16, 2)


def test_on_a_tie_in_sequences_fewer_batches_in_flight_win() -> None:
    rates = [rate(2, 1, 100.0), rate(1, 2, 100.0), rate(4, 1, 101.0)]
    picked = choose(rates, 0.05)
    assert (picked.batch_size, picked.inflight) == (2, 1)


def test_candidates_with_errors_or_no_tokens_are_never_chosen() -> None:
    rates = [rate(1, 1, 50.0), rate(8, 1, 500.0, errors=1), rate(4, 1, 0.0)]
    assert choose(rates).batch_size == 1
    with pytest.raises(ValueError, match="none of 2 candidates"):
        choose([rate(8, 1, 500.0, errors=2), rate(2, 1, 0.0)])
    with pytest.raises(ValueError, match="tolerance"):
        choose(ZEN5, 1.0)


def model_file(tmp_path: Path, name: str = "tiny.gguf", content: bytes = b"gguf") -> Path:
    """A model file as far as the tuner's identity of it goes (path, size, mtime)."""
    path = tmp_path / name
    path.write_bytes(content)
    return path


def tuning_of(path: Path, rates: list[Rate], cpu: dict[str, object] = CPU) -> Tuning:
    return Tuning(str(path), ModelFile.of(path), cpu, 1, True, 32, 4.0, tuple(rates))


def test_a_kept_tuning_is_found_for_the_same_model_and_cpu(tmp_path: Path) -> None:
    model = model_file(tmp_path)
    kept = tuning_of(model, ZEN5)
    where = keep(kept, tmp_path / "tune")
    assert where == kept_path(tmp_path / "tune", CPU, str(model))
    assert where.parent.name == "amd-epyc-9b45"
    data = json.loads(where.read_text())
    assert data["best"] == {"batch_size": 16, "inflight": 2}
    found, said = load_kept(tmp_path / "tune", str(model), BackendSettings(n_threads=1), CPU)
    assert found is not None, said
    assert said == str(where)
    assert [(r.batch_size, r.inflight, r.completion_tokens) for r in found.rates] == [
        (r.batch_size, r.inflight, r.completion_tokens) for r in ZEN5
    ]
    assert found.pick(0.0).tokens_per_s == pytest.approx(98.7)


def test_a_changed_model_file_is_not_used(tmp_path: Path) -> None:
    model = model_file(tmp_path)
    keep(tuning_of(model, ZEN5), tmp_path / "tune")
    model.write_bytes(b"a different, longer model")
    found, said = load_kept(tmp_path / "tune", str(model), BackendSettings(n_threads=1), CPU)
    assert found is None
    assert "the model file changed" in said


def test_another_cpu_or_thread_count_or_batch_mode_is_not_used(tmp_path: Path) -> None:
    model = model_file(tmp_path)
    tune_dir = tmp_path / "tune"
    keep(tuning_of(model, ZEN5), tune_dir)
    backend = BackendSettings(n_threads=1)
    found, said = load_kept(tune_dir, str(model), backend, OTHER_CPU)
    assert found is None and said.startswith("no tuning kept at") and "xeon" in said
    more_cores = {**CPU, "cores": 64}  # the same model name, another machine
    found, said = load_kept(tune_dir, str(model), backend, more_cores)
    assert found is None and "another CPU" in said
    found, said = load_kept(tune_dir, str(model), BackendSettings(n_threads=4), CPU)
    assert found is None and "n_threads 1, not 4" in said
    fast = BackendSettings(n_threads=1, llamacpp_batch_invariant=False)
    found, said = load_kept(tune_dir, str(model), fast, CPU)
    assert found is None and "llamacpp_batch_invariant" in said


def test_an_unreadable_tuning_is_not_used(tmp_path: Path) -> None:
    model = model_file(tmp_path)
    where = keep(tuning_of(model, ZEN5), tmp_path / "tune")
    where.write_text("{not json")
    found, said = load_kept(tmp_path / "tune", str(model), BackendSettings(n_threads=1), CPU)
    assert found is None and "cannot be used" in said
    where.write_text(json.dumps({"schema": "laneway.tune/0"}))
    found, said = load_kept(tmp_path / "tune", str(model), BackendSettings(n_threads=1), CPU)
    assert found is None and "laneway.tune/1" in said


def two_models(tmp_path: Path, **settings: object) -> tuple[Settings, Path, Path]:
    """Settings whose light and heavy models are files with kept tunings:
    light is fastest alone, heavy at 4 x 2."""
    light, heavy = model_file(tmp_path, "light.gguf"), model_file(tmp_path, "heavy.gguf", b"gg")
    tune_dir = tmp_path / "tune"
    keep(tuning_of(light, [rate(1, 1, 100.0), rate(2, 1, 90.0), rate(2, 2, 80.0)]), tune_dir)
    keep(tuning_of(heavy, [rate(1, 1, 50.0), rate(2, 1, 60.0), rate(4, 2, 64.0)]), tune_dir)
    backend = settings.pop("backend", None) or BackendSettings(
        n_threads=1, light_model=str(light), heavy_model=str(heavy)
    )
    return Settings(backend=backend, tune=TuneSettings(dir=tune_dir), **settings), light, heavy


async def test_a_worker_runs_its_models_at_their_kept_sizes(tmp_path: Path) -> None:
    settings, _, _ = two_models(tmp_path)
    registry = builtin_registry(settings.backend)
    bulk = await lane_tuning(settings, Lane.BULK, registry, CPU)
    assert (bulk.settings.bulk.max_batch_size, bulk.settings.bulk.max_inflight_batches) == (4, 2)
    entry = bulk.registry.for_path(AnswerPath.HEAVY)
    assert entry is not None and entry.max_batch == 8  # 4 x 2 sequences in llama.cpp
    assert settings.bulk.max_batch_size == 32  # the settings given are left alone
    assert any("tuned on this CPU" in note and "4 x 2" in note for note in bulk.notes)
    # Realtime prefers latency: within 25% of the heavy model's best, its
    # light model's single sequence.
    realtime = await lane_tuning(settings, Lane.REALTIME, registry, CPU)
    assert realtime.settings.realtime.max_batch_size == 1
    assert realtime.settings.realtime.max_inflight_batches == 1
    # Medium loads both: the lane takes the larger of their picks, and each
    # model's own sequences stay as it picked them.
    medium = await lane_tuning(settings, Lane.MEDIUM, registry, CPU)
    assert (medium.settings.medium.max_batch_size, medium.settings.medium.max_inflight_batches) == (
        4,
        2,
    )
    light_entry = medium.registry.for_path(AnswerPath.LIGHT)
    assert light_entry is not None and light_entry.max_batch == 1


async def test_explicit_settings_win_over_a_kept_tuning(tmp_path: Path) -> None:
    settings, light, heavy = two_models(
        tmp_path, bulk=BulkLaneSettings(max_batch_size=32), realtime=RealtimeLaneSettings()
    )
    tuned = await lane_tuning(settings, Lane.BULK, builtin_registry(settings.backend), CPU)
    assert tuned.settings.bulk.max_batch_size == 32  # set explicitly
    assert tuned.settings.bulk.max_inflight_batches == 2  # tuned (not set)
    assert any("max_batch_size 32 is set explicitly" in note for note in tuned.notes)
    # A registry entry's max_batch, and the llama.cpp sequences set explicitly.
    registry = ModelRegistry(
        models=tuple(
            m.model_copy(update={"max_batch": 3}) if m.path == AnswerPath.HEAVY else m
            for m in builtin_registry(settings.backend).models
        )
    )
    tuned = await lane_tuning(settings, Lane.BULK, registry, CPU)
    heavy_entry = tuned.registry.for_path(AnswerPath.HEAVY)
    assert heavy_entry is not None and heavy_entry.max_batch == 3
    backend = BackendSettings(
        n_threads=1, light_model=str(light), heavy_model=str(heavy), llamacpp_max_sequences=5
    )
    explicit = settings.model_copy(update={"backend": backend})
    tuned = await lane_tuning(explicit, Lane.BULK, builtin_registry(backend), CPU)
    heavy_entry = tuned.registry.for_path(AnswerPath.HEAVY)
    assert heavy_entry is not None and heavy_entry.max_batch is None
    assert any("LANEWAY_BACKEND_LLAMACPP_MAX_SEQUENCES 5 wins" in n for n in tuned.notes)


async def test_without_a_kept_tuning_or_with_it_switched_off_the_lane_settings_stand(
    tmp_path: Path,
) -> None:
    settings, _, _ = two_models(tmp_path)
    registry = builtin_registry(settings.backend)
    elsewhere = await lane_tuning(settings, Lane.BULK, registry, OTHER_CPU)
    assert elsewhere.settings is settings and elsewhere.registry is registry
    assert any("no tuning kept" in note for note in elsewhere.notes)
    assert "from the lane's settings" in elsewhere.notes[-1]
    off = settings.model_copy(update={"tune": TuneSettings(dir=tmp_path / "tune", use_kept=False)})
    unused = await lane_tuning(off, Lane.BULK, registry, CPU)
    assert unused.settings is off
    assert unused.notes == ("batch sizes are not tuned (LANEWAY_TUNE_USE_KEPT)",)


def test_tune_settings_take_candidates_sorted_and_refuse_zero() -> None:
    assert TuneSettings(batch_sizes=(8, 1, 2, 2)).batch_sizes == (1, 2, 8)
    with pytest.raises(ValueError, match="at least 1"):
        TuneSettings(inflight=(0, 1))


async def test_a_lane_size_set_in_the_environment_is_explicit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANEWAY_BULK_MAX_INFLIGHT_BATCHES", "1")
    settings, _, _ = two_models(tmp_path, bulk=BulkLaneSettings())
    tuned = await lane_tuning(settings, Lane.BULK, builtin_registry(settings.backend), CPU)
    assert (tuned.settings.bulk.max_batch_size, tuned.settings.bulk.max_inflight_batches) == (4, 1)
