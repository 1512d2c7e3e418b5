"""A synthetic but realistic fleet, queue tree, live load and pending backlog for `gpufleet dev bench`.

Everything here is a pure function of a `BenchSize` (which carries the seed) and the `now` the
caller passes in: the same arguments give equal snapshots in any process. Nothing iterates a set
or reads a clock, so Python's per-process string hashing cannot change the result.

The shape of the fleet follows what large shared fleets look like: mostly 8-GPU nodes over a few
GPU models (H100-80GB, A100-80GB, A100-40GB, L4), some MIG pools (`mig:all-balanced`), some
time-sliced pools (`timeslice:4`), a tainted spot pool, a handful of cordoned nodes. About half the
GPU capacity is already held by live runs (whole nodes held by multi-node runs, partly used nodes
left fragmented by small runs). The backlog is dominated by small work (1 GPU, fractions of a
GPU, MIG slices) with a tail of 8-GPU pods and 2-16 node gangs, in the spirit of the pod-size
mixes of the public traces in `shared/data` (openb, Helios).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controlplane.core.snapshot import Decision, LiveRun, PendingDelta, Snapshot
from controlplane.domain.model import (
    CPU,
    GPU,
    MEM,
    Cluster,
    Node,
    NodePool,
    PodAssignment,
    PodSet,
    QueueNode,
    Quota,
    Taint,
    Toleration,
    Workload,
    WorkloadKind,
)
from controlplane.domain.sharing import SharingKind, SharingMode

GPU_TAINT = Taint("nvidia.com/gpu", "present")
SPOT_TAINT = Taint("spot", "true")
SPOT_TOLERATION = Toleration("spot", "Equal", "true")

# Host resources each kind of pod asks for: sized so that a full node of such pods fits the
# host's CPU and memory, as on real GPU instances (CPU and memory are rarely the binding limit).
CPU_PER_GPU, MEM_PER_GPU = 8_000, 32_768
CPU_PER_SLICE, MEM_PER_SLICE = 2_000, 8_192


@dataclass(frozen=True)
class BenchSize:
    pending: int = 100_000
    clusters: int = 20
    nodes: int = 10_000
    queues: int = 200
    seed: int = 0
    occupancy: float = 0.5  # share of GPU capacity already held by live runs, roughly

    def __post_init__(self) -> None:
        if self.clusters < 1 or self.queues < 1 or self.pending < 0:
            raise ValueError("a bench fleet needs at least one cluster and one queue")
        if self.nodes < self.clusters:
            raise ValueError("a bench fleet needs at least one node per cluster")
        if not 0.0 <= self.occupancy <= 1.0:
            raise ValueError("occupancy is a share between 0 and 1")


@dataclass(frozen=True)
class PoolTemplate:
    name: str
    gpu_model: str
    gpus_per_node: int
    sharing: str
    cpu_millis: int
    memory_mib: int
    weight: float  # share of a cluster's nodes, before normalising over the pools it has
    spot: bool = False


POOL_TEMPLATES: tuple[PoolTemplate, ...] = (
    PoolTemplate("h100", "H100-80GB", 8, "exclusive", 192_000, 2_000_000, 0.24),
    PoolTemplate("a100-80", "A100-80GB", 8, "exclusive", 128_000, 1_000_000, 0.18),
    PoolTemplate("a100-40", "A100-40GB", 8, "exclusive", 96_000, 1_000_000, 0.12),
    PoolTemplate("l4", "L4", 8, "exclusive", 192_000, 768_000, 0.10),
    PoolTemplate("l4-small", "L4", 4, "exclusive", 48_000, 192_000, 0.04),
    PoolTemplate("h100-spot", "H100-80GB", 8, "exclusive", 192_000, 2_000_000, 0.08, spot=True),
    PoolTemplate("a100-mig", "A100-80GB", 8, "mig:all-balanced", 128_000, 1_000_000, 0.10),
    PoolTemplate("h100-mig", "H100-80GB", 8, "mig:all-balanced", 192_000, 2_000_000, 0.04),
    PoolTemplate("l4-ts", "L4", 8, "timeslice:4", 96_000, 384_000, 0.06),
)
CORE_POOLS = ("h100", "a100-80")  # every cluster has these; the others appear in most
WHOLE_NODE_RUN_WIDTHS = (1, 1, 1, 2, 2, 4, 8)  # nodes per multi-node run holding whole nodes
EXCLUSIVE_MODELS = ("H100-80GB", "A100-80GB", "A100-40GB", "L4")
PROVIDERS = (("eks", "us-east-1"), ("aks", "westeurope"), ("gke", "us-central1"), ("oke", "eu-frankfurt-1"))
# (name, value, preemptible, share of workloads)
PRIORITY_CLASSES = (("low", 0, True, 0.2), ("batch", 100, True, 0.7), ("production", 1000, False, 0.1))


@dataclass
class _Counters:
    run: int = 0
    workload: int = 0


@dataclass
class SyntheticFleet:
    """Builds the bench snapshot and, after a cycle, the next one (a handful of changes)."""

    size: BenchSize
    now: datetime
    rng: random.Random = field(init=False)
    clusters: tuple[Cluster, ...] = field(init=False)
    nodes: tuple[Node, ...] = field(init=False)
    queue_tree: dict[str, QueueNode] = field(init=False)
    queue_ids: list[str] = field(init=False)
    queue_weights: list[float] = field(init=False)
    fleet_gpus: int = field(init=False)
    _counters: _Counters = field(init=False, default_factory=_Counters)
    max_gang_nodes: int = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.size.seed)
        self.clusters, self.nodes = self._fleet()
        pools = {pool.id: pool for cluster in self.clusters for pool in cluster.pools}
        self._nodes_by_pool: dict[str, list[Node]] = {}
        for node in self.nodes:
            self._nodes_by_pool.setdefault(node.pool_id, []).append(node)
        self.fleet_gpus = sum(pools[node.pool_id].gpus_per_node for node in self.nodes if node.schedulable)
        self.queue_ids, self.queue_weights = self._queue_activity()
        self.queue_tree = self._queue_tree()
        # Gangs larger than an eighth of a cluster would be refused at submit on small test fleets.
        self.max_gang_nodes = max(2, min(16, self.size.nodes // self.size.clusters // 8))

    # --- the fleet ------------------------------------------------------------------------------

    def _fleet(self) -> tuple[tuple[Cluster, ...], tuple[Node, ...]]:
        clusters: list[Cluster] = []
        nodes: list[Node] = []
        base, extra = divmod(self.size.nodes, self.size.clusters)
        for c in range(self.size.clusters):
            provider, region = PROVIDERS[c % len(PROVIDERS)]
            cluster_id = f"c{c:02d}"
            # The first cluster carries every kind of pool, so every request the backlog makes
            # has somewhere to go; the others draw most pools at random.
            templates = [t for t in POOL_TEMPLATES if c == 0 or t.name in CORE_POOLS or self.rng.random() < 0.6]
            counts = _split(base + (1 if c < extra else 0), [t.weight for t in templates])
            pools: list[NodePool] = []
            for template, count in zip(templates, counts, strict=True):
                if count == 0:
                    continue
                pool = NodePool(
                    id=f"{cluster_id}-{template.name}",
                    cluster_id=cluster_id,
                    name=template.name,
                    gpu_model=template.gpu_model,
                    gpus_per_node=template.gpus_per_node,
                    cpu_millis=template.cpu_millis,
                    memory_mib=template.memory_mib,
                    sharing=SharingMode.parse(template.sharing),
                    taints=(GPU_TAINT, SPOT_TAINT) if template.spot else (GPU_TAINT,),
                    labels={"gpufleet.io/pool": template.name},
                    price_per_gpu_hour=round(self.rng.uniform(0.8, 4.0), 2),
                    spot=template.spot,
                    node_count=count,
                )
                pools.append(pool)
                for n in range(count):
                    node_id = f"{pool.id}-n{n:04d}"
                    cordoned = self.rng.random() < 0.003  # a few nodes drained for maintenance
                    nodes.append(Node(node_id, cluster_id, pool.id, node_id, schedulable=not cordoned))
            name = f"{provider}-{region}-{c:02d}"
            clusters.append(Cluster(cluster_id, name, provider if provider != "oke" else "oci", region, tuple(pools)))
        return tuple(clusters), tuple(nodes)

    # --- the queue tree -------------------------------------------------------------------------

    def _queue_activity(self) -> tuple[list[str], list[float]]:
        """Queue ids and how busy each is: a few queues carry most of the load (Zipf-like)."""
        ids = [f"q-{q:03d}" for q in range(self.size.queues)]
        ranks = list(range(1, self.size.queues + 1))
        self.rng.shuffle(ranks)
        return ids, [1.0 / rank**0.8 for rank in ranks]

    def _queue_tree(self) -> dict[str, QueueNode]:
        """Cohorts → teams → queues. Limits over-subscribe the fleet, as they do in practice:
        queues together may ask ~1.4x the fleet, their teams cap that near 1x."""
        n_queues = self.size.queues
        n_teams = max(1, n_queues // 4)
        n_cohorts = max(1, round(n_queues / 50))
        total_weight = sum(self.queue_weights)
        tree: dict[str, QueueNode] = {}
        for k in range(n_cohorts):
            cohort_id = f"cohort-{k:02d}"
            tree[cohort_id] = QueueNode(cohort_id, cohort_id, None)
        team_limits: dict[str, float] = {}
        queue_nodes: list[QueueNode] = []
        for q, queue_id in enumerate(self.queue_ids):
            team_id = f"team-{q % n_teams:03d}"
            share = self.fleet_gpus * self.queue_weights[q] / total_weight
            limit = max(8.0, round(share * self.rng.uniform(0.8, 2.0)))
            amounts: dict[str, float] = {"gpu-eq": limit}
            if self.rng.random() < 0.1:  # some queues also cap their use of the scarcest model
                amounts["H100-80GB"] = max(8.0, round(limit / 2))
            queue_nodes.append(
                QueueNode(
                    queue_id,
                    queue_id,
                    team_id,
                    guaranteed=Quota({"gpu-eq": round(share * 0.6, 1)}),
                    limit=Quota(amounts),
                    weight=self.rng.choice((1.0, 1.0, 2.0)),
                )
            )
            team_limits[team_id] = team_limits.get(team_id, 0.0) + limit
        for t in range(n_teams):
            team_id = f"team-{t:03d}"
            cohort_id = f"cohort-{t % n_cohorts:02d}"
            limit = max(8.0, round(team_limits.get(team_id, 0.0) * 0.7))
            tree[team_id] = QueueNode(team_id, team_id, cohort_id, limit=Quota({"gpu-eq": limit}))
        for queue_node in queue_nodes:
            tree[queue_node.id] = queue_node
        return tree

    def _pick_queue(self) -> str:
        return self.rng.choices(self.queue_ids, self.queue_weights)[0]

    # --- live runs ------------------------------------------------------------------------------

    def live_runs(self) -> tuple[LiveRun, ...]:
        """Runs holding about `occupancy` of the GPUs: whole nodes in multi-node runs, partly used
        nodes fragmented by small runs, the rest empty."""
        # Shares of nodes: `full` wholly held, `partial` about half held (so full + partial / 2
        # is the occupancy). One draw starts a run over `width` nodes, so turn node shares into
        # per-draw chances.
        full = self.size.occupancy * 0.7
        partial = min(1.0 - full, self.size.occupancy * 0.6)
        mean_width = sum(WHOLE_NODE_RUN_WIDTHS) / len(WHOLE_NODE_RUN_WIDTHS)
        full_p = full / (mean_width * (1.0 - full) + full) if full < 1.0 else 1.0
        draws_per_node = full_p * mean_width + 1.0 - full_p
        partial_p = partial * draws_per_node
        runs: list[LiveRun] = []
        for cluster in self.clusters:
            for pool in cluster.pools:
                nodes = [node for node in self._nodes_by_pool.get(pool.id, []) if node.schedulable]
                i = 0
                while i < len(nodes):
                    draw = self.rng.random()
                    if draw < full_p:
                        width = min(self.rng.choice(WHOLE_NODE_RUN_WIDTHS), len(nodes) - i)
                        runs.append(self._whole_node_run(cluster, pool, nodes[i : i + width]))
                        i += width
                        continue
                    if draw < full_p + partial_p:
                        runs.extend(self._partial_runs(cluster, pool, nodes[i]))
                    i += 1
        return tuple(runs)

    def _live_run(self, cluster: Cluster, assignments: list[PodAssignment]) -> LiveRun:
        self._counters.run += 1
        _, value, preemptible, _ = self._priority_class()
        return LiveRun(
            workload_id=f"live-{self._counters.run:06d}",
            queue_id=self._pick_queue(),
            cluster_id=cluster.id,
            priority=value,
            assignments=tuple(assignments),
            run_id=f"run-{self._counters.run:06d}",
            preemptible=preemptible,
            started_at=self.now - timedelta(minutes=self.rng.randint(1, 24 * 60)),
            admitted_at=self.now - timedelta(minutes=self.rng.randint(24 * 60, 25 * 60)),
        )

    def _whole_node_run(self, cluster: Cluster, pool: NodePool, nodes: Sequence[Node]) -> LiveRun:
        capacity = pool.node_capacity()
        assignments = []
        for index, node in enumerate(nodes):
            if pool.sharing.kind is SharingKind.EXCLUSIVE:
                demand = _host(pool.gpus_per_node, CPU_PER_GPU, MEM_PER_GPU) | {GPU: pool.gpus_per_node}
            else:  # a whole shared or MIG node held by one pod: every slot of it
                slots = {k: v for k, v in capacity.items() if k not in (CPU, MEM)}
                demand = _host(pool.gpus_per_node, CPU_PER_GPU, MEM_PER_GPU) | slots
            assignments.append(PodAssignment("workers", index, node.id, demand))
        return self._live_run(cluster, assignments)

    def _partial_runs(self, cluster: Cluster, pool: NodePool, node: Node) -> list[LiveRun]:
        """Small runs that leave the node partly free (the fragmentation a real fleet has)."""
        capacity = pool.node_capacity()
        runs = []
        if pool.sharing.kind is SharingKind.EXCLUSIVE:
            used = self.rng.randint(1, pool.gpus_per_node - 1)
            while used > 0:
                size = min(used, self.rng.choice((1, 1, 2, 4)))
                demand = _host(size, CPU_PER_GPU, MEM_PER_GPU) | {GPU: size}
                runs.append(self._live_run(cluster, [PodAssignment("main", 0, node.id, demand)]))
                used -= size
        else:
            for key, count in sorted(capacity.items()):
                if key in (CPU, MEM):
                    continue
                for _ in range(self.rng.randint(0, count)):
                    demand = _host(1, CPU_PER_SLICE, MEM_PER_SLICE) | {key: 1}
                    runs.append(self._live_run(cluster, [PodAssignment("server", 0, node.id, demand)]))
        return runs

    # --- pending workloads ----------------------------------------------------------------------

    def _priority_class(self) -> tuple[str, int, bool, float]:
        return self.rng.choices(PRIORITY_CLASSES, [c[3] for c in PRIORITY_CLASSES])[0]

    def workloads(self, count: int) -> list[Workload]:
        return [self._workload() for _ in range(count)]

    def _workload(self) -> Workload:
        self._counters.workload += 1
        seq = self._counters.workload
        maker = self.rng.choices(_SHAPES, [w for w, _ in _SHAPES])[0][1]
        kind, pod_sets, min_available, isolation = maker(self)
        name, value, preemptible, _ = self._priority_class()
        queue_id = self._pick_queue()
        team_id = self.queue_tree[queue_id].parent_id or ""
        return Workload(
            id=f"wl-{seq:07d}",
            team_id=team_id,
            queue_id=queue_id,
            name=f"job-{seq}",
            priority_class=name,
            priority=value,
            kind=kind,
            pod_sets=tuple(pod_sets),
            min_available=min_available if min_available else sum(ps.replicas for ps in pod_sets),
            requires_isolation=isolation,
            tolerations=(SPOT_TOLERATION,) if self.rng.random() < 0.25 else (),
            duration_seconds=float(self.rng.choice((600, 3_600, 4 * 3_600, 24 * 3_600))),
            created_seq=seq,
            preemptible=preemptible,
        )

    def pick_models(self, chance: float) -> tuple[str, ...]:
        return (self.rng.choice(EXCLUSIVE_MODELS),) if self.rng.random() < chance else ()

    # --- snapshots ------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        live = self.live_runs()
        return Snapshot(
            clusters=self.clusters,
            nodes=self.nodes,
            queue_tree=self.queue_tree,
            pending=tuple(self.workloads(self.size.pending)),
            live_runs=live,
        )

    def next_snapshot(self, snapshot: Snapshot, decision: Decision, finished: int = 5, arrivals: int = 5) -> Snapshot:
        """The snapshot of the following cycle: the decision's admissions are live runs, its
        evictions are gone, a few runs finished, a few workloads arrived. (An evicted gang would
        queue again; the bench leaves that out, a handful among the whole backlog.) It carries the
        pending gangs' delta, as the live snapshot cache's snapshots do."""
        by_id = {w.id: w for w in snapshot.pending}
        admitted = {a.workload_id for a in decision.admissions}
        evicted = {e.run_id or e.workload_id for e in decision.evictions}
        new_runs = tuple(
            LiveRun(
                workload_id=a.workload_id,
                queue_id=by_id[a.workload_id].queue_id,
                cluster_id=a.cluster_id,
                priority=by_id[a.workload_id].priority,
                assignments=a.assignments,
                run_id=f"run-{a.workload_id}",
                preemptible=by_id[a.workload_id].preemptible,
                admitted_at=self.now,
                lent_to=a.lent_to,
            )
            for a in decision.admissions
        )
        live = [run for run in snapshot.live_runs if (run.run_id or run.workload_id) not in evicted]
        live.extend(new_runs)
        for index in sorted(self.rng.sample(range(len(live)), min(finished, len(live))), reverse=True):
            del live[index]
        arrived = tuple(self.workloads(arrivals))
        pending = tuple(w for w in snapshot.pending if w.id not in admitted) + arrived
        # What changed in the pending gangs, as the live snapshot cache tells the scheduler.
        delta = PendingDelta(snapshot.pending, arrived, frozenset(admitted))
        tree = snapshot.queue_tree
        return Snapshot(snapshot.clusters, snapshot.nodes, tree, pending, tuple(live), pending_delta=delta)


def build_bench(size: BenchSize, now: datetime) -> tuple[SyntheticFleet, Snapshot]:
    fleet = SyntheticFleet(size, now)
    return fleet, fleet.snapshot()


def _split(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainders get the leftovers)."""
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _host(units: int, cpu: int, mem: int) -> dict[str, int]:
    return {CPU: units * cpu, MEM: units * mem}


# --- the backlog's shape mix ----------------------------------------------------------------------

Shape = tuple[WorkloadKind, list[PodSet], int, bool]  # kind, pod sets, min_available (0 = all), isolation


def _gpu_pods(name: str, replicas: int, gpus: int, models: tuple[str, ...] = ()) -> PodSet:
    return PodSet(
        name, replicas, gpus=gpus, cpu_millis=gpus * CPU_PER_GPU, memory_mib=gpus * MEM_PER_GPU, gpu_models=models
    )


def _one_gpu(f: SyntheticFleet) -> Shape:
    return WorkloadKind.TRAINING, [_gpu_pods("main", 1, 1, f.pick_models(0.25))], 0, False


def _fraction(f: SyntheticFleet) -> Shape:
    fraction = f.rng.choice((0.25, 0.25, 0.5))
    pod = PodSet("main", 1, gpu_fraction=fraction, cpu_millis=CPU_PER_SLICE, memory_mib=MEM_PER_SLICE)
    return WorkloadKind.INTERACTIVE, [pod], 0, False


def _mig(f: SyntheticFleet) -> Shape:
    profile = f.rng.choice(("1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb"))
    replicas = f.rng.choice((1, 1, 2))
    pod = PodSet("server", replicas, mig_profile=profile, cpu_millis=CPU_PER_SLICE, memory_mib=MEM_PER_SLICE)
    return WorkloadKind.INFERENCE, [pod], 0, True


def _few_gpus(f: SyntheticFleet) -> Shape:
    return WorkloadKind.TRAINING, [_gpu_pods("main", 1, f.rng.choice((2, 4)), f.pick_models(0.3))], 0, False


def _full_node(f: SyntheticFleet) -> Shape:
    return WorkloadKind.TRAINING, [_gpu_pods("main", 1, 8, f.pick_models(0.4))], 0, False


def _inference_replicas(f: SyntheticFleet) -> Shape:
    return WorkloadKind.INFERENCE, [_gpu_pods("server", f.rng.randint(2, 4), 1)], 0, True


def _launcher_gang(f: SyntheticFleet) -> Shape:
    nodes = min(f.rng.choice((2, 2, 2, 4, 4, 8, 16)), f.max_gang_nodes)
    models = ("H100-80GB",) if f.rng.random() < 0.5 else ()
    launcher = PodSet("launcher", 1, cpu_millis=4_000, memory_mib=16_384)
    return WorkloadKind.TRAINING, [launcher, _gpu_pods("workers", nodes, 8, models)], 0, False


def _workers_gang(f: SyntheticFleet) -> Shape:
    nodes = min(f.rng.randint(2, 4), f.max_gang_nodes)
    return WorkloadKind.TRAINING, [_gpu_pods("workers", nodes, 8, f.pick_models(0.5))], 0, False


def _elastic_gang(f: SyntheticFleet) -> Shape:
    del f  # always the same shape: 4 nodes wanted, 2 enough to start
    return WorkloadKind.BATCH, [_gpu_pods("workers", 4, 8)], 2, False


_SHAPES: tuple[tuple[float, Callable[[SyntheticFleet], Shape]], ...] = (
    (0.28, _one_gpu),
    (0.14, _fraction),
    (0.10, _mig),
    (0.12, _few_gpus),
    (0.12, _full_node),
    (0.06, _inference_replicas),
    (0.10, _launcher_gang),
    (0.06, _workers_gang),
    (0.02, _elastic_gang),
)
