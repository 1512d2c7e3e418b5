"""A gang dispatched to a GKE cluster (cloud fake for discovery and credentials, fake Kubernetes API
server for the cluster): objects created once, also by a new driver; orphans collected; a gang whose
pods never all run is torn down and requeued."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from controlplane.bootstrap import Wiring, utc_now
from controlplane.bootstrap.real_fleet import RealFleet
from controlplane.service.cluster_objects import reconcile_cluster_objects
from controlplane.service.dispatch import dispatch_once
from controlplane.service.gang_timeout import requeue_stalled_gangs
from controlplane.service.ingest import InboundMessage, Outcome, handle
from tests.clouds import test_gke
from tests.clouds.keys import KeyPair
from tests.integration.cloud_support import GKE_CLUSTER, gke_provider, schedule, sync
from tests.integration.fleet import add_tenant
from tests.kubernetes.fake_apiserver import NODES, FakeApiServer
from tests.kubernetes.nodes import presets as real

JOBS = ("batch", "v1", "jobs")


class Published:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, str]] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.messages.append((subject, payload, msg_id))


def _sql(wiring: Wiring, statement: str) -> Any:
    engine = create_engine(wiring.settings.database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        rows = conn.execute(text(statement)).all() if statement.lstrip().upper().startswith("SELECT") else None
        if rows is None:
            conn.execute(text(statement))
    engine.dispose()
    return rows


def test_gang_on_a_gke_cluster(client: TestClient, admin: dict[str, str], wiring: Wiring) -> None:
    key = KeyPair.generate()
    google = test_gke.FakeGoogle(key)
    google.server.start()
    kube = FakeApiServer(token=test_gke.ACCESS_TOKEN).start()  # only the cloud-minted token is accepted
    try:
        provider = gke_provider(google, key)
        assert client.post("/v1/clusters", json=GKE_CLUSTER, headers=admin).status_code == 201
        # The cluster's real nodes, as GKE labels them; fleet sync reads them from the first sync on.
        mig_nodes = [f"gke-train-h100-mig-4f0c1a2b-{s}" for s in ("7x9q", "k2m4")]
        for name in mig_nodes:
            kube.put(NODES, real.gke_h100_mig(name))
        for i in range(3):
            kube.put(NODES, real.gke_l4_time_sharing(f"gke-train-l4-shared-9d8e7f6a-{i}", "TIME_SHARING"))
        wiring.settings.kube_api_override = kube.url
        prefix = wiring.settings.subject_prefix
        fleet = RealFleet(wiring, Published(), prefix, {"gke": provider})
        fleet.refresh()  # a client for the cluster before its first sync
        (result,) = sync(wiring, {"gke": provider}, fleet.inventory_nodes)
        assert result.ok, result.error
        pools = {p["name"]: p for p in client.get("/v1/clusters/gke-train", headers=admin).json()["pools"]}
        assert sorted(n["name"] for n in pools["h100-mig"]["nodes"]) == mig_nodes
        assert pools["h100-mig"]["cpu_millis"] == 207410  # allocatable (GKE's CPU ladder), not 208 vCPUs
        assert (pools["l4-shared"]["sharing"], pools["l4-shared"]["max_shares_per_pod"]) == ("timeslice:4", 1)
        assert (pools["h100-mig"]["min_size"], pools["h100-mig"]["price_per_gpu_hour"]) == (0, 9.5)
        # Between two syncs the inventory report follows the nodes and keeps what the cloud said.
        bounds = (pools["l4-shared"]["min_size"], pools["l4-shared"]["max_size"])
        kube.put(NODES, real.gke_l4_time_sharing("gke-train-l4-shared-9d8e7f6a-3", "TIME_SHARING"))
        inventory = Published()
        fleet.publisher = inventory
        assert asyncio.run(fleet.publish_inventory()) == 1
        ((subject, payload, msg_id),) = inventory.messages
        applied = handle(wiring.uow(), InboundMessage(subject, payload, {}, msg_id), prefix, utc_now())
        assert applied.outcome is Outcome.APPLIED, applied.detail
        pools = {p["name"]: p for p in client.get("/v1/clusters/gke-train", headers=admin).json()["pools"]}
        assert len(pools["l4-shared"]["nodes"]) == 4
        assert (pools["l4-shared"]["min_size"], pools["l4-shared"]["max_size"]) == bounds
        for pc in ({"name": "batch", "value": 100, "is_default": True},):
            assert client.post("/v1/priority-classes", json=pc, headers=admin).status_code == 201
        tenant = add_tenant(client, admin, "vision", "vision-train")
        body = {
            "name": "mig-gang",
            "queue": tenant.queue,
            "pod_sets": [{"name": "workers", "replicas": 2, "mig_profile": "1g.10gb"}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "container": {"image": "trainer:1"},
            "labels": {"project": "vision"},
            "max_runtime_seconds": 3600,
        }
        r = client.post("/v1/workloads", json=body, headers=tenant.headers)
        assert r.status_code == 201, r.text
        workload_id = r.json()["id"]
        assert schedule(wiring) == 1

        fleet.refresh()  # the driver gets the pools the sync made
        stats = asyncio.run(dispatch_once(wiring.uow, fleet.drivers(), prefix, utc_now))
        assert (stats.applied, stats.errors) == (1, [])
        jobs = kube.objects_of(JOBS, "gpufleet")
        assert len(jobs) == 1  # both pods packed on one node: one placement group, one indexed Job
        assert jobs[0]["spec"]["completions"] == 2
        affinity = jobs[0]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchFields"][0]["values"][0] in mig_nodes  # pinned to a node that exists
        limits = jobs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"  # GKE advertises MIG partitions as nvidia.com/gpu
        # what the workload declared reaches the cluster: labels, runtime bound, its priority class
        pod = jobs[0]["spec"]["template"]
        assert jobs[0]["metadata"]["labels"]["project"] == pod["metadata"]["labels"]["project"] == "vision"
        assert pod["metadata"]["labels"]["gpufleet.io/run"].endswith("-1")  # full run id, attempt 1
        assert pod["spec"]["activeDeadlineSeconds"] == 3600
        assert pod["spec"]["priorityClassName"] == "gpufleet-batch"
        [priority_class] = kube.objects_of(("scheduling.k8s.io", "v1", "priorityclasses"))
        assert (priority_class["metadata"]["name"], priority_class["value"]) == ("gpufleet-batch", 100)
        created = list(kube.creations)

        # A dispatcher that crashed after the call but before recording it: a new driver applies again.
        _sql(wiring, "UPDATE runs SET dispatch_state = 'pending'")
        restarted = RealFleet(wiring, Published(), prefix, {"gke": provider})
        restarted.refresh()
        stats = asyncio.run(dispatch_once(wiring.uow, restarted.drivers(), prefix, utc_now))
        assert (stats.applied, stats.already_present) == (0, 1)
        assert kube.creations == created  # nothing created twice

        # An object of a run gpufleet does not know is garbage-collected.
        orphan = dict(jobs[0], metadata=dict(jobs[0]["metadata"]))
        orphan["metadata"] = {
            "name": "orphan-job",
            "namespace": "gpufleet",
            "labels": dict(jobs[0]["metadata"]["labels"], **{"gpufleet.io/run": "run-orphan"}),
            "annotations": jobs[0]["metadata"].get("annotations", {}),
        }
        kube.put(JOBS, orphan)
        orphans = asyncio.run(reconcile_cluster_objects(wiring.uow, restarted.drivers(), prefix, utc_now))
        assert len(orphans.deleted) == 1
        assert [j["metadata"]["name"] for j in kube.objects_of(JOBS, "gpufleet")] == [jobs[0]["metadata"]["name"]]

        # Pods never all run: after the gang start timeout the run is torn down and the gang requeued.
        late = utc_now() + timedelta(seconds=601)
        ended = requeue_stalled_gangs(wiring.uow, prefix, lambda: late, 600.0)
        assert len(ended) == 1
        view = client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers).json()
        assert view["state"] == "queued"
        assert "gang-start-timeout" in view["reason"]
        assert view["runs"][-1]["end_cause"] == "gang-start-timeout"  # a column, not read from the text
        stats = asyncio.run(dispatch_once(wiring.uow, restarted.drivers(), prefix, utc_now))
        assert stats.torn_down == 1
        assert kube.objects_of(JOBS, "gpufleet") == []
        subjects = [s for (s,) in _sql(wiring, "SELECT subject FROM outbox")]
        assert f"{prefix}.events.workload.{tenant.team}.{tenant.queue}.requeued" in subjects
        for f in (fleet, restarted):
            asyncio.run(f.close())
    finally:
        kube.stop()
        google.server.stop()
