"""The one place decisions become sentences: pending reasons and evictions, for people.

The core decides in types (`controlplane.core.decision`); the API, the events, the CLI and the
scenario runner show what this module renders, and machines read the kind and the fields
(`pending_fields`, `eviction_fields`) that are stored and sent next to the sentence.
"""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import Any

from controlplane.core.decision import (
    BehindHeads,
    BorrowingLimit,
    Eviction,
    EvictionKind,
    FairShareTurn,
    IsolationOnlyTimeSliced,
    NeverFits,
    NoFit,
    NotConsidered,
    NotLent,
    OutsideGuarantee,
    PendingReason,
    QuotaLimit,
    ReservationNote,
    SchedulingFailed,
    UnusableQuota,
    Why,
)
from controlplane.domain.limits import MAX_QUOTA_AMOUNT


def why_text(why: Why) -> str:
    """The sentence for one reason a gang waits (without the reservation it holds)."""
    match why:
        case NoFit(pods=pods, best_cluster=None):
            text = f"no-fit: needs {pods} pods placed at once in one cluster; no cluster has room for any"
            return text + _protected_text(why)
        case NoFit(pods=pods, best_cluster=cluster, placed=placed):
            best = f"best cluster {cluster} has room for {placed}"
            return f"no-fit: needs {pods} pods placed at once in one cluster; {best}" + _protected_text(why)
        case NeverFits(best_cluster=None, only_over_pools=False):
            return "never-fits: can never fit in this fleet as it stands (the fleet has no cluster)"
        case NeverFits(pods=pods, best_cluster=None):
            return (
                f"never-fits: can never fit in this fleet as it stands (needs {pods} pods placed at once in "
                "one node pool, and only several pools together could hold them); it waits for nodes to be "
                "added or uncordoned"
            )
        case NeverFits(pods=pods, best_cluster=cluster, placed=placed):
            return (
                f"never-fits: can never fit in this fleet as it stands (needs {pods} pods placed at once in "
                f"one cluster; the best, {cluster}, holds {placed} even with nothing running); it waits for "
                "nodes to be added or uncordoned"
            )
        case IsolationOnlyTimeSliced():
            return (
                "isolation: this workload requires isolation, and only time-sliced pools offer what it asks for; "
                "use MIG or whole GPUs, or set requires_isolation: false"
            )
        case FairShareTurn(queue=queue, share=share, ahead=ahead, more=more):
            others = ", ".join(ahead) + (f" and {more} more" if more else "")
            return (
                f"fair-share: queue {queue} (share {share:.3f}) waits its turn; "
                f"queues ordered ahead of it by fair share ({others}) took the capacity it fits this cycle"
            )
        case QuotaLimit(node=node, key=key, limit=limit, amount=amount, never=True):
            return (
                f"quota: never under the current limits: {node} limit is {limit:g} {key} and this gang needs "
                f"{amount:g} at least; it waits until that limit is raised (or the gang is made smaller)"
            )
        case QuotaLimit(node=node, key=key, limit=limit, amount=amount):
            return (
                f"quota: {node} limit is {limit:g} {key} and its work in use leaves less than the "
                f"{amount:g} this gang needs"
            )
        case BorrowingLimit(node=node, key=key, limit=limit):
            return f"quota: {node} may borrow at most {limit:g} {key} above its guarantee"
        case OutsideGuarantee(amount=None):
            return "quota: non-preemptible work runs only within its queue's guarantee"
        case OutsideGuarantee(amount=amount):
            return (
                "quota: non-preemptible work runs only within its queue's guarantee, and "
                f"{amount:g} gpu-eq more would exceed it"
            )
        case NotLent(key=key):
            return f"quota: the rest of the free {key} is guarantee other queues do not lend"
        case UnusableQuota(node=node, setting=setting, key=key, value=value):
            what = f"weight {value}" if key is None else f"{setting} {key}={value}"
            return (
                f"quota: unusable {what} on {node}; its gangs wait until an admin sets a "
                f"finite amount between 0 and {MAX_QUOTA_AMOUNT:g}"
            )
        case BehindHeads(queue=queue, heads=heads):
            return (
                f"behind: waits its turn in queue {queue}; each cycle decides a queue's first {heads} gangs "
                "(priority, then submission order), and their reasons say what the queue waits on"
            )
        case SchedulingFailed(error_type=error_type, message=message):
            return (
                f"error: scheduling this gang raised {error_type}: {message}; "
                "it is set aside each cycle until the cause is fixed, the rest of the fleet is scheduled"
            )
        case NotConsidered(failed=failed):
            return (
                f"error: not considered this cycle: {failed} gangs failed to schedule "
                "before its turn; it is considered again next cycle"
            )
    raise AssertionError(f"no wording for {why!r}")  # pragma: no cover - the match is exhaustive


def _protected_text(why: NoFit) -> str:
    if not why.protected or why.protected_until is None:
        return ""
    names = ", ".join(why.protected)
    verb = "is protected by its" if len(why.protected) == 1 else "are protected by their"
    until = why.protected_until.isoformat()
    return f"; evicting {names} would make room, but {names} {verb} minimum runtime until {until}"


def reservation_text(note: ReservationNote) -> str:
    when = "when running work ends" if note.due is None else f"by {note.due.isoformat()}"
    return f"reservation: {note.nodes} node(s) of cluster {note.cluster} held for {note.holder}, due {when}"


def pending_text(reason: PendingReason) -> str:
    """The whole pending reason as people read it (API `reason`, events, CLI)."""
    text = why_text(reason.why)
    if reason.reservation is not None:
        text = f"{text}; {reservation_text(reason.reservation)}"
    return text


def pending_fields(reason: PendingReason) -> dict[str, Any]:
    """Kind and structured fields of a pending reason, JSON-ready (stored next to the sentence)."""
    fields: dict[str, Any] = {"kind": str(reason.kind), **_plain(_shallow(reason.why))}
    if reason.reservation is not None:
        fields["reservation"] = _plain(_shallow(reason.reservation))
    return fields


def _shallow(record: Any) -> dict[str, Any]:
    """A flat decision record's fields (`asdict` deep-copies each one: about 1 s per cycle at
    100,000 pending gangs)."""
    return {f.name: getattr(record, f.name) for f in dataclass_fields(record)}


def eviction_text(eviction: Eviction) -> str:
    """Why a run was stopped, naming the beneficiary (run message, workload reason, event)."""
    who, queue, victim_queue = eviction.beneficiary_name, eviction.beneficiary_queue, eviction.victim_queue
    if eviction.kind is EvictionKind.IDLE:
        return (
            f"reclaimed-idle: the idle policy found this run's GPUs idle and workload {who} "
            f"(queue {queue}) is waiting for them"
        )
    if eviction.kind is EvictionKind.REBALANCE:
        return (
            f"rebalanced: queue {victim_queue} runs above its fair share and queue {queue} below it; workload "
            f"{who} (priority {eviction.beneficiary_priority}) takes this priority {eviction.victim_priority} "
            "gang's capacity"
        )
    if eviction.kind is EvictionKind.TAKE_BACK:
        return (
            f"taken-back: this run borrowed capacity held for workload {who} (queue {queue}) while it "
            "waited, and it now takes it back"
        )
    if eviction.kind is EvictionKind.RECLAIM:
        return (
            f"reclaimed: queue {queue} takes back its guarantee from capacity queue {victim_queue} borrowed, "
            f"for workload {who}"
        )
    return (
        f"preempted: workload {who} (priority {eviction.beneficiary_priority}) needs the capacity "
        f"of this priority {eviction.victim_priority} gang in queue {queue}"
    )


def eviction_fields(eviction: Eviction) -> dict[str, Any]:
    """Kind, end cause and the structured facts of an eviction, JSON-ready."""
    return {
        "kind": str(eviction.kind),
        "end_cause": str(eviction.end_cause),
        "beneficiary": eviction.beneficiary,
        "beneficiary_name": eviction.beneficiary_name,
        "beneficiary_queue": eviction.beneficiary_queue,
        "beneficiary_priority": eviction.beneficiary_priority,
        "victim_queue": eviction.victim_queue,
        "victim_priority": eviction.victim_priority,
    }


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: value.isoformat() if isinstance(value, datetime) else _list(value) for key, value in fields.items()}


def _list(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value
