"""A `kubernetes` cluster's pools and nodes come from its Kubernetes API (SQLite and PostgreSQL).

The cluster is registered through the REST API without pools; the control plane lists the nodes of
the fake Kubernetes API server (real Node objects, `tests/kubernetes/nodes/`), publishes the
inventory report, and ingest applies it: the real node names, their allocatable capacity, joins,
leaves, cordons, and the run that held a node that vanished (ended, its workload requeued).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from adapters.kubernetes.nodes import observe_node
from controlplane.bootstrap import Wiring, utc_now
from controlplane.bootstrap.real_fleet import RealFleet
from controlplane.service.ingest import InboundMessage, Outcome, handle
from controlplane.service.inventory import InventoryReport, inventory_msg_id
from controlplane.service.kubeconfigs import FileKubeconfigStore
from tests.integration.cloud_support import schedule
from tests.integration.fleet import Tenant, gang
from tests.kubernetes.fake_apiserver import NODES, FakeApiServer
from tests.kubernetes.nodes import onprem_node
from tests.kubernetes.nodes import presets as real

TOKEN = "sa-token-for-gpufleet"
CLUSTER = "onprem"
POOL_KEY = "example.com/gpu-pool"


class Published:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, str]] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.messages.append((subject, payload, msg_id))


def _kubeconfig() -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
            "users": [{"name": "u", "user": {"token": TOKEN}}],
        }
    )


@pytest.fixture
def registered(client: TestClient, admin: dict[str, str], wiring: Wiring) -> dict[str, Any]:
    client.app.state.kubeconfigs = FileKubeconfigStore(  # type: ignore[attr-defined]
        wiring.settings.state_dir / "kubeconfigs"
    )
    body = {
        "name": CLUSTER,
        "provider": "kubernetes",
        "kubeconfig": _kubeconfig(),
        "kubernetes": {"namespace": "ml-jobs", "pool_label_key": POOL_KEY},
        "pool_prices": {"h100": 6.5},
    }
    r = client.post("/v1/clusters", json=body, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["pools"] == []  # registered without pools or counts: they are discovered
    result: dict[str, Any] = r.json()
    return result


@pytest.fixture
def kube() -> Iterator[FakeApiServer]:
    server = FakeApiServer(token=TOKEN).start()
    yield server
    server.stop()


def _apply(wiring: Wiring, subject: str, payload: bytes, msg_id: str) -> tuple[Outcome, str]:
    result = handle(
        wiring.uow(), InboundMessage(subject, payload, {}, msg_id), wiring.settings.subject_prefix, utc_now()
    )
    return result.outcome, result.detail


def _report(wiring: Wiring, at: datetime, *nodes: dict[str, Any]) -> tuple[Outcome, str]:
    report = InventoryReport(observed_at=at, nodes=[observe_node(n, POOL_KEY) for n in nodes])
    subject = f"{wiring.settings.subject_prefix}.cluster.{CLUSTER}.inventory"
    return _apply(wiring, subject, report.model_dump_json().encode(), inventory_msg_id(CLUSTER, at))


def _pools(client: TestClient, admin: dict[str, str]) -> dict[str, dict[str, Any]]:
    view = client.get(f"/v1/clusters/{CLUSTER}", headers=admin).json()
    return {p["name"]: p for p in view["pools"]}


def _nodes(client: TestClient, admin: dict[str, str]) -> dict[str, bool]:
    return {n["name"]: n["schedulable"] for p in _pools(client, admin).values() for n in p["nodes"]}


def test_registered_cluster_shows_its_real_nodes_from_the_first_inventory(
    client: TestClient, admin: dict[str, str], wiring: Wiring, registered: dict[str, Any], kube: FakeApiServer
) -> None:
    for name in ("hgx-h100-01", "hgx-h100-02"):
        kube.put(NODES, real.onprem_h100(name))
    kube.put(NODES, real.onprem_a100_mixed("dgx-a100-01", pool="a100-mig"))
    kube.put(NODES, onprem_node("cpu-01", instance_type="m6i.2xlarge"))  # no GPUs and no pool label
    wiring.settings.kube_api_override = kube.url
    published = Published()
    fleet = RealFleet(wiring, published, wiring.settings.subject_prefix)
    try:
        fleet.refresh()  # a client for the cluster although it has no pool yet
        assert fleet.errors == {}
        assert asyncio.run(fleet.publish_inventory()) == 1
    finally:
        asyncio.run(fleet.close())
    ((subject, payload, msg_id),) = published.messages
    assert subject == f"{wiring.settings.subject_prefix}.cluster.{CLUSTER}.inventory"
    outcome, detail = _apply(wiring, subject, payload, msg_id)
    assert outcome is Outcome.APPLIED, detail
    pools = _pools(client, admin)
    assert set(pools) == {"h100", "a100-mig"}
    h100 = pools["h100"]
    assert sorted(n["name"] for n in h100["nodes"]) == ["hgx-h100-01", "hgx-h100-02"]
    # Allocatable, not the server's 224 cores and 2 TiB: what the kubelet lets pods have.
    assert (h100["cpu_millis"], h100["memory_mib"], h100["gpus_per_node"]) == (223_370, 2_048_187, 8)
    assert (h100["gpu_model"], h100["sharing"], h100["price_per_gpu_hour"]) == ("H100-80GB", "exclusive", 6.5)
    assert h100["resource_names"] == {"gpu": "nvidia.com/gpu"}
    with wiring.uow() as uow:
        synced = [json.loads(p) for _, s, p in uow.outbox.unpublished(100) if s.endswith(f".cluster.{CLUSTER}.synced")]
    ((event,),) = [synced]
    assert event["data"]["added"] == ["a100-mig", "h100"]
    assert event["data"]["source"] == "nodes"
    mig = pools["a100-mig"]
    assert (mig["gpu_model"], mig["sharing"]) == ("A100-80GB", "mig:all-balanced")
    assert mig["resource_names"]["mig:3g.40gb"] == "nvidia.com/mig-3g.40gb"


def test_nodes_that_join_leave_or_are_cordoned_are_followed(
    client: TestClient, admin: dict[str, str], wiring: Wiring, registered: dict[str, Any]
) -> None:
    at = utc_now()
    a, b, c = (real.onprem_h100(f"hgx-{i}") for i in (1, 2, 3))
    assert _report(wiring, at, a, b, c)[0] is Outcome.APPLIED
    assert _nodes(client, admin) == {"hgx-1": True, "hgx-2": True, "hgx-3": True}
    ids = {n["name"]: n["id"] for n in _pools(client, admin)["h100"]["nodes"]}
    # hgx-3 leaves, hgx-4 joins, hgx-1 is cordoned, hgx-2 goes NotReady.
    later = at + timedelta(seconds=30)
    cordoned = real.onprem_h100("hgx-1", unschedulable=True)
    not_ready = real.onprem_h100("hgx-2", ready=False)
    outcome, detail = _report(wiring, later, cordoned, not_ready, real.onprem_h100("hgx-4"))
    assert outcome is Outcome.APPLIED, detail
    assert _nodes(client, admin) == {"hgx-1": False, "hgx-2": False, "hgx-4": True}
    pool = _pools(client, admin)["h100"]
    assert pool["node_count"] == 3
    kept = {n["name"]: n["id"] for n in pool["nodes"]}
    assert kept["hgx-1"] == ids["hgx-1"]  # ids of nodes that stay are kept: runs refer to them
    # Back again: uncordoned and Ready.
    again = later + timedelta(seconds=30)
    assert _report(wiring, again, a, b, real.onprem_h100("hgx-4"))[0] is Outcome.APPLIED
    assert _nodes(client, admin) == {"hgx-1": True, "hgx-2": True, "hgx-4": True}
    # An empty list is a broken reader, not a cluster that lost every node.
    assert _report(wiring, again + timedelta(seconds=30)) == (
        Outcome.APPLIED,
        "empty report ignored (the cluster had nodes)",
    )
    assert len(_nodes(client, admin)) == 3


def test_run_on_a_vanished_node_is_ended_and_its_workload_requeued(
    client: TestClient, admin: dict[str, str], wiring: Wiring, registered: dict[str, Any], tenant: Tenant
) -> None:
    at = utc_now()
    nodes = [real.onprem_h100(f"hgx-{i}") for i in (1, 2, 3)]
    assert _report(wiring, at, *nodes)[0] is Outcome.APPLIED
    r = client.post("/v1/workloads", json=gang("pair", tenant.queue, replicas=2), headers=tenant.headers)
    assert r.status_code == 201, r.text
    workload_id = r.json()["id"]
    assert schedule(wiring) == 1
    view = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
    held = sorted(view["nodes"])
    ((run_id, run_state),) = [(run["id"], run["state"]) for run in view["runs"]]
    assert run_state == "admitted"
    survivors = [n for n in nodes if n["metadata"]["name"] != held[0]]
    outcome, detail = _report(wiring, at + timedelta(seconds=30), *survivors)
    assert outcome is Outcome.APPLIED
    assert f"runs requeued (node lost): {run_id}" in detail
    view = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
    assert view["state"] == "queued"
    (run,) = view["runs"]
    assert run["state"] == "preempted"
    assert run["message"] == f"node-lost: node {held[0]} left cluster {CLUSTER}"
    assert run["end_cause"] == "node-lost"
    with wiring.uow() as uow:
        events = [(s, json.loads(p)) for _, s, p in uow.outbox.unpublished(1000) if s.endswith(".requeued")]
    ((subject, event),) = events
    assert subject == f"{wiring.settings.subject_prefix}.events.workload.{tenant.team}.{tenant.queue}.requeued"
    assert event["data"]["run_id"] == run_id
    assert event["data"]["reason"].startswith("node-lost:")
    # The vanished node is kept, cordoned, while a run refers to it; the gang fits again on the others.
    assert _nodes(client, admin)[held[0]] is False
    assert schedule(wiring) == 1
    view = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
    assert held[0] not in view["nodes"]


def test_kubernetes_settings_are_patched_and_validated(
    client: TestClient, admin: dict[str, str], registered: dict[str, Any]
) -> None:
    patch = {"kubernetes": {"mps_resource": "nvidia.com/gpu.shared", "fail_requests_greater_than_one": True}}
    r = client.patch(f"/v1/clusters/{CLUSTER}", json=patch, headers=admin)
    assert r.status_code == 200, r.text
    settings = r.json()["kubernetes"]
    assert settings["mps_resource"] == "nvidia.com/gpu.shared"
    assert settings["fail_requests_greater_than_one"] is True
    assert settings["pool_label_key"] == POOL_KEY  # not named in the patch: unchanged
    assert settings["namespace"] == "ml-jobs"
    r = client.patch(f"/v1/clusters/{CLUSTER}", json={"kubernetes": {"mps_resource": "gpu"}}, headers=admin)
    assert r.status_code == 422
    assert "is not a Kubernetes extended resource name" in r.text
    r = client.patch(f"/v1/clusters/{CLUSTER}", json={"kubernetes": {"pool_label_key": "no spaces"}}, headers=admin)
    assert r.status_code == 422
    pools = [
        {
            "name": "h100",
            "gpu_model": "H100-80GB",
            "gpus_per_node": 8,
            "cpu_millis": 1000,
            "memory_mib": 1024,
            "node_count": 1,
        }
    ]
    r = client.patch(f"/v1/clusters/{CLUSTER}", json={"pools": pools}, headers=admin)
    assert r.status_code == 409  # the cluster's kind, not the request, is in the way
    assert "come from the cluster's nodes" in r.text
    body = {"name": "x", "provider": "kubernetes", "kubeconfig": _kubeconfig(), "pools": pools}
    r = client.post("/v1/clusters", json=body, headers=admin)
    assert r.status_code == 422
    assert "discovered from the cluster's nodes" in r.text


def test_a_fraction_the_device_plugin_refuses_is_refused_at_submit(
    client: TestClient, wiring: Wiring, registered: dict[str, Any], tenant: Tenant
) -> None:
    mps = real.onprem_h100("hgx-mps-1", pool="h100-mps")
    mps["metadata"]["labels"].update({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"})
    mps["status"]["allocatable"]["nvidia.com/gpu"] = "32"
    assert _report(wiring, utc_now(), mps)[0] is Outcome.APPLIED
    half = {"name": "infer", "queue": tenant.queue, "pod_sets": [{"name": "srv", "replicas": 1, "gpu_fraction": 0.5}]}
    r = client.post("/v1/workloads", json=half, headers=tenant.headers)
    assert r.status_code == 409, r.text  # what the fleet's device plugin allows: state, not the request
    assert (
        "pod set srv asks 0.5 GPU per pod, which is 2 shares of pool h100-mps (mps:4: one share is 1/4 GPU), "
        "but the device plugin there gives a container at most 1 share" in r.text
    )
    quarter = dict(half, pod_sets=[{"name": "srv", "replicas": 1, "gpu_fraction": 0.25}])
    r = client.post("/v1/workloads", json=quarter, headers=tenant.headers)
    assert r.status_code == 201, r.text


def test_node_that_loses_its_gpus_under_a_run_takes_no_new_work(
    client: TestClient, admin: dict[str, str], wiring: Wiring, registered: dict[str, Any], tenant: Tenant
) -> None:
    at = utc_now()
    nodes = [real.onprem_h100(f"hgx-{i}") for i in (1, 2)]
    assert _report(wiring, at, *nodes)[0] is Outcome.APPLIED
    r = client.post("/v1/workloads", json=gang("one", tenant.queue, replicas=1), headers=tenant.headers)
    assert r.status_code == 201, r.text
    assert schedule(wiring) == 1
    (held,) = client.get(f"/v1/workloads/{r.json()['id']}", headers=tenant.headers).json()["nodes"]
    broken = next(n for n in nodes if n["metadata"]["name"] == held)
    broken["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # the device plugin lost its GPUs
    others = [n for n in nodes if n is not broken]
    outcome, detail = _report(wiring, at + timedelta(seconds=30), broken, *others)
    assert outcome is Outcome.APPLIED
    assert "requeued" not in detail  # the node is still there; its run is the pod status's to judge
    assert _nodes(client, admin)[held] is False


def test_a_resource_name_the_nodes_do_not_advertise_is_refused_or_shown_with_the_cluster(
    client: TestClient, admin: dict[str, str], wiring: Wiring, registered: dict[str, Any]
) -> None:
    """Real H100 nodes advertise nvidia.com/gpu and a MIG-mixed A100 nvidia.com/mig-<profile>: an
    override that makes pods ask for another name would leave them Pending for ever."""
    at = utc_now()
    h100 = real.onprem_h100("hgx-h100-01")
    mig = real.onprem_a100_mixed("dgx-a100-01", pool="a100-mig")
    assert _report(wiring, at, h100, mig)[0] is Outcome.APPLIED
    shared = {"kubernetes": {"gpu_resource": "nvidia.com/gpu.shared"}}
    r = client.patch(f"/v1/clusters/{CLUSTER}", json=shared, headers=admin)
    assert r.status_code == 409, r.text
    assert (
        "pool h100's nodes advertise nvidia.com/gpu for gpu, but this cluster's settings make its pods ask for "
        "nvidia.com/gpu.shared, which no node offers: they would stay Pending" in r.json()["detail"]
    )
    single = {"kubernetes": {"mig_strategy": "single"}}  # the A100s are MIG-mixed
    r = client.patch(f"/v1/clusters/{CLUSTER}", json=single, headers=admin)
    assert r.status_code == 409, r.text
    assert "pool a100-mig's nodes advertise nvidia.com/mig-1g.10gb for mig:1g.10gb" in r.json()["detail"]
    assert client.get(f"/v1/clusters/{CLUSTER}", headers=admin).json()["kubernetes"].get("mig_strategy") is None
    # What the nodes advertise, said again, is accepted.
    r = client.patch(f"/v1/clusters/{CLUSTER}", json={"kubernetes": {"gpu_resource": "nvidia.com/gpu"}}, headers=admin)
    assert r.status_code == 200, r.text
    # Set before the nodes were known (here: a pool that joins later), the mismatch is shown with
    # the cluster once the inventory brings them.
    r = client.patch(f"/v1/clusters/{CLUSTER}", json={"kubernetes": {"mps_resource": "example.com/mps"}}, headers=admin)
    assert r.status_code == 200, r.text  # no MPS pool yet: nothing to check against
    mps = real.onprem_h100("hgx-mps-1", pool="h100-mps")
    mps["metadata"]["labels"].update({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"})
    mps["status"]["allocatable"]["nvidia.com/gpu"] = "32"
    assert _report(wiring, at + timedelta(seconds=30), h100, mig, mps)[0] is Outcome.APPLIED
    issues = client.get(f"/v1/clusters/{CLUSTER}", headers=admin).json()["pool_issues"]
    assert any(
        "pool h100-mps's nodes advertise nvidia.com/gpu for share" in i and "example.com/mps" in i for i in issues
    )
