"""What the web dashboard shows about the fleet and the queues, as a caller may see it.

Read models only: the figures come from the registered fleet (`admin.list_clusters`, the queue
tree) and from the fleet gauges (`FleetGaugeReader`: a few bounded aggregate queries, the same
figures Prometheus scrapes), so a page costs the same at 10 or 100,000 workloads. A team token
sees the whole fleet's capacity (as `GET /v1/clusters` shows it) but only its own team's queues.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.domain.model import GPU_EQ
from controlplane.service.errors import Invalid
from controlplane.service.metrics import FleetGauges
from controlplane.service.ports import UnitOfWork
from controlplane.service.views import ClusterView, Principal, TreeNodeView


def team_name(uow: UnitOfWork, who: Principal) -> str | None:
    """The name of the caller's team; None for an admin (who sees every team)."""
    if who.is_admin:
        return None
    if who.team_id is None:
        raise Invalid("this token belongs to no team")
    with uow:
        team = uow.admin.get_tree_node("team", who.team_id)
    if team is None:
        raise Invalid("this token's team no longer exists")
    return team.name


# --- fleet -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolLine:
    name: str
    gpu_model: str
    sharing: str
    nodes: int
    gpus: int  # GPUs on all its nodes, schedulable or not
    spot: bool
    price_per_gpu_hour: float


@dataclass(frozen=True)
class GpuLine:
    """GPUs of one model in one cluster (or fleet-wide): on schedulable nodes, and held by live runs
    (in GPU-equivalents: a MIG slice or a time-slice share counts as its part of a GPU)."""

    cluster: str
    gpu_model: str
    sharing: str  # the sharing mode of the pools with this model, or "mixed: a + b"
    capacity: float
    used: float

    @property
    def free(self) -> float:
        return max(0.0, self.capacity - self.used)


@dataclass(frozen=True)
class ClusterLine:
    name: str
    provider: str
    region: str
    sync_state: str
    pools: tuple[PoolLine, ...]
    gpus: tuple[GpuLine, ...]


@dataclass(frozen=True)
class FleetPage:
    clusters: tuple[ClusterLine, ...]
    by_model: tuple[GpuLine, ...]  # fleet-wide, per (GPU model, sharing mode)

    @property
    def capacity(self) -> float:
        return sum(line.capacity for line in self.by_model)

    @property
    def used(self) -> float:
        return sum(line.used for line in self.by_model)


def _sharing(pools: Sequence[PoolLine]) -> str:
    modes = sorted({p.sharing for p in pools})
    return modes[0] if len(modes) == 1 else "mixed: " + " + ".join(modes)


def fleet(clusters: Sequence[ClusterView], gauges: FleetGauges) -> FleetPage:
    """Clusters and pools as registered, with capacity and use per GPU model from the gauges."""
    gpus = {(g.cluster, g.gpu_model): g for g in gauges.gpus}
    lines: list[ClusterLine] = []
    fleet_wide: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cluster in clusters:
        pools = tuple(
            PoolLine(
                p.name,
                p.gpu_model,
                p.sharing,
                p.node_count,
                p.node_count * p.gpus_per_node,
                p.spot,
                p.price_per_gpu_hour,
            )
            for p in cluster.pools
        )
        by_model: dict[str, list[PoolLine]] = defaultdict(list)
        for pool in pools:
            by_model[pool.gpu_model].append(pool)
        models = sorted(set(by_model) | {m for c, m in gpus if c == cluster.name})
        cluster_gpus = []
        for model in models:
            gauge = gpus.get((cluster.name, model))
            sharing = _sharing(by_model[model]) if by_model[model] else "unknown"
            line = GpuLine(
                cluster.name, model, sharing, gauge.capacity if gauge else 0.0, gauge.allocated if gauge else 0.0
            )
            cluster_gpus.append(line)
            totals = fleet_wide[(model, sharing)]
            totals[0] += line.capacity
            totals[1] += line.used
        lines.append(
            ClusterLine(cluster.name, cluster.provider, cluster.region, cluster.sync_state, pools, tuple(cluster_gpus))
        )
    by_model_lines = tuple(
        GpuLine("", model, sharing, capacity, used) for (model, sharing), (capacity, used) in sorted(fleet_wide.items())
    )
    return FleetPage(tuple(lines), by_model_lines)


# --- queues ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One resource of one queue tree node: what it is guaranteed, uses, borrows, may use at most."""

    key: str  # "gpu-eq" or a GPU model
    guaranteed: float
    used: float
    limit: float | None  # None: no limit of its own

    @property
    def borrowed(self) -> float:
        """What it uses above its guarantee: capacity lent by others, reclaimable by them."""
        return max(0.0, self.used - self.guaranteed)

    @property
    def scale(self) -> float:
        """The amount the full width of the bar stands for."""
        return max(self.limit or 0.0, self.guaranteed, self.used, 1.0)


@dataclass(frozen=True)
class QueueLine:
    level: str  # team | queue
    name: str
    team: str
    weight: float
    weight_share: float  # its weight over its siblings' weights: its fair-share entitlement
    pending: int
    pending_by_reason: Mapping[str, int]
    bars: tuple[Bar, ...]


def _bars(guaranteed: Mapping[str, float], used: Mapping[str, float], limit: Mapping[str, float]) -> tuple[Bar, ...]:
    """gpu-eq always, and each GPU model the node's quota names: use of a model no quota speaks of
    is not borrowing of it (the fleet page shows use per model)."""
    keys = set(guaranteed) | set(limit) | {GPU_EQ}
    ordered = sorted(keys, key=lambda k: (k != GPU_EQ, k))
    return tuple(Bar(k, guaranteed.get(k, 0.0), used.get(k, 0.0), limit.get(k)) for k in ordered)


def queues(
    teams: Sequence[TreeNodeView], queue_nodes: Sequence[TreeNodeView], gauges: FleetGauges, only: str | None = None
) -> list[QueueLine]:
    """Each team, then its queues, with their bars and pending counts. `teams` are all teams (a
    team's entitlement is its weight over all of theirs); `only`: show that team alone."""
    used = {q.queue: q.used for q in gauges.quotas}
    pending: dict[str, dict[str, int]] = defaultdict(dict)
    for (queue, kind), count in gauges.pending.items():
        pending[queue][kind] = pending[queue].get(kind, 0) + count
    by_team: dict[str, list[TreeNodeView]] = defaultdict(list)
    for node in queue_nodes:
        by_team[node.parent or ""].append(node)
    team_weights = sum(t.weight for t in teams) or 1.0
    lines: list[QueueLine] = []
    for team in sorted(teams, key=lambda t: t.name):
        if only is not None and team.name != only:
            continue
        members = sorted(by_team.get(team.name, []), key=lambda q: q.name)
        team_used: dict[str, float] = defaultdict(float)
        for q in members:
            for key, amount in used.get(q.name, {}).items():
                team_used[key] += amount
        team_pending: dict[str, int] = defaultdict(int)
        for q in members:
            for kind, count in pending.get(q.name, {}).items():
                team_pending[kind] += count
        lines.append(
            QueueLine(
                "team",
                team.name,
                team.name,
                team.weight,
                team.weight / team_weights,
                sum(team_pending.values()),
                dict(team_pending),
                _bars(team.guaranteed, team_used, team.limit),
            )
        )
        siblings = sum(q.weight for q in members) or 1.0
        for q in members:
            waiting = pending.get(q.name, {})
            lines.append(
                QueueLine(
                    "queue",
                    q.name,
                    team.name,
                    q.weight,
                    q.weight / siblings,
                    sum(waiting.values()),
                    dict(waiting),
                    _bars(q.guaranteed, used.get(q.name, {}), q.limit),
                )
            )
    return lines
