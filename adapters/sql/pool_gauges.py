"""The fleet page's figures per node pool and the queued demand, read with grouped queries.

Each query groups in the database: a row per (pool, idle stage, demand shape), per pool of measured
GPUs, or per pod-set shape of the queued gangs, so the answer's size follows what was registered and
the few shapes people ask for, never the number of workloads, pods or telemetry windows.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta
from fractions import Fraction

from sqlalchemy import String, and_, cast, func, select
from sqlalchemy.orm import Session

from adapters.sql.slo_gauges import activity_terms, demand_of
from adapters.sql.tables import (
    ClusterRow,
    IdleFindingRow,
    NodeRow,
    PodSetRow,
    RunAssignmentRow,
    RunRow,
    TelemetryWindowRow,
    WorkloadRow,
)
from controlplane.core.gpu_eq import gpu_eq_float
from controlplane.domain.model import NodePool
from controlplane.domain.sharing import mig_gpu_eq
from controlplane.service.metrics import PendingDemand, PoolGpus

# Shared with the fleet gauges (gauges_repo imports them from here: it imports this module).
LIVE_RUN_STATES = ("admitted", "dispatching", "running")
# Idle stages at which a run's GPUs count as idle GPUs (`gpufleet_idle_notified_gpus`).
NOTIFIED_STAGES = ("notify", "deprioritize", "reclaim")
# The safety cap of any grouped query: far above what a registered fleet produces.
MAX_ROWS = 20_000


def pool_gpus(
    s: Session, clusters: Mapping[str, str], pools: Mapping[str, NodePool], now: datetime, lookback: timedelta
) -> tuple[PoolGpus, ...]:
    """Per pool: schedulable GPUs, GPU-equivalents live runs hold and how many of those the idle
    policy flagged, and the busy GPU-equivalents DCGM measured over `lookback` (each measured GPU's
    mean activity, summed)."""
    capacity: dict[str, int] = defaultdict(int)
    for pool_id, nodes in s.execute(
        select(NodeRow.pool_id, func.count()).where(NodeRow.schedulable.is_(True)).group_by(NodeRow.pool_id)
    ):
        pool = pools.get(pool_id)
        if pool is not None:
            capacity[pool_id] += pool.gpus_per_node * int(nodes)
    allocated: dict[str, Fraction] = defaultdict(Fraction)
    idle: dict[str, Fraction] = defaultdict(Fraction)
    shape = cast(RunAssignmentRow.demand, String)
    stage = func.coalesce(IdleFindingRow.stage, "")
    for pool_id, idle_stage, demand_text, count in s.execute(
        select(NodeRow.pool_id, stage, shape, func.count())
        .select_from(RunAssignmentRow)
        .join(RunRow, RunRow.id == RunAssignmentRow.run_id)
        .join(NodeRow, NodeRow.id == RunAssignmentRow.node_id)
        .outerjoin(IdleFindingRow, IdleFindingRow.run_id == RunRow.id)
        .where(RunRow.state.in_(LIVE_RUN_STATES))
        .group_by(NodeRow.pool_id, stage, shape)
        .limit(MAX_ROWS)
    ):
        pool = pools.get(pool_id)
        if pool is None:
            continue
        amount = Fraction(gpu_eq_float(demand_of(demand_text), pool)) * int(count)
        allocated[pool_id] += amount
        if idle_stage in NOTIFIED_STAGES:
            idle[pool_id] += amount
    used, measured = _busy(s, now, lookback)
    keys = sorted(set(capacity) | set(allocated), key=lambda p: (clusters.get(pools[p].cluster_id, ""), pools[p].name))
    return tuple(
        PoolGpus(
            cluster=clusters.get(pools[p].cluster_id, ""),
            pool=pools[p].name,
            gpu_model=pools[p].gpu_model,
            capacity=float(capacity.get(p, 0)),
            allocated=float(allocated.get(p, 0)),
            used=used.get(p, 0.0),
            measured=measured.get(p, 0),
            idle=float(idle.get(p, 0)),
        )
        for p in keys
        if pools[p].cluster_id in clusters
    )


def _busy(s: Session, now: datetime, lookback: timedelta) -> tuple[dict[str, float], dict[str, int]]:
    """Per pool: the sum over measured GPUs of their mean activity, and how many GPUs were measured.
    The windows name their cluster and node; the join finds the node's pool."""
    w = TelemetryWindowRow
    total, samples = activity_terms()
    per_gpu = (
        select(NodeRow.pool_id.label("pool_id"), (total / func.nullif(samples, 0)).label("activity"))
        .select_from(w)
        .join(ClusterRow, ClusterRow.name == w.cluster)
        .join(NodeRow, and_(NodeRow.cluster_id == ClusterRow.id, NodeRow.name == w.node))
        .where(w.window_start >= now - lookback, w.run_id != "")
        .group_by(NodeRow.pool_id, w.gpu_key)
        .subquery()
    )
    used: dict[str, float] = {}
    measured: dict[str, int] = {}
    for pool_id, busy, gpus in s.execute(
        select(per_gpu.c.pool_id, func.sum(per_gpu.c.activity), func.count()).group_by(per_gpu.c.pool_id)
    ):
        used[pool_id] = float(busy or 0.0)
        measured[pool_id] = int(gpus)
    return used, measured


def pending_demand(s: Session) -> tuple[PendingDemand, ...]:
    """What queued gangs ask for, per the GPU models their pod sets accept: gangs, pods and
    GPU-equivalents (a MIG slice or a fraction counts as its part of a GPU)."""
    p = PodSetRow
    models = cast(p.gpu_models, String)
    gangs: dict[str, int] = defaultdict(int)
    pods: dict[str, int] = defaultdict(int)
    gpu_eq: dict[str, Fraction] = defaultdict(Fraction)
    for text, gpus, mig_profile, fraction, replicas, count in s.execute(
        select(
            models,
            p.gpus,
            p.mig_profile,
            p.gpu_fraction,
            func.sum(p.replicas),
            func.count(func.distinct(p.workload_id)),
        )
        .join(WorkloadRow, WorkloadRow.id == p.workload_id)
        .where(WorkloadRow.state == "queued")
        .group_by(models, p.gpus, p.mig_profile, p.gpu_fraction)
        .limit(MAX_ROWS)
    ):
        key = _models_key(text)
        if mig_profile:
            per_pod = mig_gpu_eq(mig_profile)
        elif fraction:
            per_pod = Fraction(fraction).limit_denominator(1000)
        else:
            per_pod = Fraction(int(gpus or 0))
        if not per_pod:
            continue
        gangs[key] += int(count)
        pods[key] += int(replicas or 0)
        gpu_eq[key] += per_pod * int(replicas or 0)
    return tuple(PendingDemand(k, gangs[k], pods[k], float(gpu_eq[k])) for k in sorted(gangs))


def _models_key(text: object) -> str:
    value = json.loads(text) if isinstance(text, str) else text
    if not isinstance(value, list):
        return ""
    return " or ".join(sorted(str(m) for m in value))


def cluster_runs(s: Session, clusters: Mapping[str, str]) -> dict[tuple[str, str], int]:
    """Live runs per (cluster, state): admitted, dispatching, running."""
    rows = s.execute(
        select(RunRow.cluster_id, RunRow.state, func.count())
        .where(RunRow.state.in_(LIVE_RUN_STATES))
        .group_by(RunRow.cluster_id, RunRow.state)
    )
    return {(clusters[c], str(state)): int(n) for c, state, n in rows if c in clusters}
