"""One gang's life on each kind of real cluster gpufleet supports, end to end (issue 10, "Done when").

Per flavour (EKS managed node group, AKS, GKE, OKE, plain `kubernetes`), covering across the set
whole GPUs, MIG mixed (`nvidia.com/mig-<profile>`), MIG as GKE advertises it (`nvidia.com/gpu`),
MPS, and renamed time-slicing (`nvidia.com/gpu.shared`):

1. the cluster is registered through the REST API (cloud ones discovered through the cloud SDK
   fakes, or moto for EKS; `kubernetes` with a token kubeconfig) and the fake Kubernetes API server
   holds real-looking nodes of that flavour (`tests/kubernetes/nodes/`);
2. after fleet sync (cloud) or the inventory report (`kubernetes`) `GET /v1/clusters` lists the
   nodes' real names, in pools discovered from the nodes;
3. a gang submitted through the API is scheduled and dispatched; the server validates every object
   (refusing otherwise); its scheduler binds the pods to those nodes and its kubelet runs them; the
   pod watcher's report, ingested, moves the workload to `running`, and to `succeeded` once the
   pods succeed;
4. a dcgm-exporter exposition of those pods, rendered as dcgm-exporter renders it (pod labels incl.
   `gpufleet_io_run`, or `--kubernetes-virtual-gpus` on shared GPUs), is scraped by the agent and
   ingested: its samples land in that run's windows;
5. a second gang that shows zero activity over the idle policy's windows is reclaimed for another
   team's waiting gang, whose pods then run on the freed nodes.

Loops are driven by calling the service functions (sync, inventory, schedule, dispatch, ingest,
idle pass) rather than by sleeping; telemetry is stamped in the near future so its windows are
whole. Each flavour runs on SQLite and PostgreSQL (`database_url`); about 3 s per case, the EKS
case more for moto.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from moto.server import ThreadedMotoServer

from adapters.kubernetes.nodes import observe_node
from adapters.kubernetes.status import PodStatusWatcher
from controlplane.agent.dcgm import AgentConfig, default_resolver, scrape_once
from controlplane.bootstrap import Wiring, utc_now
from controlplane.bootstrap.real_fleet import RealFleet
from controlplane.core.idle import IdlePolicy, IdleRules
from controlplane.service.cloud_ports import CloudProvider
from controlplane.service.cluster_status import PodReport
from controlplane.service.dispatch import dispatch_once
from controlplane.service.idle import idle_pass
from controlplane.service.ingest import InboundMessage, Outcome, handle
from controlplane.service.kubeconfigs import FileKubeconfigStore
from controlplane.service.telemetry import ActivitySource, BatchMessage, handle_batch, run_windows
from controlplane.service.telemetry import Outcome as BatchOutcome
from tests.clouds import test_aks, test_eks, test_gke, test_oke
from tests.clouds.keys import KeyPair
from tests.integration.cloud_support import (
    EKS_CLUSTER,
    GKE_CLUSTER,
    aks_provider,
    eks_provider,
    gke_provider,
    oke_provider,
    schedule,
    seed_eks,
    sync,
)
from tests.integration.fleet import Tenant, add_tenant
from tests.kubernetes import nodes as k8s
from tests.kubernetes.fake_apiserver import (
    NODES,
    PODS,
    FakeApiServer,
    admit_kueue,
    finish_pods,
    run_job_controller,
    run_kubelet,
)
from tests.telemetry.test_agent import Exporter

WINDOW = 300  # the telemetry roll-up window the idle policy reads (the default)
SCRAPE_EVERY = 60  # seconds between scrapes: 5 samples per GPU and window
KUBE_TOKEN = "sa-token-for-gpufleet"
POOL_KEY = "example.com/gpu-pool"
# AKS spot pools are tainted; a gang opts in. GPU taints (`nvidia.com/gpu`, `sku=gpu`) gpufleet
# tolerates by itself, so no other flavour names any.
SPOT_TOLERATION = {
    "key": "kubernetes.azure.com/scalesetpriority",
    "operator": "Equal",
    "value": "spot",
    "effect": "NoSchedule",
}
RULES = IdleRules(
    default=IdlePolicy(
        grace_seconds=0,
        notify_after=1,
        deprioritize_after=2,
        reclaim_after=3,
        min_samples_per_gpu=3,
        stale_seconds=2 * WINDOW,
    ),
    working_hours=None,
)
# What dcgm-exporter prints as modelName (NVML's name), by gpufleet model.
NVML_NAMES = {"H100-80GB": "NVIDIA H100 80GB HBM3", "A10": "NVIDIA A10", "L4": "NVIDIA L4"}


@dataclass(frozen=True)
class Flavour:
    cluster: str  # gpufleet's name of the cluster
    provider: str
    namespace: str
    pool: str  # the pool the nodes form (the provider's own name for it)
    nodes: Callable[[], list[dict[str, Any]]]
    request: dict[str, Any]  # one pod's GPU request in the pod set
    resource: str  # the extended resource a pod must ask for on these nodes
    gpu_model: str
    sharing: str  # what the pool's sharing reads as
    mig_profile: str | None = None
    shared: bool = False  # time-slicing / MPS: dcgm-exporter runs with --kubernetes-virtual-gpus
    kubernetes: dict[str, Any] = field(default_factory=dict)
    tolerations: tuple[dict[str, str], ...] = ()
    # dcgm-exporter's pod labels: all of them, or only gpufleet's run label (the recommended allowlist)
    all_pod_labels: bool = False


FLAVOURS = [
    Flavour(
        "eks-train",
        "eks",
        "gpufleet",
        "p5-reserved",
        lambda: [k8s.eks_managed_node(i, nodegroup="p5-reserved", zone="us-west-2a") for i in range(2)],
        {"gpus": 1},
        "nvidia.com/gpu",
        "H100-80GB",
        "exclusive",
        kubernetes={"namespace": "gpufleet", "gang": "none"},  # one indexed Job per node group
    ),
    Flavour(  # Karpenter: a pool the cloud API does not list, found from the nodes alone
        "eks-train",
        "eks",
        "inference",
        "l4-ts",
        lambda: [
            k8s.eks_karpenter_node(
                i,
                nodepool="l4-ts",
                instance_type="g6.xlarge",
                gpu=k8s.GpuSetup("L4", 1, "time-slicing", replicas=4),
            )
            for i in range(2)
        ],
        {"gpu_fraction": 0.25},
        "nvidia.com/gpu",  # time-slicing without renameByDefault
        "L4",
        "timeslice:4",
        shared=True,
        kubernetes={"namespace": "inference", "gang": "volcano"},
    ),
    Flavour(
        "aks-ml",
        "aks",
        "gpufleet",
        "gpuh100",
        lambda: [
            k8s.aks_node(
                i,
                pool="gpuh100",
                zone="eastus-2",
                spot=True,
                sku_gpu_taint=True,
                gpu=k8s.GpuSetup("H100-80GB", 8, "mig", mig_layout={"3g.40gb": 2}, mig_config="all-3g.40gb"),
            )
            for i in range(2)
        ],
        {"mig_profile": "3g.40gb"},
        "nvidia.com/mig-3g.40gb",
        "H100-80GB",
        "mig:all-3g.40gb",
        mig_profile="3g.40gb",
        kubernetes={"namespace": "gpufleet", "gang": "kueue", "use_jobset": True},
        tolerations=(SPOT_TOLERATION,),
    ),
    Flavour(
        "gke-train",
        "gke",
        "gpufleet",
        "h100-mig",
        lambda: [k8s.gke_node(i, pool="h100-mig", cluster="train", partition_size="1g.10gb") for i in range(2)],
        {"mig_profile": "1g.10gb"},
        "nvidia.com/gpu",  # GKE advertises MIG partitions as whole GPUs
        "H100-80GB",
        "mig:all-1g.10gb",
        mig_profile="1g.10gb",
        kubernetes={"namespace": "gpufleet", "gang": "none", "use_jobset": True},
        all_pod_labels=True,
    ),
    Flavour(
        "oke-gpu",
        "oke",
        "gpufleet",
        "h100",
        lambda: [
            k8s.oke_node(i, node_pool_id=test_oke._pool_id("h100"), gpu=k8s.GpuSetup("H100-80GB", 8, "mps", replicas=4))
            for i in range(2)
        ],
        {"gpu_fraction": 0.25},
        "nvidia.com/gpu",
        "H100-80GB",
        "mps:4",
        shared=True,
        kubernetes={"namespace": "gpufleet", "gang": "volcano"},
    ),
    Flavour(
        "onprem",
        "kubernetes",
        "ml-jobs",
        "a10-shared",
        lambda: [
            k8s.onprem_node(
                f"gpu-a10-{i:02d}",
                instance_type="VM.GPU.A10.1",
                labels={POOL_KEY: "a10-shared"},
                gpu=k8s.GpuSetup("A10", 1, "time-slicing", replicas=4, rename_by_default=True),
            )
            for i in range(2)
        ],
        {"gpu_fraction": 0.25},
        "nvidia.com/gpu.shared",
        "A10",
        "timeslice:4",
        shared=True,
        kubernetes={"namespace": "ml-jobs", "pool_label_key": POOL_KEY, "gang": "coscheduling"},
    ),
    Flavour(
        "onprem-mig",
        "kubernetes",
        "batch",
        "h100-mig",
        lambda: [
            k8s.onprem_node(
                f"dgx-h100-{i:02d}",
                labels={POOL_KEY: "h100-mig"},
                gpu=k8s.GpuSetup("H100-80GB", 8, "mig", mig_strategy="single", mig_layout={"3g.40gb": 2}),
            )
            for i in range(2)
        ],
        {"mig_profile": "3g.40gb"},
        "nvidia.com/gpu",  # the single strategy advertises MIG instances as whole GPUs
        "H100-80GB",
        "mig:all-3g.40gb",
        mig_profile="3g.40gb",
        kubernetes={"namespace": "batch", "pool_label_key": POOL_KEY, "gang": "none", "use_jobset": True},
        all_pod_labels=True,
    ),
]


class Published:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, str]] = []

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.messages.append((subject, payload, msg_id))


@pytest.fixture(scope="module")
def key() -> KeyPair:
    return KeyPair.generate()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def eks_cloud(moto_url: str) -> str:
    """moto with the EKS cluster and its node groups, seeded once (moto is slow to create node
    groups); `p5-reserved` runs the two nodes its flavour puts on the API server."""
    eks = seed_eks(moto_url)
    scaling = {"minSize": 0, "maxSize": 4, "desiredSize": 2}
    eks.update_nodegroup_config(clusterName=test_eks.CLUSTER, nodegroupName="p5-reserved", scalingConfig=scaling)
    return moto_url


def _kubeconfig() -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
            "users": [{"name": "u", "user": {"token": KUBE_TOKEN}}],
        }
    )


@contextmanager
def _cloud(
    flavour: Flavour, key: KeyPair, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[dict[str, Any], dict[str, CloudProvider]]]:
    """The registration body and the cloud providers (SDK fakes) for the flavour."""
    body: dict[str, Any]
    if flavour.provider == "kubernetes":
        body = {"name": flavour.cluster, "provider": "kubernetes", "kubeconfig": _kubeconfig()}
        yield dict(body, kubernetes=flavour.kubernetes), {}
        return
    if flavour.provider == "eks":
        moto_url: str = request.getfixturevalue("eks_cloud")
        provider, _ = eks_provider(moto_url)
        yield dict(EKS_CLUSTER, kubernetes=flavour.kubernetes), {"eks": provider}
        return
    fake: Any
    if flavour.provider == "gke":
        fake = test_gke.FakeGoogle(key)
        fake.server.start()
        provider = gke_provider(fake, key)
        body = dict(GKE_CLUSTER)
    elif flavour.provider == "aks":
        fake = test_aks.FakeArm()
        fake.server.start()
        provider = aks_provider(fake)
        body = {
            "name": flavour.cluster,
            "provider": "aks",
            "account": test_aks.SUB,
            "region": "eastus",
            "cluster": test_aks.CLUSTER,
            "resource_group": test_aks.RG,
        }
    else:
        fake = test_oke.FakeOci(key)
        fake.server.start()
        provider = oke_provider(fake, key, tmp_path)
        body = {
            "name": flavour.cluster,
            "provider": "oke",
            "account": test_oke.COMPARTMENT,
            "region": test_oke.REGION,
            "cluster": test_oke.CLUSTER,
        }
    try:
        yield dict(body, kubernetes=flavour.kubernetes), {flavour.provider: provider}
    finally:
        fake.server.stop()


class Plane:
    """The control plane's steps, called directly, against one cluster on the fake API server."""

    def __init__(self, wiring: Wiring, client: TestClient, admin: dict[str, str], flavour: Flavour) -> None:
        self.wiring, self.client, self.admin, self.flavour = wiring, client, admin, flavour
        self.prefix = wiring.settings.subject_prefix

    def apply(self, subject: str, payload: bytes, msg_id: str) -> str:
        result = handle(self.wiring.uow(), InboundMessage(subject, payload, {}, msg_id), self.prefix, utc_now())
        assert result.outcome is Outcome.APPLIED, result.detail
        return result.detail

    def report_pods(self, fleet: RealFleet) -> int:
        """One list of the pod watcher (what its watch reports, too), each report ingested."""
        cluster = fleet.clusters[self.flavour.cluster]
        reports: list[PodReport] = []

        async def sink(report: PodReport) -> None:
            reports.append(report)

        watcher = PodStatusWatcher(cluster.configuration, self.flavour.namespace, sink)
        try:
            asyncio.run(watcher.resync())
        finally:
            watcher.close()
        subject = f"{self.prefix}.cluster.{self.flavour.cluster}.pods"
        for i, report in enumerate(reports):
            self.apply(subject, report.model_dump_json().encode(), f"{report.run_id}:{utc_now().timestamp()}:{i}")
        return len(reports)

    def view(self, tenant: Tenant, workload_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/workloads/{workload_id}", headers=tenant.headers)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def submit(self, tenant: Tenant, name: str, replicas: int, cpu_millis: int) -> str:
        body = {
            "name": name,
            "queue": tenant.queue,
            "pod_sets": [{"name": "workers", "replicas": replicas, "cpu_millis": cpu_millis, **self.flavour.request}],
            "tolerations": list(self.flavour.tolerations),
            "container": {"image": "registry.example.com/trainer:1"},
            "labels": {"project": name},
            "max_runtime_seconds": 3600,
        }
        r = self.client.post("/v1/workloads", json=body, headers=tenant.headers)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def dispatch(self, fleet: RealFleet) -> tuple[int, int]:
        fleet.refresh()
        stats = asyncio.run(dispatch_once(self.wiring.uow, fleet.drivers(), self.prefix, utc_now))
        assert stats.errors == [], stats.errors
        return stats.applied, stats.torn_down


def _sanitise(label: str) -> str:
    """dcgm-exporter's utils.SanitizeLabelName: every character outside [a-zA-Z0-9_] becomes `_`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _gpu_uuid(node: str, gpu: int) -> str:
    digest = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


# The fields of deploy/dcgm-exporter/gpufleet-counters.csv, as the exporter prints them: name,
# HELP text, and the value for a pod whose GPU is `activity` busy. MIG instances have no
# GPU_UTIL or power of their own (device-level fields), so their series carry only the rest.
COUNTERS: list[tuple[str, str, Callable[[float], str], bool]] = [
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", lambda a: f"{a:.6f}", True),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", lambda a: f"{a:.6f}", True),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda a: f"{a / 2:.6f}",
        True,
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda a: f"{round(a * 100)}", False),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda a: "30123", True),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda a: "9837", True),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda a: f"{70 + 600 * a:.3f}", False),
]


def exposition(flavour: Flavour, pods: list[dict[str, Any]], activity: float) -> str:
    """What dcgm-exporter on these pods' nodes prints: one GPU (or MIG instance) per pod, each
    series with the GPU's labels, `Hostname` (the node), the CSV's label fields, then the pod's
    labels (sanitised, sorted; `--kubernetes-enable-pod-labels`, all of them or only
    `gpufleet.io/run` under the allowlist deploy/dcgm-exporter recommends) and `container,
    namespace, pod`. With `--kubernetes-virtual-gpus` (shared GPUs) no pod labels but `vgpu`."""
    series: list[tuple[str, str]] = []  # (labels, pod) per GPU, in the exporter's order
    per_node: dict[str, int] = {}
    for pod in sorted(pods, key=lambda p: (p["spec"]["nodeName"], p["metadata"]["name"])):
        node = pod["spec"]["nodeName"]
        slot = per_node.get(node, 0)
        per_node[node] = slot + 1
        gpu = 0 if flavour.shared or flavour.mig_profile else slot
        labels = [
            f'gpu="{gpu}"',
            f'UUID="{_gpu_uuid(node, gpu)}"',
            f'pci_bus_id="00000000:{0x18 + gpu:02X}:00.0"',
            f'device="nvidia{gpu}"',
            f'modelName="{NVML_NAMES[flavour.gpu_model]}"',
        ]
        if flavour.mig_profile:
            labels += [f'GPU_I_PROFILE="{flavour.mig_profile}"', f'GPU_I_ID="{1 + slot}"']
        labels += [f'Hostname="{node}"', 'DCGM_FI_DRIVER_VERSION="570.133.20"']
        meta = pod["metadata"]
        if not flavour.shared:
            shown = meta["labels"] if flavour.all_pod_labels else {"gpufleet.io/run": meta["labels"]["gpufleet.io/run"]}
            labels += [f'{_sanitise(k)}="{v}"' for k, v in sorted(shown.items())]
        container = pod["spec"]["containers"][0]["name"]
        labels += [f'container="{container}"', f'namespace="{meta["namespace"]}"', f'pod="{meta["name"]}"']
        if flavour.shared:
            labels.append(f'vgpu="{slot}"')
        series.append((",".join(labels), meta["name"]))
    lines = []
    for name, help_text, value, per_instance in COUNTERS:
        if flavour.mig_profile and not per_instance:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f"{name}{{{labels}}} {value(activity)}" for labels, _ in series]
    return "\n".join(lines) + "\n"


def feed_telemetry(
    plane: Plane, pods: list[dict[str, Any]], activity: float, start: datetime, windows: int
) -> tuple[int, int]:
    """Scrape the exporter with the agent every minute from `start` for `windows` windows and ingest
    each scrape; returns (samples, attributed)."""
    flavour = plane.flavour
    exporter = Exporter(exposition(flavour, pods, activity))
    config = AgentConfig(
        cluster=flavour.cluster,
        dcgm_url=exporter.url,
        prefix=plane.prefix,
        node="agent-host",
        namespaces=(flavour.namespace,),
    )
    resolver = default_resolver(None, frozenset({flavour.namespace}))
    published = Published()
    samples = attributed = 0

    async def scrape_all() -> None:
        nonlocal samples, attributed
        async with httpx.AsyncClient() as http:
            for step in range(windows * WINDOW // SCRAPE_EVERY):
                at = start + timedelta(seconds=step * SCRAPE_EVERY)
                report = await scrape_once(http, config, resolver, published, at.timestamp())
                samples += report.samples
                attributed += report.attributed

    try:
        asyncio.run(scrape_all())
    finally:
        exporter.close()
    messages = [BatchMessage(s, p, m) for s, p, m in published.messages]
    result = handle_batch(plane.wiring.uow(), messages, plane.prefix, start + timedelta(seconds=windows * WINDOW))
    assert {o for o, _ in result.outcomes} == {BatchOutcome.APPLIED}, result.outcomes
    return samples, attributed


def _next_window(after: datetime, skip: int = 1) -> datetime:
    return datetime.fromtimestamp((after.timestamp() // WINDOW + skip) * WINDOW, UTC)


def _pods_of(kube: FakeApiServer, namespace: str, run_id: str) -> list[dict[str, Any]]:
    return [p for p in kube.objects_of(PODS, namespace) if p["metadata"]["labels"].get("gpufleet.io/run") == run_id]


def node_agents(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The DaemonSet pods every GPU node runs besides gpufleet's (GPU Operator, gpufleet's agent):
    they hold some of the node's allocatable and must not confuse the pod watcher."""
    name = node["metadata"]["name"]
    suffix = hashlib.sha256(name.encode()).hexdigest()[:5]
    pods = []
    for namespace, daemonset, cpu, memory in (
        ("gpu-operator", "nvidia-device-plugin-daemonset", "50m", "64Mi"),
        ("gpu-operator", "nvidia-dcgm-exporter", "100m", "256Mi"),
        ("gpufleet-system", "gpufleet-agent", "50m", "64Mi"),
    ):
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{daemonset}-{suffix}",
                    "namespace": namespace,
                    "labels": {"app": daemonset, "controller-revision-hash": "6d9f7c8b5"},
                },
                "spec": {
                    "nodeName": name,
                    "containers": [
                        {
                            "name": daemonset.rsplit("-", 1)[-1],
                            "image": f"nvcr.io/nvidia/{daemonset}:v1",
                            "resources": {"requests": {"cpu": cpu, "memory": memory}},
                        }
                    ],
                    "tolerations": [{"operator": "Exists"}],
                },
                "status": {"phase": "Running"},
            }
        )
    return pods


def run_cluster(kube: FakeApiServer, flavour: Flavour) -> None:
    """The cluster's actors: Kueue admits (if used), the JobSet/Job controllers and the scheduler
    make and bind the pods, the kubelet starts them."""
    ns = flavour.namespace
    if flavour.kubernetes.get("gang") == "kueue":
        assert admit_kueue(kube, ns, {"gpufleet"})
    run_job_controller(kube, ns)
    run_kubelet(kube, ns)


def expected_kinds(flavour: Flavour) -> set[str]:
    """What gpufleet creates for a gang under the cluster's gang settings (plurals)."""
    kinds = {"priorityclasses", "jobsets" if flavour.kubernetes.get("use_jobset") else "jobs"}
    gang = flavour.kubernetes.get("gang")
    if gang in ("volcano", "coscheduling"):
        kinds.add("podgroups")
    return kinds


def _allocatable_millis(node: dict[str, Any]) -> int:
    cpu = str(node["status"]["allocatable"]["cpu"])
    return int(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour", FLAVOURS, ids=[f"{f.cluster}-{f.pool}" for f in FLAVOURS])
def test_gang_life_on_a_real_cluster_flavour(
    flavour: Flavour,
    client: TestClient,
    admin: dict[str, str],
    wiring: Wiring,
    key: KeyPair,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    client.app.state.kubeconfigs = FileKubeconfigStore(  # type: ignore[attr-defined]
        wiring.settings.state_dir / "kubeconfigs"
    )
    plane = Plane(wiring, client, admin, flavour)
    prefix = plane.prefix
    ns = flavour.namespace
    kube = FakeApiServer(token=KUBE_TOKEN, generated_pod_names=True).start()
    fleet: RealFleet | None = None
    try:
        with _cloud(flavour, key, tmp_path, request) as (body, providers):
            # 1. Registered through the API; the cluster's own nodes are on its API server.
            r = client.post("/v1/clusters", json=body, headers=admin)
            assert r.status_code == 201, r.text
            assert r.json()["pools"] == []
            nodes = flavour.nodes()
            for node in nodes:
                kube.put(NODES, node)
                for pod in node_agents(node):
                    kube.put(PODS, pod)
            names = sorted(n["metadata"]["name"] for n in nodes)
            wiring.settings.kube_api_override = kube.url  # the cluster's address, tunnelled to the test server
            fleet = RealFleet(wiring, Published(), prefix, providers)
            fleet.refresh()  # a client before the first sync: real node names from the start
            assert fleet.errors == {}
            if flavour.cluster in fleet.credentials:  # only the token the cloud minted is accepted
                kube.token = fleet.credentials[flavour.cluster].access.token

            # 2. Sync (cloud) or the inventory report (`kubernetes`): the real nodes are listed.
            if providers:
                (result,) = sync(wiring, providers, fleet.inventory_nodes)
                assert result.ok, result.error
            else:
                inventory = Published()
                fleet.publisher = inventory
                assert asyncio.run(fleet.publish_inventory()) == 1
                ((subject, payload, msg_id),) = inventory.messages
                plane.apply(subject, payload, msg_id)
            # The list says which pools the nodes made and how many; the cluster's view names the nodes.
            (listed,) = client.get("/v1/clusters", headers=admin).json()
            assert listed["sync_state"] == "ready"
            assert {p["name"]: p["node_count"] for p in listed["pools"]}[flavour.pool] == len(nodes)
            detail = client.get(f"/v1/clusters/{flavour.cluster}", headers=admin).json()
            pools = {p["name"]: p for p in detail["pools"]}
            pool = pools[flavour.pool]
            assert sorted(n["name"] for n in pool["nodes"]) == names
            assert (pool["gpu_model"], pool["sharing"]) == (flavour.gpu_model, flavour.sharing)
            others = [n["name"] for p in detail["pools"] if p["name"] != flavour.pool for n in p["nodes"]]
            assert not set(others) & set(names)

            # 3. A gang runs on those nodes and succeeds. Each pod asks for most of a node's CPU,
            # so a gang of one pod per node fills the pool (the idle story below needs that).
            cpu = min(_allocatable_millis(n) for n in nodes) * 6 // 10
            assert client.post(
                "/v1/priority-classes", json={"name": "batch", "value": 100, "is_default": True}, headers=admin
            ).status_code in (201, 409)
            llm = add_tenant(client, admin, "llm", "llm-train")
            vision = add_tenant(client, admin, "vision", "vision-train")
            train = plane.submit(llm, "pretrain", len(nodes), cpu)
            assert schedule(wiring) == 1
            assert plane.dispatch(fleet) == (1, 0)
            assert kube.failed_creates == []
            run_cluster(kube, flavour)
            (train_run,) = [run["id"] for run in plane.view(llm, train)["runs"]]
            pods = _pods_of(kube, ns, train_run)
            assert len(pods) == len(nodes)
            assert sorted(p["spec"]["nodeName"] for p in pods) == names
            for pod in pods:
                assert pod["status"]["phase"] == "Running"
                (container,) = pod["spec"]["containers"]
                assert container["resources"]["limits"][flavour.resource] == "1"
                assert pod["metadata"]["labels"]["project"] == "pretrain"
            assert plane.report_pods(fleet) == 1
            assert plane.view(llm, train)["state"] == "running"

            # 4. A scrape of those pods reaches this run's own windows.
            start = _next_window(utc_now())
            samples, attributed = feed_telemetry(plane, pods, 0.87, start, windows=1)
            assert samples == attributed == len(pods) * WINDOW // SCRAPE_EVERY  # one sample per GPU and scrape
            windows = run_windows(wiring.uow(), train_run)
            assert len(windows) == len(pods)  # one window per GPU (or MIG instance, or shared replica)
            assert {w.node for w in windows} == set(names)
            assert all(w.cluster == flavour.cluster and w.activity_samples == WINDOW // SCRAPE_EVERY for w in windows)
            assert all(w.activity_mean == pytest.approx(0.87) for w in windows)
            assert {w.activity_source for w in windows} == {ActivitySource.SM_ACTIVE}
            assert all(w.tensor_mean == pytest.approx(0.435) and w.fb_used_mean_mib == 30123 for w in windows)
            if flavour.mig_profile:  # each window is one MIG instance of the pool's profile
                assert {(w.mig_profile, w.mig_instance) for w in windows} == {(flavour.mig_profile, 1)}

            finish_pods(kube, ns)
            run_job_controller(kube, ns)
            assert plane.report_pods(fleet) == 1
            view = plane.view(llm, train)
            assert (view["state"], view["runs"][0]["state"]) == ("succeeded", "succeeded")

            # 5. An idle gang fills the pool; another team's gang waits; the idle policy reclaims.
            hoarder = plane.submit(llm, "hoarder", len(nodes), cpu)
            assert schedule(wiring) == 1
            assert plane.dispatch(fleet) == (1, 1)  # the finished gang's objects go too
            assert _pods_of(kube, ns, train_run) == []
            run_cluster(kube, flavour)
            (hoarder_run,) = [run["id"] for run in plane.view(llm, hoarder)["runs"]]
            hoarder_pods = _pods_of(kube, ns, hoarder_run)
            assert sorted(p["spec"]["nodeName"] for p in hoarder_pods) == names
            plane.report_pods(fleet)
            assert plane.view(llm, hoarder)["state"] == "running"
            waiting = plane.submit(vision, "waiting", len(nodes), cpu)
            assert schedule(wiring) == 0  # the pool is full

            idle_from = _next_window(start, 2)
            feed_telemetry(plane, hoarder_pods, 0.0, idle_from, windows=RULES.default.reclaim_after)
            idle_windows = run_windows(wiring.uow(), hoarder_run)
            assert len(idle_windows) == len(hoarder_pods) * RULES.default.reclaim_after
            now = idle_from + timedelta(seconds=RULES.default.reclaim_after * WINDOW + 5)
            idle_pass(wiring.uow, RULES, prefix, now)
            with wiring.uow() as uow:
                finding = uow.idle.findings()[hoarder_run]
                announced = [
                    json.loads(p) for _, subject, p in uow.outbox.unpublished(10_000) if ".events.idle." in subject
                ]
            assert (finding.status, finding.stage) == ("idle", "reclaim"), finding
            assert finding.cluster == flavour.cluster
            assert [e["data"]["run_id"] for e in announced if e["type"] == "idle.reclaim"] == [hoarder_run]
            assert schedule(wiring, now) == 1
            view = plane.view(llm, hoarder)
            assert view["state"] == "queued"
            assert view["runs"][0]["message"].startswith("reclaimed-idle:"), view["runs"][0]["message"]
            assert sorted(plane.view(vision, waiting)["nodes"]) == names

            # The reclaimed gang's objects go, the waiting gang's pods run on the freed nodes.
            assert plane.dispatch(fleet) == (1, 1)
            assert _pods_of(kube, ns, hoarder_run) == []
            run_cluster(kube, flavour)
            (waiting_run,) = [run["id"] for run in plane.view(vision, waiting)["runs"]]
            winners = _pods_of(kube, ns, waiting_run)
            assert sorted(p["spec"]["nodeName"] for p in winners) == names
            assert all(p["status"]["phase"] == "Running" for p in winners)
            plane.report_pods(fleet)
            assert plane.view(vision, waiting)["state"] == "running"

            # Everything gpufleet sent passed the server's schemas and admission; nothing was refused.
            assert kube.failed_creates == []
            assert any(code == 201 for _, _, code in kube.responses)  # answers are recorded
            refused = [r for r in kube.responses if r[2] in (400, 401, 403, 405, 422)]
            assert refused == [], refused
            created = {key[2] for key, _, _ in kube.creations}
            assert created == expected_kinds(flavour), created
    finally:
        if fleet is not None:
            asyncio.run(fleet.close())
        kube.stop()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # a capacity question, not a storage one
def test_gang_asking_a_whole_nodes_allocatable_cpu_is_scheduled_by_the_cluster(
    client: TestClient,
    admin: dict[str, str],
    wiring: Wiring,
    key: KeyPair,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    flavour = next(f for f in FLAVOURS if f.cluster == "onprem-mig")
    client.app.state.kubeconfigs = FileKubeconfigStore(  # type: ignore[attr-defined]
        wiring.settings.state_dir / "kubeconfigs"
    )
    plane = Plane(wiring, client, admin, flavour)
    kube = FakeApiServer(token=KUBE_TOKEN, generated_pod_names=True).start()
    fleet: RealFleet | None = None
    try:
        with _cloud(flavour, key, tmp_path, request) as (body, _):
            assert client.post("/v1/clusters", json=body, headers=admin).status_code == 201
            nodes = flavour.nodes()
            for node in nodes:
                kube.put(NODES, node)
                for pod in node_agents(node):
                    kube.put(PODS, pod)
            wiring.settings.kube_api_override = kube.url
            inventory = Published()
            fleet = RealFleet(wiring, inventory, plane.prefix)
            fleet.refresh()
            assert asyncio.run(fleet.publish_inventory()) == 1
            plane.apply(*inventory.messages[0])
            pool = {p["name"]: p for p in client.get(f"/v1/clusters/{flavour.cluster}", headers=admin).json()["pools"]}
            whole = pool[flavour.pool]["cpu_millis"]  # what gpufleet believes one node can give a pod
            allocatable = min(observe_node(n).allocatable["cpu"] for n in nodes)
            assert whole == allocatable - 200  # the three DaemonSet pods' 50m + 100m + 50m on every node
            tenant = add_tenant(client, admin, "llm", "llm-train")
            assert client.post(
                "/v1/priority-classes", json={"name": "batch", "value": 100, "is_default": True}, headers=admin
            ).status_code in (201, 409)
            workload = plane.submit(tenant, "whole-nodes", len(nodes), whole)
            assert schedule(wiring) == 1  # admitted: gpufleet thinks it fits
            assert plane.dispatch(fleet) == (1, 0)
            run_cluster(kube, flavour)
            (run_id,) = [run["id"] for run in plane.view(tenant, workload)["runs"]]
            pods = _pods_of(kube, flavour.namespace, run_id)
            # The cluster's scheduler leaves them Pending: the DaemonSet pods hold 200m of each node.
            assert [p["status"].get("phase") for p in pods] == ["Running"] * len(nodes)
    finally:
        if fleet is not None:
            asyncio.run(fleet.close())
        kube.stop()
