"""Group commit of REST submits: concurrent submits written in one transaction, each answered alone.

`submit_many` does for each submit what `workloads.submit` does for one, with the checks and the
answer of each kept apart: a submit that cannot be taken (unknown queue, a revoked token, a class or
a fleet that cannot take it, an idempotency key used for a different request) gets its own error
and the others go on. The statements are shared: one queue and token query per (queue, token), one
priority class read, one workload insert, one pod set insert and one outbox insert for the lot.

An idempotency key repeated inside the batch is a retry of the first submit that used it (the same
request is answered with that workload, 200; a different one is refused, 409), exactly as if the two
had come one after the other. A failure of the transaction itself writes nothing: the database
unavailable answers every submit of the batch with `StoreUnavailable`; anything else unexpected is
retried one submit per transaction, so only the submit that causes it fails.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.service import workloads
from controlplane.service.commands import SubmitWorkload
from controlplane.service.errors import ServiceError, StoreUnavailable
from controlplane.service.events import view_event
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.ports import NewWorkload, UnitOfWork, UnitOfWorkFactory
from controlplane.service.views import Principal, WorkloadView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmitItem:
    """One REST submit: who sends it and what. `recheck_token`: the principal came from the memo of
    recent authentications, so its token is checked again in the transaction that writes."""

    principal: Principal
    request: SubmitWorkload
    recheck_token: bool = True


# Each submit's answer: its workload and whether it was created (False: an idempotent retry), or
# the error it alone gets.
Answer = tuple[WorkloadView, bool] | Exception


@dataclass(frozen=True)
class _Retry:
    """A submit whose idempotency key was used before (in this batch or the database), to answer
    with that workload; `refusal`: what it gets if the key turns out unused after all."""

    index: int
    team_id: str
    key: str
    fingerprint: str
    refusal: Exception | None = None


def submit_many(
    uow_factory: UnitOfWorkFactory,
    items: Sequence[SubmitItem],
    prefix: str,
    now: datetime,
    fit: FleetFit | None = None,
) -> list[Answer]:
    """The answer of each submit, in order (see the module's docstring)."""
    if not items:
        return []
    try:
        return _in_one_transaction(uow_factory(), items, prefix, now, fit)
    except StoreUnavailable as exc:
        return [exc for _ in items]
    except Exception as exc:
        if len(items) == 1:
            return [exc]
        # Nothing was written (the transaction rolled back): each submit alone, so the one that
        # fails does not take the others with it.
        log.warning("a batch of %d submits failed (%s: %s); retrying one by one", len(items), type(exc).__name__, exc)
        return [submit_many(uow_factory, [item], prefix, now, fit)[0] for item in items]


def _in_one_transaction(
    uow: UnitOfWork, items: Sequence[SubmitItem], prefix: str, now: datetime, fit: FleetFit | None
) -> list[Answer]:
    answers: dict[int, Answer] = {}
    retries: list[_Retry] = []
    taken: list[tuple[int, NewWorkload, WorkloadView]] = []
    keys_taken: set[tuple[str, str]] = set()  # (team id, idempotency key) this batch adds
    # Submits of one batch share `now`; their order of arrival is kept in `created_seq`.
    first_seq = int(now.timestamp() * 1_000_000)
    with uow:
        lookups = workloads.SubmitLookups(uow)
        for index, item in enumerate(items):
            request = item.request
            token_id = item.principal.token_id if item.recheck_token else None
            try:
                prepared = workloads.prepare(uow, lookups, item.principal, request, now, fit, token_id)
            except ServiceError as exc:
                answers[index] = exc
                continue
            key, team_id = request.idempotency_key, prepared.queue.team_id
            if key and (team_id, key) in keys_taken:  # a retry of a submit earlier in this batch
                retries.append(_Retry(index, team_id, key, prepared.fingerprint))
                continue
            if prepared.workload is None:
                assert prepared.refusal is not None
                if key:  # a retry is answered with its workload even when the request would be refused now
                    retries.append(_Retry(index, team_id, key, prepared.fingerprint, prepared.refusal))
                else:
                    answers[index] = prepared.refusal
                continue
            if key:
                keys_taken.add((team_id, key))
            workload = dataclasses.replace(prepared.workload, created_seq=first_seq + index)
            new = NewWorkload(
                workload, request.container, request.labels, key, prepared.fingerprint, request.serving_declaration()
            )
            taken.append((index, new, workloads.new_workload_view(workload, prepared.queue, request, now)))
        added = uow.workloads.add_many([new for _, new, _ in taken], now)
        events = []
        for index, new, view in taken:
            if new.workload.id in added:
                answers[index] = (view, True)
                events.append(view_event(prefix, "queued", view, now))
            else:  # the key was used meanwhile, by a submit another process committed
                assert new.idempotency_key is not None
                retries.append(_Retry(index, new.workload.team_id, new.idempotency_key, new.fingerprint))
        for retry in retries:
            answers[retry.index] = _replayed(uow, retry)
        uow.outbox.add_many(events, now)
        uow.commit()
    return [answers[i] for i in range(len(items))]


def _replayed(uow: UnitOfWork, retry: _Retry) -> Answer:
    existing = uow.workloads.by_idempotency_key(retry.team_id, retry.key)
    if existing is None:
        # Only a refused first-time submit gets here: a key this batch added, or another process
        # committed (the insert skipped it), is found.
        assert retry.refusal is not None, retry.key
        return retry.refusal
    try:
        workload_id = workloads.replayed_id(retry.key, existing, retry.fingerprint)
    except ServiceError as exc:
        return exc
    view = uow.workloads.view(workload_id)
    assert view is not None, workload_id
    return view, False
