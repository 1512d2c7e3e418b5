"""Could this gang ever run in this fleet? The submit-time check, and its per-process memo.

Every submit asks it, and answering from scratch means reading every cluster, pool and node and
placing the gang on the empty fleet: tens of milliseconds at fleet scale, paid per submit. The memo
(`FleetFit`) keeps one read of the fleet for `ttl` seconds and one answer per gang shape on it.

Staleness is only ever allowed to err towards accepting: a refusal found on a remembered fleet is
judged again on a fresh read before it is given, so a cluster registered a moment ago is never
ignored. An acceptance on a fleet that changed since costs nothing worse than what the scheduler
already handles: the gang waits with a precise reason.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from controlplane.core.capacity import FleetCapacity, empty_fleet, never_fits
from controlplane.domain.model import Cluster, Node, NodePool, PodSet, Workload
from controlplane.service.autoscale import nodes_at_max_size
from controlplane.service.ports import UnitOfWork

# Staleness only ever errs towards accepting (see above), so one read may serve a minute: at 10,000
# nodes a read and its capacity model cost about a second of the API's CPU.
DEFAULT_TTL = 60.0
MAX_SHAPES = 4096  # answers kept per fleet read; the memo starts afresh beyond that


@dataclass
class _FleetRead:
    clusters: tuple[Cluster, ...]
    nodes: tuple[Node, ...]
    grown: tuple[Node, ...]  # `nodes` plus every cloud pool grown to its max size
    read_at: float
    answers: dict[Workload, str | None] = field(default_factory=dict)
    _empty: FleetCapacity | None = None
    _empty_grown: FleetCapacity | None = None

    @property
    def empty(self) -> FleetCapacity:
        if self._empty is None:
            self._empty = empty_fleet(self.clusters, self.nodes)
        return self._empty

    @property
    def empty_grown(self) -> FleetCapacity:
        if self._empty_grown is None:
            self._empty_grown = empty_fleet(self.clusters, self.grown)
        return self._empty_grown

    @property
    def pools(self) -> list[NodePool]:
        return [p for c in self.clusters for p in c.pools]


def _read(uow: UnitOfWork, now: float) -> _FleetRead:
    clusters, nodes = uow.admin.fleet()
    return _FleetRead(clusters, nodes, nodes_at_max_size(nodes, uow.cloud.cloud_pools()), now)


def _shape(workload: Workload) -> Workload:
    """The workload without what cannot change where it fits (its identity and names)."""
    return dataclasses.replace(workload, id="", team_id="", queue_id="", name="", created_seq=0)


def refusal(fleet: _FleetRead, workload: Workload) -> str | None:
    """Why `workload` can never run in `fleet` (a sentence for the submitter), or None."""
    offered = {key[4:] for p in fleet.pools for key in p.node_capacity() if key.startswith("mig:")}
    for pod_set in workload.pod_sets:
        if pod_set.mig_profile and pod_set.mig_profile not in offered:
            return f"pod set {pod_set.name}: no pool in the fleet offers MIG profile {pod_set.mig_profile}" + (
                f" (offered: {', '.join(sorted(offered))})" if offered else ""
            )
    share_refusal = _share_no_pool_serves(workload.pod_sets, fleet.pools)
    if share_refusal is not None:
        return share_refusal
    reason = never_fits(fleet.empty, workload)
    # Cloud pools grow on demand (the autoscaler): judged with each one at its max size.
    if reason is not None and len(fleet.grown) > len(fleet.nodes):
        reason = never_fits(fleet.empty_grown, workload)
    return reason


def _share_no_pool_serves(pod_sets: Sequence[PodSet], pools: Sequence[NodePool]) -> str | None:
    """A GPU fraction that every shared pool it could use refuses per container is refused at submit,
    with the device plugin's reason, rather than left queued with a vaguer one."""
    for pod_set in pod_sets:
        if not pod_set.gpu_fraction:
            continue
        shared = [
            p for p in pools if p.sharing.shared and (not pod_set.gpu_models or p.gpu_model in pod_set.gpu_models)
        ]
        refusals = [r for p in shared if (r := pod_set.share_limit_refusal(p)) is not None]
        if shared and len(refusals) == len(shared):
            return refusals[0]
    return None


class FleetFit:
    """The per-process memo of `refusal` (thread-safe: the API answers from a thread pool)."""

    def __init__(self, ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.clock = ttl, clock
        self._fleet: _FleetRead | None = None
        self._lock = threading.Lock()
        self.reads = 0  # fleet reads, for tests and benchmarks

    def refusal(self, uow: UnitOfWork, workload: Workload) -> str | None:
        fleet, fresh = self._current(uow, force=False)
        answer = self._answer(fleet, workload)
        if answer is not None and not fresh:  # a remembered fleet: judge the refusal on a fresh read
            fleet, _ = self._current(uow, force=True)
            answer = self._answer(fleet, workload)
        return answer

    def _current(self, uow: UnitOfWork, force: bool) -> tuple[_FleetRead, bool]:
        """The fleet to judge on, and whether it was read for this call."""
        now = self.clock()
        with self._lock:
            fleet = self._fleet
            if not force and fleet is not None and now - fleet.read_at < self.ttl:
                return fleet, False
            fleet = self._fleet = _read(uow, now)
            self.reads += 1
            return fleet, True

    def _answer(self, fleet: _FleetRead, workload: Workload) -> str | None:
        key = _shape(workload)
        if key in fleet.answers:
            return fleet.answers[key]
        with self._lock:  # one placement search at a time on the shared capacity model
            answer = refusal(fleet, workload)
            if len(fleet.answers) >= MAX_SHAPES:
                fleet.answers.clear()
            fleet.answers[key] = answer
        return answer


def refusal_now(uow: UnitOfWork, workload: Workload) -> str | None:
    """`refusal` on a fresh read of the fleet, for callers without a memo."""
    return refusal(_read(uow, 0.0), workload)
