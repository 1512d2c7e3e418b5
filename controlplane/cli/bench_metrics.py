"""`gpufleet dev bench metrics`: what one read of the fleet gauges costs on a large installation.

A synthetic installation is written straight into SQL (clusters with pools and nodes, teams and
queues with quotas, queued gangs with pending reasons of every kind, live runs with their pod
assignments, idle findings, a telemetry window per GPU, an outbox backlog, leases); then the
exact reader an API process runs at scrape time is timed. Figures are printed, never asserted.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
from sqlalchemy import Engine, insert

from adapters.prometheus.fleet import fleet_families
from adapters.sql.engine import make_engine
from adapters.sql.gauges_repo import SqlFleetGauges
from adapters.sql.migrate import upgrade_to_head
from adapters.sql.tables import (
    ClusterRow,
    IdleFindingRow,
    LeaderLeaseRow,
    NodePoolRow,
    NodeRow,
    OutboxRow,
    PendingReasonRow,
    PriorityClassRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    TelemetryWindowRow,
    WorkloadRow,
)
from controlplane.bootstrap import utc_now

GPUS_PER_NODE = 8
# (kind stored in pending_reasons.kind, the sentence people read): the gauges group on the kind; a
# gang of kind "" has no pending row (the scheduler has not decided it), only its own reason.
REASONS = (
    ("no-fit", "no-fit: needs {n} pods placed at once in one cluster; best: {c} fits {m}"),
    ("quota-limit", "quota: team-{n} limit is {m} gpu-eq, {n} in use"),
    ("fair-share", "fair-share: queue q-{n} (share 0.{m}) waits its turn"),
    ("no-fit", "no-fit: nothing free; reservation: holds {n} nodes"),
    ("", "preempted: workload w-{n} (priority {m}) needs the capacity"),
    ("", ""),
)
STAGES = ("none", "notify", "deprioritize", "reclaim")


def _reason(rng: random.Random) -> tuple[str, str]:
    kind, text = rng.choice(REASONS)
    return kind, text.format(n=rng.randint(1, 64), m=rng.randint(1, 999), c="cluster-0")


def populate(engine: Engine, clusters: int, nodes: int, queues: int, queued: int, live: int, seed: int) -> None:
    rng = random.Random(seed)
    now = utc_now()
    per_cluster = max(1, nodes // clusters)
    teams = max(1, queues // 5)
    with engine.begin() as conn:
        conn.execute(insert(PriorityClassRow), [{"name": "bench", "value": 0}])
        conn.execute(insert(TeamRow), [{"id": f"t{i}", "name": f"team-{i}", "created_at": now} for i in range(teams)])
        conn.execute(
            insert(QueueRow),
            [
                {
                    "id": f"q{i}",
                    "name": f"queue-{i}",
                    "team_id": f"t{i % teams}",
                    "created_at": now,
                    "guaranteed": {"gpu-eq": 64},
                    "limit_": {"gpu-eq": 512, "H100-80GB": 256},  # the column behind QueueRow.limit
                }
                for i in range(queues)
            ],
        )
        node_ids: list[tuple[str, str]] = []
        for c in range(clusters):
            conn.execute(
                insert(ClusterRow), [{"id": f"c{c}", "name": f"cluster-{c}", "provider": "sim", "created_at": now}]
            )
            conn.execute(
                insert(NodePoolRow),
                [
                    {
                        "id": f"p{c}",
                        "cluster_id": f"c{c}",
                        "name": "h100",
                        "gpu_model": "H100-80GB",
                        "gpus_per_node": GPUS_PER_NODE,
                        "cpu_millis": 192_000,
                        "memory_mib": 2_000_000,
                        "node_count": per_cluster,
                    }
                ],
            )
            rows = [
                {"id": f"n{c}-{i}", "cluster_id": f"c{c}", "pool_id": f"p{c}", "name": f"node-{i}"}
                for i in range(per_cluster)
            ]
            conn.execute(insert(NodeRow), rows)
            node_ids += [(f"c{c}", row["id"]) for row in rows]
        workload = {"priority_class": "bench", "priority": 0, "kind": "training", "min_available": 2}
        reasons = [_reason(rng) for _ in range(queued)]
        conn.execute(
            insert(WorkloadRow),
            [
                {
                    **workload,
                    "id": f"wq{i}",
                    "team_id": f"t{(i % queues) % teams}",
                    "queue_id": f"q{i % queues}",
                    "name": f"queued-{i}",
                    "state": "queued",
                    "reason": reasons[i][1],
                    "created_seq": i,
                    "created_at": now,
                    "updated_at": now,
                }
                for i in range(queued)
            ],
        )
        pending = [
            {"workload_id": f"wq{i}", "reason": text, "kind": kind} for i, (kind, text) in enumerate(reasons) if kind
        ]
        for start in range(0, len(pending), 5000):
            conn.execute(insert(PendingReasonRow), pending[start : start + 5000])
        runs: list[dict[str, Any]] = []
        assignments: list[dict[str, Any]] = []
        findings: list[dict[str, Any]] = []
        windows: list[dict[str, Any]] = []
        for i in range(live):
            cluster, node = node_ids[(2 * i) % len(node_ids)]
            _, second = node_ids[(2 * i + 1) % len(node_ids)]
            runs.append(
                {
                    "id": f"r{i}",
                    "workload_id": f"wl{i}",
                    "attempt": 1,
                    "cluster_id": cluster,
                    "epoch": 1,
                    "state": "running",
                    "created_at": now,
                }
            )
            for ordinal, on in enumerate((node, second)):
                demand = {"gpu": GPUS_PER_NODE, "cpu": 8000, "memory": 64_000}
                assignments.append(
                    {
                        "run_id": f"r{i}",
                        "ordinal": ordinal,
                        "pod_set": "workers",
                        "pod_index": ordinal,
                        "node_id": on,
                        "demand": demand,
                    }
                )
                for gpu in range(GPUS_PER_NODE):
                    windows.append(_window(f"r{i}", f"cluster-{cluster[1:]}", on, gpu, rng.random(), now))
            if i % 3 == 0:
                findings.append(
                    {
                        "run_id": f"r{i}",
                        "workload_id": f"wl{i}",
                        "cluster": cluster,
                        "status": "idle",
                        "stage": rng.choice(STAGES),
                        "idle_windows": 3,
                        "reason": "idle",
                        "action": "requeue",
                        "stage_since": now,
                        "updated_at": now,
                    }
                )
        conn.execute(
            insert(WorkloadRow),
            [
                {
                    **workload,
                    "id": f"wl{i}",
                    "team_id": f"t{(i % queues) % teams}",
                    "queue_id": f"q{i % queues}",
                    "name": f"live-{i}",
                    "state": "running",
                    "created_seq": queued + i,
                    "created_at": now,
                    "updated_at": now,
                }
                for i in range(live)
            ],
        )
        for table, rows in ((RunRow, runs), (RunAssignmentRow, assignments), (IdleFindingRow, findings)):
            for start in range(0, len(rows), 5000):
                conn.execute(insert(table), rows[start : start + 5000])
        for start in range(0, len(windows), 5000):
            conn.execute(insert(TelemetryWindowRow), windows[start : start + 5000])
        conn.execute(
            insert(OutboxRow),
            [
                {"id": f"e{i}", "subject": "bench.events.x", "payload": "{}", "created_at": now - timedelta(seconds=i)}
                for i in range(1000)
            ],
        )
        conn.execute(
            insert(LeaderLeaseRow),
            [
                {"name": n, "holder": "bench", "epoch": 3, "expires_at": now + timedelta(seconds=10)}
                for n in ("scheduler", "dispatcher", "relay")
            ],
        )


def _window(run: str, cluster: str, node: str, gpu: int, activity: float, now: Any) -> dict[str, Any]:
    counters = {
        f"{m}_{k}": 0 for m in ("gr_engine", "gpu_util", "tensor", "fb_used", "fb_free", "power") for k in ("n", "sum")
    }
    return {
        **counters,
        "run_id": run,
        "gpu_key": f"{node}/{gpu}",
        "window_start": now - timedelta(minutes=5),
        "window_seconds": 300,
        "cluster": cluster,
        "node": node,
        "gpu_uuid": f"GPU-{node}-{gpu}",
        "gpu_index": gpu,
        "samples": 30,
        "first_sample_at": now - timedelta(minutes=5),
        "last_sample_at": now,
        "sm_active_n": 30,
        "sm_active_sum": 30 * activity,
        "sm_active_max": activity,
        "gr_engine_max": 0.0,
        "gpu_util_max": 0.0,
        "xid_error_samples": 0,
        "updated_at": now,
    }


def run_bench(
    database_url: str | None, clusters: int, nodes: int, queues: int, queued: int, live: int, reads: int, seed: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-metrics-") as workdir:
        url = database_url or f"sqlite:///{Path(workdir) / 'bench.db'}"
        upgrade_to_head(url)
        engine = make_engine(url)
        try:
            started = time.perf_counter()
            populate(engine, clusters, nodes, queues, queued, live, seed)
            populate_seconds = time.perf_counter() - started
            reader = SqlFleetGauges(engine, pools=False)  # as Prometheus scrapes it
            timings: list[float] = []
            for _ in range(reads):
                started = time.perf_counter()
                gauges = reader.read(utc_now())
                timings.append(time.perf_counter() - started)
            series = sum(len(family.samples) for family in fleet_families(gauges))
        finally:
            engine.dispose()
    return {
        "database": url.split(":", 1)[0].split("+", 1)[0],
        "clusters": clusters,
        "nodes": nodes,
        "queues": queues,
        "queued_gangs": queued,
        "live_runs": live,
        "pod_assignments": 2 * live,
        "telemetry_windows": 2 * GPUS_PER_NODE * live,
        "populate_seconds": round(populate_seconds, 2),
        "reads": reads,
        "read_p50_ms": round(statistics.median(timings) * 1000, 1),
        "read_max_ms": round(max(timings) * 1000, 1),
        "series": series,
    }


@click.command("metrics")
@click.option(
    "--database-url", default=None, help="a migrated, EMPTY PostgreSQL/SQLite database (default: temp SQLite)"
)
@click.option("--clusters", default=4, show_default=True, type=click.IntRange(min=1))
@click.option("--nodes", default=2000, show_default=True, type=click.IntRange(min=1))
@click.option("--queues", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--queued", default=20_000, show_default=True, type=click.IntRange(min=0))
@click.option("--live", default=4000, show_default=True, type=click.IntRange(min=0), help="running gangs of 2 x 8 GPUs")
@click.option("--reads", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def bench_metrics(
    database_url: str | None,
    clusters: int,
    nodes: int,
    queues: int,
    queued: int,
    live: int,
    reads: int,
    seed: int,
    as_json: bool,
) -> None:
    """Time one read of the fleet gauges (what an API process does when Prometheus scrapes it)."""
    result = run_bench(database_url, clusters, nodes, queues, queued, live, reads, seed)
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:>20}  {value}")
