"""Seeding `gpufleet dev bench live`'s database: the synthetic fleet as rows, in bulk.

The service layer would take minutes to submit 100,000 gangs one by one; the bench wants the
state they leave, not their submits, so the rows go in with SQLAlchemy Core executemany. The
values are those of `controlplane.bench.synthetic` (the same generator `bench schedule` uses),
mapped to the columns `adapters/sql/tables.py` declares.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import datetime
from itertools import islice
from typing import Any

from sqlalchemy import Engine, Table, insert, text

from adapters.sql.engine import make_engine
from adapters.sql.tables import (
    ClusterRow,
    CohortRow,
    NodePoolRow,
    NodeRow,
    PodSetRow,
    PriorityClassRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from adapters.sql.workload_repo import pod_set_row
from controlplane.bench.synthetic import PRIORITY_CLASSES, BenchSize, SyntheticFleet
from controlplane.core.snapshot import LiveRun
from controlplane.domain.model import CPU, GPU, MEM, QueueNode, Workload

BATCH = 5_000  # rows per executemany: bounded memory, few round trips
DEFAULT_CLASS = "batch"


def _table(row: type[Any]) -> Table:
    table: Table = row.__table__
    return table


def _batches(rows: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    it = iter(rows)
    while chunk := list(islice(it, BATCH)):
        yield chunk


def _quota_columns(node: QueueNode) -> dict[str, Any]:
    return {
        "guaranteed": dict(node.guaranteed.amounts),
        "limit_": dict(node.limit.amounts),
        "weight": node.weight,
        "borrowing_limit": dict(node.borrowing_limit.amounts),
        "lending_limit": dict(node.lending_limit.amounts),
    }


def _workload_row(w: Workload, state: str, reason: str, now: datetime) -> dict[str, Any]:
    return {
        "id": w.id,
        "team_id": w.team_id,
        "queue_id": w.queue_id,
        "name": w.name,
        "priority_class": w.priority_class,
        "priority": w.priority,
        "kind": str(w.kind),
        "requires_isolation": w.requires_isolation,
        "min_available": w.min_available,
        "tolerations": [
            {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect} for t in w.tolerations
        ],
        "duration_seconds": w.duration_seconds,
        "max_runtime_seconds": w.max_runtime_seconds,
        "spot": w.spot,
        "same_pool": w.same_pool,
        "container": {},
        "labels": {},
        "idempotency_key": None,
        "request_fingerprint": "",
        "state": state,
        "reason": reason,
        "version": 1,
        "created_seq": w.created_seq,
        "created_at": now,
        "updated_at": now,
        "finished_at": None,
    }


def _live_workload(run: LiveRun, team_id: str, seq: int, now: datetime) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The workload row behind a synthetic live run (runs reference their workload), with one pod
    set per assigned pod-set name sized from the assignments' demand. Only GPUs, CPU and memory
    are carried over: the scheduler reads a live run's holdings from its assignments, never from
    its workload's pod sets, so MIG and shared slices need no pod-set form here."""
    name = next(c for c in PRIORITY_CLASSES if c[1] == run.priority)[0]
    by_set: dict[str, list[dict[str, int]]] = {}
    for a in run.assignments:
        by_set.setdefault(a.pod_set, []).append(dict(a.demand))
    pod_sets: list[dict[str, Any]] = [
        {
            "workload_id": run.workload_id,
            "ordinal": i,
            "name": pod_set,
            "replicas": len(demands),
            "gpus": demands[0].get(GPU, 0),
            "mig_profile": None,
            "gpu_fraction": None,
            "cpu_millis": demands[0].get(CPU, 0),
            "memory_mib": demands[0].get(MEM, 0),
            "gpu_models": [],
        }
        for i, (pod_set, demands) in enumerate(sorted(by_set.items()))
    ]
    total = sum(len(d) for d in by_set.values())
    return (
        {
            "id": run.workload_id,
            "team_id": team_id,
            "queue_id": run.queue_id,
            "name": run.workload_id,
            "priority_class": name,
            "priority": run.priority,
            "kind": "training",
            "requires_isolation": False,
            "min_available": total,
            "tolerations": [],
            "duration_seconds": None,
            "max_runtime_seconds": None,
            "spot": "allow",
            "same_pool": "preferred",
            "container": {},
            "labels": {},
            "idempotency_key": None,
            "request_fingerprint": "",
            "state": "running",
            "reason": "running",
            "version": 3,
            "created_seq": seq,
            "created_at": run.admitted_at or now,
            "updated_at": now,
            "finished_at": None,
        },
        pod_sets,
    )


def _run_rows(run: LiveRun, now: datetime) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    assert run.run_id is not None
    return (
        {
            "id": run.run_id,
            "workload_id": run.workload_id,
            "attempt": 1,
            "cluster_id": run.cluster_id,
            "epoch": 0,
            "state": "running",
            "dispatch_state": "applied",
            "message": "",
            "end_cause": "",
            "created_at": run.admitted_at or now,
            "dispatched_at": run.admitted_at or now,
            "started_at": run.started_at,
            "finished_at": None,
        },
        [
            {
                "run_id": run.run_id,
                "ordinal": i,
                "pod_set": a.pod_set,
                "pod_index": a.index,
                "node_id": a.node_id,
                "demand": dict(a.demand),
            }
            for i, a in enumerate(run.assignments)
        ],
    )


def seed_database(url: str, size: BenchSize, now: datetime) -> dict[str, int]:
    """Write the synthetic fleet, queue tree, live runs and `size.pending` queued gangs. Returns
    the row counts written."""
    fleet = SyntheticFleet(size, now)
    live = fleet.live_runs()
    engine = make_engine(url)
    try:
        counts = _write(engine, fleet, live, now)
        if engine.dialect.name == "postgresql":
            # A database that grew to this size has statistics (autovacuum analyses as it grows);
            # one bulk-loaded a moment ago has none, and plans on tables believed nearly empty.
            # Without this the bench measured plans production never sees (and hid one that took
            # 22 s to write the first reasons).
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE"))
        return counts
    finally:
        engine.dispose()


def _write(engine: Engine, fleet: SyntheticFleet, live: tuple[LiveRun, ...], now: datetime) -> dict[str, int]:
    tree = fleet.queue_tree
    counts: dict[str, int] = {}

    def put(row: type[Any], rows: Iterable[dict[str, Any]]) -> None:
        written = 0
        with engine.begin() as conn:
            for chunk in _batches(rows):
                conn.execute(insert(_table(row)), chunk)
                written += len(chunk)
        counts[_table(row).name] = counts.get(_table(row).name, 0) + written

    put(
        PriorityClassRow,
        (
            {"name": n, "value": v, "preemptible": p, "min_runtime_seconds": 0, "is_default": n == DEFAULT_CLASS}
            for n, v, p, _ in PRIORITY_CLASSES
        ),
    )
    put(
        ClusterRow,
        (
            {"id": c.id, "name": c.name, "provider": c.provider, "region": c.region, "created_at": now}
            for c in fleet.clusters
        ),
    )
    put(
        NodePoolRow,
        (
            {
                "id": p.id,
                "cluster_id": p.cluster_id,
                "name": p.name,
                "gpu_model": p.gpu_model,
                "gpus_per_node": p.gpus_per_node,
                "cpu_millis": p.cpu_millis,
                "memory_mib": p.memory_mib,
                "sharing": str(p.sharing),
                "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in p.taints],
                "labels": dict(p.labels),
                "price_per_gpu_hour": p.price_per_gpu_hour,
                "spot": p.spot,
                "node_count": p.node_count,
            }
            for c in fleet.clusters
            for p in c.pools
        ),
    )
    put(
        NodeRow,
        (
            {"id": n.id, "cluster_id": n.cluster_id, "pool_id": n.pool_id, "name": n.name, "schedulable": n.schedulable}
            for n in fleet.nodes
        ),
    )
    levels = {CohortRow: None, TeamRow: "cohort_id", QueueRow: "team_id"}
    prefixes = {CohortRow: "cohort-", TeamRow: "team-", QueueRow: "q-"}
    for row, parent_column in levels.items():
        nodes = [n for n in tree.values() if n.id.startswith(prefixes[row])]
        put(
            row,
            (
                {"id": n.id, "name": n.name, "created_at": now, **_quota_columns(n)}
                | ({parent_column: n.parent_id} if parent_column else {})
                for n in nodes
            ),
        )
    # Live runs first: their workloads sit before every pending gang in submission order.
    live_workloads = [_live_workload(run, tree[run.queue_id].parent_id or "", i, now) for i, run in enumerate(live)]
    put(WorkloadRow, (w for w, _ in live_workloads))
    put(PodSetRow, (p for _, pod_sets in live_workloads for p in pod_sets))
    runs = [_run_rows(run, now) for run in live]
    put(RunRow, (r for r, _ in runs))
    put(RunAssignmentRow, (a for _, assignments in runs for a in assignments))
    del live_workloads, runs
    offset = len(live)
    remaining = fleet.size.pending
    while remaining > 0:  # in slices, so 100,000 gangs never sit in memory as rows and values at once
        gangs = fleet.workloads(min(BATCH * 4, remaining))
        remaining -= len(gangs)
        put(
            WorkloadRow,
            (
                _workload_row(
                    replace(w, created_seq=offset + w.created_seq),
                    "queued",
                    "waiting for the next cycle",
                    now,
                )
                for w in gangs
            ),
        )
        put(PodSetRow, (pod_set_row(w.id, i, p) for w in gangs for i, p in enumerate(w.pod_sets)))
    return counts
