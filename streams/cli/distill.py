"""``laneway distill export|train|report``: the distillation loop's commands
(``streams.distill``). Errors are one line on stderr and exit status 2.

    laneway distill export --since 24h -o rows.jsonl          # or --format parquet
    laneway distill train rows.jsonl -o router.json --heavy-share 0.3 --holdout 0.2 \\
        [--finetune-out light-sft.jsonl]
    laneway distill report --artifact router.json rows.jsonl --held-out -o report/
    laneway distill report --artifact router.json --since 2h -o report/   # a later window
    laneway distill student light-sft.jsonl -o student/ --held-out 0.2 --steps 60   # or rows.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from schemas.settings import Settings

__all__ = ["cmd", "run_distill", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    distill: argparse.ArgumentParser = subparsers.add_parser(
        "distill", help="export traffic, train and report a learned router, fine-tune a student"
    )
    commands = distill.add_subparsers(dest="distill_command", required=True)

    export = commands.add_parser("export", help="a time window of traffic as training rows")
    _window_args(export, required=True)
    export.add_argument("-o", "--out", required=True, help="rows file (.jsonl or .parquet)")
    export.add_argument("--format", choices=["jsonl", "parquet"], help="default: by suffix")

    train = commands.add_parser("train", help="fit and calibrate a learned router")
    train.add_argument("rows", help="an export (.jsonl or .parquet)")
    train.add_argument("-o", "--out", required=True, help="the artifact to write (JSON)")
    train.add_argument(
        "--heavy-share", type=float, default=0.3, help="share of traffic calibrated to go heavy"
    )
    train.add_argument(
        "--holdout", type=float, default=0.0, help="share of rows kept out (report --held-out)"
    )
    train.add_argument("-C", type=float, default=1.0, help="inverse L2 strength")
    train.add_argument("--finetune-out", help="also write chat JSONL of heavy answers")
    _label_args(train)

    report = commands.add_parser("report", help="the learned router against today's rule")
    report.add_argument("rows", nargs="?", help="an export; or --since/--until to export one")
    report.add_argument("--artifact", required=True)
    _window_args(report, required=False)
    report.add_argument(
        "--held-out", action="store_true", help="only the rows the artifact's --holdout kept out"
    )
    report.add_argument("-o", "--out", help="folder (default: report-<version>)")
    report.add_argument("--min-labels", type=int, default=20, help="fewer: never promote")
    _label_args(report)

    student = commands.add_parser(
        "student", help="fine-tune the light model (LoRA) on the heavy model's answers"
    )
    student.add_argument("source", help="fine-tune chat JSONL (--finetune-out) or an export")
    student.add_argument(
        "-o", "--out", required=True, help="folder: adapter.gguf, peft/, student.json"
    )
    student.add_argument("--held-out", type=float, help="share of prompts kept out (0..1)")
    student.add_argument("--steps", type=int, help="optimiser steps")
    student.add_argument("--rank", type=int, help="LoRA rank (alpha: twice it)")
    student.add_argument("--lr", type=float, help="learning rate")
    student.add_argument("--min-rows", type=int, help="fewer training prompts: refused")
    student.add_argument("--seed", type=int, default=0, help="held-out split and batch order")
    student.add_argument("--max-new-tokens", type=int, help="answer length on held-out prompts")
    student.add_argument("--base", help="the light model (default: LANEWAY_BACKEND_LIGHT_MODEL)")
    student.add_argument(
        "--teacher",
        help="the heavy model's name (default: the rows', else LANEWAY_BACKEND_HEAVY_MODEL)",
    )
    student.add_argument(
        "--agree-at", type=float, help="answer cosine that counts as agreeing with the teacher"
    )
    return distill


def cmd(args: argparse.Namespace) -> int:
    from streams.cli.common import settings_of

    return run_distill(settings_of(args), args)


def _window_args(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--since", required=required, help="ISO time, epoch ms, or back from now: 2h, 30m, 7d"
    )
    parser.add_argument("--until", default="now", help="as --since (default: now)")
    parser.add_argument(
        "--late", default="10m", help="results and feedback read this long after --until"
    )


def _label_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agree-at", type=float, default=0.75, help="answer cosine that counts as agreement"
    )
    parser.add_argument(
        "--no-embedding", action="store_true", help="features only: no MiniLM (faster)"
    )


def _embedder(args: argparse.Namespace) -> Callable[[list[str]], np.ndarray] | None:
    if args.no_embedding:
        return None
    from streams.cache.embedding import MiniLMEmbedder

    return MiniLMEmbedder().embed


def _registry(settings: Settings) -> Any:
    from streams.routing.registry import load_registry

    return load_registry(settings.routing.models_file, settings.backend)


def _window(args: argparse.Namespace) -> Any:
    from streams.distill.export import Window
    from streams.distill.rows import parse_when

    now = datetime.now(UTC)
    since, until = parse_when(args.since, now), parse_when(args.until, now)
    late = now - parse_when(args.late, now)
    return Window.of(since, until, late.total_seconds())


def _export(settings: Settings, args: argparse.Namespace) -> list[Any]:
    from streams.distill.export import export_rows, summary_lines

    window = _window(args)
    rows, summary = asyncio.run(export_rows(settings, window, _registry(settings)))
    for line in summary_lines(summary, window):
        print(line, file=sys.stderr)
    return rows


def run_distill(settings: Settings, args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError

    from schemas.errors import BackendUnavailable
    from streams.distill.rows import RowsError
    from streams.distill.train import TrainError
    from streams.routing.learned import ArtifactError

    try:
        return _COMMANDS[args.distill_command](settings, args)
    except (
        RowsError,
        TrainError,
        ArtifactError,
        BackendUnavailable,
        ValueError,
        OSError,
    ) as exc:
        print(f"laneway distill {args.distill_command}: {exc}", file=sys.stderr)
        return 2
    except KafkaError as exc:
        print(
            f"laneway distill {args.distill_command}: Kafka at {settings.kafka.bootstrap}: "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 2


def _run_export(settings: Settings, args: argparse.Namespace) -> int:
    from streams.distill.rows import write_rows

    rows = _export(settings, args)
    n = write_rows(rows, Path(args.out), args.format)
    print(f"{n} rows written to {args.out}")
    return 0


def _run_train(settings: Settings, args: argparse.Namespace) -> int:
    from streams.distill.rows import read_rows
    from streams.distill.train import train_router, write_finetune

    rows = list(read_rows(Path(args.rows)))
    span = [r.ts_ms for r in rows]
    window = {
        "rows": args.rows,
        "since": _iso(min(span)) if span else None,
        "until": _iso(max(span)) if span else None,
    }
    trained = train_router(
        rows,
        embed=_embedder(args),
        heavy_share=args.heavy_share,
        holdout=args.holdout,
        agree_at=args.agree_at,
        c=args.C,
        window=window,
    )
    artifact = trained.router.artifact
    trained.router.save(Path(args.out))
    print(f"learned router {artifact.version} written to {args.out}")
    print(f"labels: {artifact.labels} of {artifact.rows} training rows")
    print(
        f"thresholds (heavy share {artifact.heavy_share}): "
        + ", ".join(f"{name} {head.threshold:.4f}" for name, head in artifact.heads.items())
    )
    print(f"metrics: {json.dumps(artifact.metrics)}")
    if args.finetune_out:
        n = write_finetune(rows, Path(args.finetune_out))
        print(f"{n} fine-tuning conversations written to {args.finetune_out}")
    return 0


def _run_report(settings: Settings, args: argparse.Namespace) -> int:
    from streams.distill.report import build_report, write_report
    from streams.distill.rows import read_rows
    from streams.distill.train import held_out
    from streams.routing.learned import LearnedRouter

    router = LearnedRouter.from_file(Path(args.artifact))
    if args.rows:
        rows = list(read_rows(Path(args.rows)))
    elif args.since:
        rows = _export(settings, args)
    else:
        raise ValueError("give an export file, or --since (and --until) to export a window")
    if args.held_out:
        share = router.artifact.holdout
        if share <= 0:
            raise ValueError(f"{args.artifact} was trained with no --holdout: nothing held out")
        rows = [row for row in rows if held_out(row.id, share)]
    report = build_report(
        router,
        rows,
        embed=_embedder(args),
        routing=settings.routing,
        registry=_registry(settings),
        agree_at=args.agree_at,
        min_labels=args.min_labels,
    )
    out = Path(args.out or f"report-{router.version}")
    for path in write_report(report, out):
        print(path)
    print(f"{'PROMOTE' if report.promote else 'DO NOT PROMOTE'} {router.version}: {report.reason}")
    return 0


def _run_student(settings: Settings, args: argparse.Namespace) -> int:
    from streams.bench.results import git_commit
    from streams.cache.embedding import MiniLMEmbedder
    from streams.distill.student.data import load_pairs
    from streams.distill.student.lora import LoraConfig
    from streams.distill.student.pipeline import run_student
    from workers.models import resolve_gguf

    conf = settings.student
    pick = lambda flag, default: default if flag is None else flag  # noqa: E731
    rank = pick(args.rank, conf.rank)
    config = LoraConfig(
        r=rank,
        alpha=2.0 * rank,
        steps=pick(args.steps, conf.steps),
        lr=pick(args.lr, conf.lr),
        batch_size=conf.batch_size,
        seed=args.seed,
    )
    data = load_pairs(Path(args.source))
    base = args.base or settings.backend.light_model
    teacher = args.teacher or data.teacher or settings.backend.heavy_model
    print(
        f"{len(data.pairs)} distinct prompts with a teacher answer in {args.source} "
        f"({data.dropped_bad} rated bad, {data.dropped_failed} failed: left out)"
    )
    run = run_student(
        data,
        base_model=base,
        gguf=resolve_gguf(base, settings.backend.model_dir),
        teacher=teacher,
        out=Path(args.out),
        config=config,
        held_out_share=pick(args.held_out, conf.held_out),
        min_rows=pick(args.min_rows, conf.min_rows),
        embed=MiniLMEmbedder().embed,
        agree_at=pick(args.agree_at, conf.agree_at),
        max_new_tokens=pick(args.max_new_tokens, conf.max_new_tokens),
        n_threads=settings.backend.n_threads,
        system=settings.backend.system_prompt,
        commit=git_commit(),
        on_step=lambda step, loss: print(f"step {step:4d}  loss {loss:.4f}", flush=True),
    )
    p = run.provenance
    m = p.metrics
    print(f"\nheld out: {p.rows.held_out} prompts; teacher {p.teacher}")
    print(f"{'model':<10} {'agreement':>10} {'tokens/s':>10}")
    for name, agree, speed in (
        ("base", m.base_agreement, m.base_tokens_per_s),
        ("student", m.student_agreement, m.student_tokens_per_s),
    ):
        print(f"{name:<10} {_fmt(agree, 3):>10} {_fmt(speed, 1):>10}")
    print(f"\nloss {_fmt(m.loss_first, 4)} -> {_fmt(m.loss_last, 4)}")
    print(f"{'OFFERED' if p.offered else 'NOT OFFERED'}: {p.reason}")
    print(f"written to {run.out}: adapter.gguf, peft/, student.json")
    return 0


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


_COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "export": _run_export,
    "train": _run_train,
    "report": _run_report,
    "student": _run_student,
}
