"""The whole ``laneway distill student`` run, with its rails.

pairs -> seeded held-out split -> refuse below the floor of training rows
-> LoRA training -> ``adapter.gguf`` and ``peft/`` -> base and student
answers on the held-out prompts (llama.cpp) -> ``student.json``. A student
whose held-out agreement is not above the base's is written all the same,
with ``offered: false`` and the reason: the versions go out as shadow or
canary only when ``offered``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from schemas.student import (
    ADAPTER_FILE,
    PEFT_DIR,
    LoraInfo,
    RowCounts,
    StudentMetrics,
    StudentProvenance,
    TimeWindow,
)
from streams.distill.student.agreement import Answers, agreement, greedy_answers
from streams.distill.student.data import StudentData, StudentError, split
from streams.distill.student.lora import LoraConfig, Trained, train_lora
from streams.distill.student.model import LightModel, load_base, prompt_text

__all__ = ["StudentRun", "offer", "run_student"]


@dataclass(slots=True)
class StudentRun:
    provenance: StudentProvenance
    out: Path
    held_out: list[tuple[str, str, str, str]]
    """Per held-out prompt: (prompt, teacher, base answer, student answer)."""
    trained: Trained
    light: LightModel


def offer(base: float | None, student: float | None) -> tuple[bool, str]:
    """Whether a student may be offered for promotion, and why."""
    if student is None or base is None:
        return False, "no held-out prompt had an agreement verdict: nothing shows it is better"
    if student > base:
        return True, f"held-out agreement {student:.3f} above the base's {base:.3f}"
    return False, f"held-out agreement {student:.3f} is not above the base's {base:.3f}"


def run_student(
    data: StudentData,
    *,
    base_model: str,
    gguf: Path,
    teacher: str,
    out: Path,
    config: LoraConfig,
    held_out_share: float,
    min_rows: int,
    embed: Callable[[list[str]], np.ndarray] | None,
    agree_at: float = 0.75,
    max_new_tokens: int = 64,
    n_threads: int | None = None,
    system: str = "",
    commit: str = "unknown",
    on_step: Callable[[int, float], None] | None = None,
    now: datetime | None = None,
) -> StudentRun:
    train, held = split(data.pairs, held_out_share, config.seed)
    if len(train) < min_rows:
        raise StudentError(
            f"{len(train)} training rows (of {len(data.pairs)} distinct prompts, "
            f"{len(held)} held out; {data.dropped_bad} rated bad and {data.dropped_failed} "
            f"failed left out) is below the floor of {min_rows} (--min-rows, "
            "LANEWAY_DISTILL_STUDENT_MIN_ROWS)"
        )
    light = load_base(gguf, system)
    trained = train_lora(light, train, config, on_step)
    out.mkdir(parents=True, exist_ok=True)
    from streams.distill.student.export import write_gguf_adapter, write_peft_adapter

    adapter = write_gguf_adapter(light, trained.model, config.alpha, out / ADAPTER_FILE)
    write_peft_adapter(trained.model, out / PEFT_DIR)
    prompts = [prompt_text(light.tokenizer, pair.prompt, light.system) for pair in held]
    teacher_answers = [pair.answer for pair in held]

    def answers(adapter: Path | None) -> Answers:
        if not held:
            return Answers([], [], 0.0)
        return greedy_answers(
            gguf, prompts, adapter=adapter, max_tokens=max_new_tokens, n_threads=n_threads
        )

    base = answers(None)
    student = answers(adapter)
    base_agreement = agreement(base.texts, teacher_answers, embed, agree_at) if held else None
    student_agreement = agreement(student.texts, teacher_answers, embed, agree_at) if held else None
    offered, reason = offer(base_agreement, student_agreement)
    window = data.window()
    provenance = StudentProvenance(
        base_model=base_model,
        base_gguf=gguf.name,
        teacher=teacher,
        window=TimeWindow(**window) if window else None,
        rows=RowCounts(
            train=len(train),
            held_out=len(held),
            dropped_bad=data.dropped_bad,
            dropped_failed=data.dropped_failed,
        ),
        lora=LoraInfo(
            r=config.r,
            alpha=config.alpha,
            targets=list(config.targets),
            steps=config.steps,
            lr=config.lr,
        ),
        metrics=StudentMetrics(
            loss_first=_round(trained.loss_first),
            loss_last=_round(trained.loss_last),
            base_agreement=_round(base_agreement),
            student_agreement=_round(student_agreement),
            base_tokens_per_s=_round(base.tokens_per_s, 1),
            student_tokens_per_s=_round(student.tokens_per_s, 1) if held else None,
        ),
        offered=offered,
        reason=reason,
        created=(now or datetime.now(UTC)).isoformat(timespec="seconds").replace("+00:00", "Z"),
        commit=commit,
    )
    provenance.write(out)
    rows = [
        (pair.prompt, pair.answer, b, s)
        for pair, b, s in zip(held, base.texts, student.texts, strict=True)
    ]
    return StudentRun(provenance, out, rows, trained, light)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
