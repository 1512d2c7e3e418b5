"""What the service layer reads and writes about real (non-simulated) clusters: plain records and the
repository protocol the SQL adapter implements. No secrets travel through here: locators, settings and
the file name of a user kubeconfig only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from controlplane.core.decision import EndCause
from controlplane.service.cluster_specs import CLOUD_PROVIDERS, PoolSpec


@dataclass(frozen=True)
class CloudClusterRecord:
    """A registered cluster that is not simulated (`kubernetes` or a cloud provider)."""

    id: str
    name: str
    provider: str
    region: str
    account: str = ""
    cloud_cluster: str = ""
    resource_group: str = ""
    cloud_cluster_id: str = ""
    kube_settings: Mapping[str, Any] = field(default_factory=dict)
    kubeconfig_ref: str = ""
    sync_state: str = "ready"
    synced_at: datetime | None = None
    pool_prices: Mapping[str, float] = field(default_factory=dict)

    @property
    def is_cloud(self) -> bool:
        return self.provider in CLOUD_PROVIDERS


@dataclass(frozen=True)
class SyncedPool:
    """One pool as fleet sync found it: the gpufleet pool, its cloud bounds and its nodes' names."""

    spec: PoolSpec
    min_size: int
    max_size: int | None
    instance_type: str
    cloud_pool_id: str
    node_names: tuple[str, ...]
    # What the pool's nodes advertise per demand key (gpu, share, mig:<profile>); empty: the defaults.
    resource_names: Mapping[str, str] = field(default_factory=dict)
    max_shares_per_pod: int = 0  # 1 when the device plugin refuses more shares per container; 0: no limit


@dataclass(frozen=True)
class PoolChanges:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    resized: tuple[tuple[str, int, int], ...] = ()  # (pool, before, after)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.resized)


@dataclass(frozen=True)
class CloudPoolRecord:
    """A pool of a cloud cluster as the autoscaler sees it."""

    id: str
    cluster_id: str
    cluster: str
    provider: str
    name: str
    node_count: int
    min_size: int
    max_size: int | None
    scale_target: int | None
    scale_requested_at: datetime | None
    idle_since: datetime | None
    busy: bool  # live runs hold nodes of this pool


@dataclass(frozen=True)
class LostRun:
    """A live run that holds a node its cluster no longer has."""

    run_id: str
    workload_id: str
    queue: str
    node: str


@dataclass(frozen=True)
class StalledRun:
    run_id: str
    workload_id: str
    queue: str
    cluster: str
    dispatched_at: datetime


class CloudRepository(Protocol):
    def set_cluster_meta(
        self,
        cluster_id: str,
        *,
        account: str,
        cloud_cluster: str,
        resource_group: str,
        cloud_cluster_id: str,
        kube_settings: Mapping[str, Any],
        kubeconfig_ref: str,
        sync_state: str,
        pool_prices: Mapping[str, float],
    ) -> None: ...

    def real_clusters(self) -> list[CloudClusterRecord]:
        """Every cluster whose provider is not `sim`, by name."""
        ...

    def sync_pools(
        self,
        cluster_id: str,
        pools: Sequence[SyncedPool],
        issues: Sequence[str],
        now: datetime,
        cloud_synced: bool = True,
    ) -> PoolChanges:
        """Make the cluster's pools and nodes what `pools` says, keeping the ids of pools and nodes that
        stay (runs refer to them); nodes that runs refer to are cordoned rather than deleted.
        `cloud_synced` marks the cluster synced with its cloud (fleet sync), not only with its nodes."""
        ...

    def live_runs_on_nodes(self, cluster_id: str, node_names: Sequence[str]) -> list[LostRun]:
        """Live runs holding any of the cluster's nodes named, one entry per run (its first such node)."""
        ...

    def sync_failed(self, cluster_id: str, error: str) -> None: ...

    def cloud_pools(self) -> list[CloudPoolRecord]: ...

    def set_scale_target(self, pool_id: str, target: int, now: datetime) -> None: ...

    def set_idle_since(self, pool_id: str, since: datetime | None) -> None: ...

    def pending_kinds(self) -> dict[str, str]:
        """workload id -> kind of its pending reason (`PendingKind`, "" if none yet), for queued workloads."""
        ...

    def stalled_runs(self, dispatched_before: datetime) -> list[StalledRun]:
        """Runs applied to their cluster before `dispatched_before` whose gang is not running yet."""
        ...

    def undispatched_runs(self, admitted_before: datetime) -> list[StalledRun]:
        """Live runs admitted before `admitted_before` that were never applied to their cluster
        (`dispatched_at` of the result holds the admission time)."""
        ...

    def applied_runs(self, cluster: str, dispatched_before: datetime) -> list[StalledRun]:
        """Live runs of `cluster` applied to it before `dispatched_before`, running or not: those whose
        objects the cluster must still hold."""
        ...

    def requeue_run(self, run_id: str, message: str, cause: EndCause, now: datetime, running_too: bool = False) -> bool:
        """End a live, not-yet-running run (or, with `running_too`, a running one as well) as `preempted`:
        its workload goes back to its queue, and its objects are scheduled for teardown."""
        ...
