"""The command line's one convention, and `laneway status` against a stack
that is not there."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streams.cli.bench import MODES
from streams.cli.main import COMMANDS, build_parser, main
from streams.devstack.embedded import free_port


def test_every_command_is_one_module_of_one_shape() -> None:
    for name in COMMANDS:
        module = importlib.import_module(f"streams.cli.{name}")
        assert callable(module.subparser_init) and callable(module.cmd), name
    for mode in MODES:
        module = importlib.import_module(f"streams.bench.{mode.replace('-', '_')}")
        assert callable(module.add_arguments) and callable(module.run), mode
        assert module.HELP, mode


def test_the_parser_is_built_without_side_effects(tmp_path: Path) -> None:
    """The docs build the CLI reference from it: no settings built (a bad
    LANEWAY_* variable would fail them), no file written under HOME."""
    code = (
        "from streams.cli.main import build_parser; p = build_parser();"
        "print(len(p._subparsers._group_actions[0].choices))"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANEWAY_KAFKA_PARTITIONS": "nope"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert int(done.stdout) == len(COMMANDS)
    assert list(tmp_path.iterdir()) == [], "nothing written under HOME"


def test_every_bench_mode_is_a_subcommand_with_the_result_options() -> None:
    parser = build_parser()
    for mode in MODES:
        args = parser.parse_args(["bench", mode, *(["2"] if mode in ("burst", "batch") else [])])
        assert args.mode == mode and args.result is None and args.save is False
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "mix", "--result", "x.json", "--save"])


def test_status_says_what_is_down_and_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LANEWAY_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("LANEWAY_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    assert main(["status", "--json"]) == 1
    assert time.monotonic() - started < 15, "every probe is bounded"
    status = json.loads(capsys.readouterr().out)
    assert status["ok"] is False and status["stack_found"] is False
    assert {p["name"]: p["up"] for p in status["parts"]} == {
        "kafka": False,
        "redis": False,
        "workers": False,
        "tracker": False,
    }
