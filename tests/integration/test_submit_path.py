"""The submit path writes few statements and reads nothing back: what it answers and the event it
writes must still be exactly what reading the workload back gives."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select

from adapters.sql.tables import OutboxRow, WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.domain.model import Workload
from controlplane.service import workloads
from controlplane.service.auth import PrincipalCache, authenticate
from controlplane.service.commands import SubmitWorkload
from controlplane.service.errors import Conflict, DuplicateKey
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.ports import UnitOfWork
from controlplane.service.views import Principal, TokenView
from tests.integration.fleet import Tenant, gang, mixed_cluster

BODIES: list[dict[str, Any]] = [
    {"pod_sets": [{"name": "w", "replicas": 2, "gpus": 8}]},
    {
        "pod_sets": [
            {"name": "a", "replicas": 3, "gpus": 8, "min_replicas": 1, "gpu_models": ["H100-80GB"]},
            {"name": "b", "replicas": 1, "gpus": 0, "cpu_millis": 1500, "memory_mib": 2048},
        ],
        "min_available": 2,
        "duration_seconds": 600,
        "max_runtime_seconds": 7200.5,
        "spot": "avoid",
        "same_pool": "required",
        "labels": {"team": "vision", "run": "r1"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "container": {"image": "busybox", "command": ["sleep", "1"]},
        "kind": "inference",
    },
    {"pod_sets": [{"name": "s", "replicas": 1, "gpu_fraction": 0.25}], "requires_isolation": False},
    {"pod_sets": [{"name": "m", "replicas": 1, "mig_profile": "3g.40gb"}], "priority_class": "batch"},
]


def _principal(wiring: Wiring, tenant: Tenant) -> Principal:
    who = authenticate(wiring.uow(), tenant.token)
    assert who is not None
    return who


@pytest.mark.parametrize("extra", BODIES)
def test_the_answered_view_and_the_event_are_what_reading_back_gives(
    wiring: Wiring, tenant: Tenant, client: TestClient, admin: dict[str, str], extra: dict[str, Any]
) -> None:
    assert client.post("/v1/clusters", json=mixed_cluster(), headers=admin).status_code == 201
    body = {"name": "g", "queue": tenant.queue, **extra}
    request = SubmitWorkload.model_validate({**body, "idempotency_key": "k1"})
    answered, created = workloads.submit(wiring.uow(), _principal(wiring, tenant), request, "p", utc_now())
    assert created
    with wiring.uow() as uow:
        read_back = uow.workloads.view(answered.id)
        assert read_back is not None
        assert asdict(answered) == asdict(read_back)
        # The JSON the API answers with is the same too (floats stay floats, times UTC).
        assert json.dumps(asdict(answered), default=str, sort_keys=True) == json.dumps(
            asdict(read_back), default=str, sort_keys=True
        )
        payloads = [json.loads(p) for p in uow.session.scalars(select(OutboxRow.payload))]
        queued = [p for p in payloads if p["type"] == "workload.queued"]
        assert [p["data"] for p in queued] == [uow.workloads.event_data(answered.id)]


def test_a_rest_submit_is_one_transaction_of_few_statements(wiring: Wiring, tenant: Tenant, client: TestClient) -> None:
    """The queue with its team and the token's state, the priority class, the workload, its pod
    sets, the event: no savepoints, nothing read back and no transaction of its own for the token
    (it was 16 statements in two transactions, a savepoint among them)."""
    assert client.post("/v1/workloads", json=gang("warm", tenant.queue), headers=tenant.headers).status_code == 201
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement.split(None, 2)[0].upper() + " " + statement.split(None, 3)[1:3][-1])

    event.listen(wiring.engine, "before_cursor_execute", count)
    try:
        r = client.post("/v1/workloads", json=gang("g", tenant.queue), headers=tenant.headers)
    finally:
        event.remove(wiring.engine, "before_cursor_execute", count)
    assert r.status_code == 201, r.text
    assert not [s for s in statements if "SAVEPOINT" in s], statements
    # The token was authenticated a moment ago (the warm-up): it is checked in the queue's query.
    assert len([s for s in statements if not s.startswith("BEGIN")]) == 5, statements


class _RefusingNow(FleetFit):
    """A fleet that can no longer hold anything (it shrank since the first submit)."""

    def refusal(self, uow: UnitOfWork, workload: Workload) -> str | None:
        return "no cluster in the fleet could ever hold this gang"


def test_a_retry_is_answered_with_its_workload_even_if_the_request_would_be_refused_now(
    wiring: Wiring, tenant: Tenant
) -> None:
    who = _principal(wiring, tenant)
    request = SubmitWorkload.model_validate({**gang("g", tenant.queue, replicas=1), "idempotency_key": "again"})
    first, created = workloads.submit(wiring.uow(), who, request, "p", utc_now())
    assert created
    again, created = workloads.submit(wiring.uow(), who, request, "p", utc_now(), _RefusingNow())
    assert (again.id, created) == (first.id, False)
    changed = request.model_copy(update={"name": "other"})
    with pytest.raises(Conflict):
        workloads.submit(wiring.uow(), who, changed, "p", utc_now(), _RefusingNow())
    with pytest.raises(Conflict):
        workloads.submit(wiring.uow(), who, changed, "p", utc_now())


def test_a_reused_idempotency_key_leaves_the_transaction_usable(wiring: Wiring, tenant: Tenant) -> None:
    """The insert skips a used key itself: the winner is read in the same transaction (PostgreSQL
    refuses every statement after a failed insert, unless a savepoint was taken before it)."""
    request = SubmitWorkload.model_validate({**gang("g", tenant.queue, replicas=1), "idempotency_key": "k"})
    now = utc_now()
    with wiring.uow() as uow:
        queue = uow.admin.queue_ref(tenant.queue)
        pc = uow.admin.default_priority_class()
        assert queue is not None
        assert pc is not None
        first = workloads._to_domain("wl-first", queue.team_id, queue.id, pc.name, pc.value, request, now)
        second = workloads._to_domain("wl-second", queue.team_id, queue.id, pc.name, pc.value, request, now)
        uow.workloads.add(first, container={}, labels={}, idempotency_key="k", fingerprint="f1", now=now)
        with pytest.raises(DuplicateKey):
            uow.workloads.add(second, container={}, labels={}, idempotency_key="k", fingerprint="f2", now=now)
        assert uow.workloads.by_idempotency_key(queue.team_id, "k") == ("wl-first", "f1")
        assert uow.workloads.view("wl-second") is None


def _revoke(client: TestClient, admin: dict[str, str], name: str) -> None:
    token_id = next(t["id"] for t in client.get("/v1/tokens", headers=admin).json() if t["name"] == name)
    assert client.delete(f"/v1/tokens/{token_id}", headers=admin).status_code == 204


@pytest.mark.parametrize("queue_known", [True, False])
def test_a_token_revoked_a_moment_ago_submits_nothing(
    wiring: Wiring, tenant: Tenant, client: TestClient, admin: dict[str, str], queue_known: bool
) -> None:
    """The submit route remembers recent authentications, and checks the token again in the
    transaction that would write: a revoked token gets a 401 at once, and nothing is written."""
    r = client.post("/v1/workloads", json=gang("before", tenant.queue), headers=tenant.headers)
    assert r.status_code == 201, r.text  # the token is now remembered
    _revoke(client, admin, f"{tenant.team}-ci")
    queue = tenant.queue if queue_known else "no-such-queue"
    body = gang("after", queue, idempotency_key="after")
    r = client.post("/v1/workloads", json=body, headers=tenant.headers)
    assert r.status_code == 401, r.text
    assert r.headers["WWW-Authenticate"] == "Bearer"
    # A retry of a submission taken before the revocation is refused too.
    r = client.post("/v1/workloads", json=gang("before", tenant.queue), headers=tenant.headers)
    assert r.status_code == 401, r.text
    with wiring.uow() as uow:
        names = uow.session.scalars(select(WorkloadRow.name)).all()
    assert names == ["before"]
    assert client.get("/v1/workloads", headers=tenant.headers).status_code == 401


def test_remembered_principals_expire_and_stay_bounded() -> None:
    now = [0.0]
    lookups: list[str] = []

    class Uow:  # authenticate() only enters it and asks for the token
        def __enter__(self) -> Uow:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        @property
        def tokens(self) -> Any:
            return self

        def by_hash(self, token_hash: str) -> TokenView | None:
            lookups.append(token_hash)
            return TokenView("tok-1", "ci", "team", "team-1", utc_now(), None)

    cache = PrincipalCache(ttl=5.0, max_entries=2, clock=lambda: now[0])
    factory: Any = Uow
    for _ in range(3):
        assert cache.authenticate(factory, "gpf_a") == Principal("tok-1", "team", "team-1")
    assert len(lookups) == 1
    now[0] = 5.0
    cache.authenticate(factory, "gpf_a")
    assert len(lookups) == 2  # expired: looked up again
    for raw in ("gpf_b", "gpf_c", "gpf_d"):
        cache.authenticate(factory, raw)
    assert len(cache._entries) <= 2
    assert cache.authenticate(factory, "not-a-token") is None
    assert len(lookups) == 5
