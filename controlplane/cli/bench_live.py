"""`gpufleet dev bench live`: the live scheduler on a real database holding a deep backlog.

A child process seeds the database in bulk (the synthetic fleet of `bench schedule`, its live runs
and `--pending` queued gangs); this process then plays the scheduler and measures
(a) a leader's first decision: take the lease, run one cycle, its phases timed; once on the
    fresh backlog (the first cycle admits all that fits), then for a leader restarted after it;
(b) a new submit's time to its first decision while the production scheduler loop runs at its
    default interval: a gang submitted through the service, its row polled until the scheduler
    has admitted it or written why it waits;
(c) this process's peak RSS (the seeding child's memory is not counted).
Figures are measured, never asserted: the command reports what it saw, hit or miss.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import click
from sqlalchemy import func, select

from adapters.sql.migrate import upgrade_to_head
from adapters.sql.tables import PendingReasonRow, WorkloadRow
from controlplane.bench.synthetic import BenchSize
from controlplane.bootstrap import Wiring, utc_now
from controlplane.cli.bench_live_seed import seed_database
from controlplane.config import Settings
from controlplane.core.incremental import IncrementalScheduler
from controlplane.core.snapshot import Policy
from controlplane.service import workloads
from controlplane.service.commands import SubmitWorkload
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.metrics import CyclePhase
from controlplane.service.scheduling import (
    LEASE_NAME,
    CycleResult,
    acquire_leadership,
    release_leadership,
    run_cycle,
)
from controlplane.service.snapshot_cache import SnapshotCache
from controlplane.service.views import Principal
from controlplane.workers.scheduler_loop import scheduler_loop

PREFIX = "bench"
WARM_UP_TIMEOUT = 600.0  # seconds the warm-up probe may wait for the new leader's first cycle


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024, 1)


def _seed(url: str, size: BenchSize, now: datetime) -> tuple[dict[str, int], float]:
    """Seed in a child process, so its generator's memory stays out of this process's peak RSS."""
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        counts = pool.apply(seed_database, (url, size, now))
    return counts, time.perf_counter() - started


def _phases(result: CycleResult) -> dict[str, float]:
    return {f"{phase}_seconds": round(seconds, 3) for phase, seconds in result.phases}


def _leader_cycle(wiring: Wiring, policy: Policy, settings: Settings, holder: str) -> dict[str, Any]:
    """A leader that has just started: take the lease, then decide once, as the production loop's
    first cycle of a term does (a new snapshot cache and kept state: a full read, the park phase,
    then the ordered pass). Decisions land twice: the park phase stores the reasons of every gang
    its queue's split leaves pending (behind the heads, blocked among them, parked for good), in
    its own transaction, before any gang is decided in order; the rest (the queue heads and the
    candidates the fleet has room or evictions for) land when the cycle's transaction commits
    (the end of its last phase). The cycle then settles what it built for the collector
    (`settle_long_lived_objects`)."""
    started = time.perf_counter()
    epoch = acquire_leadership(wiring.uow, holder, utc_now(), settings.lease_ttl)
    if epoch is None:
        raise click.ClickException("another holder has the scheduler lease; use an empty database")
    leased = time.perf_counter()
    now, ttl = utc_now(), settings.lease_ttl
    result = run_cycle(
        wiring.uow, holder, epoch, policy, PREFIX, now, ttl, cache=SnapshotCache(), scheduler=IncrementalScheduler()
    )
    done = time.perf_counter()
    release_leadership(wiring.uow, holder, epoch)
    seconds = dict(result.phases)
    backlog = sum(seconds.get(phase, 0.0) for phase in (CyclePhase.SNAPSHOT, CyclePhase.PARK))
    landed = sum(seconds.values())
    return {
        "lease_seconds": round(leased - started, 3),
        "cycle_seconds": round(done - leased, 3),
        # The backlog behind the heads (and what limits park) has its reasons stored.
        "backlog_decided_seconds": round(leased - started + backlog, 3),
        # Every gang decided: the heads admitted or told why they wait.
        "first_decision_seconds": round(leased - started + landed, 3),
        **_phases(result),
        "admitted": result.admitted,
        "evicted": result.evicted,
        "left_pending": result.pending,
        "reasons_written": result.reasons_written,
    }


def _scheduler_process(url: str, workdir: Path, stop: EventType) -> None:
    """The production scheduler loop, as `gpufleet server run scheduler` runs it, until `stop` is set."""
    settings = Settings(database_url=url, state_dir=workdir, subject_prefix=PREFIX)
    wiring = Wiring(settings)

    async def main() -> None:
        stopped = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.05)
            stopped.set()

        watcher = asyncio.create_task(watch())
        await scheduler_loop(
            wiring.uow,
            settings.scheduling_policy(),
            PREFIX,
            utc_now,
            stopped,
            settings.scheduler_interval,
            settings.lease_ttl,
        )
        await watcher

    try:
        asyncio.run(main())
    finally:
        wiring.close()


class _Scheduler:
    """The scheduler in its own process, as deployed: the probe's submits and polls share no
    interpreter lock with it."""

    def __init__(self, url: str, workdir: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.process = context.Process(target=_scheduler_process, args=(url, workdir, self.stop), daemon=True)

    def __enter__(self) -> _Scheduler:
        self.process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.process.join(timeout=120)
        if self.process.is_alive():
            self.process.kill()


def _lease_written(wiring: Wiring, timeout: float) -> bool:
    """Whether the scheduler writes its lease within `timeout`: it takes it, and every write of a
    cycle (the parked reasons, the decision) renews it under the epoch. (So does the term's
    background renewal, every third of the TTL: landing in the wait, it ends it early.)"""
    deadline = time.monotonic() + timeout
    with wiring.uow() as uow:
        before = uow.leases.expires_at(LEASE_NAME)
    while time.monotonic() < deadline:
        with wiring.uow() as uow:
            expires = uow.leases.expires_at(LEASE_NAME)
        if expires is not None and expires != before:
            return True
        time.sleep(0.02)
    return False


def _wait_for_leader(wiring: Wiring, timeout: float) -> None:
    """Until the scheduler process holds its lease."""
    if not _lease_written(wiring, timeout):
        raise click.ClickException(f"the scheduler process took no lease within {timeout:.0f} s")


def _decided(wiring: Wiring, workload_id: str) -> bool:
    """The scheduler has decided on it: admitted (or otherwise moved on), or given a pending reason."""
    with wiring.engine.connect() as conn:
        row = conn.execute(
            select(WorkloadRow.state, PendingReasonRow.workload_id)
            .outerjoin(PendingReasonRow, PendingReasonRow.workload_id == WorkloadRow.id)
            .where(WorkloadRow.id == workload_id)
        ).one()
    return bool(row.state != "queued" or row.workload_id is not None)


def _submit_latency(wiring: Wiring, settings: Settings, submits: int, timeout: float) -> dict[str, Any]:
    admin = Principal("bench", "admin", None)
    with wiring.uow() as uow:
        queue = uow.admin.list_tree_nodes("queue")[0].name
    latencies: list[float] = []
    submit_seconds: list[float] = []
    timed_out = 0
    fit = FleetFit()  # the submit-time fleet check's memo, as the API and the ingest consumer keep one
    with _Scheduler(str(wiring.engine.url.render_as_string(hide_password=False)), settings.state_dir):
        _wait_for_leader(wiring, timeout)
        # A new leader's first cycle is a full rebuild over the whole backlog (timed above as the
        # restarted leader): a warm-up probe, not counted, waits it out, so the probes below
        # measure the loop's steady state.
        for i in range(-1, submits):
            request = SubmitWorkload.model_validate(
                {
                    "name": "warm-up" if i < 0 else f"probe-{i}",
                    "queue": queue,
                    "pod_sets": [{"name": "main", "replicas": 1, "gpus": 1}],
                }
            )
            started = time.perf_counter()
            view, _ = workloads.submit(wiring.uow(), admin, request, PREFIX, utc_now(), fit)
            submitted = time.perf_counter()
            if i < 0:
                while not _decided(wiring, view.id) and time.perf_counter() - submitted < WARM_UP_TIMEOUT:
                    time.sleep(0.05)
                # A gang behind its queue's heads is told in its cycle's park phase, before the
                # ordered pass: the probes start once that cycle has written its decision too.
                _lease_written(wiring, WARM_UP_TIMEOUT)
                continue
            submit_seconds.append(submitted - started)
            while not _decided(wiring, view.id):
                if time.perf_counter() - submitted > timeout:
                    timed_out += 1
                    break
                time.sleep(0.01)
            else:
                latencies.append(time.perf_counter() - submitted)
            # Submits land at different points of the loop's interval, as real ones do.
            time.sleep(0.37 * (i % 3))
    return {
        "submits": submits,
        "scheduler_interval_seconds": settings.scheduler_interval,
        "submit_call_ms_median": round(statistics.median(submit_seconds) * 1000, 1),
        "first_decision_ms_median": round(statistics.median(latencies) * 1000, 1) if latencies else None,
        "first_decision_ms_min": round(min(latencies) * 1000, 1) if latencies else None,
        "first_decision_ms_max": round(max(latencies) * 1000, 1) if latencies else None,
        "timed_out": timed_out,
    }


def run_live_bench(url: str, size: BenchSize, submits: int, timeout: float, workdir: Path) -> dict[str, Any]:
    upgrade_to_head(url)
    counts, seed_seconds = _seed(url, size, datetime.now(UTC))
    settings = Settings(database_url=url, state_dir=workdir, subject_prefix=PREFIX)
    policy = settings.scheduling_policy()
    wiring = Wiring(settings)
    try:
        with wiring.engine.connect() as conn:
            queued = conn.scalar(select(func.count()).select_from(WorkloadRow).where(WorkloadRow.state == "queued"))
        # The first leader meets a backlog nobody has decided on and admits all that fits (a burst);
        # a leader restarted after it meets what it left: the backlog that could not run.
        fresh = _leader_cycle(wiring, policy, settings, "bench-first-leader")
        restarted = _leader_cycle(wiring, policy, settings, "bench-restarted-leader")
        submit = _submit_latency(wiring, settings, submits, timeout) if submits else {}
    finally:
        wiring.close()
    return {
        "database": url.split(":", 1)[0].split("+", 1)[0],
        "queued": queued,
        "live_runs": counts.get("runs", 0),
        "nodes": counts.get("nodes", 0),
        "queues": size.queues,
        "seed_seconds": round(seed_seconds, 1),
        "fresh_backlog_leader": fresh,
        "restarted_leader": restarted,
        "new_submit": submit,
        "peak_rss_mb": _peak_rss_mb(),
    }


@click.command("live")
@click.option("--pending", default=100_000, show_default=True, type=click.IntRange(min=0), help="queued gangs")
@click.option("--clusters", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--nodes", default=10_000, show_default=True, type=click.IntRange(min=1), help="nodes in the fleet")
@click.option("--queues", default=200, show_default=True, type=click.IntRange(min=1), help="leaf queues")
@click.option("--seed", default=0, show_default=True, type=int, help="seed of the synthetic fleet and backlog")
@click.option("--submits", default=5, show_default=True, type=click.IntRange(min=0, max=1000), help="probe submits")
@click.option("--timeout", default=120.0, show_default=True, type=click.FloatRange(min=1.0), help="per probe")
@click.option("--database-url", default=None, help="an empty database (default: a new SQLite file)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def bench_live(
    pending: int,
    clusters: int,
    nodes: int,
    queues: int,
    seed: int,
    submits: int,
    timeout: float,
    database_url: str | None,
    as_json: bool,
) -> None:
    """A restarted leader's first decision and a new submit's, on a database with a deep backlog."""
    if nodes < clusters:
        raise click.BadParameter("needs at least one node per cluster", param_hint="--nodes")
    size = BenchSize(pending=pending, clusters=clusters, nodes=nodes, queues=queues, seed=seed)
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-live-") as tmp:
        url = database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        result = run_live_bench(url, size, submits, timeout, Path(tmp))
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        if isinstance(value, dict):
            click.echo(f"{key}:")
            for inner, figure in value.items():
                click.echo(f"{inner:>32}: {figure}")
        else:
            click.echo(f"{key:>34}: {value}")
