"""A version with a LoRA adapter: the registry field, the register and
refuse decisions (``streams.rollout.register``), the registry file it
writes, and ``laneway models register`` on real files (it needs no Redis)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from schemas.messages import AnswerPath
from schemas.settings import BackendSettings
from schemas.student import PROVENANCE_FILE, TimeWindow
from streams.cli.main import build_parser, main
from streams.rollout.register import (
    RegisterError,
    new_version,
    provenance_line,
    read_student,
    registry_text,
)
from streams.routing.registry import (
    ModelEntry,
    ModelRegistry,
    RegistryError,
    builtin_registry,
    load_registry,
)

BUILTIN = builtin_registry(BackendSettings())

REGISTRY = """\
# The light path and its students.
models:
  - name: smollm2-135m   # the wheel's
    version: q4_1
    backend: llamacpp
    path: light
    max_complexity: simple
    cost_per_1k_tokens: 0.0002
  - {name: gemma3-270m, version: q4_k_m, backend: llamacpp, path: heavy}
"""


def student_json(folder: Path, *, offered: bool = True, reason: str = "beats its base") -> Path:
    """A student directory as ``laneway distill student`` leaves it (the
    adapter a placeholder file: nothing here loads it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter.gguf").write_bytes(b"GGUF")
    record = {
        "kind": "laneway.student/1",
        "base_model": "smollm2-135m",
        "base_gguf": "/wheels/SmolLM2-135M-Instruct.Q4_1.gguf",
        "teacher": "gemma3-270m",
        "window": None,
        "rows": {"train": 240, "held_out": 60, "dropped_bad": 2, "dropped_failed": 0},
        "lora": {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"], "steps": 40, "lr": 1e-3},
        "metrics": {
            "loss_first": 2.1,
            "loss_last": 1.4,
            "base_agreement": 0.4,
            "student_agreement": 0.5 if offered else 0.35,
            "base_tokens_per_s": 80.0,
            "student_tokens_per_s": 78.0,
        },
        "offered": offered,
        "reason": reason,
        "created": "2026-12-07T04:00:00Z",
        "commit": "abc1234",
    }
    (folder / PROVENANCE_FILE).write_text(json.dumps(record))
    return folder


# -- the registry field -----------------------------------------------------------


def test_a_version_may_carry_an_adapter_where_its_backend_takes_one(tmp_path: Path) -> None:
    entry = ModelEntry(
        name="smollm2-135m", backend="llamacpp", path=AnswerPath.LIGHT, adapter=tmp_path
    )
    assert entry.adapter == tmp_path
    assert ModelEntry(name="x", backend="vllm", path=AnswerPath.LIGHT, adapter=tmp_path).adapter
    assert ModelEntry(name="x", backend="llamacpp", path=AnswerPath.LIGHT).adapter is None
    for backend in ("openai", "rules"):
        with pytest.raises(ValueError, match=f"backend {backend} takes no LoRA adapter"):
            ModelEntry(name="x", backend=backend, path=AnswerPath.LIGHT, adapter=tmp_path)


def test_an_adapter_on_the_openai_backend_fails_the_registry_load(tmp_path: Path) -> None:
    file = tmp_path / "models.yaml"
    file.write_text(
        "models:\n  - {name: gpt, backend: openai, path: heavy, adapter: /students/1}\n"
    )
    with pytest.raises(RegistryError, match="backend openai takes no LoRA adapter"):
        load_registry(file, BackendSettings())


def test_a_relative_adapter_is_relative_to_the_registry_file(tmp_path: Path) -> None:
    file = tmp_path / "conf" / "models.yaml"
    file.parent.mkdir()
    file.write_text(
        REGISTRY + "  - {name: smollm2-135m, version: s1, state: shadow, backend: llamacpp,"
        " path: light, adapter: students/1}\n"
        + "  - {name: smollm2-135m, version: s2, state: shadow, backend: llamacpp,"
        " path: light, adapter: /abs/students/2}\n"
    )
    registry = load_registry(file, BackendSettings())
    assert registry.version(AnswerPath.LIGHT, "s1").adapter == file.parent / "students" / "1"  # type: ignore[union-attr]
    assert registry.version(AnswerPath.LIGHT, "s2").adapter == Path("/abs/students/2")  # type: ignore[union-attr]


# -- register and refuse ----------------------------------------------------------


def test_a_student_joins_its_path_as_a_shadow_of_the_active_versions_kind(
    tmp_path: Path,
) -> None:
    folder = student_json(tmp_path / "s")
    entry = new_version(BUILTIN, AnswerPath.LIGHT, "2", folder, read_student(folder))
    active = BUILTIN.for_path(AnswerPath.LIGHT)
    assert active is not None
    assert (entry.name, entry.version, entry.state, entry.share) == (
        "smollm2-135m",
        "2",
        "shadow",
        None,
    )
    assert entry.adapter == folder
    assert (entry.backend, entry.max_complexity, entry.cost_per_1k_tokens) == (
        active.backend,
        active.max_complexity,
        active.cost_per_1k_tokens,
    )
    canary = new_version(
        BUILTIN, AnswerPath.LIGHT, "2", folder, read_student(folder), state="canary"
    )
    assert (canary.state, canary.share) == ("canary", 0.0)  # nothing until a share is given
    half = new_version(BUILTIN, AnswerPath.LIGHT, "2", folder, None, share=0.5, force=True)
    assert (half.state, half.share, half.name) == ("shadow", 0.5, "smollm2-135m")


def test_a_student_not_offered_is_refused_with_its_reason_unless_forced(tmp_path: Path) -> None:
    folder = student_json(tmp_path / "s", offered=False, reason="agreement 35% <= base 40%")
    student = read_student(folder)
    assert student is not None and not student.offered
    with pytest.raises(
        RegisterError, match=r"not offered for promotion: agreement 35% <= base 40%"
    ):
        new_version(BUILTIN, AnswerPath.LIGHT, "2", folder, student)
    forced = new_version(BUILTIN, AnswerPath.LIGHT, "2", folder, student, force=True)
    assert forced.adapter == folder


def test_what_cannot_be_registered_says_why(tmp_path: Path) -> None:
    folder = student_json(tmp_path / "s")
    student = read_student(folder)
    with pytest.raises(RegisterError, match=r"already has version 'q4_1'"):
        new_version(BUILTIN, AnswerPath.LIGHT, "q4_1", folder, student)
    with pytest.raises(RegisterError, match=r"no model path medium"):
        new_version(BUILTIN, AnswerPath("medium"), "2", folder, student)
    with pytest.raises(RegisterError, match=r"no student.json beside"):
        new_version(BUILTIN, AnswerPath.LIGHT, "2", tmp_path / "bare.gguf", None)
    with pytest.raises(RegisterError, match=r"share"):
        new_version(BUILTIN, AnswerPath.LIGHT, "2", folder, student, share=1.5)
    (folder / PROVENANCE_FILE).write_text('{"kind": "other/9", "base_model": "x"}')
    with pytest.raises(RegisterError, match=r"of kind 'other/9'"):
        read_student(folder)
    (folder / PROVENANCE_FILE).write_text("{not json")
    with pytest.raises(RegisterError, match=r"cannot be read"):
        read_student(folder / "adapter.gguf")  # a file's folder holds its student.json


def test_the_provenance_line_shows_base_teacher_rows_and_agreement(tmp_path: Path) -> None:
    student = read_student(student_json(tmp_path / "s"))
    assert student is not None
    line = provenance_line(student)
    assert line.startswith("student of smollm2-135m from gemma3-270m: 240 rows (60 held out)")
    assert "agreement 40% -> 50%" in line and line.endswith("offered")
    window = TimeWindow(start="2026-12-01", end="2026-12-07")
    windowed = student.model_copy(update={"window": window})
    assert "(60 held out), traffic 2026-12-01..2026-12-07, agreement" in provenance_line(windowed)
    unmeasured = student.metrics.model_copy(update={"base_agreement": None})
    bare = student.model_copy(
        update={"metrics": unmeasured, "offered": False, "reason": "too few rows"}
    )
    assert provenance_line(bare).endswith(
        "(60 held out), agreement not measured; not offered: too few rows"
    )


# -- the registry file ------------------------------------------------------------


def test_the_new_entry_is_appended_to_the_file_with_its_comments(tmp_path: Path) -> None:
    entry = new_version(
        ModelRegistry.model_validate(yaml.safe_load(REGISTRY)),
        AnswerPath.LIGHT,
        "2",
        student_json(tmp_path / "s"),
        None,
        force=True,
    )
    text = registry_text(REGISTRY, BUILTIN, entry)
    assert text.startswith(REGISTRY) and "# the wheel's" in text
    parsed = ModelRegistry.model_validate(yaml.safe_load(text))
    assert parsed.models[-1] == entry and len(parsed.models) == 3


def test_a_file_the_entry_cannot_be_appended_to_is_written_afresh(tmp_path: Path) -> None:
    flow = "{models: [{name: smollm2-135m, backend: llamacpp, path: light}]}\n"
    entry = new_version(
        ModelRegistry.model_validate(yaml.safe_load(flow)),
        AnswerPath.LIGHT,
        "2",
        tmp_path,
        None,
        force=True,
    )
    parsed = ModelRegistry.model_validate(yaml.safe_load(registry_text(flow, BUILTIN, entry)))
    assert [m.version for m in parsed.models] == ["1", "2"] and parsed.models[-1] == entry
    fresh = ModelRegistry.model_validate(yaml.safe_load(registry_text(None, BUILTIN, entry)))
    assert fresh.models == (*BUILTIN.models, entry)


# -- the command ------------------------------------------------------------------


def test_the_register_command_parses() -> None:
    args = build_parser().parse_args(
        ["models", "register", "light", "2", "--adapter", "/s/1", "--share", "0.5"]
    )
    assert (args.models_command, args.path, args.version) == ("register", "light", "2")
    assert (args.adapter, args.state, args.share, args.force) == (
        Path("/s/1"),
        "shadow",
        0.5,
        False,
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["models", "register", "light", "2"])  # --adapter is required
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["models", "register", "light", "2", "--adapter", "x", "--state", "active"]
        )


def test_register_adds_the_version_to_the_file_every_process_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "models.yaml"
    file.write_text(REGISTRY)
    monkeypatch.setenv("LANEWAY_ROUTING_MODELS_FILE", str(file))
    good = student_json(tmp_path / "good")
    assert main(["models", "register", "light", "s1", "--adapter", str(good)]) == 0
    out = capsys.readouterr().out
    assert "light s1: shadow" in out and "agreement 40% -> 50%" in out
    registry = load_registry(file, BackendSettings())
    added = registry.version(AnswerPath.LIGHT, "s1")
    assert added is not None and added.adapter == good and added.state == "shadow"
    assert file.read_text().startswith(REGISTRY)
    # Not offered: refused with the reason, the file unchanged; forced: added.
    bad = student_json(tmp_path / "bad", offered=False, reason="agreement 35% <= base 40%")
    before = file.read_text()
    assert main(["models", "register", "light", "s2", "--adapter", str(bad)]) == 2
    assert "agreement 35% <= base 40%" in capsys.readouterr().err
    assert file.read_text() == before
    args = ["models", "register", "light", "s2", "--adapter", str(bad), "--force"]
    assert main([*args, "--state", "canary"]) == 0
    s2 = load_registry(file, BackendSettings()).version(AnswerPath.LIGHT, "s2")
    assert s2 is not None and (s2.state, s2.share) == ("canary", 0.0)
    # An adapter its backend cannot find is refused before the file changes.
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / PROVENANCE_FILE).write_text((good / PROVENANCE_FILE).read_text())
    assert main(["models", "register", "light", "s3", "--adapter", str(empty)]) == 2
    assert "adapter.gguf" in capsys.readouterr().err


def test_register_creates_a_missing_file_from_the_built_in_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "new" / "models.yaml"
    monkeypatch.setenv("LANEWAY_ROUTING_MODELS_FILE", str(file))
    folder = student_json(tmp_path / "s")
    assert main(["models", "register", "light", "s1", "--adapter", str(folder)]) == 0
    assert "created from the built-in models" in capsys.readouterr().out
    registry = load_registry(file, BackendSettings())
    assert [m.version for m in registry.models] == ["q4_1", "q4_k_m", "s1"]
    monkeypatch.delenv("LANEWAY_ROUTING_MODELS_FILE")
    assert main(["models", "register", "light", "s2", "--adapter", str(folder)]) == 2
    assert "set LANEWAY_ROUTING_MODELS_FILE" in capsys.readouterr().err
