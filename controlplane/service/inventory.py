"""Node inventory reported by clusters on `<prefix>.cluster.<cluster>.inventory`.

A report lists the cluster's nodes as the cluster sees them. For every node the fleet already knows
by name, `schedulable` becomes `node.schedulable and node.ready`: a cordoned or NotReady node takes no
new work, while runs already on it are left alone. Nodes the fleet does not know are reported back,
never created (pools and their nodes come from fleet sync).

Reports can arrive out of order. The `observed_at` of the last applied report of a cluster is kept in
that cluster's `kube_settings` under `INVENTORY_MARK` (no schema change; the composition root drops
the key before building the cluster's Kubernetes settings). A report not newer than it is ignored,
and so is one stamped more than `MAX_CLOCK_SKEW` after the control plane's clock (it would hold back
every later report).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import AwareDatetime, Field

from controlplane.service.commands import Strict
from controlplane.service.ports import UnitOfWork

INVENTORY_MARK = "inventory_observed_at"
MAX_CLOCK_SKEW = timedelta(minutes=5)


def inventory_subject(prefix: str, cluster: str) -> str:
    return f"{prefix}.cluster.{cluster}.inventory"


class InventoryNode(Strict):
    name: str = Field(min_length=1, max_length=253)
    pool: str = Field(default="", max_length=63)  # from the node's pool label; empty when it has none
    schedulable: bool  # not cordoned (spec.unschedulable is false)
    ready: bool  # the Ready condition is True
    gpu_product: str = Field(default="", max_length=100)
    gpu_count: int = Field(default=0, ge=0, le=1024)
    allocatable: dict[str, int] = Field(default_factory=dict, max_length=64)


class InventoryReport(Strict):
    """What a cluster (its agent, the control plane's own watcher, or a simulation) says about its nodes."""

    observed_at: AwareDatetime
    nodes: list[InventoryNode] = Field(max_length=10_000)


def inventory_msg_id(cluster: str, observed_at: datetime) -> str:
    return f"inventory:{cluster}:{int(observed_at.timestamp() * 1000)}"


def apply_inventory(uow: UnitOfWork, cluster: str, report: InventoryReport, now: datetime) -> str:
    """Apply one report inside the caller's transaction; returns what happened, for logs and tests."""
    view = uow.admin.get_cluster(cluster)
    if view is None:
        return "unknown cluster"
    if report.observed_at > now + MAX_CLOCK_SKEW:
        return "report from the future ignored"  # it would hold back every later report
    last = view.kubernetes.get(INVENTORY_MARK)
    if isinstance(last, str) and datetime.fromisoformat(last) >= report.observed_at:
        return f"stale report (last applied {last})"
    wanted = {node.name: node.schedulable and node.ready for node in report.nodes}
    mark = {INVENTORY_MARK: report.observed_at.isoformat()}
    changed, unknown = uow.admin.apply_node_schedulable(view.id, wanted, mark)
    result = f"{changed} nodes changed"
    if unknown:
        shown = ", ".join(sorted(unknown)[:20])
        result += f"; unknown nodes: {shown}" + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
    return result
