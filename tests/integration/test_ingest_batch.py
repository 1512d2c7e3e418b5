"""A batch of NATS messages in one transaction (`ingest.handle_batch`): runs of submits are written
together, and each message still comes to what it would alone."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, func, select

from adapters.sql.tables import InboxRow, OutboxRow, WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.service import ingest
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.ingest import Handled, InboundMessage, Outcome
from tests.integration.fleet import Tenant, gang


def _submit(wiring: Wiring, tenant: Tenant, msg_id: str, body: Any, queue: str | None = None) -> InboundMessage:
    prefix = wiring.settings.subject_prefix
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return InboundMessage(f"{prefix}.submit.{tenant.team}.{queue or tenant.queue}", data, {}, msg_id)


def _batch(wiring: Wiring, messages: list[InboundMessage], fit: FleetFit | None = None) -> list[Handled]:
    return ingest.handle_batch(wiring.uow(), messages, wiring.settings.subject_prefix, utc_now(), fit)


def _count(wiring: Wiring, row: Any) -> int:
    with wiring.uow() as uow:
        return int(uow.session.scalar(select(func.count()).select_from(row)) or 0)


def _event_types(wiring: Wiring) -> list[str]:
    with wiring.uow() as uow:
        payloads = uow.session.scalars(select(OutboxRow.payload).order_by(OutboxRow.seq))
        return [json.loads(p)["type"] for p in payloads]


def test_a_bad_message_in_a_batch_is_dead_lettered_and_the_others_applied(wiring: Wiring, tenant: Tenant) -> None:
    prefix = wiring.settings.subject_prefix
    messages = [
        _submit(wiring, tenant, "a", gang("a", tenant.queue, replicas=1)),
        _submit(wiring, tenant, "bad", b'{"name": "x", "name": "y"}'),  # duplicate keys: refused JSON
        _submit(wiring, tenant, "b", gang("b", tenant.queue, replicas=1)),
        InboundMessage(f"{prefix}.cluster.nowhere.pods", b"{}", {}, "c"),  # malformed pod report
        _submit(wiring, tenant, "c", gang("c", tenant.queue, replicas=1)),
    ]
    outcomes = [r.outcome for r in _batch(wiring, messages)]
    assert outcomes == [Outcome.APPLIED, Outcome.MALFORMED, Outcome.APPLIED, Outcome.MALFORMED, Outcome.APPLIED]
    assert _count(wiring, WorkloadRow) == 3
    assert _count(wiring, InboxRow) == 3  # a dead-lettered message leaves nothing, not even its inbox row
    assert _event_types(wiring) == ["workload.queued"] * 3


def test_a_message_id_twice_in_one_batch_is_applied_once(wiring: Wiring, tenant: Tenant) -> None:
    messages = [
        _submit(wiring, tenant, "same", gang("a", tenant.queue, replicas=1)),
        _submit(wiring, tenant, "same", gang("a", tenant.queue, replicas=1)),
        _submit(wiring, tenant, "other", gang("b", tenant.queue, replicas=1)),
    ]
    outcomes = [r.outcome for r in _batch(wiring, messages)]
    assert outcomes == [Outcome.APPLIED, Outcome.DUPLICATE, Outcome.APPLIED]
    assert _count(wiring, WorkloadRow) == 2
    # The batch delivered again (the consumer died before acking): every message is a duplicate.
    assert [r.outcome for r in _batch(wiring, messages)] == [Outcome.DUPLICATE] * 3
    assert _count(wiring, WorkloadRow) == 2
    assert _event_types(wiring) == ["workload.queued"] * 2


def test_an_idempotency_key_twice_in_one_batch_is_one_workload(wiring: Wiring, tenant: Tenant) -> None:
    body = gang("a", tenant.queue, replicas=1, idempotency_key="k")
    messages = [
        _submit(wiring, tenant, "m1", body),
        _submit(wiring, tenant, "m2", body),  # a retry with a new message id: the same workload
        _submit(wiring, tenant, "m3", {**body, "name": "changed"}),  # the key for another request
    ]
    first, retry, changed = _batch(wiring, messages)
    assert (first.outcome, retry.outcome, retry.detail) == (Outcome.APPLIED, Outcome.APPLIED, first.detail)
    assert changed.outcome == Outcome.REJECTED
    assert "already used for a different request" in changed.detail
    assert _count(wiring, WorkloadRow) == 1
    assert _event_types(wiring) == ["workload.queued", "workload.rejected"]
    # An idempotency key used in an earlier batch answers with that workload too.
    (later,) = _batch(wiring, [_submit(wiring, tenant, "m4", body)])
    assert (later.outcome, later.detail) == (Outcome.APPLIED, first.detail)


def test_rejections_in_a_batch_leave_events_in_message_order(wiring: Wiring, tenant: Tenant) -> None:
    messages = [
        _submit(wiring, tenant, "r1", gang("a", tenant.queue, replicas=1)),
        _submit(wiring, tenant, "r2", gang("huge", tenant.queue, replicas=64)),  # never fits the fleet
        _submit(wiring, tenant, "r3", {"name": "b"}),  # no pod sets: invalid
        _submit(wiring, tenant, "r4", gang("c", "elsewhere", replicas=1), queue="elsewhere"),
        _submit(wiring, tenant, "r5", gang("d", "other-queue", replicas=1)),  # body and subject disagree
        _submit(wiring, tenant, "r6", gang("e", tenant.queue, replicas=1)),
    ]
    results = _batch(wiring, messages)
    outcomes = [r.outcome for r in results]
    assert outcomes == [Outcome.APPLIED] + [Outcome.REJECTED] * 4 + [Outcome.APPLIED]
    assert "unknown queue 'elsewhere'" in results[3].detail
    assert "was sent to" in results[4].detail
    assert _event_types(wiring) == ["workload.queued"] + ["workload.rejected"] * 4 + ["workload.queued"]
    assert _count(wiring, InboxRow) == 6  # rejected messages are processed: a redelivery is a duplicate


def test_a_batch_of_submits_is_a_few_statements_however_many(wiring: Wiring, tenant: Tenant) -> None:
    """Inbox rows, workloads, pod sets and events each in one statement for the batch (it was about
    ten statements and two savepoints per submit)."""
    fit = FleetFit()  # the consumer's memo of the fleet check, as the worker passes it
    _batch(wiring, [_submit(wiring, tenant, "warm", gang("w", tenant.queue, replicas=1))], fit)
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    messages = [_submit(wiring, tenant, f"s{i}", gang(f"g{i}", tenant.queue, replicas=1)) for i in range(40)]
    event.listen(wiring.engine, "before_cursor_execute", count)
    try:
        outcomes = {r.outcome for r in _batch(wiring, messages, fit)}
    finally:
        event.remove(wiring.engine, "before_cursor_execute", count)
    assert outcomes == {Outcome.APPLIED}
    assert _count(wiring, WorkloadRow) == 41
    assert len(statements) <= 10, statements


def test_a_team_that_does_not_exist_is_rejected_in_a_batch(wiring: Wiring, tenant: Tenant, client: TestClient) -> None:
    prefix = wiring.settings.subject_prefix
    ghost = InboundMessage(f"{prefix}.submit.ghost.q", json.dumps(gang("a", "q")).encode(), {}, "g1")
    results = _batch(wiring, [ghost, _submit(wiring, tenant, "ok", gang("b", tenant.queue, replicas=1))])
    assert [r.outcome for r in results] == [Outcome.REJECTED, Outcome.APPLIED]
    assert results[0].detail == "no team 'ghost'"


def test_an_inventory_report_in_a_batch_is_applied_in_its_place(wiring: Wiring, tenant: Tenant) -> None:
    """An inventory report gets a transaction of its own (it learns only as it applies which runs it
    ends, and the one lock order wants every workload a transaction writes locked first): the
    messages around it are applied before and after it, each as it would be alone."""
    prefix = wiring.settings.subject_prefix
    with wiring.uow() as uow:
        view = uow.admin.get_cluster("sim-h100")
        assert view is not None
        cordoned = sorted(n.name for p in view.pools for n in p.nodes)[0]
    at = utc_now()
    report = {"observed_at": at.isoformat(), "nodes": [{"name": cordoned, "schedulable": False, "ready": True}]}
    messages = [
        _submit(wiring, tenant, "a", gang("a", tenant.queue, replicas=1)),
        InboundMessage(f"{prefix}.cluster.sim-h100.inventory", json.dumps(report).encode(), {}, "inv"),
        _submit(wiring, tenant, "bad", b"[1"),
        _submit(wiring, tenant, "b", gang("b", tenant.queue, replicas=1)),
    ]
    results = _batch(wiring, messages)
    assert [r.outcome for r in results] == [Outcome.APPLIED, Outcome.APPLIED, Outcome.MALFORMED, Outcome.APPLIED]
    assert results[1].detail == "1 nodes changed"
    assert _count(wiring, WorkloadRow) == 2
    assert _count(wiring, InboxRow) == 3
    # Delivered again: all three taken are duplicates, in their places.
    again = [r.outcome for r in _batch(wiring, messages)]
    assert again == [Outcome.DUPLICATE, Outcome.DUPLICATE, Outcome.MALFORMED, Outcome.DUPLICATE]
