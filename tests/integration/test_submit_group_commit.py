"""Group commit of REST submits (service/submit_batch.py, api/group_commit.py), on SQLite and
PostgreSQL: concurrent submits share one transaction, and each still gets its own answer and its own
error; a failed transaction writes nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from adapters.sql.tables import OutboxRow, PodSetRow, WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.domain.model import Workload
from controlplane.service.auth import authenticate
from controlplane.service.commands import SubmitWorkload
from controlplane.service.errors import Conflict, NotFound, StoreUnavailable, Unauthenticated
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.ports import NewWorkload, UnitOfWork
from controlplane.service.submit_batch import Answer, SubmitItem, submit_many
from controlplane.service.views import Principal, WorkloadView
from tests.integration.fleet import Tenant, gang

PREFIX = "p"


def _principal(wiring: Wiring, tenant: Tenant) -> Principal:
    who = authenticate(wiring.uow(), tenant.token)
    assert who is not None
    return who


def _item(who: Principal, body: dict[str, Any]) -> SubmitItem:
    return SubmitItem(who, SubmitWorkload.model_validate(body))


def _created(answer: Answer) -> WorkloadView:
    assert not isinstance(answer, Exception), answer
    view, created = answer
    assert created
    return view


def _replayed(answer: Answer) -> str:
    """The id of the workload an idempotent retry was answered with."""
    assert not isinstance(answer, Exception), answer
    view, created = answer
    assert not created
    return view.id


def _stored(wiring: Wiring) -> tuple[list[str], int, list[str]]:
    """Workload names, pod set rows, and the workload ids of the queued events, as stored."""
    with wiring.uow() as uow:
        names = sorted(uow.session.scalars(select(WorkloadRow.name)))
        pod_sets = uow.session.scalar(select(func.count()).select_from(PodSetRow)) or 0
        payloads = [json.loads(p) for p in uow.session.scalars(select(OutboxRow.payload).order_by(OutboxRow.seq))]
    return names, pod_sets, [p["data"]["workload_id"] for p in payloads if p["type"] == "workload.queued"]


def test_a_batch_of_good_and_bad_submits_answers_each_and_writes_the_good_ones(
    wiring: Wiring, tenant: Tenant, client: TestClient, admin: dict[str, str]
) -> None:
    who = _principal(wiring, tenant)
    r = client.post("/v1/tokens", json={"name": "revoked", "team": tenant.team}, headers=admin)
    revoked = authenticate(wiring.uow(), r.json()["token"])
    assert revoked is not None
    assert client.delete(f"/v1/tokens/{r.json()['id']}", headers=admin).status_code == 204
    items = [
        _item(who, gang("first", tenant.queue, replicas=1)),
        _item(who, gang("nowhere", "no-such-queue")),
        _item(who, gang("no-class", tenant.queue, priority_class="no-such-class")),
        _item(who, gang("second", tenant.queue, replicas=2, idempotency_key="k2")),
        _item(who, gang("too-big", tenant.queue, replicas=64)),  # the fleet has 4 nodes of 8 GPUs
        _item(revoked, gang("revoked", tenant.queue)),
        _item(who, gang("third", tenant.queue, replicas=1, labels={"a": "b"})),
    ]
    answers = submit_many(wiring.uow, items, PREFIX, utc_now())
    assert [type(a).__name__ for a in answers] == [
        "tuple",
        "NotFound",
        "NotFound",
        "tuple",
        "Conflict",
        "Unauthenticated",
        "tuple",
    ]
    assert isinstance(answers[1], NotFound)
    assert "no-such-queue" in str(answers[1])
    assert isinstance(answers[4], Conflict)
    assert isinstance(answers[5], Unauthenticated)
    views = [_created(answers[i]) for i in (0, 3, 6)]
    assert [v.name for v in views] == ["first", "second", "third"]
    names, pod_sets, queued = _stored(wiring)
    assert names == ["first", "second", "third"]
    assert pod_sets == 3
    assert queued == [v.id for v in views]  # one event each, in the order they came
    # Each answer is what reading the workload back gives, through the API too.
    for view in views:
        r = client.get(f"/v1/workloads/{view.id}", headers=tenant.headers)
        assert r.status_code == 200
        assert r.json()["labels"] == view.labels
        assert r.json()["pod_sets"][0]["replicas"] == view.pod_sets[0]["replicas"]
    # Their arrival order is their queue order.
    with wiring.uow() as uow:
        seqs = dict(uow.session.execute(select(WorkloadRow.name, WorkloadRow.created_seq)).all())
    assert seqs["first"] < seqs["second"] < seqs["third"]


def test_an_idempotency_key_repeated_inside_a_batch_and_across_batches(wiring: Wiring, tenant: Tenant) -> None:
    who = _principal(wiring, tenant)
    same = gang("g", tenant.queue, replicas=1, idempotency_key="k")
    different = gang("other", tenant.queue, replicas=1, idempotency_key="k")
    answers = submit_many(wiring.uow, [_item(who, same), _item(who, same), _item(who, different)], PREFIX, utc_now())
    first = _created(answers[0])
    assert _replayed(answers[1]) == first.id
    assert isinstance(answers[2], Conflict)
    assert first.id in str(answers[2])
    # A later batch: the same request is a retry, a different one a conflict, a new key a workload.
    answers = submit_many(
        wiring.uow,
        [_item(who, different), _item(who, same), _item(who, {**same, "idempotency_key": "k-new"})],
        PREFIX,
        utc_now(),
    )
    assert isinstance(answers[0], Conflict)
    assert _replayed(answers[1]) == first.id
    _created(answers[2])
    names, _, queued = _stored(wiring)
    assert names == ["g", "g"]
    assert len(queued) == 2  # no event for a retry


def test_a_retry_inside_a_batch_is_answered_even_if_the_request_would_be_refused_now(
    wiring: Wiring, tenant: Tenant
) -> None:
    """The key names a workload taken before; a fleet that shrank since would refuse it now."""
    who = _principal(wiring, tenant)
    body = gang("g", tenant.queue, replicas=1, idempotency_key="k")
    first = _created(submit_many(wiring.uow, [_item(who, body)], PREFIX, utc_now())[0])
    fresh = gang("fresh", tenant.queue, replicas=1)
    changed = {**body, "name": "changed"}
    answers = submit_many(
        wiring.uow, [_item(who, body), _item(who, fresh), _item(who, changed)], PREFIX, utc_now(), _Shrunk()
    )
    assert _replayed(answers[0]) == first.id
    assert isinstance(answers[1], Conflict)
    assert str(answers[1]) == _Shrunk.REASON
    assert isinstance(answers[2], Conflict)
    assert "already used for a different request" in str(answers[2])
    assert _stored(wiring)[0] == ["g"]


class _Shrunk(FleetFit):
    REASON = "no cluster in the fleet could ever hold this gang"

    def refusal(self, uow: UnitOfWork, workload: Workload) -> str | None:
        return self.REASON


class _FailingUow:
    """A unit of work whose writes fail as the test says (the database going away, or a bug)."""

    def __init__(self, inner: UnitOfWork, fail_outbox: Exception | None, poison: str | None) -> None:
        self._inner = inner
        self._fail_outbox = fail_outbox
        self._poison = poison

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> _FailingUow:
        self._inner.__enter__()
        add_outbox, add_workloads_really = self._inner.outbox.add_many, self._inner.workloads.add_many
        fail_outbox, poison = self._fail_outbox, self._poison

        def add_events(events: Sequence[tuple[str, str, str]], now: datetime) -> None:
            if fail_outbox is not None:
                raise fail_outbox
            add_outbox(events, now)

        def add_workloads(new: Sequence[NewWorkload], now: datetime) -> set[str]:
            added = add_workloads_really(new, now)  # written, then the statement after it fails
            if any(n.workload.name == poison for n in new):
                raise RuntimeError("a bug this submit runs into")
            return added

        self._inner.outbox.add_many = add_events  # type: ignore[method-assign]
        self._inner.workloads.add_many = add_workloads  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)


def test_the_database_failing_mid_batch_answers_every_submit_with_an_error_and_writes_nothing(
    wiring: Wiring, tenant: Tenant
) -> None:
    who = _principal(wiring, tenant)
    lost = OperationalError("INSERT INTO outbox", {}, Exception("server closed the connection unexpectedly"))
    items = [_item(who, gang(f"g{i}", tenant.queue, replicas=1, idempotency_key=f"k{i}")) for i in range(5)]
    answers = submit_many(lambda: _FailingUow(wiring.uow(), lost, None), items, PREFIX, utc_now())
    assert all(isinstance(a, StoreUnavailable) for a in answers), answers
    assert _stored(wiring) == ([], 0, [])
    # The same submits retried later are created (nothing of the failed batch holds their keys).
    answers = submit_many(wiring.uow, items, PREFIX, utc_now())
    assert [_created(a).name for a in answers] == [f"g{i}" for i in range(5)]


def test_an_unexpected_failure_fails_only_the_submit_that_causes_it(wiring: Wiring, tenant: Tenant) -> None:
    who = _principal(wiring, tenant)
    names = ["a", "poison", "b"]
    items = [_item(who, gang(name, tenant.queue, replicas=1)) for name in names]
    answers = submit_many(lambda: _FailingUow(wiring.uow(), None, "poison"), items, PREFIX, utc_now())
    assert isinstance(answers[1], RuntimeError)
    assert [_created(answers[i]).name for i in (0, 2)] == ["a", "b"]
    stored, pod_sets, queued = _stored(wiring)
    assert stored == ["a", "b"]
    assert pod_sets == 2
    assert len(queued) == 2


def test_concurrent_rest_submits_each_get_their_own_status(wiring: Wiring, tenant: Tenant, client: TestClient) -> None:
    """Through the route and the batcher: 201 for the new, 200 for the retries (same key, same
    request), 409 for a key reused for another request, 404 for an unknown queue; whatever the
    batches the event loop happened to form."""
    bodies: list[tuple[dict[str, Any], dict[str, str]]] = []
    for i in range(12):
        bodies.append((gang(f"g{i}", tenant.queue, replicas=1), {"Idempotency-Key": f"key-{i}"}))
    for i in range(4):
        bodies.append((gang(f"g{i}", tenant.queue, replicas=1), {"Idempotency-Key": f"key-{i}"}))  # retries
    # Another request under key-0, racing the first two with it: whichever of the three comes first
    # takes the key; the others are a retry of it (200) or a reuse for another request (409).
    bodies.append((gang("clash", tenant.queue, replicas=1), {"Idempotency-Key": "key-0"}))
    bodies.append((gang("lost", "no-such-queue", replicas=1), {}))

    def post(body: tuple[dict[str, Any], dict[str, str]]) -> tuple[int, dict[str, Any]]:
        r = client.post("/v1/workloads", json=body[0], headers={**tenant.headers, **body[1]})
        return r.status_code, r.json()

    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(post, bodies))
    statuses = [status for status, _ in results]
    # A retry racing its first submit is answered 200 with the same workload, whichever came first.
    for i in range(1, 4):
        pair = sorted([statuses[i], statuses[12 + i]])
        assert pair == [200, 201], (i, statuses)
        assert results[i][1]["id"] == results[12 + i][1]["id"]
    key_0 = sorted([statuses[0], statuses[12], statuses[16]])
    clash_first = statuses[16] == 201
    assert key_0 == ([201, 409, 409] if clash_first else [200, 201, 409]), statuses
    if not clash_first:
        assert statuses[16] == 409, results[16]
        assert results[0][1]["id"] == results[12][1]["id"]
    assert statuses[4:12] == [201] * 8
    assert statuses[17] == 404, results[17]
    assert results[17][1]["detail"] == "unknown queue 'no-such-queue'"
    created = [answer["id"] for status, answer in results if status == 201]
    assert len(set(created)) == 12
    names, _, queued = _stored(wiring)
    assert names == sorted(["clash" if clash_first else "g0", *(f"g{i}" for i in range(1, 12))])
    assert len(queued) == 12


@pytest.mark.parametrize("error", [StoreUnavailable("the database is unavailable"), Conflict("taken")])
def test_a_route_answers_a_batch_error_with_its_own_status(
    wiring: Wiring, tenant: Tenant, client: TestClient, error: Exception
) -> None:
    app_ctx = client.app.state.ctx  # type: ignore[attr-defined]

    def failing(items: Sequence[SubmitItem]) -> list[Answer]:
        return [error for _ in items]

    app_ctx.submits._write = failing
    r = client.post("/v1/workloads", json=gang("g", tenant.queue), headers=tenant.headers)
    if isinstance(error, StoreUnavailable):
        assert (r.status_code, r.headers["Retry-After"]) == (503, "5")
    else:
        assert (r.status_code, r.json()) == (409, {"detail": "taken"})
