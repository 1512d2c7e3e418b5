"""A batch's NATS submits, applied together: one inbox insert, one workload insert, one pod set
insert and one outbox insert for the lot, instead of a savepoint and about ten statements each.

What each message does is what `ingest.handle` does with it alone: a message id seen before (in an
earlier batch or earlier in this one) is a duplicate; a submit that cannot be taken is rejected with
a `workload.rejected` event; an idempotency key the team used before (or earlier in this batch)
answers with that workload, or is rejected when the request differs. A submit never dead-letters
once its body decoded, so no message here needs a savepoint of its own: anything unexpected rolls
the whole batch back and the worker applies its messages one by one. Rows with a unique key (inbox
rows, idempotency keys) are written in key order, so several batches in flight at once (the
submit consumer's pullers) never deadlock on each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from controlplane.service import workloads
from controlplane.service.commands import SubmitWorkload
from controlplane.service.errors import ServiceError
from controlplane.service.events import envelope, view_event, workload_subject
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.ingest_messages import CONSUMER, Handled, InboundMessage, Outcome, errors_text, inbox_key
from controlplane.service.ports import NewWorkload, UnitOfWork
from controlplane.service.views import Principal, WorkloadView

Event = tuple[str, str, str]  # subject, event id, payload


@dataclass(frozen=True)
class SubmitMessage:
    """A message on `<prefix>.submit.<team>.<queue>` whose body decoded to a JSON object."""

    message: InboundMessage
    team: str
    queue: str
    body: dict[str, Any]


def team_principal(uow: UnitOfWork, team: str) -> Principal | None:
    node = uow.admin.get_tree_node("team", team)
    if node is None or node.name != team:
        return None
    return Principal(f"nats:team:{team}", "team", node.id)


def rejection(team: str, queue: str, message: InboundMessage, reason: str, prefix: str, now: datetime) -> Event:
    event_id, payload = envelope(
        "workload.rejected",
        {"request_id": message.msg_id[:200], "subject": message.subject[:300], "reason": reason},
        now,
    )
    return workload_subject(prefix, team, queue, "rejected"), event_id, payload


@dataclass
class _Taken:
    """A submit to add with its batch."""

    index: int
    submit: SubmitMessage
    new: NewWorkload
    view: WorkloadView


@dataclass
class _Batch:
    uow: UnitOfWork
    prefix: str
    now: datetime
    fit: FleetFit | None

    def __post_init__(self) -> None:
        self.results: dict[int, Handled] = {}
        self.events: dict[int, Event] = {}
        self.lookups = workloads.SubmitLookups(self.uow)
        self.principals: dict[str, Principal | None] = {}
        self.taken: list[_Taken] = []
        self.keys_taken: set[tuple[str, str]] = set()  # (team id, idempotency key) added by this batch
        # Submits that repeat an idempotency key (index, message, team id, key, fingerprint): answered
        # once this batch's workloads are added.
        self.retries: list[tuple[int, SubmitMessage, str, str, str]] = []

    def reject(self, index: int, submit: SubmitMessage, reason: str) -> None:
        self.events[index] = rejection(submit.team, submit.queue, submit.message, reason, self.prefix, self.now)
        self.results[index] = Handled(Outcome.REJECTED, reason)

    def principal(self, team: str) -> Principal | None:
        if team not in self.principals:
            self.principals[team] = team_principal(self.uow, team)
        return self.principals[team]

    def take(self, index: int, submit: SubmitMessage) -> None:
        """Check one first-time submit; it is added, rejected or answered as a retry (now or once
        the batch's workloads are added)."""
        principal = self.principal(submit.team)
        if principal is None:
            self.reject(index, submit, f"no team {submit.team!r}")
            return
        body = dict(submit.body)
        body.setdefault("queue", submit.queue)
        if body["queue"] != submit.queue:
            self.reject(index, submit, f"body names queue {body['queue']!r} but was sent to {submit.queue!r}")
            return
        body.setdefault("idempotency_key", submit.message.msg_id[:100])
        try:
            request = SubmitWorkload.model_validate(body)
            prepared = workloads.prepare(self.uow, self.lookups, principal, request, self.now, self.fit)
        except ValidationError as exc:
            self.reject(index, submit, errors_text(exc))
            return
        except ServiceError as exc:
            self.reject(index, submit, str(exc))
            return
        key = request.idempotency_key
        team_id = prepared.queue.team_id
        if key and (team_id, key) in self.keys_taken:
            self.retries.append((index, submit, team_id, key, prepared.fingerprint))  # used earlier in this batch
            return
        if prepared.workload is None:
            if key and self.uow.workloads.by_idempotency_key(team_id, key) is not None:
                self.retries.append((index, submit, team_id, key, prepared.fingerprint))
                return
            assert prepared.refusal is not None
            self.reject(index, submit, str(prepared.refusal))
            return
        if key:
            self.keys_taken.add((team_id, key))
        new = NewWorkload(
            prepared.workload,
            request.container,
            request.labels,
            key,
            prepared.fingerprint,
            request.serving_declaration(),
        )
        view = workloads.new_workload_view(prepared.workload, prepared.queue, request, self.now)
        self.taken.append(_Taken(index, submit, new, view))

    def write(self) -> None:
        # In key order, as the inbox rows: two batches committing at once (several pullers on one
        # consumer) that share keys wait for each other in one order, never in a cycle.
        self.taken.sort(key=lambda t: (t.new.workload.team_id, t.new.idempotency_key or ""))
        added = self.uow.workloads.add_many([t.new for t in self.taken], self.now)
        for t in self.taken:
            if t.new.workload.id in added:
                self.events[t.index] = view_event(self.prefix, "queued", t.view, self.now)
                self.results[t.index] = Handled(Outcome.APPLIED, t.view.id)
            else:  # the key was used before, by a submit another process committed meanwhile
                assert t.new.idempotency_key is not None
                team_id, key = t.new.workload.team_id, t.new.idempotency_key
                self.retries.append((t.index, t.submit, team_id, key, t.new.fingerprint))
        for index, submit, team_id, key, fingerprint in self.retries:
            existing = self.uow.workloads.by_idempotency_key(team_id, key)
            assert existing is not None
            try:
                self.results[index] = Handled(Outcome.APPLIED, workloads.replayed_id(key, existing, fingerprint))
            except ServiceError as exc:
                self.reject(index, submit, str(exc))
        self.uow.outbox.add_many([self.events[i] for i in sorted(self.events)], self.now)


def apply_submits(
    uow: UnitOfWork,
    submits: Sequence[SubmitMessage],
    prefix: str,
    now: datetime,
    fit: FleetFit | None = None,
) -> list[Handled]:
    """Apply these submits (in the caller's transaction), with what each one came to, in order."""
    batch = _Batch(uow, prefix, now, fit)
    first: dict[str, int] = {}
    for index, submit in enumerate(submits):
        key = inbox_key(f"team:{submit.team}", submit.message.msg_id)
        if key in first:
            batch.results[index] = Handled(Outcome.DUPLICATE, "already processed")
        else:
            first[key] = index
    # Sorted: a key another batch holds uncommitted makes this one wait (then find it a duplicate),
    # and batches that wait on each other's keys in one order cannot deadlock.
    new_keys = uow.inbox.first_times(CONSUMER, sorted(first), now)
    for key, index in first.items():
        if key in new_keys:
            batch.take(index, submits[index])
        else:
            batch.results[index] = Handled(Outcome.DUPLICATE, "already processed")
    batch.write()
    return [batch.results[i] for i in range(len(submits))]
