"""``laneway bench student``: a LoRA student of the light model against its
base, cross-validated on the labelled set.

**The set** is ``laneway bench router``'s (``streams/distill/prompts.jsonl``,
201 prompts; ``--limit`` takes the first N for a short run). **The
teacher**: the heavy model's greedy answers through ``workers.backends``
with the worker's system prompt, cached as ``bench router`` caches them.
**The comparison**: k folds over the prompts (a seeded shuffle); in each,
a student (``streams.distill.student``: LoRA on the light model loaded
from its GGUF) is trained on the other folds' prompts and the teacher's
answers, exported as ``adapter.gguf``, and answers the fold's prompts with
llama.cpp; the base answers every prompt the same way (greedy, the same
context, threads and token limit). Agreement with the teacher is
``labels.agreement_scores`` at ``--agree-at``, the measure ``distill
train`` labels with. Printed and recorded: pooled out-of-fold agreement of
base and student, and each one's tokens/s.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from schemas.settings import Settings
from streams.bench.results import BenchRun, Figure

__all__ = ["HELP", "add_arguments", "run"]

HELP = "a LoRA student of the light model against its base, cross-validated on the labelled set"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--steps", type=int, default=60, help="training steps per fold")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (alpha: twice it)")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length")
    parser.add_argument("--agree-at", type=float, default=0.75, help="agreement cosine")
    parser.add_argument("--seed", type=int, default=0, help="fold assignment and batches")


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    from streams.bench.router import cached_answers, load_prompts
    from streams.cache.embedding import MiniLMEmbedder
    from streams.distill.student.agreement import agreement, greedy_answers
    from streams.distill.student.data import Pair
    from streams.distill.student.export import write_gguf_adapter
    from streams.distill.student.lora import LoraConfig, train_lora
    from streams.distill.student.model import load_base, prompt_text
    from workers.models import resolve_gguf

    if args.folds < 2:
        raise SystemExit("laneway bench student: --folds must be at least 2")
    prompts = [p.prompt for p in load_prompts()][: args.limit]
    heavy, light_name = settings.backend.heavy_model, settings.backend.light_model
    teacher = cached_answers(settings.backend, [heavy], prompts, args.max_tokens)[heavy]
    gguf = resolve_gguf(light_name, settings.backend.model_dir)
    light = load_base(gguf, settings.backend.system_prompt)
    rendered = [prompt_text(light.tokenizer, p, light.system) for p in prompts]
    order = list(range(len(prompts)))
    random.Random(args.seed).shuffle(order)
    fold_of = {i: n % args.folds for n, i in enumerate(order)}
    base = greedy_answers(
        gguf, rendered, max_tokens=args.max_tokens, n_threads=settings.backend.n_threads
    )
    student_texts = [""] * len(prompts)
    student_tokens = 0
    student_s = 0.0
    config = LoraConfig(r=args.rank, alpha=2.0 * args.rank, steps=args.steps, lr=args.lr)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="laneway-bench-student-") as scratch:
        for fold in range(args.folds):
            train = [
                Pair(prompts[i], teacher[i])
                for i in range(len(prompts))
                if fold_of[i] != fold and teacher[i].strip()
            ]
            test = [i for i in range(len(prompts)) if fold_of[i] == fold]
            trained = train_lora(light, train, config)
            adapter = write_gguf_adapter(
                light, trained.model, config.alpha, Path(scratch) / f"fold{fold}.gguf"
            )
            light.model = trained.model.unload()
            got = greedy_answers(
                gguf,
                [rendered[i] for i in test],
                adapter=adapter,
                max_tokens=args.max_tokens,
                n_threads=settings.backend.n_threads,
            )
            for i, text in zip(test, got.texts, strict=True):
                student_texts[i] = text
            student_tokens += sum(len(t) for t in got.tokens)
            student_s += got.seconds
            print(
                f"fold {fold + 1}/{args.folds}: {len(train)} trained, {len(test)} answered, "
                f"loss {trained.loss_first:.3f} -> {trained.loss_last:.3f}",
                flush=True,
            )
    embed = MiniLMEmbedder().embed
    base_agree = agreement(base.texts, teacher, embed, args.agree_at)
    student_agree = agreement(student_texts, teacher, embed, args.agree_at)
    student_tps = student_tokens / student_s if student_s > 0 else None
    print(f"{'model':<10} {'agreement':>10} {'tokens/s':>10}")
    for name, agree, speed in (
        ("base", base_agree, base.tokens_per_s),
        ("student", student_agree, student_tps),
    ):
        print(f"{name:<10} {_fmt(agree, 3):>10} {_fmt(speed, 1):>10}")
    return BenchRun(
        exit_code=0,
        figures={
            "base_agreement": Figure(base_agree, "share", "base light model agrees with teacher"),
            "student_agreement": Figure(student_agree, "share", "student agrees with teacher"),
            "base_tokens_per_s": Figure(base.tokens_per_s, "tokens/s", "base, llama.cpp"),
            "student_tokens_per_s": Figure(student_tps, "tokens/s", "student, llama.cpp"),
            "prompts": Figure(len(prompts), "count", "prompts cross-validated"),
            "train_s": Figure(round(time.perf_counter() - started, 1), "s", "all folds"),
        },
        notes=f"{args.folds} folds, {args.steps} steps, rank {args.rank}, teacher {heavy}",
    )


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
