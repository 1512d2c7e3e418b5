"""Fair-share history and opt-in rebalancing through the scheduler's shell on a real database."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import update

from adapters.sql.tables import RunRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Policy
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import Tenant, add_tenant, gang

TTL = 15.0
HISTORY = Policy(usage_history_weight=1.0, usage_half_life_seconds=3600)


def _submit(client: TestClient, tenant: Tenant, name: str, replicas: int) -> str:
    r = client.post("/v1/workloads", json=gang(name, tenant.queue, replicas=replicas), headers=tenant.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _state(client: TestClient, tenant: Tenant, workload_id: str) -> dict[str, object]:
    return dict(client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json())


def test_recent_heavy_usage_puts_a_queue_behind_and_the_api_says_fair_share(
    wiring: Wiring, client: TestClient, tenant: Tenant, admin: dict[str, str]
) -> None:
    other = add_tenant(client, admin, "nlp", "nlp-train")
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), TTL)
    assert epoch is not None
    # vision uses the whole fleet for a while; its runs ended ten minutes ago.
    used = [_submit(client, tenant, f"old{i}", 1) for i in range(4)]
    run_cycle(wiring.uow, "s", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), TTL, True)
    now = utc_now()
    with wiring.uow() as uow:
        uow.session.execute(  # type: ignore[attr-defined]
            update(RunRow).values(
                state="succeeded", created_at=now - timedelta(hours=3), finished_at=now - timedelta(minutes=10)
            )
        )
        for workload_id in used:
            uow.workloads.set_state(workload_id, ("admitted",), "succeeded", "done", now)
        uow.commit()

    mine = _submit(client, tenant, "again", 4)
    theirs = _submit(client, other, "first-time", 4)
    with wiring.uow() as uow:
        snapshot = uow.snapshots.load(history_since=now - timedelta(hours=8))
    assert {i.queue_id for i in snapshot.usage_history} == {snapshot.pending[0].queue_id}
    assert all(i.gpu_eq == 8.0 for i in snapshot.usage_history)
    # Without history vision, which submitted first, would go first.
    plain = schedule(snapshot, Policy(), now)
    assert [a.workload_id for a in plain.admissions] == [mine]

    run_cycle(wiring.uow, "s", epoch, HISTORY, wiring.settings.subject_prefix, now, TTL, True)
    assert _state(client, other, theirs)["state"] == "admitted"
    waiting = _state(client, tenant, mine)
    assert waiting["state"] == "queued"
    assert str(waiting["reason"]).startswith("fair-share: queue vision-train")


def test_rebalancing_is_opt_in_evicts_once_and_then_waits_out_its_interval(
    wiring: Wiring, client: TestClient, tenant: Tenant, admin: dict[str, str]
) -> None:
    other = add_tenant(client, admin, "nlp", "nlp-train")
    epoch = acquire_leadership(wiring.uow, "s", utc_now(), TTL)
    assert epoch is not None
    prefix = wiring.settings.subject_prefix
    hogs = [_submit(client, other, f"hog{i}", 1) for i in range(4)]
    run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), TTL, True)
    first = _submit(client, tenant, "first", 1)

    # Off by default: nothing is evicted.
    assert run_cycle(wiring.uow, "s", epoch, Policy(), prefix, utc_now(), TTL, True).evicted == 0
    policy = Policy(rebalance=True, rebalance_interval_seconds=3600)
    result = run_cycle(wiring.uow, "s", epoch, policy, prefix, utc_now(), TTL, True)
    assert result.evicted == 1
    assert _state(client, tenant, first)["state"] == "admitted"
    evicted = [h for h in hogs if _state(client, other, h)["state"] == "queued"]
    assert len(evicted) == 1
    assert str(_state(client, other, evicted[0])["runs"][0]["message"]).startswith("rebalanced:")  # type: ignore[index]
    assert _state(client, other, evicted[0])["runs"][0]["end_cause"] == "rebalanced"  # type: ignore[index]
    with wiring.uow() as uow:
        marked = uow.snapshots.load(last_rebalance=True).last_rebalance_at
    assert marked is not None

    # Within the interval a second gang waits, though taking another hog would still be fairer.
    second = _submit(client, tenant, "second", 1)
    assert run_cycle(wiring.uow, "s", epoch, policy, prefix, utc_now(), TTL, True).evicted == 0
    assert _state(client, tenant, second)["state"] == "queued"
    later = utc_now() + timedelta(hours=2)
    assert run_cycle(wiring.uow, "s", epoch, policy, prefix, later, TTL * 1000, True).evicted == 1
    assert _state(client, tenant, second)["state"] == "admitted"
