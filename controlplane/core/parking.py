"""Parking: the gangs a cycle leaves pending before it orders anything, and what wakes them.

A cycle first asks of every pending gang whether the fleet's state at the start of the cycle
blocks it: a limit on its queue chain, or (non-preemptible work) its guarantee. Within a cycle
usage only grows until an eviction, so such a gang stays blocked unless an eviction made for it
lifts the block. Hence the rule:

- a blocked gang that may not ask for evictions (it may not evict, no eviction is enabled, or it
  needs more than a limit allows on its own) is *parked*: left pending with that reason, outside
  the fair-share order;
- of a queue's blocked gangs that may ask for evictions, only the *front* one (in the queue's
  own order: priority, then FIFO) is decided in the order and may ask; the others are parked
  behind it with their reason (Kueue considers queue heads the same way);
- of a queue's gangs the limits let through, the first `heads_per_queue` are *candidates*,
  decided in the fair-share order (`cycle.py`);
- every gang beyond the queue's first `heads_per_queue` (counting all but those parked for good)
  that is not a candidate waits *behind* the heads, whatever blocks it: a deep backlog keeps one
  reason while its queue's limit fills and frees, and only the heads' reasons move
  (`split_queue`).

The block depends only on the start-of-cycle ledger and a few facts of the gang, gathered in its
*class* (`ParkingClass`), so every gang of a class gets the same answer. A scheduler that keeps its
state (`incremental.py`) keeps the answer per class and asks again only when something the answer
read has changed: its *wake rules* (`Parked`). Evictions made during a cycle wake what they
unblock from the next cycle on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from controlplane.core.decision import OutsideGuarantee, QuotaLimit, Why
from controlplane.core.snapshot import Policy
from controlplane.core.state import CycleState
from controlplane.domain.model import GPU_EQ, Workload


class ParkingClass(NamedTuple):
    """What the parking answer depends on, of one gang. (A named tuple: made and hashed once per
    pending gang per full cycle, 100,000 times, where a frozen dataclass costs several times more.)"""

    queue_id: str
    priority: int
    preemptible: bool
    may_evict: bool
    least: int  # gpu-eq units its cheapest start holds


def class_of(state: CycleState, workload: Workload) -> ParkingClass:
    return ParkingClass(
        workload.queue_id, workload.priority, workload.preemptible, workload.may_evict, state.facts.least(workload)
    )


def queue_order(workload: Workload) -> tuple[int, int, str]:
    """A gang's place in its own queue: priority, then FIFO (the ids settle ties)."""
    return (-workload.priority, workload.created_seq, workload.id)


@dataclass(frozen=True)
class Parked:
    """A parking answer and the changes that may alter it (its wake rules).

    Blocked by a limit at the chain's node of depth d: any usage change on the nodes below it (a
    lower limit may become the first to block) and a drop of usage where it blocks wake it; a
    limit it exceeds on its own, nothing (a new limit rebuilds the state); blocked by its
    guarantee: any usage change on the chain. Not blocked: any usage change on a node of the
    chain with a gpu-eq limit (on the whole chain for non-preemptible work, which its guarantee
    may block)."""

    why: Why | None  # None: not blocked, a candidate
    may_ask: bool = False  # blocked, but its queue's front gang of this kind may ask for evictions
    watch_any: tuple[str, ...] = ()  # node ids: any usage change wakes it
    watch_drop: tuple[tuple[str, str], ...] = ()  # (node id, key): a drop of that usage wakes it

    @property
    def for_good(self) -> bool:
        """Parked until a limit changes (it needs more than one allows on its own), wherever it
        stands in its queue."""
        return isinstance(self.why, QuotaLimit) and self.why.never


CANDIDATE = Parked(None)  # a class not asked yet

Gang = TypeVar("Gang")


@dataclass
class QueueSplit(Generic[Gang]):
    """What a cycle does with one queue's gangs (`split_queue`)."""

    candidates: list[Gang] = field(default_factory=list)
    parked: list[tuple[Gang, Why]] = field(default_factory=list)  # with the reason of their block
    behind: list[Gang] = field(default_factory=list)  # waiting behind the queue's heads


def split_queue(gangs: Iterable[tuple[Gang, Parked]], heads: int) -> QueueSplit[Gang]:
    """Split one queue's gangs, given in the queue's order with their parking answers:

    - parked for good (`Parked.for_good`): parked with that reason, and not counted below;
    - the first `heads` the limits let through: candidates; the rest of those: behind;
    - the first blocked gang that may ask for evictions: a candidate (the queue's front);
    - another blocked gang among the first `heads`: parked with its reason; beyond them: behind.
    """
    split: QueueSplit[Gang] = QueueSplit()
    position = through = 0
    front_taken = False
    for gang, answer in gangs:
        why = answer.why
        if why is not None and answer.for_good:
            split.parked.append((gang, why))
            continue
        in_front = position < heads
        position += 1
        if why is None:
            if through < heads:
                through += 1
                split.candidates.append(gang)
            else:
                split.behind.append(gang)
        elif answer.may_ask and not front_taken:
            front_taken = True
            split.candidates.append(gang)
        elif in_front:
            split.parked.append((gang, why))
        else:
            split.behind.append(gang)
    return split


def park(state: CycleState, policy: Policy, gang: ParkingClass) -> Parked:
    """Whether gangs of this class are blocked at the start of the cycle, and why: the checks
    `Cycle._decide` starts with, on the start-of-cycle ledger."""
    ledger = state.ledger
    wanted = {GPU_EQ: gang.least}
    chain = ledger.chain(gang.queue_id)
    found = ledger.limit_block_at(gang.queue_id, wanted, least=True)
    may_ask = gang.may_evict and (policy.preemption or policy.reclaim)
    if found is not None:
        depth, limit = found
        if limit.never:
            return Parked(limit)  # no usage, eviction or time lifts it: only a new limit (a rebuild)
        watch_any = tuple(node.id for node in chain[:depth])
        return Parked(limit, may_ask, watch_any, ((chain[depth].id, GPU_EQ),))
    if not gang.preemptible and not ledger.within_guarantee(gang.queue_id, wanted):
        why = OutsideGuarantee(state.unit.gpus(gang.least))
        return Parked(why, may_ask, tuple(node.id for node in chain))
    # Not blocked: usage rising where a gpu-eq limit stands (anywhere on the chain, for work only
    # its guarantee admits) may block it.
    watched = chain if not gang.preemptible else [node for node in chain if GPU_EQ in ledger.limits[node.id]]
    return Parked(None, watch_any=tuple(node.id for node in watched))
