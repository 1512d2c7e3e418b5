"""`gpufleet report utilization` against the fake API of the client-command tests."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner, Result

from controlplane.cli.report_commands import register
from controlplane.cli.report_tables import cell, justify
from tests.cli.test_client_commands import FakeApi, FakeServer, Handler


@pytest.fixture
def api() -> Iterator[FakeApi]:
    server = FakeServer(("127.0.0.1", 0), Handler)
    server.api = FakeApi(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield server.api
    server.shutdown()
    server.server_close()
    thread.join(timeout=1)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("GPUFLEET_API", "GPUFLEET_TOKEN", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "200")


def run(api: FakeApi, *args: str) -> Result:
    group = click.Group("gpufleet")
    register(group)
    return CliRunner().invoke(group, ["report", "utilization", "--api", api.url, "--token", "tok-1", *args])


def figures(runs: int, allocated: float, measured: float, used: float, idle: float, reclaimed: float) -> dict[str, Any]:
    return {
        "runs": runs,
        "allocated_gpu_hours": allocated,
        "measured_gpu_hours": measured,
        "used_gpu_hours": used,
        "idle_gpu_hours": idle,
        "unmeasured_gpu_hours": allocated - measured,
        "reclaimed_gpu_hours": reclaimed,
        "efficiency": used / measured if measured else None,
    }


REPORT = {
    "start": "2026-05-01T00:00:00Z",
    "end": "2026-05-02T00:00:00Z",
    "group_by": "team",
    "idle_threshold": 0.05,
    "groups": [
        {"group": "nlp", **figures(1, 8.0, 8.0, 0.0, 8.0, 8.0)},
        {"group": "vision", **figures(1, 16.0, 8.0, 4.0, 0.0, 0.0)},
    ],
    "total": figures(2, 24.0, 16.0, 4.0, 8.0, 8.0),
    "top_idle_runs": [
        {
            "run_id": "run-b",
            "workload_id": "wl-b",
            "workload": "beta",
            "team": "nlp",
            "queue": "nlp-train",
            "cluster": "sim-h100",
            "state": "preempted",
            "gpu_eq": 8.0,
            "allocated_gpu_hours": 8.0,
            "used_gpu_hours": 0.0,
            "idle_gpu_hours": 8.0,
            "efficiency": 0.0,
        }
    ],
}


def test_csv_has_one_row_per_group_then_the_total(api: FakeApi) -> None:
    api.reply("GET", "/v1/reports/utilization", REPORT)

    result = run(api, "--from", "2026-05-01", "--to", "2026-05-02", "--by", "team", "--csv")

    assert result.exit_code == 0, result.output
    sent = api.only
    assert sent.query == {
        "from": ["2026-05-01T00:00:00"],
        "to": ["2026-05-02T00:00:00"],
        "group_by": ["team"],
        "top": ["10"],
    }
    assert sent.headers["authorization"] == "Bearer tok-1"
    rows = list(csv.reader(io.StringIO(result.output)))
    assert rows == [
        ["team", "runs", "allocated_gpu_hours", "measured_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
         "unmeasured_gpu_hours", "reclaimed_gpu_hours", "efficiency"],
        ["nlp", "1", "8.0", "8.0", "0.0", "8.0", "0.0", "8.0", "0.0"],
        ["vision", "1", "16.0", "8.0", "4.0", "0.0", "8.0", "0.0", "0.5"],
        ["total", "2", "24.0", "16.0", "4.0", "8.0", "8.0", "8.0", "0.25"],
    ]  # fmt: skip


def test_csv_leaves_an_unknown_efficiency_empty(api: FakeApi) -> None:
    api.reply("GET", "/v1/reports/utilization", {**REPORT, "groups": [], "total": figures(0, 0.0, 0.0, 0.0, 0.0, 0.0)})

    result = run(api, "--from", "2026-05-01", "--to", "2026-05-02", "--csv")

    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "total,0,0.0,0.0,0.0,0.0,0.0,0.0,"


def test_table_by_default_with_the_idlest_runs(api: FakeApi) -> None:
    api.reply("GET", "/v1/reports/utilization", {**REPORT, "group_by": "queue"})

    result = run(api, "--from", "2026-05-01", "--to", "2026-05-02", "--by", "queue", "--top", "3")

    assert result.exit_code == 0, result.output
    assert api.only.query["group_by"] == ["queue"]
    assert api.only.query["top"] == ["3"]
    assert "GPU-hours by queue" in result.output
    assert "24.00" in result.output
    assert "25.0%" in result.output
    assert "idlest runs" in result.output
    assert "run-b" in result.output


def test_an_unknown_grouping_is_refused_before_calling_the_api(api: FakeApi) -> None:
    result = run(api, "--from", "2026-05-01", "--to", "2026-05-02", "--by", "pool")

    assert result.exit_code == 2
    assert api.requests == []


def test_the_servers_422_is_shown(api: FakeApi) -> None:
    api.reply("GET", "/v1/reports/utilization", {"detail": "`to` must be after `from`"}, status=422)

    result = run(api, "--from", "2026-05-02", "--to", "2026-05-01")

    assert result.exit_code == 1
    assert "invalid request: `to` must be after `from`" in result.output


def test_last_asks_for_the_range_that_ends_now(api: FakeApi) -> None:
    api.reply("GET", "/v1/reports/utilization", REPORT)
    before = datetime.now(UTC).replace(microsecond=0)

    result = run(api, "--last", "7d", "--csv")

    assert result.exit_code == 0, result.output
    start = datetime.fromisoformat(api.only.query["from"][0])
    end = datetime.fromisoformat(api.only.query["to"][0])
    assert end - start == timedelta(days=7)
    assert before <= end <= datetime.now(UTC)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--last", "24h", "--from", "2026-05-01"], "not both"),
        (["--from", "2026-05-01"], "give --from and --to, or --last"),
        ([], "give --from and --to, or --last"),
        (["--last", "soon"], "is not a duration such as"),
        (["--last", "0h"], "is not a duration such as 1h, 24h, 7d or 30d"),
        (["--last", "inf"], "longer than"),
    ],
)
def test_a_range_that_is_not_one_is_refused_before_calling_the_api(api: FakeApi, args: list[str], says: str) -> None:
    result = run(api, *args)

    assert result.exit_code == 2
    assert says in result.output
    assert api.requests == []


def test_every_report_table_formats_figures_alike(api: FakeApi) -> None:
    """Counts with separators, hours and costs with two decimals, parts of a whole in per cent,
    figures right-aligned: the same in the utilization table and the generic report tables."""
    rows = [
        {
            "bucket_start": "2026-05-01T00:00:00Z",
            "bucket_end": "2026-05-01T01:00:00Z",
            "team": "nlp",
            "queue": "nlp-train",
            "allocated_gpu_hours": 1234.5,
            "share": 0.25,
            "entitlement": 0.5,
            "share_over_entitlement": 0.5,
        }
    ]
    api.reply("GET", "/v1/reports/fairness", {"start": "a", "end": "b", "rows": rows})
    group = click.Group("gpufleet")
    register(group)
    args = ["report", "fairness", "--last", "1h", "--api", api.url, "--token", "tok-1"]
    result = CliRunner().invoke(group, args)

    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "nlp-train" in line)
    assert "1,234.50" in line
    assert "25.0%" in line
    assert "50.0%" in line
    assert "0.50" in line
    assert cell("runs", 12345) == "12,345"
    assert cell("efficiency", None) == "-"
    assert justify("allocated_gpu_hours") == "right"
    assert justify("team") == "left"


def test_o_csv_and_o_json_are_the_older_csv_and_json_and_yaml_reads_back_the_same(api: FakeApi) -> None:
    api.reply("GET", "/v1/reports/utilization", REPORT)
    window = ["--from", "2026-05-01", "--to", "2026-05-02"]

    printed = {flags: run(api, *window, *flags) for flags in (("--csv",), ("-o", "csv"), ("--json",), ("-o", "json"))}
    as_yaml = run(api, *window, "-o", "yaml")

    for result in (*printed.values(), as_yaml):
        assert result.exit_code == 0, result.output
    assert printed[("--csv",)].stdout == printed[("-o", "csv")].stdout
    assert printed[("--json",)].stdout == printed[("-o", "json")].stdout
    assert yaml.safe_load(as_yaml.stdout) == json.loads(printed[("-o", "json")].stdout) == REPORT


def test_csv_with_another_output_is_a_usage_error(api: FakeApi) -> None:
    result = run(api, "--last", "1h", "--csv", "-o", "yaml")
    assert result.exit_code == 2
    assert "--csv means -o csv" in result.stderr
    assert api.requests == []
