"""`gpufleet dev bench metrics` builds its synthetic installation and reads the fleet gauges off it."""

from __future__ import annotations

import json

from click.testing import CliRunner

from adapters.sql.engine import make_engine
from adapters.sql.gauges_repo import SqlFleetGauges
from adapters.sql.migrate import upgrade_to_head
from controlplane.bootstrap import utc_now
from controlplane.cli.bench_metrics import populate
from controlplane.cli.main import main


def test_bench_metrics_prints_its_figures() -> None:
    args = [
        "dev",
        "bench",
        "metrics",
        "--nodes",
        "40",
        "--queues",
        "5",
        "--queued",
        "50",
        "--live",
        "10",
        "--reads",
        "2",
    ]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["live_runs"] == 10
    assert figures["read_p50_ms"] > 0
    assert figures["series"] > 0


def test_the_synthetic_installation_reads_back_as_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    upgrade_to_head(url)
    engine = make_engine(url)
    try:
        populate(engine, clusters=2, nodes=20, queues=5, queued=50, live=10, seed=1)
        gauges = SqlFleetGauges(engine).read(utc_now())
    finally:
        engine.dispose()
    assert sum(gauges.pending.values()) == 50
    assert sum(c.capacity for c in gauges.gpus) == 20 * 8
    assert sum(c.allocated for c in gauges.gpus) == 10 * 2 * 8  # each live run: 2 pods of 8 GPUs
    assert sum(q.used.get("gpu-eq", 0) for q in gauges.quotas) == 160
    assert {q.limit["gpu-eq"] for q in gauges.quotas} == {512}
    assert sum(gauges.measured_gpus.values()) == 160
    assert all(0 <= v <= 1 for v in gauges.sm_active.values())
    assert sum(gauges.idle_findings.values()) == 4  # every third run has a finding
    assert gauges.outbox_backlog == 1000
    assert 999 <= gauges.outbox_oldest_seconds < 1100
    assert {lease.lease for lease in gauges.leases} == {"scheduler", "dispatcher", "relay"}
