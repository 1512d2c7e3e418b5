"""Editing and deleting a cluster whose nodes ended runs' history names (they answered 500 before)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select

from adapters.sql.tables import RunAssignmentRow, RunRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import add_tenant, gang, h100_cluster, setup_fleet


def _ended_run_on(client: TestClient, wiring: Wiring, admin: dict[str, str]) -> set[str]:
    """Admit one 8-GPU gang, cancel it, and return the names of the nodes its ended run names."""
    tenant = add_tenant(client, admin, "vision", "vision-train")
    r = client.post("/v1/workloads", json=gang("once", tenant.queue, replicas=2), headers=tenant.headers)
    assert r.status_code == 201, r.text
    workload_id = r.json()["id"]
    epoch = acquire_leadership(wiring.uow, "test", utc_now(), 15.0)
    assert epoch is not None
    run_cycle(wiring.uow, "test", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 15.0)
    assert client.post(f"/v1/workloads/{workload_id}/cancel", headers=tenant.headers).status_code == 200
    view = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
    assert view["state"] == "cancelled"
    assert [run["state"] for run in view["runs"]] == ["cancelled"]
    return set(view["nodes"])


def test_pools_are_reconciled_by_name_and_nodes_history_names_stay_cordoned(
    client: TestClient, wiring: Wiring, admin: dict[str, str]
) -> None:
    setup_fleet(client, admin, h100_cluster(nodes=2))
    used = _ended_run_on(client, wiring, admin)
    assert used == {"sim-h100-h100-0", "sim-h100-h100-1"}
    pool = client.get("/v1/clusters/sim-h100", headers=admin).json()["pools"][0]
    before = {n["name"]: n["id"] for n in pool["nodes"]}
    r = client.patch("/v1/clusters/sim-h100", json={"pools": h100_cluster(nodes=1)["pools"]}, headers=admin)
    assert r.status_code == 200, r.text
    nodes = {n["name"]: n for n in r.json()["pools"][0]["nodes"]}
    # The node kept keeps its id; the one taken out is still there, cordoned, for the history.
    assert nodes["sim-h100-h100-0"]["id"] == before["sim-h100-h100-0"]
    assert nodes["sim-h100-h100-0"]["schedulable"] is True
    assert nodes["sim-h100-h100-1"]["schedulable"] is False
    r = client.patch("/v1/clusters/sim-h100", json={"pools": h100_cluster(nodes=3)["pools"]}, headers=admin)
    assert r.status_code == 200, r.text
    assert sorted(n["name"] for n in r.json()["pools"][0]["nodes"]) == [f"sim-h100-h100-{i}" for i in range(3)]
    with wiring.uow() as uow:
        session = uow.session  # type: ignore[attr-defined]  # the SQL unit of work under the port
        assert len(session.scalars(select(RunAssignmentRow)).all()) == 2  # the history is whole
        assert len(session.scalars(select(RunRow)).all()) == 1


def test_a_cluster_with_run_history_is_not_deleted_and_says_why(
    client: TestClient, wiring: Wiring, admin: dict[str, str]
) -> None:
    setup_fleet(client, admin, h100_cluster(nodes=2))
    client.post("/v1/clusters", json=h100_cluster("sim-spare", nodes=1), headers=admin)
    _ended_run_on(client, wiring, admin)
    r = client.delete("/v1/clusters/sim-h100", headers=admin)
    assert r.status_code == 409
    assert "history of 1 ended run(s)" in r.json()["detail"]
    assert client.get("/v1/clusters/sim-h100", headers=admin).status_code == 200
    assert client.delete("/v1/clusters/sim-spare", headers=admin).status_code == 204
