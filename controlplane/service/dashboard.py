"""What the web dashboard shows about the fleet and the queues, as a caller may see it.

Read models only: the figures come from the registered fleet (`admin.list_clusters`, the queue
tree) and from the fleet gauges (`FleetGaugeReader`: a few bounded aggregate queries, the same
figures Prometheus scrapes), so a page costs the same at 10 or 100,000 workloads. A team token
sees the whole fleet's capacity (as `GET /v1/clusters` shows it) but only its own team's queues.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from controlplane.domain.model import GPU_EQ
from controlplane.service.errors import Invalid, NotFound
from controlplane.service.metrics import FleetGauges, PendingDemand, PoolGpus
from controlplane.service.ports import UnitOfWork
from controlplane.service.views import ClusterView, NodeLoad, PoolView, Principal, TreeNodeView


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
    # From the gauges (`PoolGpus`): schedulable GPUs, held by live runs, busy by DCGM, flagged idle.
    capacity: float = 0.0
    allocated: float = 0.0
    used: float = 0.0
    measured: int = 0
    idle: float = 0.0
    pending_gpu_eq: float = 0.0  # what queued gangs that accept this pool's model ask for

    @property
    def free(self) -> float:
        return max(0.0, self.capacity - self.allocated)


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
    runs: Mapping[str, int] = field(default_factory=dict)  # live runs by state (admitted, dispatching, running)


@dataclass(frozen=True)
class FleetPage:
    clusters: tuple[ClusterLine, ...]
    by_model: tuple[GpuLine, ...]  # fleet-wide, per (GPU model, sharing mode)
    pending: tuple[PendingDemand, ...] = ()  # queued demand per accepted GPU models ("": any)

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
    by_pool = {(p.cluster, p.pool): p for p in gauges.pools}
    lines: list[ClusterLine] = []
    fleet_wide: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cluster in clusters:
        pools = tuple(
            _pool_line(
                PoolLine(
                    p.name,
                    p.gpu_model,
                    p.sharing,
                    p.node_count,
                    p.node_count * p.gpus_per_node,
                    p.spot,
                    p.price_per_gpu_hour,
                ),
                by_pool.get((cluster.name, p.name)),
                gauges.pending_demand,
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
            ClusterLine(
                cluster.name,
                cluster.provider,
                cluster.region,
                cluster.sync_state,
                pools,
                tuple(cluster_gpus),
                {state: n for (c, state), n in gauges.cluster_runs.items() if c == cluster.name},
            )
        )
    by_model_lines = tuple(
        GpuLine("", model, sharing, capacity, used) for (model, sharing), (capacity, used) in sorted(fleet_wide.items())
    )
    return FleetPage(tuple(lines), by_model_lines, tuple(gauges.pending_demand))


def _pool_line(line: PoolLine, gauge: PoolGpus | None, demand: Sequence[PendingDemand]) -> PoolLine:
    """The pool's registered figures with its gauges, and the queued demand it could serve: gangs
    that accept its GPU model or any model (a gang counts in every pool it could go to)."""
    asking = sum(d.gpu_eq for d in demand if not d.gpu_models or line.gpu_model in d.gpu_models.split(" or "))
    if gauge is None:
        return replace(line, pending_gpu_eq=asking)
    return replace(
        line,
        capacity=gauge.capacity,
        allocated=gauge.allocated,
        used=gauge.used,
        measured=gauge.measured,
        idle=gauge.idle,
        pending_gpu_eq=asking,
    )


# The most nodes a node view lists (by name): a pool larger than that is shown in part, and says so.
MAX_NODES_SHOWN = 500


@dataclass(frozen=True)
class PoolNodes:
    cluster: str
    pool: PoolView
    nodes: tuple[NodeLoad, ...]
    more: bool  # the pool has more nodes than are shown


def pool_nodes(uow: UnitOfWork, who: Principal, cluster: str, pool: str) -> PoolNodes:
    """One pool's nodes and what live runs hold on each. Capacity is fleet-wide knowledge (as
    `GET /v1/clusters` shows it); a team token sees only its own team's workloads named on a node."""
    with uow:
        # The registered clusters without their nodes (`get_cluster` would load every node of it).
        view = next((c for c in uow.admin.list_clusters() if c.name == cluster), None)
        found = next((p for p in view.pools if p.name == pool), None) if view is not None else None
        if view is None or found is None:
            raise NotFound(f"no node pool {pool!r} in cluster {cluster!r}")
        nodes = uow.admin.pool_nodes(view.id, pool, MAX_NODES_SHOWN + 1)
    if not who.is_admin:
        nodes = [replace(n, workloads=tuple(w for w in n.workloads if w[2] == who.team_id)) for n in nodes]
    return PoolNodes(view.name, found, tuple(nodes[:MAX_NODES_SHOWN]), len(nodes) > MAX_NODES_SHOWN)


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
    level: str  # cohort | team | queue
    name: str
    team: str
    weight: float
    weight_share: float  # its weight over its siblings' weights: its fair-share entitlement
    pending: int
    pending_by_reason: Mapping[str, int]
    bars: tuple[Bar, ...]
    admitted: int = 0  # workloads admitted or being dispatched, not yet running
    running: int = 0
    oldest_wait_seconds: float = 0.0  # how long its oldest queued workload has waited (0: none)


def _bars(guaranteed: Mapping[str, float], used: Mapping[str, float], limit: Mapping[str, float]) -> tuple[Bar, ...]:
    """gpu-eq always, and each GPU model the node's quota names: use of a model no quota speaks of
    is not borrowing of it (the fleet page shows use per model)."""
    keys = set(guaranteed) | set(limit) | {GPU_EQ}
    ordered = sorted(keys, key=lambda k: (k != GPU_EQ, k))
    return tuple(Bar(k, guaranteed.get(k, 0.0), used.get(k, 0.0), limit.get(k)) for k in ordered)


def queues(
    teams: Sequence[TreeNodeView],
    queue_nodes: Sequence[TreeNodeView],
    gauges: FleetGauges,
    only: str | None = None,
    cohorts: Sequence[TreeNodeView] = (),
) -> list[QueueLine]:
    """Each team, then its queues, with their bars and pending counts. `teams` are all teams (a
    team's entitlement is its weight over all of theirs); `only`: show that team alone. With
    `cohorts`, each cohort comes first with its teams' sums, then its teams (teams in no cohort last)."""
    used = {q.queue: q.used for q in gauges.quotas}
    admitted: dict[str, int] = defaultdict(int)
    running: dict[str, int] = defaultdict(int)
    for (queue, state), count in gauges.workloads.items():
        if state in ("admitted", "dispatching"):
            admitted[queue] += count
        elif state == "running":
            running[queue] += count
    oldest = {w.queue: w.oldest_seconds for w in gauges.queue_waits}
    pending: dict[str, dict[str, int]] = defaultdict(dict)
    for (queue, kind), count in gauges.pending.items():
        pending[queue][kind] = pending[queue].get(kind, 0) + count
    by_team: dict[str, list[TreeNodeView]] = defaultdict(list)
    for node in queue_nodes:
        by_team[node.parent or ""].append(node)
    team_weights = sum(t.weight for t in teams) or 1.0
    blocks: dict[str, list[QueueLine]] = {}
    used_by_team: dict[str, dict[str, float]] = {}
    for team in sorted(teams, key=lambda t: t.name):
        if only is not None and team.name != only:
            continue
        lines: list[QueueLine] = []
        blocks[team.name] = lines
        members = sorted(by_team.get(team.name, []), key=lambda q: q.name)
        team_used: dict[str, float] = defaultdict(float)
        used_by_team[team.name] = team_used
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
                sum(admitted[q.name] for q in members),
                sum(running[q.name] for q in members),
                max((oldest.get(q.name, 0.0) for q in members), default=0.0),
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
                    admitted[q.name],
                    running[q.name],
                    oldest.get(q.name, 0.0),
                )
            )
    return _with_cohorts(teams, cohorts, blocks, used_by_team)


def _with_cohorts(
    teams: Sequence[TreeNodeView],
    cohorts: Sequence[TreeNodeView],
    blocks: Mapping[str, list[QueueLine]],
    used_by_team: Mapping[str, Mapping[str, float]],
) -> list[QueueLine]:
    """The teams' blocks (a team line, then its queues), each cohort's teams under a cohort line
    that sums them: used, pending, admitted and running, and the oldest wait among them."""
    out: list[QueueLine] = []
    placed: set[str] = set()
    cohort_weights = sum(c.weight for c in cohorts) or 1.0
    for cohort in sorted(cohorts, key=lambda c: c.name):
        members = [t.name for t in sorted(teams, key=lambda t: t.name) if t.parent == cohort.name and t.name in blocks]
        heads = [blocks[name][0] for name in members]
        cohort_used: dict[str, float] = defaultdict(float)
        waiting: dict[str, int] = defaultdict(int)
        for name, head in zip(members, heads, strict=True):
            for key, amount in used_by_team[name].items():
                cohort_used[key] += amount
            for kind, count in head.pending_by_reason.items():
                waiting[kind] += count
        out.append(
            QueueLine(
                "cohort",
                cohort.name,
                "",
                cohort.weight,
                cohort.weight / cohort_weights,
                sum(waiting.values()),
                dict(waiting),
                _bars(cohort.guaranteed, cohort_used, cohort.limit),
                sum(h.admitted for h in heads),
                sum(h.running for h in heads),
                max((h.oldest_wait_seconds for h in heads), default=0.0),
            )
        )
        for name in members:
            out += blocks[name]
            placed.add(name)
    for name, block in blocks.items():
        if name not in placed:
            out += block
    return out
