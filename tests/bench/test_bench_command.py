"""`gpufleet dev bench schedule` on a tiny fleet: it runs, and reports every figure with sane values.

Only shape and sanity are checked here; the speed targets of issue 3 are measured, never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from controlplane.cli.main import main

TINY = ["dev", "bench", "schedule", "--pending", "200", "--clusters", "2", "--nodes", "40", "--queues", "4"]
KEYS = {
    "pending",
    "admitted",
    "cycle_seconds",
    "decisions_per_second",
    "admitted_per_second",
    "incremental_cycle_seconds",
    "incremental_pending",
    "incremental_admitted",
    "first_cycle_admitted",
    "drain_cycles",
    "drain_seconds",
    "peak_rss_mb",
    "clusters",
    "nodes",
    "queues",
    "seed",
}


def test_bench_schedule_prints_every_figure_as_json() -> None:
    result = CliRunner().invoke(main, [*TINY, "--seed", "3", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert set(figures) >= KEYS
    assert figures["pending"] == 200
    assert (figures["clusters"], figures["nodes"], figures["queues"], figures["seed"]) == (2, 40, 4, 3)
    assert 0 <= figures["admitted"] <= figures["pending"]
    assert figures["admitted"] + figures["left_pending"] == figures["pending"]
    assert figures["cycle_seconds"] > 0
    assert figures["incremental_cycle_seconds"] > 0
    assert figures["decisions_per_second"] > 0
    assert figures["admitted_per_second"] >= 0
    assert 0 < figures["first_cycle_admitted"] <= figures["admitted"]
    assert figures["drain_cycles"] >= 1
    assert figures["drain_seconds"] >= figures["cycle_seconds"]
    assert figures["incremental_pending"] == figures["pending"] - figures["admitted"] + 5
    assert 0 <= figures["incremental_admitted"] <= figures["incremental_pending"]
    assert figures["peak_rss_mb"] > 0


def test_steady_cycles_are_reported_when_asked() -> None:
    result = CliRunner().invoke(main, [*TINY, "--steady-cycles", "3", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["steady_cycles"] == 3
    assert 0 < figures["steady_last_cycle_seconds"] <= figures["steady_max_cycle_seconds"]
    assert figures["steady_last_candidates"] >= 0
    without = json.loads(CliRunner().invoke(main, [*TINY, "--json"]).output)
    assert "steady_cycles" not in without


def test_the_same_seed_admits_the_same_number() -> None:
    runs = [json.loads(CliRunner().invoke(main, [*TINY, "--json"]).output) for _ in range(2)]
    assert runs[0]["admitted"] == runs[1]["admitted"]
    assert runs[0]["incremental_admitted"] == runs[1]["incremental_admitted"]


def test_without_json_it_prints_a_table(tmp_path: Path) -> None:
    profile = tmp_path / "bench.prof"
    result = CliRunner().invoke(main, [*TINY, "--profile", str(profile)])
    assert result.exit_code == 0, result.output
    assert "cycle_seconds" in result.output
    assert "incremental_cycle_seconds" in result.output
    assert profile.stat().st_size > 0


def test_a_fleet_with_fewer_nodes_than_clusters_is_refused() -> None:
    result = CliRunner().invoke(main, ["dev", "bench", "schedule", "--clusters", "3", "--nodes", "2", "--json"])
    assert result.exit_code != 0
    assert "at least one node per cluster" in result.output
