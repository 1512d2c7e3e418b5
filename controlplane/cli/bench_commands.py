"""`gpufleet dev bench schedule`: time the pure scheduling core on a synthetic fleet.

The clock and the resource meter live here, not in `controlplane.core` or `controlplane.bench`,
which stay pure. Figures are measured, never asserted: the command reports what it saw.
"""

from __future__ import annotations

import cProfile
import gc
import json
import pstats
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from controlplane.bench.synthetic import BenchSize, SyntheticFleet
from controlplane.cli import (
    bench_dashboard,
    bench_e2e,
    bench_ingest,
    bench_live,
    bench_metrics,
    bench_reads,
    bench_submit,
)
from controlplane.core.incremental import IncrementalScheduler, same_decision
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Decision, Policy, Snapshot
from controlplane.service.scheduling import collector_paused, settle_long_lived_objects

# A fixed `now`: the decision must not depend on when the bench runs.
BENCH_NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024, 1)


def _timed(
    scheduler: IncrementalScheduler | None, snapshot: Snapshot, policy: Policy, profiler: cProfile.Profile | None
) -> tuple[Decision, float]:
    """One cycle: on the kept state of `scheduler`, or one-shot `schedule()` when it is None.

    Timed as the live loop runs it (`run_cycle`): the cyclic garbage collector paused for the
    cycle, and what a rebuilt state made settled before it resumes. The young collection that the
    cycle's allocations then set off (paid by the live loop at its next allocation) is counted too."""
    if profiler is not None:
        profiler.enable()
    start = time.perf_counter()
    with collector_paused(lambda: scheduler is not None and scheduler.last_sync.rebuilt):
        if scheduler is None:
            decision = schedule(snapshot, policy, BENCH_NOW)
        else:
            decision = scheduler.decide(snapshot, policy, BENCH_NOW)
    gc.collect(1)
    elapsed = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
    return decision, elapsed


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


# The drain stops at the first cycle that admits less than this part of what the first cycle
# admitted (the fleet is full: what is left is the trickle into capacity evictions free), or after
# this many cycles.
DRAIN_DONE_SHARE = 0.05
MAX_DRAIN_CYCLES = 25


def run_bench(
    size: BenchSize, profile: Path | None = None, check: bool = False, steady_cycles: int = 0
) -> dict[str, Any]:
    """Build the fleet and time, on the state the scheduler keeps (`IncrementalScheduler`): the
    first cycle; the drain (cycles, each on the last one's outcome, until one admits nothing: the
    backlog admitted per second until the fleet is full); then two cycles after a handful of
    changes each. With `check`, one-shot `schedule()` is also timed on the first of those and its
    decision compared. With `steady_cycles`, that many more cycles with nothing changed but what
    the scheduler itself decides: a full fleet's steady state, where the queue heads find no room
    and ask for evictions and reservations every cycle."""
    build_start = time.perf_counter()
    fleet = SyntheticFleet(size, BENCH_NOW)
    snapshot = fleet.snapshot()
    build_seconds = time.perf_counter() - build_start
    policy = Policy()
    profiler = cProfile.Profile() if profile is not None else None
    scheduler = IncrementalScheduler()
    # As the live scheduler does after a full read (`settle_long_lived_objects`): the fleet and
    # backlog just built are long-lived, and full garbage collections would walk them every time.
    settle_long_lived_objects()
    first_snapshot = snapshot
    decision, cycle_seconds = _timed(scheduler, snapshot, policy, profiler)
    first_admitted = len(decision.admissions)
    drain_cycles, drain_seconds, drain_admitted, drain_evicted = 1, cycle_seconds, len(decision.admissions), 0
    while len(decision.admissions) > first_admitted * DRAIN_DONE_SHARE and drain_cycles < MAX_DRAIN_CYCLES:
        snapshot = fleet.next_snapshot(snapshot, decision, finished=0, arrivals=0)
        decision, seconds = _timed(scheduler, snapshot, policy, None)
        drain_cycles, drain_seconds = drain_cycles + 1, drain_seconds + seconds
        drain_admitted += len(decision.admissions)
        drain_evicted += len(decision.evictions)
    # A cycle after a handful of changes: ~5 runs finished, ~5 workloads arrived.
    follow_up = fleet.next_snapshot(snapshot, decision, finished=5, arrivals=5)
    second, incremental_seconds = _timed(scheduler, follow_up, policy, profiler)
    sync = scheduler.last_sync
    second_reasons = scheduler.pending_reasons() if check else {}
    third_snapshot = fleet.next_snapshot(follow_up, second, finished=5, arrivals=5)
    third, third_seconds = _timed(scheduler, third_snapshot, policy, profiler)
    steady: list[float] = []
    steady_snapshot, steady_decision = third_snapshot, third
    for _ in range(steady_cycles):
        steady_snapshot = fleet.next_snapshot(steady_snapshot, steady_decision, finished=0, arrivals=0)
        steady_decision, seconds = _timed(scheduler, steady_snapshot, policy, None)
        steady.append(seconds)
    steady_figures: dict[str, Any] = {}
    if steady:
        steady_figures = {
            "steady_cycles": len(steady),
            "steady_last_cycle_seconds": round(steady[-1], 4),
            "steady_max_cycle_seconds": round(max(steady), 4),
            "steady_last_candidates": scheduler.last_sync.candidates,
            "steady_last_admitted": len(steady_decision.admissions),
            "steady_last_evicted": len(steady_decision.evictions),
        }
    if profiler is not None and profile is not None:
        profiler.dump_stats(str(profile))
    checked: dict[str, Any] = {}
    if check:
        oracle, one_shot_seconds = _timed(None, follow_up, policy, None)
        checked = {
            "one_shot_second_cycle_seconds": round(one_shot_seconds, 4),
            "equal_to_one_shot": same_decision(oracle, second, second_reasons),
        }
    pending = len(first_snapshot.pending)
    return {
        "pending": pending,
        "admitted": drain_admitted,  # until the fleet was full (the drain)
        "left_pending": pending - drain_admitted,
        "cycle_seconds": round(cycle_seconds, 4),  # the first cycle
        "first_cycle_admitted": first_admitted,
        # Pending workloads the first cycle decided (admitted, parked, or given a reason) per second.
        "decisions_per_second": _rate(pending, cycle_seconds),
        "drain_cycles": drain_cycles,
        "drain_seconds": round(drain_seconds, 3),
        "drain_evicted": drain_evicted,
        "admitted_per_second": _rate(drain_admitted, drain_seconds),
        "incremental_pending": len(follow_up.pending),
        "incremental_admitted": len(second.admissions),
        # The cycle after a handful of changes, on the kept state (runs synced, gangs parked).
        "incremental_cycle_seconds": round(incremental_seconds, 4),
        "incremental_runs_synced": sync.runs_released + sync.runs_added,
        "incremental_candidates": sync.candidates,  # gangs decided in order; the rest stayed parked
        "incremental_classes_asked": sync.classes_checked,
        "incremental_reasons_changed": len(second.pending),
        "third_cycle_seconds": round(third_seconds, 4),
        "third_admitted": len(third.admissions),
        **checked,
        **steady_figures,
        "peak_rss_mb": _peak_rss_mb(),
        "build_seconds": round(build_seconds, 3),
        "clusters": len(first_snapshot.clusters),
        "nodes": len(first_snapshot.nodes),
        "pools": sum(len(c.pools) for c in first_snapshot.clusters),
        "queues": size.queues,
        "live_runs": len(first_snapshot.live_runs),
        "fleet_gpus": fleet.fleet_gpus,
        "seed": size.seed,
    }


def _table(result: dict[str, Any]) -> Table:
    table = Table(title="gpufleet dev bench schedule", show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    return table


@click.group("bench")
def bench() -> None:
    """Measure the scheduling core on synthetic fleets."""


@bench.command("schedule")
@click.option("--pending", default=100_000, show_default=True, type=click.IntRange(min=0), help="pending gangs")
@click.option("--clusters", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--nodes", default=10_000, show_default=True, type=click.IntRange(min=1), help="nodes in the fleet")
@click.option("--queues", default=200, show_default=True, type=click.IntRange(min=1), help="leaf queues")
@click.option("--seed", default=0, show_default=True, type=int, help="seed of the synthetic fleet and backlog")
@click.option("--occupancy", default=0.5, show_default=True, type=click.FloatRange(0.0, 1.0), help="share held")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option(
    "--profile",
    type=click.Path(path_type=Path, dir_okay=False),
    help="write cProfile stats of both cycles to this file (slows the cycles down)",
)
@click.option("--check", is_flag=True, help="also time one-shot schedule() on the second cycle and compare decisions")
@click.option(
    "--steady-cycles",
    default=0,
    show_default=True,
    type=click.IntRange(0, 200),
    help="then this many cycles with nothing but the scheduler's own decisions applied (a full fleet's steady state)",
)
def bench_schedule(
    pending: int,
    clusters: int,
    nodes: int,
    queues: int,
    seed: int,
    occupancy: float,
    as_json: bool,
    profile: Path | None,
    check: bool,
    steady_cycles: int,
) -> None:
    """Time one full scheduling cycle, then one after a handful of changes."""
    if nodes < clusters:
        raise click.BadParameter("needs at least one node per cluster", param_hint="--nodes")
    size = BenchSize(pending=pending, clusters=clusters, nodes=nodes, queues=queues, seed=seed, occupancy=occupancy)
    result = run_bench(size, profile, check, steady_cycles)
    if as_json:
        click.echo(json.dumps(result))
        return
    console = Console()
    console.print(_table(result))
    if profile is not None:
        stats = pstats.Stats(str(profile))
        stats.sort_stats("cumulative").print_stats(15)


bench.add_command(bench_ingest.bench_ingest)
bench.add_command(bench_submit.bench_submit)
bench.add_command(bench_metrics.bench_metrics)
bench.add_command(bench_live.bench_live)
bench.add_command(bench_reads.bench_reads)
bench.add_command(bench_dashboard.bench_dashboard)
bench.add_command(bench_e2e.bench_e2e)


def register(group: click.Group) -> None:
    group.add_command(bench)
