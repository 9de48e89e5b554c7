"""``laneway distill student``: training pairs, the held-out split, the
rails, the provenance file, and (slow) a real LoRA trained on the light
model from its wheel, exported as GGUF and loaded by llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.student import (
    LoraInfo,
    RowCounts,
    StudentMetrics,
    StudentProvenance,
)
from streams.distill.rows import ExportRow
from streams.distill.student.data import (
    Pair,
    StudentData,
    StudentError,
    load_pairs,
    pairs_from_rows,
    split,
)
from streams.distill.student.lora import LoraConfig
from streams.distill.student.pipeline import offer, run_student


def _row(i: int, prompt: str, path: str, **kw: object) -> ExportRow:
    return ExportRow(
        id=f"r{i}",
        ts_ms=1_700_000_000_000 + i,
        prompt=prompt,
        features={},
        path=path,
        success=kw.pop("success", True),
        **kw,
    )  # type: ignore[arg-type]


def test_rows_rated_bad_or_failed_are_never_targets() -> None:
    rows = [
        _row(1, "Capital of France?", "heavy", output="Paris.", model="gemma3-270m"),
        _row(2, "Capital of Peru?", "heavy", output="Quito.", feedback=-1.0, model="gemma3-270m"),
        # The same bad answer carried by a light row is not a target either.
        _row(3, "capital of  PERU?", "light", output="Lima", heavy_output="Quito."),
        _row(4, "Capital of Chile?", "heavy", success=False, error_code="INF-502"),
        _row(5, "Capital of Chile?", "light", output="Santiago"),
        _row(6, "Capital of Spain?", "light", output="Madrid", heavy_output="Madrid."),
        _row(7, "Capital of France?", "light", output="Paris", heavy_output="Paris!"),
    ]
    data = pairs_from_rows(rows)
    assert [(p.prompt, p.answer) for p in data.pairs] == [
        ("Capital of France?", "Paris."),
        ("Capital of Spain?", "Madrid."),
    ]
    assert (data.dropped_bad, data.dropped_failed, data.teacher) == (1, 1, "gemma3-270m")
    assert data.window() == {"start": "2023-11-14T22:13:20Z", "end": "2023-11-14T22:13:20Z"}


def test_chat_jsonl_and_rows_are_both_read(tmp_path: Path) -> None:
    chat = tmp_path / "sft.jsonl"
    chat.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "Hi?"},
                    {"role": "assistant", "content": "Hello."},
                ]
            }
        )
        + "\n"
    )
    assert load_pairs(chat).pairs == [Pair("Hi?", "Hello.")]
    assert load_pairs(chat).window() is None
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_row(1, "Hi?", "heavy", output="Hey.").as_dict()) + "\n")
    assert load_pairs(rows).pairs == [Pair("Hi?", "Hey.")]
    with pytest.raises(StudentError, match="no such file"):
        load_pairs(tmp_path / "missing.jsonl")


def test_held_out_split_is_seeded_and_by_prompt() -> None:
    pairs = [Pair(f"q{i}", f"a{i}") for i in range(20)]
    train, held = split(pairs, 0.25, seed=3)
    assert len(held) == 5 and len(train) == 15
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert split(pairs, 0.25, seed=3) == (train, held)
    assert split(pairs, 0.25, seed=4)[1] != held
    with pytest.raises(StudentError, match=r"within 0\.\.1"):
        split(pairs, 1.0, seed=0)


def test_fewer_rows_than_the_floor_are_refused(tmp_path: Path) -> None:
    data = StudentData([Pair(f"q{i}", f"a{i}") for i in range(10)], dropped_bad=2)
    with pytest.raises(StudentError, match=r"8 training rows .* below the floor of 50"):
        run_student(
            data,
            base_model="smollm2-135m",
            gguf=tmp_path / "never-loaded.gguf",
            teacher="gemma3-270m",
            out=tmp_path / "out",
            config=LoraConfig(),
            held_out_share=0.2,
            min_rows=50,
            embed=None,
        )
    assert not (tmp_path / "out").exists()


def test_a_student_no_better_than_its_base_is_not_offered() -> None:
    assert offer(0.40, 0.45)[0]
    assert offer(0.40, 0.40) == (False, "held-out agreement 0.400 is not above the base's 0.400")
    assert not offer(None, 0.5)[0]


def test_provenance_has_exactly_the_contract_keys(tmp_path: Path) -> None:
    provenance = StudentProvenance(
        base_model="smollm2-135m",
        base_gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        teacher="gemma3-270m",
        window=None,
        rows=RowCounts(train=80, held_out=20, dropped_bad=1, dropped_failed=0),
        lora=LoraInfo(r=8, alpha=16, targets=["v_proj"], steps=60, lr=1e-3),
        metrics=StudentMetrics(
            loss_first=2.0,
            loss_last=1.0,
            base_agreement=0.3,
            student_agreement=0.4,
            base_tokens_per_s=50.0,
            student_tokens_per_s=49.0,
        ),
        offered=True,
        reason="better",
        created="2026-12-07T00:00:00Z",
        commit="abc",
    )
    written = json.loads(provenance.write(tmp_path).read_text())
    assert list(written) == [
        "kind",
        "base_model",
        "base_gguf",
        "teacher",
        "window",
        "rows",
        "lora",
        "metrics",
        "offered",
        "reason",
        "created",
        "commit",
    ]
    assert written["kind"] == "laneway.student/1"
    assert StudentProvenance.read(tmp_path) == provenance


@pytest.mark.slow
def test_a_tiny_lora_lowers_its_loss_and_llama_cpp_serves_it(tmp_path: Path) -> None:
    from streams.distill.student.agreement import greedy_answers
    from streams.distill.student.export import write_gguf_adapter, write_peft_adapter
    from streams.distill.student.lora import train_lora
    from streams.distill.student.model import load_base, prompt_text
    from workers.models import resolve_gguf

    gguf = resolve_gguf("smollm2-135m", tmp_path)
    light = load_base(gguf)
    pairs = [
        Pair(f"What is the capital of {c}?", f"Zorbla, capital of {c}.")
        for c in ("France", "Spain", "Japan", "Kenya")
    ]
    config = LoraConfig(steps=4, lr=3e-3, batch_size=2)
    trained = train_lora(light, pairs, config)
    assert trained.losses[-1] < trained.losses[0]
    adapter = write_gguf_adapter(light, trained.model, config.alpha, tmp_path / "adapter.gguf")
    prompts = [prompt_text(light.tokenizer, pairs[0].prompt)]
    base = greedy_answers(gguf, prompts, max_tokens=8)
    student = greedy_answers(gguf, prompts, adapter=adapter, max_tokens=8)
    assert student.tokens != base.tokens
    assert "Zorbla" in student.texts[0]
    peft_dir = write_peft_adapter(trained.model, tmp_path / "peft")
    config_written = json.loads((peft_dir / "adapter_config.json").read_text())
    assert config_written["r"] == config.r
    assert (peft_dir / "adapter_model.safetensors").is_file()
