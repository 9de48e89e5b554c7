"""The bench result file: CPU, commit, name, and validation against
benchmarks/result.schema.json."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from streams.bench.results import (
    SCHEMA_FILE,
    BenchRun,
    Figure,
    InvalidResult,
    Series,
    build_result,
    cpu_info,
    cpu_slug,
    git_commit,
    load_average,
    result_name,
    validate_result,
    write_result,
)

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 1

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
"""

RUN = BenchRun(
    0,
    {"rules_p99_ms": Figure(18.2, "ms", "rules answer p99 through Kafka")},
    {
        "latency_vs_load": Series(
            "offered load", "req/s", "p99 latency", "ms", [(50, 12.0), (100, float("nan"))]
        )
    },
    notes="two shared cores",
)


def test_the_cpu_is_read_from_cpuinfo_and_a_generic_name_gets_family_and_model(
    tmp_path: Path,
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(XEON)
    cpu = cpu_info(cpuinfo)
    assert (cpu["model"], cpu["family"], cpu["model_number"]) == (
        "Intel(R) Xeon(R) Processor",
        6,
        167,
    )
    assert cpu["cores"] >= 1
    assert cpu_slug(cpu) == "intel-r-xeon-r-processor-f6m167"
    epyc = {"model": "AMD EPYC 7763 64-Core Processor", "family": 25, "model_number": 1}
    assert cpu_slug(epyc) == "amd-epyc-7763-64-core-processor"
    assert cpu_info(tmp_path / "none")["model"] == "unknown"


def test_the_commit_is_unknown_outside_a_checkout(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == "unknown"
    here = git_commit()
    assert here == "unknown" or len(here.removesuffix("-dirty")) >= 7


def test_a_result_is_named_by_mode_date_cpu_and_commit_and_validates(tmp_path: Path) -> None:
    result = build_result(
        "pipeline",
        "laneway bench pipeline -n 8",
        RUN,
        now=datetime(2026, 12, 7, 19, 30, 5, 123, tzinfo=UTC),
        commit="3c672e1abc-dirty",
        cpu={"model": "Intel(R) Xeon(R) Processor", "family": 6, "model_number": 167, "cores": 2},
        load={"before": [0.5, 0.4, 0.3], "after": [1.9, 0.8, 0.4]},
    )
    assert result["date"] == "2026-12-07T19:30:05Z"
    assert result["load"] == {"before": [0.5, 0.4, 0.3], "after": [1.9, 0.8, 0.4]}
    assert result["series"]["latency_vs_load"]["points"] == [[50, 12.0], [100, None]]
    assert result_name(result) == Path(
        "pipeline/2026-12-07-intel-r-xeon-r-processor-f6m167-3c672e1.json"
    )
    path = write_result(tmp_path / result_name(result), result)
    assert json.loads(path.read_text()) == result
    assert SCHEMA_FILE.exists(), "the schema the docs read is in the checkout"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"schema": "laneway.bench.result/0"}, "schema"),
        ({"figures": {"Bad Name": {"value": 1, "unit": "", "label": ""}}}, "snake_case"),
        ({"figures": {"ok": {"value": "fast", "unit": "", "label": ""}}}, "figures"),
        ({"cpu": {"model": "x"}}, "cpu"),
        ({"load": {"before": [1.0], "after": [1.0, 1.0, 1.0]}}, "load"),
    ],
)
def test_a_result_that_breaks_the_schema_is_not_written(
    tmp_path: Path, change: dict[str, object], why: str
) -> None:
    result = {**build_result("mix", "laneway bench mix", RUN, commit="unknown"), **change}
    with pytest.raises(InvalidResult, match=why):
        validate_result(result)
    with pytest.raises(InvalidResult):
        write_result(tmp_path / "r.json", result)
    assert not (tmp_path / "r.json").exists()


def test_a_run_records_how_busy_the_machine_was_where_it_can() -> None:
    load = load_average()
    assert load is None or (len(load) == 3 and all(x >= 0 for x in load))
    unknown = build_result("mix", "laneway bench mix", RUN, load={"before": None, "after": load})
    assert "load" not in unknown, "a half-known load is left out, not written half"


def test_the_recorded_command_measures_the_same_without_saying_where_it_went() -> None:
    from streams.cli.bench import command_line

    argv = ["bench", "mix", "--embedded", "-n", "120", "--save"]
    assert command_line(argv) == "laneway bench mix --embedded -n 120"
    argv = ["bench", "gateway", "--result", "out dir/r.json", "--seconds", "8"]
    assert command_line(argv) == "laneway bench gateway --seconds 8"
    assert command_line(["bench", "router", "--result=r.json"]) == "laneway bench router"
    argv = ["bench", "chaos", "--log-file", "/tmp/chaos.log", "--rate", "4"]
    assert command_line(argv) == "laneway bench chaos --rate 4"
