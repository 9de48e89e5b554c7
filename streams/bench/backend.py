"""``laneway bench backend``: what batching buys a backend, with
no Kafka in the way.

Each CPU model is loaded once and given the same requests (different
prompts, greedy) at every batch size: in batches of 1, then of 2, and so on,
each batch waiting for the one before, then with two batches in flight as a
lane worker keeps them (the second joins the running decode as the first's
short answers finish), then with that many sequences kept in flight, each
replaced by the next prompt as soon as it finishes ("refill": continuous
batching at its best, no sequence waiting for its batch-mates). Tokens/s
and requests/s per batch size, and their ratio to batch 1, are measured
side by side in one run, so a noisy machine moves every row alike.
The measuring is ``workers.measure.direct_rates``, shared with the
pipeline-efficiency bench (the ceiling a model reaches when called
directly) and the batch-size tuner (``workers.tune``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Sequence

from schemas.settings import Settings
from streams.bench.drive import HARD_PROMPTS, RULE_PROMPTS, SIMPLE_PROMPTS
from streams.bench.results import BenchRun, Figure, Series
from workers.measure import Rate, direct_rates
from workers.models import KNOWN_MODELS

__all__ = [
    "HELP",
    "Rate",
    "add_arguments",
    "bench_prompts",
    "direct_rates",
    "format_rates",
    "run",
]

HELP = "call the backend directly, no Kafka: tokens/s per batch size of each CPU model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", choices=["llamacpp"], default="llamacpp", help="the backend to call"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--batch-sizes", default="1,2,4,8,16", help="comma-separated")
    parser.add_argument(
        "--modes",
        default="invariant",
        help="invariant and/or fast (LANEWAY_BACKEND_LLAMACPP_BATCH_INVARIANT)",
    )
    parser.add_argument(
        "--models", default="", help="which wheel-shipped models, comma-separated (default: all)"
    )


MODES = {"invariant": True, "fast": False}
"""``--modes``: the value of ``llamacpp_batch_invariant`` each one runs with."""


def bench_prompts(n: int) -> list[str]:
    """``n`` different prompts: the bench's own, then asked again in other words."""
    base = [*SIMPLE_PROMPTS, *HARD_PROMPTS, *RULE_PROMPTS]
    ways = ["{}", "{} Answer in one sentence.", "Briefly: {}", "{} Explain your answer."]
    return [ways[(i // len(base)) % len(ways)].format(base[i % len(base)]) for i in range(n)]


def format_rates(rates: Sequence[Rate]) -> str:
    header = (
        f"{'model':<21} {'batch':>5} {'in flight':>9} {'tokens/s':>9} {'requests/s':>11} "
        f"{'vs batch 1':>10} {'tokens/cpu-s':>12} {'vs batch 1':>10} {'tokens':>7} "
        f"{'seconds':>8} {'errors':>6}"
    )
    lines = [header, "-" * len(header)]
    first: dict[str, Rate] = {}
    for rate in rates:
        base = first.setdefault(rate.model, rate)
        wall = rate.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0
        cpu = rate.tokens_per_cpu_s / base.tokens_per_cpu_s if base.tokens_per_cpu_s else 0.0
        depth = "refill" if rate.refilled else str(rate.inflight)
        lines.append(
            f"{rate.model:<21} {rate.batch_size:>5} {depth:>9} {rate.tokens_per_s:>9.1f} "
            f"{rate.requests_per_s:>11.2f} {wall:>9.2f}x {rate.tokens_per_cpu_s:>12.1f} "
            f"{cpu:>9.2f}x {rate.completion_tokens:>7} {rate.seconds:>8.1f} {rate.errors:>6}"
        )
    return "\n".join(lines)


def run(settings: Settings, args: argparse.Namespace) -> BenchRun:
    try:
        sizes = [int(s) for s in str(args.batch_sizes).split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        print(f"laneway bench: --batch-sizes {args.batch_sizes!r} is not a list like 1,2,4,8")
        return BenchRun(2)
    modes = [m.strip() for m in str(args.modes).split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        print(f"laneway bench: --modes {args.modes!r} is not a list of {', '.join(MODES)}")
        return BenchRun(2)
    models = [m.strip() for m in str(args.models).split(",") if m.strip()] or list(KNOWN_MODELS)
    if set(models) - set(KNOWN_MODELS):
        print(f"laneway bench: --models {args.models!r} is not a list of {', '.join(KNOWN_MODELS)}")
        return BenchRun(2)
    prompts = bench_prompts(2 * max(sizes))  # two in flight of the largest batch

    async def measure() -> list[Rate]:
        rates: list[Rate] = []
        for model in models:
            for mode in modes:
                backend = settings.backend.model_copy(
                    update={"llamacpp_batch_invariant": MODES[mode]}
                )
                measured = await direct_rates(
                    backend, model, sizes, prompts, args.max_tokens, args.backend, (1, 2), True
                )
                label = model if len(modes) == 1 else f"{model} {mode}"
                rates += [dataclasses.replace(rate, model=label) for rate in measured]
        return rates

    rates = asyncio.run(measure())
    if "fast" in modes:
        from workers.backends.llama_batch import extra_buffers_work

        repacked = "yes" if extra_buffers_work() else "no: they crash on this CPU's AMX"
        print(f"\nfast mode: one unified KV cache; repacked kernels: {repacked}")
    print(
        f"\nlaneway bench backend --backend {args.backend}: {len(prompts)} different prompts at "
        f"every batch size, greedy, max_tokens {args.max_tokens}, "
        f"n_threads {settings.backend.n_threads}; one batch at a time, two in flight "
        "as a lane worker keeps them, and 'refill': that many sequences kept in flight, each "
        "replaced by the next prompt as it finishes; ratios against batch 1, one at a time "
        "(tokens per CPU second: the same work measured by the process's CPU time, which "
        "the machine's other processes sway less than the wall clock)"
    )
    print(format_rates(rates))
    return BenchRun(1 if any(r.errors for r in rates) else 0, *rate_figures(rates))


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


def rate_figures(rates: Sequence[Rate]) -> tuple[dict[str, Figure], dict[str, Series]]:
    """Each model's tokens/s per batch size (one batch at a time, two in
    flight, refill) as figures, and per model the one-at-a-time curve."""
    figures: dict[str, Figure] = {}
    series: dict[str, Series] = {}
    for rate in rates:
        depth = "refill" if rate.refilled else f"inflight{rate.inflight}"
        name = f"{_slug(rate.model)}_batch{rate.batch_size}_{depth}_tokens_per_s"
        figures[name] = Figure(
            rate.tokens_per_s,
            "tokens/s",
            f"{rate.model}, batch {rate.batch_size}, {depth.replace('inflight', 'in flight ')}",
        )
    for model in dict.fromkeys(rate.model for rate in rates):
        points = [
            (float(r.batch_size), r.tokens_per_s)
            for r in rates
            if r.model == model and r.inflight == 1 and not r.refilled
        ]
        name = "tokens_per_s_vs_batch" if not series else f"tokens_per_s_vs_batch_{_slug(model)}"
        series[name] = Series("batch size", "requests", f"tokens/s, {model}", "tokens/s", points)
    return figures, series
