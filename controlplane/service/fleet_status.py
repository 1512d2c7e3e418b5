"""`gpufleet status` and `GET /v1/status`: the fleet at a glance, as a caller may see it.

The same read models as the dashboard's fleet and queue pages (`dashboard.fleet`, `dashboard.queues`:
the registered fleet, the queue tree and the fleet gauges, a few bounded aggregate queries), so the
answer costs the same at 10 or 100,000 workloads. A team token sees the fleet's capacity and use
(as `GET /v1/clusters` shows the fleet) but only its own team and queues; the control plane's own
health (the scheduler's lease, the outbox) is shown to admins.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.service import admin, dashboard
from controlplane.service.metrics import FleetGaugeReader
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.scheduling import LEASE_NAME
from controlplane.service.views import Principal


@dataclass(frozen=True)
class GpuStatus:
    cluster: str  # "" for a fleet-wide line
    gpu_model: str
    sharing: str
    capacity: float  # GPUs on schedulable nodes
    allocated: float  # GPU-equivalents held by live runs


@dataclass(frozen=True)
class PoolStatus:
    """One node pool now (GPU-equivalents; `pending` is what queued gangs that accept its GPU
    model ask for, so a gang that accepts several models counts in each)."""

    cluster: str
    pool: str
    gpu_model: str
    capacity: float  # on schedulable nodes
    allocated: float  # held by live runs
    free: float
    pending: float


@dataclass(frozen=True)
class QueueStatus:
    level: str  # team | queue
    name: str
    team: str
    pending: int
    pending_by_reason: dict[str, int]
    used_gpu_eq: float
    guaranteed_gpu_eq: float
    limit_gpu_eq: float | None  # None: no gpu-eq limit of its own


@dataclass(frozen=True)
class ControlPlaneStatus:
    scheduler_epoch: int | None  # None: no scheduler ever led
    scheduler_lease_expires_in_seconds: float | None  # negative: nobody holds it now
    outbox_backlog: int
    outbox_oldest_seconds: float


@dataclass(frozen=True)
class FleetStatus:
    at: datetime
    clusters: int
    gpus: list[GpuStatus]  # fleet-wide per GPU model and sharing mode
    queues: list[QueueStatus]  # each team, then its queues (a team token: its own)
    pools: list[PoolStatus]  # every node pool of the fleet, by cluster
    control_plane: ControlPlaneStatus | None  # admins only


def fleet_status(uow: UnitOfWorkFactory, gauges: FleetGaugeReader, who: Principal, now: datetime) -> FleetStatus:
    team = dashboard.team_name(uow(), who)
    read = gauges.read(now)
    page = dashboard.fleet(admin.list_clusters(uow()), read)
    teams = admin.list_tree_nodes(uow(), "team")
    queue_nodes = admin.list_tree_nodes(uow(), "queue", None if who.is_admin else who.team_id)
    lines = dashboard.queues(teams, queue_nodes, read, only=team)
    queues = [
        QueueStatus(
            line.level,
            line.name,
            line.team,
            line.pending,
            dict(line.pending_by_reason),
            line.bars[0].used,  # gpu-eq comes first (`dashboard._bars`)
            line.bars[0].guaranteed,
            line.bars[0].limit,
        )
        for line in lines
    ]
    control = None
    if who.is_admin:
        lease = next((lease for lease in read.leases if lease.lease == LEASE_NAME), None)
        control = ControlPlaneStatus(
            lease.epoch if lease else None,
            lease.expires_in_seconds if lease else None,
            read.outbox_backlog,
            read.outbox_oldest_seconds,
        )
    return FleetStatus(
        now,
        len(page.clusters),
        [GpuStatus("", g.gpu_model, g.sharing, g.capacity, g.used) for g in page.by_model],
        queues,
        [
            PoolStatus(c.name, p.name, p.gpu_model, p.capacity, p.allocated, p.free, p.pending_gpu_eq)
            for c in page.clusters
            for p in c.pools
        ],
        control,
    )
