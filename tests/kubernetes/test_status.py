"""Pod status read back as `PodReport`s (pure parsing and the list+watch loop) and node inventory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes import client

from adapters.kubernetes.cluster_reads import list_nodes
from adapters.kubernetes.driver import KubernetesCluster
from adapters.kubernetes.manifests import KubeSettings
from adapters.kubernetes.status import PodStatusWatcher, pod_status, reports_from_pods
from controlplane.domain.model import Taint
from controlplane.service.cluster_status import PodReport, PodStatus
from tests.kubernetes.conftest import NAMESPACE, pools, training_order
from tests.kubernetes.fake_apiserver import (
    NODES,
    PODS,
    FakeApiServer,
    Request,
    run_job_controller,
    set_pod_status,
)

RUN = "run-0123456789abcdef0123"


def pod(
    name: str,
    *,
    run: str = RUN,
    pod_set: str = "worker",
    completion: int = 0,
    indices: str = "0",
    phase: str = "Pending",
    created: str = "2026-01-01T00:00:00Z",
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": name,
            "creationTimestamp": created,
            "labels": {
                "app.kubernetes.io/managed-by": "gpufleet",
                "gpufleet.io/run": run,
                "gpufleet.io/epoch": "3",
                "gpufleet.io/pod-set": pod_set,
            },
            "annotations": {
                "batch.kubernetes.io/job-completion-index": str(completion),
                "gpufleet.io/pod-indices": indices,
            },
        },
        "status": {"phase": phase, **status},
    }


def test_completion_index_maps_to_the_core_pod_index() -> None:
    parsed = pod_status(pod("w-1", completion=1, indices="1,3", phase="Running"))
    assert parsed is not None
    key, status = parsed
    assert (key.run_id, key.epoch, key.pod_set, key.index) == (RUN, 3, "worker", 3)
    assert status == PodStatus(pod_set="worker", index=3, phase="Running", message="")


def test_failed_container_and_unschedulable_pod_messages() -> None:
    failed = pod(
        "w-0",
        phase="Failed",
        containerStatuses=[
            {"name": "main", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "boom"}}}
        ],
    )
    parsed = pod_status(failed)
    assert parsed is not None
    assert parsed[1].message == "w-0: container main exited 137 (OOMKilled): boom"
    pending = pod(
        "w-0",
        conditions=[{"type": "PodScheduled", "status": "False", "message": "0/4 nodes are available"}],
        containerStatuses=[{"name": "main", "state": {"waiting": {"reason": "ImagePullBackOff"}}}],
    )
    parsed = pod_status(pending)
    assert parsed is not None
    assert parsed[1].message == "w-0: 0/4 nodes are available; container main: ImagePullBackOff"
    assert len(pod_status(pod("x", phase="Failed", message="m" * 2000))[1].message) == 500  # type: ignore[index]


def test_foreign_and_malformed_pods_are_ignored() -> None:
    assert pod_status({"metadata": {"name": "x", "labels": {}}}) is None
    broken = pod("w-0", completion=5, indices="0,1")  # index beyond the group's list
    assert pod_status(broken) is None
    weird = pod("w-0", phase="Evicting")
    assert pod_status(weird)[1].phase == "Unknown"  # type: ignore[index]


def test_reports_group_per_run_and_newest_pod_wins() -> None:
    reports = reports_from_pods(
        [
            pod("w-0-old", phase="Failed", created="2026-01-01T00:00:00Z"),
            pod("w-0-new", phase="Running", created="2026-01-01T00:05:00Z"),
            pod("w-1", completion=0, indices="1", phase="Running"),
            pod("l-0", pod_set="launcher", phase="Succeeded"),
            pod("o-0", run="run-other", phase="Pending"),
        ]
    )
    assert reports == [
        PodReport(
            run_id=RUN,
            epoch=3,
            pods=[
                PodStatus(pod_set="launcher", index=0, phase="Succeeded"),
                PodStatus(pod_set="worker", index=0, phase="Running"),
                PodStatus(pod_set="worker", index=1, phase="Running"),
            ],
        ),
        PodReport(run_id="run-other", epoch=3, pods=[PodStatus(pod_set="worker", index=0, phase="Pending")]),
    ]


class Collector:
    """The sink: collects reports; can be told to fail like a NATS outage."""

    def __init__(self) -> None:
        self.reports: list[PodReport] = []
        self.failures_left = 0
        self.changed = asyncio.Event()

    async def __call__(self, report: PodReport) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise ConnectionError("nats is down")
        self.reports.append(report)
        self.changed.set()

    async def wait_for(self, predicate: Callable[[PodReport], bool], timeout: float = 15) -> PodReport:
        async def scan() -> PodReport:
            seen = 0
            while True:
                for report in self.reports[seen:]:
                    if predicate(report):
                        return report
                seen = len(self.reports)
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(scan(), timeout)


def phases(report: PodReport) -> dict[tuple[str, int], str]:
    return {(p.pod_set, p.index): p.phase for p in report.pods}


@pytest.fixture
async def cluster(fake_api: FakeApiServer, kube_config: client.Configuration) -> AsyncIterator[KubernetesCluster]:
    driver = KubernetesCluster("east", kube_config, KubeSettings(namespace=NAMESPACE, gang="volcano"), pools())
    await driver.apply(training_order())
    run_job_controller(fake_api, NAMESPACE)
    yield driver
    driver.close()


@pytest.fixture
async def watcher(
    kube_config: client.Configuration, cluster: KubernetesCluster
) -> AsyncIterator[tuple[PodStatusWatcher, Collector]]:
    sink = Collector()
    w = PodStatusWatcher(kube_config, NAMESPACE, sink, watch_timeout_seconds=2, retry_seconds=0.1)
    task = asyncio.create_task(w.run())
    yield w, sink
    w.stop()
    await asyncio.wait_for(task, 10)  # stop() must end the blocked watch promptly
    w.close()


ALL_PODS = {("launcher", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("worker", 3)}


async def test_watcher_reports_pod_events_per_run(
    fake_api: FakeApiServer, watcher: tuple[PodStatusWatcher, Collector]
) -> None:
    w, sink = watcher
    first = await sink.wait_for(lambda r: True)
    assert first.run_id == RUN
    assert first.epoch == 3
    assert phases(first) == dict.fromkeys(ALL_PODS, "Pending")

    # Job worker-1 runs on node-b and holds core indices 1 and 3: its completion index 1 is pod 3.
    set_pod_status(fake_api, NAMESPACE, f"{RUN}-worker-1-1", "Running")
    report = await sink.wait_for(lambda r: phases(r)[("worker", 3)] == "Running")
    assert phases(report)[("worker", 1)] == "Pending"

    for p in fake_api.objects_of(PODS, NAMESPACE):
        set_pod_status(fake_api, NAMESPACE, p["metadata"]["name"], "Running")
    await sink.wait_for(lambda r: set(phases(r).values()) == {"Running"})

    set_pod_status(
        fake_api,
        NAMESPACE,
        f"{RUN}-worker-0-1",
        "Failed",
        containerStatuses=[
            {
                "name": "main",
                "image": "trainer:1.2",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
            }
        ],
    )
    failed = await sink.wait_for(lambda r: "Failed" in phases(r).values())
    [bad] = [p for p in failed.pods if p.phase == "Failed"]
    assert (bad.pod_set, bad.index) == ("worker", 2)  # worker-0 holds indices 0,2
    assert bad.message == f"{RUN}-worker-0-1: container main exited 1 (Error)"
    assert w.relists == 1


async def test_unchanged_pods_are_not_reported_twice(
    fake_api: FakeApiServer, watcher: tuple[PodStatusWatcher, Collector]
) -> None:
    _, sink = watcher
    await sink.wait_for(lambda r: True)
    # A label-only change (what kubectl label would do) alters no status: no new report.
    p = fake_api.get(PODS, NAMESPACE, f"{RUN}-launcher-0-0")
    assert p is not None
    p["metadata"]["labels"]["touched"] = "yes"
    fake_api.put(PODS, p)
    set_pod_status(fake_api, NAMESPACE, f"{RUN}-launcher-0-0", "Running")
    await sink.wait_for(lambda r: phases(r)[("launcher", 0)] == "Running")
    assert len(sink.reports) == 2


async def test_watcher_relists_after_410_gone(
    fake_api: FakeApiServer, watcher: tuple[PodStatusWatcher, Collector]
) -> None:
    w, sink = watcher
    await sink.wait_for(lambda r: True)
    gone_once: list[Request] = []

    def change_then_compact(request: Request) -> None:
        # While no watch is open, a pod changes and the history is compacted away: the resumed
        # watch's resourceVersion is too old, so the server answers 410 and only a list can tell.
        if request.query.get("watch") and not gone_once:
            gone_once.append(request)
            set_pod_status(fake_api, NAMESPACE, f"{RUN}-worker-0-0", "Running")
            fake_api.remove(PODS, NAMESPACE, f"{RUN}-launcher-0-0")
            fake_api.compact()

    fake_api.before_request = change_then_compact
    fake_api.close_watches()
    report = await sink.wait_for(lambda r: phases(r)[("worker", 0)] == "Running")
    assert gone_once
    assert w.relists == 2
    assert phases(report)[("worker", 2)] == "Pending"
    # the pod that vanished unseen is judged like a DELETED event: it did not finish
    [launcher] = [p for p in report.pods if p.pod_set == "launcher"]
    assert (launcher.phase, launcher.message) == ("Failed", f"{RUN}-launcher-0-0: deleted before it finished")


async def test_deleted_unfinished_pod_is_reported_failed_then_the_run_is_forgotten(
    fake_api: FakeApiServer, watcher: tuple[PodStatusWatcher, Collector], cluster: KubernetesCluster
) -> None:
    w, sink = watcher
    await sink.wait_for(lambda r: True)
    fake_api.remove(PODS, NAMESPACE, f"{RUN}-launcher-0-0")
    report = await sink.wait_for(lambda r: phases(r)[("launcher", 0)] == "Failed")
    [launcher] = [p for p in report.pods if p.pod_set == "launcher"]
    assert launcher.message == f"{RUN}-launcher-0-0: deleted before it finished"

    await cluster.delete(RUN)  # teardown: every pod goes, with a last report, then nothing is kept
    await sink.wait_for(lambda r: set(phases(r).values()) == {"Failed"})
    for _ in range(50):
        if not w._pods:
            break
        await asyncio.sleep(0.05)
    assert w._pods == {}


async def test_undelivered_report_is_sent_again(
    fake_api: FakeApiServer, kube_config: client.Configuration, cluster: KubernetesCluster
) -> None:
    sink = Collector()
    sink.failures_left = 1
    w = PodStatusWatcher(kube_config, NAMESPACE, sink, watch_timeout_seconds=1, retry_seconds=0.1)
    task = asyncio.create_task(w.run())
    try:
        report = await sink.wait_for(lambda r: True)  # delivered at the end of a watch round
        assert phases(report) == dict.fromkeys(ALL_PODS, "Pending")
        assert sink.failures_left == 0
    finally:
        w.stop()
        await asyncio.wait_for(task, 10)
        w.close()


async def test_watcher_survives_an_api_server_error(
    fake_api: FakeApiServer, kube_config: client.Configuration, cluster: KubernetesCluster
) -> None:
    sink = Collector()
    failed: list[Request] = []

    def fail_first_list(request: Request) -> None:
        if not failed:
            failed.append(request)
            fake_api.token = "rotated"  # the first list is refused with 401

    fake_api.before_request = fail_first_list
    w = PodStatusWatcher(kube_config, NAMESPACE, sink, watch_timeout_seconds=1, retry_seconds=0.1)
    task = asyncio.create_task(w.run())
    try:
        await asyncio.sleep(0.3)
        assert sink.reports == []
        fake_api.token = kube_config.api_key["authorization"]
        await sink.wait_for(lambda r: True)
    finally:
        w.stop()
        await asyncio.wait_for(task, 10)
        w.close()


async def test_node_inventory(fake_api: FakeApiServer, kube_config: client.Configuration) -> None:
    fake_api.put(
        NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "gke-gpu-1",
                "labels": {
                    "cloud.google.com/gke-nodepool": "h100",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "nvidia.com/gpu.count": "8",
                },
            },
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "190", "memory": "1900Gi", "nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        },
    )
    fake_api.put(
        NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "aks-cpu-0", "labels": {"kubernetes.azure.com/agentpool": "system"}},
            "spec": {"unschedulable": True},
            "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "False"}]},
        },
    )
    api = client.ApiClient(kube_config)
    try:
        nodes = await list_nodes(api)
        gpu_only = await list_nodes(api, label_selector="nvidia.com/gpu.count")
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert [n.name for n in nodes] == ["aks-cpu-0", "gke-gpu-1"]
    cpu, gpu = nodes
    assert (gpu.pool, gpu.gpu_product, gpu.gpu_count, gpu.schedulable) == ("h100", "NVIDIA-H100-80GB-HBM3", 8, True)
    assert gpu.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert gpu.allocatable["nvidia.com/gpu"] == "8"
    assert (cpu.pool, cpu.gpu_product, cpu.gpu_count, cpu.unschedulable, cpu.ready) == ("system", None, 0, True, False)
    assert not cpu.schedulable
    assert [n.name for n in gpu_only] == ["gke-gpu-1"]
