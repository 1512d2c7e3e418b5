"""`gpufleet dev bench live` on a tiny bulk-seeded database: the seeding lands what the synthetic
generator made, both leaders decide on it, a probe submit gets its first decision from the real
scheduler process. Only completeness and consistency are checked; timings are never asserted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, func, select

from adapters.sql.tables import RunAssignmentRow, WorkloadRow
from controlplane.cli.main import main

TINY = ["dev", "bench", "live", "--pending", "300", "--clusters", "2", "--nodes", "40", "--queues", "8", "--json"]


def _run(*extra: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, [*TINY, *extra])
    assert result.exit_code == 0, result.output
    figures: dict[str, Any] = json.loads(result.output.strip().splitlines()[-1])
    return figures


def _check_leader(figures: dict[str, Any], queued: int) -> None:
    assert figures["admitted"] + figures["left_pending"] == queued  # every queued gang decided on
    assert figures["reasons_written"] <= figures["left_pending"]
    # The production loop's path: a full read, the park phase (its reasons stored), the ordered pass.
    phases = [figures[f"{phase}_seconds"] for phase in ("snapshot", "park", "schedule", "apply")]
    assert all(seconds >= 0 for seconds in phases)
    assert sum(phases) <= figures["cycle_seconds"] + 0.01  # the phases are parts of the cycle
    # The backlog's reasons are in once the park phase has stored them; the rest once the phases
    # are done (the cycle's commit), before the cycle settles its state.
    backlog = figures["lease_seconds"] + sum(phases[:2])
    assert figures["backlog_decided_seconds"] == pytest.approx(backlog, abs=0.0011)
    landed = figures["lease_seconds"] + sum(phases)
    assert figures["first_decision_seconds"] == pytest.approx(landed, abs=0.0011)
    assert figures["backlog_decided_seconds"] <= figures["first_decision_seconds"]
    assert figures["first_decision_seconds"] <= figures["lease_seconds"] + figures["cycle_seconds"] + 0.01


def test_bench_live_on_sqlite_reports_both_leaders_and_the_probe() -> None:
    figures = _run("--submits", "2")
    assert (figures["database"], figures["queued"], figures["nodes"], figures["queues"]) == ("sqlite", 300, 40, 8)
    assert figures["live_runs"] > 0  # the synthetic live runs were mapped onto the seeded nodes
    fresh, restarted = figures["fresh_backlog_leader"], figures["restarted_leader"]
    _check_leader(fresh, 300)
    _check_leader(restarted, fresh["left_pending"] + fresh["evicted"])  # evicted runs queue again
    assert fresh["admitted"] > 0  # half the fleet is free: the first leader admits
    assert fresh["reasons_written"] == fresh["left_pending"]  # every waiting gang had the submit's reason
    probe = figures["new_submit"]
    assert (probe["submits"], probe["timed_out"]) == (2, 0)
    assert 0 < probe["first_decision_ms_min"] <= probe["first_decision_ms_median"] <= probe["first_decision_ms_max"]
    assert figures["peak_rss_mb"] > 0


def test_bench_live_seeds_postgresql_in_bulk(empty_postgresql: str) -> None:
    figures = _run("--submits", "0", "--database-url", empty_postgresql)
    assert (figures["database"], figures["queued"]) == ("postgresql", 300)
    assert figures["new_submit"] == {}
    engine = create_engine(empty_postgresql)
    try:
        with engine.connect() as conn:
            workloads = conn.scalar(select(func.count()).select_from(WorkloadRow)) or 0
            assignments = conn.scalar(select(func.count()).select_from(RunAssignmentRow)) or 0
    finally:
        engine.dispose()
    assert workloads == 300 + figures["live_runs"]  # every pending gang and one workload per live run
    assert assignments >= figures["live_runs"] + figures["fresh_backlog_leader"]["admitted"]
