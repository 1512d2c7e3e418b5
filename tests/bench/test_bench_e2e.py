"""`gpufleet dev bench e2e` on a tiny burst, by REST and by NATS: real scheduler, dispatcher, ingest,
relay (and API) processes on PostgreSQL carry every gang to `succeeded`, and every figure is
reported. Only completeness is checked; the speed targets are measured, never asserted."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from controlplane.cli.bench_e2e import BurstShape, plan
from controlplane.cli.main import main

TINY = ["dev", "bench", "e2e", "--gangs", "6", "--clusters", "1", "--nodes-per-cluster", "2", "--queues", "2"]
TINY += ["--cohorts", "1", "--rate", "20", "--min-seconds", "0.5", "--max-seconds", "1", "--timeout", "240", "--json"]


@pytest.mark.parametrize("via", ["rest", "nats"])
def test_bench_e2e_carries_every_gang_to_succeeded_and_reports_every_figure(empty_postgresql: str, via: str) -> None:
    result = CliRunner().invoke(main, [*TINY, "--via", via, "--database-url", empty_postgresql])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["complete"] is True
    assert figures["states"] == {"succeeded": 6}
    assert figures["submit_outcomes"] == ({"201": 6} if via == "rest" else {"published": 6})
    assert figures["fleet_gpus"] == 16
    assert figures["floor_seconds"] > 0
    assert figures["wall_seconds"] >= figures["floor_seconds"]
    assert figures["runs"] >= 6
    assert figures["admission_to_dispatched_seconds"]["p95"] is not None
    assert figures["running_to_recorded_seconds"]["p95"] is not None  # the bench saw the pod reports
    assert set(figures["time_to_running_seconds"]) <= {"low", "batch", "high"}
    assert isinstance(figures["deadlocks"], int)
    assert figures["cpu_seconds_per_workload"] > 0


def test_the_burst_fits_the_fleet_and_the_queues_guarantees() -> None:
    shape = BurstShape(
        gangs=500, queues=4, cohorts=1, clusters=2, nodes_per_cluster=1, rate=10, min_seconds=1, max_seconds=2, seed=3
    )
    gangs = plan(shape)
    assert gangs == plan(shape)  # seeded: the same burst every run
    assert max(g.replicas * g.gpus for g in gangs) <= 8  # one node per cluster: no gang spans two
    # Non-preemptible work runs only within its queue's guarantee (here a team's 8 GPUs over its 2 queues).
    assert all(g.replicas * g.gpus <= shape.queue_share for g in gangs if g.priority_class == "high")
    assert {g.priority_class for g in gangs} == {"low", "batch", "high"}
    assert [g.at for g in gangs[:3]] == [0.0, 0.1, 0.2]
