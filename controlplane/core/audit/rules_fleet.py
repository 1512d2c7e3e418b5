"""Rules about how the fleet is set up: pools and their taints, the queue tree, priority classes,
clusters' gang mechanism and telemetry. Each takes facts and returns findings; none does I/O."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from controlplane.core.audit.facts import AuditFacts, PoolFact, TreeFact
from controlplane.core.audit.findings import (
    ADMINS,
    FLEET,
    ClassPolicy,
    Finding,
    Fix,
    NoGuarantee,
    NoLimit,
    NonGpuPods,
    NoTelemetry,
    ObjectRef,
    PoolUntainted,
    Rule,
    Severity,
    TimeslicePoolOpen,
    team_of,
)
from controlplane.domain.model import GPU_EQ
from controlplane.domain.sharing import SharingKind

# Effects that keep a pod that does not tolerate the taint off the node. PreferNoSchedule is only a
# preference: kube-scheduler still places other pods there when the cluster is full.
KEEPS_PODS_OFF = frozenset({"NoSchedule", "NoExecute"})
MAX_SAMPLE = 8


def _pool_ref(pool: PoolFact) -> ObjectRef:
    return ObjectRef("pool", pool.key)


def untainted_gpu_pools(facts: AuditFacts) -> list[Finding]:
    """A GPU pool needs a taint that keeps pods off unless they tolerate it (any key: AKS's
    `sku=gpu:NoSchedule` counts as well as `nvidia.com/gpu`), or CPU-only pods fill its GPU nodes."""
    found = []
    for pool in facts.pools:
        if pool.gpus_per_node <= 0 or any(t.effect in KEEPS_PODS_OFF for t in pool.taints):
            continue
        taints = tuple(f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in pool.taints)
        found.append(
            Finding(
                Rule.GPU_POOL_UNTAINTED,
                Severity.HIGH,
                (_pool_ref(pool),),
                PoolUntainted(gpus=pool.gpus, taints=taints),
                Fix.ADD_GPU_TAINT,
                FLEET,
            )
        )
    return found


def non_gpu_pods_on_gpu_nodes(facts: AuditFacts) -> list[Finding]:
    """Pods that ask for no GPU on GPU nodes (seen by the inventory), one finding per pool. Admins
    only: the pods' names are other tenants' objects."""
    by_pool: dict[tuple[str, str], list[tuple[str, int, tuple[str, ...]]]] = defaultdict(list)
    for seen in facts.node_pods:
        if seen.count > 0:
            by_pool[(seen.cluster, seen.pool)].append((seen.node, seen.count, seen.sample))
    found = []
    for (cluster, pool), nodes in sorted(by_pool.items()):
        nodes.sort()
        sample = tuple(name for _, _, names in nodes for name in names)[:MAX_SAMPLE]
        objects = (ObjectRef("pool", f"{cluster}/{pool}"), *(ObjectRef("node", f"{cluster}/{n}") for n, _, _ in nodes))
        found.append(
            Finding(
                Rule.NON_GPU_PODS_ON_GPU_NODES,
                Severity.WARNING,
                objects[: 1 + MAX_SAMPLE],
                NonGpuPods(nodes=len(nodes), pods=sum(c for _, c, _ in nodes), sample=sample),
                Fix.KEEP_NON_GPU_PODS_OFF,
                ADMINS,
            )
        )
    return found


def _bars(node: TreeFact | None, model: str) -> bool:
    """Whether this node of the tree keeps its work off GPUs of `model` (a limit of 0)."""
    if node is None:
        return False
    return node.limit.get(model) == 0 or node.limit.get(GPU_EQ) == 0


def timeslice_pools_open_to_all(facts: AuditFacts) -> list[Finding]:
    """Time-slicing gives tenants no memory or fault isolation. In a fleet that has MIG, a
    time-sliced pool every team may use (no team's, cohort's or all of its queues' limit for the
    pool's GPU model is 0) invites multi-tenant work onto it. One team is no multi-tenancy."""
    mig = facts.mig_pools()
    teams = [t for t in facts.tree if t.level == "team"]
    if not mig or len(teams) < 2:
        return []
    cohorts = {t.name: t for t in facts.tree if t.level == "cohort"}
    queues: dict[str, list[TreeFact]] = defaultdict(list)
    for q in facts.tree:
        if q.level == "queue" and q.parent is not None:
            queues[q.parent].append(q)
    found = []
    for pool in facts.pools:
        if pool.sharing.kind is not SharingKind.TIMESLICE:
            continue
        model = pool.gpu_model
        open_to = [
            t
            for t in teams
            if not _bars(t, model)
            and not _bars(cohorts.get(t.parent or ""), model)
            and any(not _bars(q, model) for q in queues[t.name])
        ]
        if len(open_to) < len(teams):
            continue
        found.append(
            Finding(
                Rule.TIMESLICE_POOL_OPEN_TO_ALL,
                Severity.WARNING,
                (_pool_ref(pool),),
                TimeslicePoolOpen(
                    sharing=str(pool.sharing), teams=len(teams), mig_pools=tuple(sorted(p.key for p in mig))
                ),
                Fix.RESTRICT_TIMESLICE_POOL,
                FLEET,
            )
        )
    return found


def missing_limits(facts: AuditFacts) -> list[Finding]:
    """A team (or queue) with no limit can take the whole fleet: the "no quota, one team hoards"
    mistake. A queue bounded by its team or cohort is only informed; unbounded is a warning."""
    by_name = {(t.level, t.name): t for t in facts.tree}
    found = []
    for node in facts.tree:
        if node.level not in ("team", "queue") or node.limit:
            continue
        chain: list[TreeFact] = []
        parent_level = "team" if node.level == "queue" else "cohort"
        parent = by_name.get((parent_level, node.parent or ""))
        while parent is not None:
            chain.append(parent)
            parent = by_name.get(("cohort", parent.parent or "")) if parent.level == "team" else None
        bounded_by = next((p.level for p in chain if p.limit), "")
        team = node.name if node.level == "team" else (node.parent or "")
        found.append(
            Finding(
                Rule.TEAM_WITHOUT_LIMIT if node.level == "team" else Rule.QUEUE_WITHOUT_LIMIT,
                Severity.INFO if bounded_by else Severity.WARNING,
                (ObjectRef(node.level, node.name),),
                NoLimit(level=node.level, bounded_by=bounded_by),
                Fix.SET_LIMIT,
                team_of(team),
            )
        )
    return found


def classes_without_preemption_policy(facts: AuditFacts) -> list[Finding]:
    """In gpufleet a priority class's preemption policy is two fields: `preemptible` (may the
    scheduler evict its runs at all) and `min_runtime_seconds` (how long a started run is safe).
    A non-preemptible class has a policy (never evicted; its limits bound it). A preemptible class
    with no minimum runtime has none: its gangs may be evicted the moment they start, so a busy
    fleet can thrash them and every eviction throws away the start-up (image pull, checkpoint load).
    """
    return [
        Finding(
            Rule.CLASS_WITHOUT_PREEMPTION_POLICY,
            Severity.WARNING,
            (ObjectRef("priority-class", c.name),),
            ClassPolicy(value=c.value, preemptible=c.preemptible, min_runtime_seconds=c.min_runtime_seconds),
            Fix.SET_PREEMPTION_POLICY,
            FLEET,
        )
        for c in facts.classes
        if c.preemptible and c.min_runtime_seconds <= 0
    ]


def fleet_without_guarantee(facts: AuditFacts) -> list[Finding]:
    """Without any guarantee nothing is ever reclaimed from a borrower: the first team to fill the
    fleet keeps it. A guarantee held by a team or cohort counts (its queues share it)."""
    queues = [t for t in facts.tree if t.level == "queue"]
    if not queues or any(v > 0 for t in facts.tree for v in t.guaranteed.values()):
        return []
    return [
        Finding(
            Rule.FLEET_WITHOUT_GUARANTEE,
            Severity.WARNING,
            (),
            NoGuarantee(queues=len(queues)),
            Fix.SET_GUARANTEE,
            FLEET,
        )
    ]


def clusters_without_telemetry(facts: AuditFacts, now: datetime) -> list[Finding]:
    """A cluster whose running runs (running for longer than `stale_seconds`, so they had time to
    report) have no telemetry window that recent sends no DCGM data: its idle GPUs are never seen."""
    stale = timedelta(seconds=facts.stale_seconds)
    running: dict[str, list[datetime | None]] = defaultdict(list)
    for run in facts.runs:
        if run.running and run.started_at is not None and now - run.started_at > stale:
            running[run.cluster].append(run.last_window_end)
    found = []
    for cluster, windows in sorted(running.items()):
        seen = [w for w in windows if w is not None]
        newest = max(seen) if seen else None
        if newest is not None and now - newest <= stale:
            continue
        found.append(
            Finding(
                Rule.CLUSTER_WITHOUT_TELEMETRY,
                Severity.HIGH,
                (ObjectRef("cluster", cluster),),
                NoTelemetry(running_runs=len(windows), last_window_at=newest, stale_seconds=facts.stale_seconds),
                Fix.DEPLOY_TELEMETRY,
                FLEET,
            )
        )
    return found
