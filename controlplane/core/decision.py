"""What a scheduling cycle decides, as data: admissions, evictions and pending reasons.

Decisions carry kinds and the structured facts behind them (queue and cluster *names*, limits,
amounts, the beneficiary, the reservation); the sentences people read are rendered at the edge by
one renderer (`controlplane.service.wording`). Nothing downstream parses prose: the SQL adapter,
the reports and the autoscaler read kinds (`PendingReason.kind`, `Eviction.kind`, a run's
`EndCause`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from controlplane.domain.model import PodAssignment


class EvictionKind(StrEnum):
    """Why the scheduler stops a live run (the actions in their fixed order)."""

    IDLE = "idle"  # its GPUs were measured idle and a waiting gang takes them
    RECLAIM = "reclaim"  # its queue borrowed; a queue under its guarantee takes it back
    PREEMPT = "preempt"  # a higher-priority gang of its own queue needs the room
    REBALANCE = "rebalance"  # opt-in: a queue below its fair share takes it
    # It ran on capacity a reservation lent while its owner waited; the owner takes it back.
    TAKE_BACK = "take-back"

    @property
    def end_cause(self) -> EndCause:
        return _END_CAUSE_OF_EVICTION[self]


class EndCause(StrEnum):
    """Why a run ended: stored with the run (`runs.end_cause`), never parsed from its message.

    The values are the words the run messages and events have always started with.
    """

    PREEMPTED = "preempted"
    RECLAIMED = "reclaimed"
    RECLAIMED_IDLE = "reclaimed-idle"
    REBALANCED = "rebalanced"
    TAKEN_BACK = "taken-back"  # it ran on lent reserved capacity, and the reservation's owner took it
    NODE_LOST = "node-lost"  # a node it held left its cluster
    OBJECTS_LOST = "objects-lost"  # its objects vanished from its cluster (deleted behind gpufleet's back)
    GANG_START_TIMEOUT = "gang-start-timeout"  # dispatched, but its pods never all ran in time
    DISPATCH_TIMEOUT = "dispatch-timeout"  # its cluster never took it
    DISPATCH_FAILED = "dispatch-failed"  # its cluster refused it for good
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a pod failed
    CANCELLED = "cancelled"


_END_CAUSE_OF_EVICTION = {
    EvictionKind.IDLE: EndCause.RECLAIMED_IDLE,
    EvictionKind.RECLAIM: EndCause.RECLAIMED,
    EvictionKind.PREEMPT: EndCause.PREEMPTED,
    EvictionKind.REBALANCE: EndCause.REBALANCED,
    EvictionKind.TAKE_BACK: EndCause.TAKEN_BACK,
}


@dataclass(frozen=True)
class Admission:
    workload_id: str
    cluster_id: str
    assignments: tuple[PodAssignment, ...]
    # Admitted on capacity held for this waiting gang (id) and lent until it is taken back.
    lent_to: str | None = None

    @property
    def pod_counts(self) -> dict[str, int]:
        """Pods admitted per pod set (pod set name -> count), in the order of the assignments: fewer
        than a pod set's replicas when the gang was admitted partially (down to its minimums). Only
        these pods are dispatched, and the counts hold for the whole run."""
        counts: dict[str, int] = {}
        for a in self.assignments:
            counts[a.pod_set] = counts.get(a.pod_set, 0) + 1
        return counts


@dataclass(frozen=True)
class Eviction:
    """A live run the decision stops, and for whom; its workload goes back to its queue."""

    workload_id: str
    run_id: str
    kind: EvictionKind
    beneficiary: str  # id of the workload that needs the capacity
    beneficiary_name: str = ""
    beneficiary_queue: str = ""  # queue names, for people
    beneficiary_priority: int = 0
    victim_queue: str = ""
    victim_priority: int = 0

    @property
    def end_cause(self) -> EndCause:
        return self.kind.end_cause


class PendingKind(StrEnum):
    """The kind of reason a gang is left pending (also stored as `pending_reasons.kind`)."""

    NO_FIT = "no-fit"  # no cluster has room for it now
    NEVER_FITS = "never-fits"  # no cluster could hold it even empty, as the fleet stands
    ISOLATION = "isolation"  # only time-sliced pools offer what an isolated gang asks for
    FAIR_SHARE = "fair-share"  # it fitted at the start of the cycle; queues ahead took the room
    QUOTA_LIMIT = "quota-limit"
    QUOTA_BORROWING = "quota-borrowing"
    QUOTA_GUARANTEE = "quota-guarantee"  # non-preemptible work beyond its queue's guarantee
    QUOTA_NOT_LENT = "quota-not-lent"  # the rest of the free capacity is guarantee not lent
    QUOTA_UNUSABLE = "quota-unusable"  # its queue tree holds a quota no arithmetic can use
    BEHIND = "behind"  # its queue's first gangs are decided this cycle; it waits its turn
    ERROR = "error"  # scheduling this gang raised
    NOT_CONSIDERED = "not-considered"  # too many gangs failed before its turn

    @property
    def is_quota(self) -> bool:
        return self in _QUOTA_KINDS


_QUOTA_KINDS = frozenset(
    {
        PendingKind.QUOTA_LIMIT,
        PendingKind.QUOTA_BORROWING,
        PendingKind.QUOTA_GUARANTEE,
        PendingKind.QUOTA_NOT_LENT,
        PendingKind.QUOTA_UNUSABLE,
    }
)


@dataclass(frozen=True)
class NoFit:
    kind: ClassVar[PendingKind] = PendingKind.NO_FIT
    pods: int  # min_available: pods it needs placed at once
    best_cluster: str | None  # name of the cluster that held the most of them, None if none did
    placed: int = 0
    # Runs (workload ids) whose eviction would make room but whose minimum runtime protects them
    # until `protected_until`: it waits for that, not for work to end.
    protected: tuple[str, ...] = ()
    protected_until: datetime | None = None


@dataclass(frozen=True)
class NeverFits:
    """No cluster of the fleet as it stands (schedulable nodes only) could hold the gang even with
    nothing running: it waits for nodes to be added or uncordoned, not for work to end."""

    kind: ClassVar[PendingKind] = PendingKind.NEVER_FITS
    pods: int  # min_available
    best_cluster: str | None  # name of the cluster that would hold the most of them empty
    placed: int = 0  # how many of them that cluster holds empty
    # With no best cluster: True when clusters could hold it only over several pools (same_pool
    # required), False when the fleet has no cluster at all.
    only_over_pools: bool = False


@dataclass(frozen=True)
class IsolationOnlyTimeSliced:
    kind: ClassVar[PendingKind] = PendingKind.ISOLATION


@dataclass(frozen=True)
class FairShareTurn:
    kind: ClassVar[PendingKind] = PendingKind.FAIR_SHARE
    queue: str
    share: float
    ahead: tuple[str, ...]  # names of (at most three of) the queues that went ahead
    more: int = 0  # how many others went ahead too


@dataclass(frozen=True)
class QuotaLimit:
    kind: ClassVar[PendingKind] = PendingKind.QUOTA_LIMIT
    node: str  # name of the queue, team or cohort whose limit blocks
    key: str  # gpu-eq or a GPU model
    limit: float
    amount: float  # what the gang needs
    # The gang needs more than the limit on its own: it can never run while the limit stands.
    never: bool = False


@dataclass(frozen=True)
class BorrowingLimit:
    kind: ClassVar[PendingKind] = PendingKind.QUOTA_BORROWING
    node: str
    key: str
    limit: float


@dataclass(frozen=True)
class OutsideGuarantee:
    """Non-preemptible work runs only within its queue's guarantee."""

    kind: ClassVar[PendingKind] = PendingKind.QUOTA_GUARANTEE
    amount: float | None = None  # gpu-eq more that would exceed it, when known


@dataclass(frozen=True)
class NotLent:
    kind: ClassVar[PendingKind] = PendingKind.QUOTA_NOT_LENT
    key: str


@dataclass(frozen=True)
class UnusableQuota:
    kind: ClassVar[PendingKind] = PendingKind.QUOTA_UNUSABLE
    node: str
    setting: str  # weight | guaranteed | limit | borrowing_limit | lending_limit
    key: str | None  # the quota key, None for the weight
    value: str  # repr of the value found


@dataclass(frozen=True)
class BehindHeads:
    """It is not among its queue's first `heads` gangs (in the queue's order), which are the ones
    decided this cycle or told what blocks them: it waits its turn behind them, whatever limit
    the queue is at (the heads' reasons say that, and this reason does not move with it)."""

    kind: ClassVar[PendingKind] = PendingKind.BEHIND
    queue: str  # name
    heads: int


@dataclass(frozen=True)
class SchedulingFailed:
    kind: ClassVar[PendingKind] = PendingKind.ERROR
    error_type: str
    message: str


@dataclass(frozen=True)
class NotConsidered:
    kind: ClassVar[PendingKind] = PendingKind.NOT_CONSIDERED
    failed: int


Why = (
    NoFit
    | NeverFits
    | IsolationOnlyTimeSliced
    | FairShareTurn
    | QuotaLimit
    | BorrowingLimit
    | OutsideGuarantee
    | NotLent
    | UnusableQuota
    | BehindHeads
    | SchedulingFailed
    | NotConsidered
)


@dataclass(frozen=True)
class ReservationNote:
    """Nodes held for the head of a queue until the work on them ends."""

    nodes: int
    cluster: str  # name
    holder: str  # name of the workload it is held for
    due: datetime | None  # None: when running work ends (no declared end)


@dataclass(frozen=True)
class PendingReason:
    """Why a gang waits. Its place in its queue is not part of it (it moves whenever a gang ahead
    is admitted): it is worked out where it is read, from the queue's order."""

    workload_id: str
    why: Why
    reservation: ReservationNote | None = None

    @property
    def kind(self) -> PendingKind:
        return self.why.kind


@dataclass(frozen=True)
class Decision:
    admissions: tuple[Admission, ...] = ()
    pending: tuple[PendingReason, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    stats: Mapping[str, int] = field(default_factory=dict)
