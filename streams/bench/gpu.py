"""GPU batching benchmark of one backend, without Kafka: the same number of
different prompts run as batches of each size, and what each size gives in
requests and generated tokens per second.

    laneway bench gpu --batch-sizes 1,8,32 --save
    python -m streams.bench.gpu --batch-sizes 1,8,32 --out bench.json

The backend and model come from the ``LANEWAY_BACKEND_*`` settings (vllm by
default, with ``LANEWAY_BACKEND_VLLM_MODEL_DIR``); ``compose/gpu-check.sh``
runs it. Prompts are greedy and all different, so no cache or coalescing
hides work, and ``--max-tokens`` bounds each answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from schemas.errors import LanewayError
from schemas.messages import ChatMessage
from schemas.settings import BackendSettings, Settings
from streams.bench.results import BenchRun, Figure, Series
from workers.backends.base import Backend, Generation, GenerationInput, Outcome, create_backend

__all__ = [
    "HELP",
    "Row",
    "add_arguments",
    "format_table",
    "main",
    "measure",
    "prompts",
    "run",
    "summarize",
]

HELP = "one backend called directly on a GPU: tokens/s per batch size (vllm by default)"

TOPICS = (
    "the sea",
    "a mountain",
    "the moon",
    "a library",
    "a river",
    "the desert",
    "a city at night",
    "a forest",
)


def prompts(n: int, offset: int = 0) -> list[str]:
    """``n`` different prompts; ``offset`` starts the numbering elsewhere."""
    return [
        f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (number {i})."
        for i in range(offset, offset + n)
    ]


@dataclass(frozen=True, slots=True)
class Row:
    batch_size: int
    batches: int
    requests: int
    errors: int
    seconds: float
    """Wall time of all the batches of this size, run one after another."""
    batch_p50_ms: float
    requests_per_s: float
    tokens_per_s: float
    """Generated (completion) tokens per second."""
    mean_completion_tokens: float


def summarize(batch_size: int, durations_s: Sequence[float], outcomes: Sequence[Outcome]) -> Row:
    """One row from the wall time of each batch and every request's outcome."""
    done = [o for o in outcomes if isinstance(o, Generation)]
    seconds = sum(durations_s)
    tokens = sum(o.completion_tokens for o in done)
    return Row(
        batch_size=batch_size,
        batches=len(durations_s),
        requests=len(outcomes),
        errors=len(outcomes) - len(done),
        seconds=round(seconds, 3),
        batch_p50_ms=round(statistics.median(durations_s) * 1000, 1) if durations_s else 0.0,
        requests_per_s=round(len(done) / seconds, 2) if seconds > 0 else 0.0,
        tokens_per_s=round(tokens / seconds, 1) if seconds > 0 else 0.0,
        mean_completion_tokens=round(tokens / len(done), 1) if done else 0.0,
    )


def format_table(rows: Sequence[Row], title: str) -> str:
    header = (
        f"{'batch':>5} {'batches':>7} {'req':>5} {'err':>4} {'s':>8} "
        f"{'p50 ms':>9} {'req/s':>8} {'tok/s':>9} {'tok/req':>7}"
    )
    lines = [title, header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.batch_size:>5} {r.batches:>7} {r.requests:>5} {r.errors:>4} {r.seconds:>8.2f} "
            f"{r.batch_p50_ms:>9.1f} {r.requests_per_s:>8.2f} {r.tokens_per_s:>9.1f} "
            f"{r.mean_completion_tokens:>7.1f}"
        )
    if rows and rows[0].tokens_per_s > 0:
        best = max(rows, key=lambda r: r.tokens_per_s)
        lines.append(
            f"\nbatch {best.batch_size} generates {best.tokens_per_s / rows[0].tokens_per_s:.1f}x "
            f"the tokens per second of batch {rows[0].batch_size}"
        )
    return "\n".join(lines)


def _inputs(texts: Sequence[str], max_tokens: int) -> list[GenerationInput]:
    return [GenerationInput([ChatMessage(role="user", content=t)], max_tokens, 0.0) for t in texts]


async def bench(
    backend: Backend, batch_sizes: Sequence[int], requests: int, max_tokens: int
) -> list[Row]:
    """For each size, ``requests`` prompts (at least one batch) in batches of
    that size, one batch after another; a warm-up batch first."""
    await backend.infer_batch(_inputs(prompts(max(batch_sizes), offset=10_000), max_tokens))
    rows = []
    for size in batch_sizes:
        batches = max(1, requests // size)
        durations: list[float] = []
        outcomes: list[Outcome] = []
        for b in range(batches):
            texts = prompts(size, offset=(size * 1000) + b * size)
            started = time.perf_counter()
            outcomes += await backend.infer_batch(_inputs(texts, max_tokens))
            durations.append(time.perf_counter() - started)
        rows.append(summarize(size, durations, outcomes))
        errors = {o.code for o in outcomes if isinstance(o, LanewayError)}
        if errors:
            print(f"batch {size}: errors {sorted(errors)}", file=sys.stderr)
    return rows


async def measure(args: argparse.Namespace, settings: BackendSettings) -> BenchRun:
    backend = create_backend(args.backend, args.model, settings)
    started = time.perf_counter()
    await backend.load()
    load_s = time.perf_counter() - started
    try:
        rows = await bench(backend, args.batch_sizes, args.requests, args.max_tokens)
    finally:
        await backend.close()
    title = (
        f"laneway bench gpu: backend {args.backend}:{args.model}, "
        f"{args.requests} requests per size, max_tokens {args.max_tokens}, greedy; "
        f"model loaded in {load_s:.1f} s"
    )
    table = format_table(rows, title)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "title": title,
            "load_s": round(load_s, 2),
            "rows": [asdict(r) for r in rows],
            "table": table,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"figures: {args.out}")
    figures = {"load_s": Figure(load_s, "s", "model load time")}
    for r in rows:
        figures[f"tokens_per_s_batch_{r.batch_size}"] = Figure(
            r.tokens_per_s, "tokens/s", f"generated tokens/s in batches of {r.batch_size}"
        )
        figures[f"requests_per_s_batch_{r.batch_size}"] = Figure(
            r.requests_per_s, "req/s", f"requests/s in batches of {r.batch_size}"
        )
    series = {
        "tokens_per_s_vs_batch": Series(
            "batch size",
            "requests",
            f"tokens/s ({args.backend})",
            "tokens/s",
            [(r.batch_size, r.tokens_per_s) for r in rows],
        )
    }
    return BenchRun(1 if any(r.errors for r in rows) else 0, figures, series)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="vllm", help="backend kind (default vllm)")
    parser.add_argument("--model", default="bench", help="model name (the served name for vllm)")
    parser.add_argument("--batch-sizes", type=_sizes, default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=64, help="requests per batch size")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, help="also write the table's figures here as JSON")


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    return asyncio.run(measure(args, settings.backend))


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers: {text!r}")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams.bench.gpu", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return asyncio.run(measure(args, BackendSettings())).exit_code


if __name__ == "__main__":
    raise SystemExit(main())
