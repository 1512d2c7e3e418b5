"""Cancelling a gang that runs on a real cluster: a `kubernetes` cluster registered through the REST
API with a token kubeconfig, reached (`kube_api_override`) at the fake Kubernetes API server. The gang
is dispatched (a Volcano PodGroup and its Job, whose pods the fake Job controller creates), cancelled
through the REST API, and the next dispatcher pass deletes its objects: the server holds none after."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from controlplane.bootstrap import Wiring, utc_now
from controlplane.bootstrap.real_fleet import RealFleet
from controlplane.service.cluster_objects import reconcile_cluster_objects
from controlplane.service.dispatch import dispatch_once
from controlplane.service.ingest import InboundMessage, Outcome, handle
from controlplane.service.kubeconfigs import FileKubeconfigStore
from tests.integration.cloud_support import schedule
from tests.integration.fleet import add_tenant, gang
from tests.kubernetes.fake_apiserver import NODES, FakeApiServer, run_job_controller
from tests.kubernetes.nodes import presets as real

TOKEN = "sa-token-for-gpufleet"
NAMESPACE = "ml-jobs"
RUN_LABEL = "gpufleet.io/run"


class Published:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, str]] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.messages.append((subject, payload, msg_id))


def _kubeconfig(server: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "onprem", "cluster": {"server": server}}],
            "contexts": [{"name": "onprem", "context": {"cluster": "onprem", "user": "gpufleet"}}],
            "current-context": "onprem",
            "users": [{"name": "gpufleet", "user": {"token": TOKEN}}],
        }
    )


def _held(kube: FakeApiServer) -> dict[str, list[tuple[str, str]]]:
    """Every object the API server holds, by resource plural: (namespace, name)."""
    with kube.lock:
        return {key[2]: sorted(store) for key, store in kube.objects.items() if store}


def _of_run(kube: FakeApiServer, run_id: str) -> list[tuple[str, str]]:
    with kube.lock:
        return [
            (key[2], name)
            for key, store in kube.objects.items()
            for (_, name), obj in store.items()
            if (obj["metadata"].get("labels") or {}).get(RUN_LABEL) == run_id
        ]


def test_cancelled_gang_leaves_nothing_on_its_cluster(
    client: TestClient, admin: dict[str, str], wiring: Wiring, tmp_path: Path
) -> None:
    kube = FakeApiServer(token=TOKEN).start()  # only the kubeconfig's token is accepted
    fleet: RealFleet | None = None
    try:
        # The API and the dispatcher share the state dir's kubeconfig store, as in a deployment.
        client.app.state.kubeconfigs = FileKubeconfigStore(  # type: ignore[attr-defined]
            wiring.settings.state_dir / "kubeconfigs"
        )
        body: dict[str, Any] = {
            "name": "onprem",
            "provider": "kubernetes",
            "kubeconfig": _kubeconfig("https://10.0.0.1:6443"),
            "kubernetes": {"namespace": NAMESPACE, "gang": "volcano", "pool_label_key": "example.com/gpu-pool"},
        }
        r = client.post("/v1/clusters", json=body, headers=admin)
        assert r.status_code == 201, r.text
        # Its pools and nodes are the API server's nodes, read by the control plane's inventory.
        for name in ("hgx-h100-01", "hgx-h100-02"):
            kube.put(NODES, real.onprem_h100(name))
        wiring.settings.kube_api_override = kube.url
        prefix = wiring.settings.subject_prefix
        inventory = Published()
        fleet = RealFleet(wiring, inventory, prefix)
        fleet.refresh()
        assert asyncio.run(fleet.publish_inventory()) == 1
        ((subject, payload, msg_id),) = inventory.messages
        assert handle(wiring.uow(), InboundMessage(subject, payload, {}, msg_id), prefix, utc_now()).outcome is (
            Outcome.APPLIED
        )
        r = client.post("/v1/priority-classes", json={"name": "batch", "value": 100, "is_default": True}, headers=admin)
        assert r.status_code == 201, r.text
        tenant = add_tenant(client, admin, "vision", "vision-train")
        spec = gang("two-nodes", tenant.queue, replicas=2, gpus=8, container={"image": "trainer:1"})
        r = client.post("/v1/workloads", json=spec, headers=tenant.headers)
        assert r.status_code == 201, r.text
        workload_id = r.json()["id"]
        assert schedule(wiring) == 1

        # The kubeconfig names the cluster's own address; the test reaches it through the override (a tunnel).
        fleet.refresh()  # the driver gets the pools the inventory made
        assert fleet.errors == {}
        stats = asyncio.run(dispatch_once(wiring.uow, fleet.drivers(), prefix, utc_now))
        assert (stats.applied, stats.errors) == (1, [])
        run_job_controller(kube, NAMESPACE)  # the Job controller creates the gang's pods
        view = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
        ((run_id, cluster),) = [(run["id"], run["cluster"]) for run in view["runs"]]
        assert cluster == "onprem"
        held = _held(kube)
        assert {"podgroups", "jobs", "pods"} <= set(held), held
        assert len(held["pods"]) == 2
        assert {kind for kind, _ in _of_run(kube, run_id)} >= {"podgroups", "jobs"}

        r = client.post(f"/v1/workloads/{workload_id}/cancel", json={"reason": "not needed"}, headers=tenant.headers)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "cancelled"
        assert [run["state"] for run in r.json()["runs"]] == ["cancelled"]
        stats = asyncio.run(dispatch_once(wiring.uow, fleet.drivers(), prefix, utc_now))
        assert (stats.torn_down, stats.errors) == (1, [])
        assert _of_run(kube, run_id) == []
        # its pods went with their Job; what stays: the nodes and the class's PriorityClass, shared by every run
        assert _held(kube) == {
            "nodes": [("", "hgx-h100-01"), ("", "hgx-h100-02")],
            "priorityclasses": [("", "gpufleet-batch")],
        }
        assert kube.deletions, "deleted through the API, not left to a garbage collector"
        # Nothing left to do: a second pass tears nothing down, orphan collection finds nothing.
        stats = asyncio.run(dispatch_once(wiring.uow, fleet.drivers(), prefix, utc_now))
        assert (stats.applied, stats.torn_down) == (0, 0)
        assert asyncio.run(reconcile_cluster_objects(wiring.uow, fleet.drivers(), prefix, utc_now)).deleted == []
    finally:
        if fleet is not None:
            asyncio.run(fleet.close())
        kube.stop()
