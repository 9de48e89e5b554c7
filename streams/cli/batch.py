"""``laneway batch ...``: thin handlers over ``streams.jobs``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from schemas.jobs import BatchJob
from schemas.settings import Settings
from streams.cli.common import ops_endpoints, settings_of
from streams.cli.reach import NOT_ALIVE, missing_tracker
from streams.jobs.jsonl import parse_window
from streams.jobs.progress import cancel_job, format_status, get_job, list_jobs, watch
from streams.jobs.results import write_results
from streams.jobs.submit import InvalidBatchFile, submit_file

__all__ = ["cmd", "run_batch", "subparser_init"]


def subparser_init(subparsers: Any) -> argparse.ArgumentParser:
    batch: argparse.ArgumentParser = subparsers.add_parser(
        "batch", help="offline batch jobs: JSONL files on the bulk lane"
    )
    actions = batch.add_subparsers(dest="batch_command", required=True)
    submit = actions.add_parser("submit", help="validate a JSONL file and submit it as a job")
    submit.add_argument("file", type=Path)
    submit.add_argument("--tenant")
    submit.add_argument("--window", default=None, help="completion window, e.g. 24h (default)")
    submit.add_argument("--wait", action="store_true", help="show progress until the job ends")
    submit.add_argument("--skip-invalid", action="store_true", help="submit the valid lines")
    submit.add_argument("--json", action="store_true", help="print the job as JSON")
    status = actions.add_parser("status", help="a job's counts")
    status.add_argument("job_id")
    status.add_argument("--json", action="store_true")
    results = actions.add_parser("results", help="write a job's results, in input order")
    results.add_argument("job_id")
    results.add_argument("-o", "--output", type=Path, required=True)
    results.add_argument("--errors", type=Path, help="default: <output stem>.errors.jsonl")
    listing = actions.add_parser("list", help="the newest jobs")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--json", action="store_true")
    cancel = actions.add_parser("cancel", help="stop a job's unstarted work")
    cancel.add_argument("job_id")
    cancel.add_argument("--json", action="store_true")
    actions.add_parser("tracker", help="run the job tracker (laneway up runs one)")
    return batch


def cmd(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    if args.batch_command == "tracker":
        from streams.jobs.tracker import serve_tracker

        with ops_endpoints(settings) as state:
            asyncio.run(serve_tracker(settings, state))
        return 0
    return run_batch(settings, args)


def run_batch(settings: Settings, args: argparse.Namespace) -> int:
    handler = {
        "submit": _submit,
        "status": _status,
        "results": _results,
        "list": _list,
        "cancel": _cancel,
    }[args.batch_command]
    try:
        return handler(settings, args)
    except KeyError as exc:
        print(f"laneway batch: no job {exc.args[0]!r}", file=sys.stderr)
        return 2


def _submit(settings: Settings, args: argparse.Namespace) -> int:
    try:
        window_s = parse_window(args.window) if args.window else None
        data = args.file.read_bytes()
    except (ValueError, OSError) as exc:
        print(f"laneway batch submit: {exc}", file=sys.stderr)
        return 2

    # Before anything is written: a job on a Redis where no tracker counts
    # its results would be waited on for its whole window. Without --wait
    # it is submitted anyway (a tracker started later still counts it), but
    # the person submitting it is told.
    missing = asyncio.run(missing_tracker(settings))
    if missing is not None and args.wait:
        print(f"laneway batch submit --wait: {missing}", file=sys.stderr)
        return NOT_ALIVE
    if missing is not None:
        print(
            f"laneway batch submit: warning: {missing}; the job is submitted, and a tracker "
            "started later counts it",
            file=sys.stderr,
        )

    def progress(job: BatchJob) -> None:
        if args.wait and not args.json and sys.stderr.isatty():
            c = job.counts
            print(f"\rproduced {c.produced}/{c.total}", end="", file=sys.stderr, flush=True)

    try:
        job = asyncio.run(
            submit_file(
                settings,
                data,
                tenant=args.tenant,
                window_s=window_s,
                skip_invalid=args.skip_invalid,
                on_progress=progress,
            )
        )
    except InvalidBatchFile as bad:
        for error in bad.parsed.errors:
            print(f"{args.file}:{error.line}: {error.message}", file=sys.stderr)
        print(f"laneway batch submit: {bad} (--skip-invalid submits the rest)", file=sys.stderr)
        return 2
    parsed_errors = job.counts.invalid
    if parsed_errors and not args.json:
        print(f"skipped {parsed_errors} invalid line(s)", file=sys.stderr)
    if args.wait:
        if not args.json and sys.stderr.isatty():
            print(file=sys.stderr)
        job = asyncio.run(watch(settings, job.id, sys.stderr))
    print(job.model_dump_json() if args.json else job.id)
    return 0 if job.status in ("in_progress", "finalizing", "completed") else 1


def _status(settings: Settings, args: argparse.Namespace) -> int:
    job = asyncio.run(get_job(settings, args.job_id))
    if job is None:
        raise KeyError(args.job_id)
    print(job.model_dump_json() if args.json else format_status(job))
    return 0


def _results(settings: Settings, args: argparse.Namespace) -> int:
    summary = asyncio.run(write_results(settings, args.job_id, args.output, args.errors))
    errors = args.errors or args.output.with_name(args.output.stem + ".errors.jsonl")
    print(
        f"{args.output}: {summary.written} lines ({summary.ok} ok, {summary.errors} errors, "
        f"{summary.missing} without a result); {errors}: {summary.invalid} invalid input "
        f"lines + {summary.errors} failed requests; job {summary.job.status}"
    )
    return 0


def _list(settings: Settings, args: argparse.Namespace) -> int:
    jobs = asyncio.run(list_jobs(settings, args.limit))
    if args.json:
        print(json.dumps([json.loads(j.model_dump_json()) for j in jobs]))
        return 0
    head = ("job", "status", "tenant", "total", "done", "failed", "pending")
    print("{:28} {:12} {:10} {:>6} {:>6} {:>6} {:>7}".format(*head))
    for job in jobs:
        c = job.counts
        print(
            f"{job.id:28} {job.status:12} {job.tenant or '-':10} {c.total:6} {c.done:6} "
            f"{c.failed:6} {c.pending:7}"
        )
    return 0


def _cancel(settings: Settings, args: argparse.Namespace) -> int:
    async def cancel() -> tuple[bool, BatchJob]:
        producer = AIOKafkaProducer(acks="all", **settings.kafka.client_options())
        await producer.start()
        try:
            return await cancel_job(settings, args.job_id, producer)
        finally:
            await producer.stop()

    cancelled, job = asyncio.run(cancel())
    if args.json:
        print(job.model_dump_json())
        return 0 if cancelled else 1
    c = job.counts
    if not cancelled:
        print(f"job {args.job_id} is {job.status}: nothing to cancel")
        return 1
    print(
        f"cancelled {args.job_id}: {c.done + c.failed} ran ({c.done} ok, {c.failed} failed), "
        f"{c.produced - c.done - c.failed} produced and still running, "
        f"{c.total - c.produced} never produced"
    )
    return 0
