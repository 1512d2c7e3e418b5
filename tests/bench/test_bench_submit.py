"""`gpufleet dev bench submit` on a tiny fleet, by REST and by NATS: it runs real server processes and
reports every figure. Only completeness is checked; the speed targets are measured, never asserted."""

from __future__ import annotations

import json

from click.testing import CliRunner

from controlplane.cli.main import main

TINY = ["dev", "bench", "submit", "--count", "30", "--clusters", "2", "--nodes", "8", "--json"]


def test_bench_submit_by_rest_reports_every_submit() -> None:
    result = CliRunner().invoke(main, [*TINY, "--via", "rest", "--clients", "4", "--api-processes", "2"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["outcomes"] == {"201": 30}  # every submit created its workload, none replayed
    assert figures["submits_per_second"] > 0
    assert figures["p50_ms"] <= figures["p99_ms"]
    assert (figures["database"], figures["nodes"], figures["api_processes"]) == ("sqlite", 8, 2)
    assert figures["server_cpu_ms_per_submit"] > 0  # the servers' CPU, read from /proc
    assert figures["client_cpu_ms_per_submit"] > 0
    assert figures["database_cpu_ms_per_submit"] is None  # SQLite runs inside the servers


def test_bench_submit_by_nats_counts_what_reached_sql() -> None:
    result = CliRunner().invoke(main, [*TINY, "--via", "nats"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["complete"] is True
    assert figures["landed"] == 30
    assert figures["submits_per_second_into_sql"] > 0
    assert figures["ingest_start_seconds"] > 0  # the warm-up submit, not timed with the rest
    assert figures["ingest_cpu_ms_per_submit"] >= 0  # read from /proc (Linux)
