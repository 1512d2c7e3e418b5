"""deploy/member: each overlay renders (kubectl kustomize, or the Python renderer), every object passes the API server's
schemas (kubernetes-validate, strict), and the controller's RBAC grants exactly the calls
gpufleet's driver, pod-status watcher and node inventory make, as the fake API server sees them
when each gang mode is driven through its whole life (apply, re-apply, list, reconcile, delete,
a priority class changing value, the pod watch, the node list)."""

from __future__ import annotations

import asyncio
import functools
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from adapters.kubernetes.cluster_reads import list_live_pod_objects, list_nodes
from adapters.kubernetes.driver import KubernetesCluster
from adapters.kubernetes.manifests import KubeSettings
from adapters.kubernetes.status import PodStatusWatcher
from controlplane.service.cluster_status import PodReport
from tests.kubernetes import kustomize_lite
from tests.kubernetes.conftest import NAMESPACE, pools, training_order
from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.schemas import validate_object

ROOT = Path(__file__).resolve().parents[2]
MEMBER = ROOT / "deploy" / "member"
KUBECTL = shutil.which("kubectl")
# overlay -> the cluster's Kubernetes settings it serves
OVERLAYS = {
    "none": KubeSettings(gang="none"),
    "volcano": KubeSettings(gang="volcano"),
    "coscheduling": KubeSettings(gang="coscheduling"),
    "kueue": KubeSettings(gang="kueue"),
    "jobset": KubeSettings(gang="none", use_jobset=True),
}
# Granted ahead of use: the node inventory's watch (issue 10, deliverable 1) follows nodes
# joining, leaving and going NotReady; the list it starts from is exercised below.
GRANTED_AHEAD = {("", "nodes", "watch")}
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?/?$"
)


def _kustomize_major() -> int:
    """The major version of kubectl's built-in kustomize (0: no kubectl). The overlays use
    `labels` and inline `patches` with targets, which kustomize v4.1+ understands; Debian 12's
    `kubernetes-client` (kubectl 1.20, kustomize v2.0.3) does not."""
    if KUBECTL is None:
        return 0
    out = subprocess.run(
        [KUBECTL, "version", "--client", "-o", "json"], check=False, capture_output=True, text=True, timeout=30
    )
    match = re.search(r'"kustomizeVersion":\s*"v(\d+)', out.stdout)
    return int(match.group(1)) if match else 0


KUSTOMIZE_V5 = _kustomize_major() >= 5


@functools.cache
def _kubectl_kustomize(overlay: str) -> str:
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, "kustomize", str(MEMBER / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def render(overlay: str) -> list[dict[str, Any]]:
    """The overlay's objects: `kubectl kustomize` when a recent kubectl is installed, else the
    Python renderer of the same subset (checked against kubectl below wherever both exist)."""
    if KUSTOMIZE_V5:
        return [doc for doc in yaml.safe_load_all(_kubectl_kustomize(overlay)) if doc]
    return kustomize_lite.render(MEMBER / "overlays" / overlay)


@pytest.mark.skipif(not KUSTOMIZE_V5, reason="kubectl with kustomize v5 (kubectl 1.27+) is not installed")
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_python_renderer_matches_kubectl_kustomize(overlay: str) -> None:
    def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
        return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}

    real = keyed([doc for doc in yaml.safe_load_all(_kubectl_kustomize(overlay)) if doc])
    assert keyed(kustomize_lite.render(MEMBER / "overlays" / overlay)) == real


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_renders_and_every_object_passes_the_schemas(overlay: str) -> None:
    objects = render(overlay)
    for obj in objects:
        validate_object(obj)
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
    assert kinds == [
        "ClusterRole/gpufleet-controller",
        "ClusterRoleBinding/gpufleet-controller",
        "ConfigMap/gpufleet-agent",
        "ConfigMap/gpufleet-dcgm-counters",
        "DaemonSet/gpufleet-agent",
        "Namespace/gpufleet",
        "Role/gpufleet-controller",
        "RoleBinding/gpufleet-controller",
        "Secret/gpufleet-controller-token",
        "Service/gpufleet-dcgm-exporter",
        "ServiceAccount/gpufleet-agent",
        "ServiceAccount/gpufleet-controller",
    ]
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufleet" for o in objects)


def test_the_counters_configmap_is_what_the_gpu_operator_mounts() -> None:
    """The operator mounts key `dcgm-metrics.csv` of `dcgmExporter.config.name` at
    /etc/dcgm-exporter/dcgm-metrics.csv (controllers/object_controls.go, MetricsConfigFileName)."""
    objects = render("none")
    counters = find(objects, "ConfigMap", "gpufleet-dcgm-counters")
    assert counters["metadata"]["namespace"] == "gpu-operator"
    csv = (ROOT / "deploy" / "dcgm-exporter" / "gpufleet-counters.csv").read_text()
    assert counters["data"] == {"dcgm-metrics.csv": csv}
    service = find(objects, "Service", "gpufleet-dcgm-exporter")
    assert service["spec"]["internalTrafficPolicy"] == "Local"  # each agent scrapes its own node
    assert service["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}


def test_the_agent_runs_on_gpu_nodes_without_an_api_token() -> None:
    objects = render("none")
    agent = find(objects, "DaemonSet", "gpufleet-agent")["spec"]["template"]["spec"]
    assert agent["automountServiceAccountToken"] is False
    [container] = agent["containers"]
    assert container["args"][0] == "agent"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["GPUFLEET_NATS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "gpufleet-agent", "key": "nats-url"}
    assert env["GPUFLEET_AGENT_NAMESPACES"]["valueFrom"]["configMapKeyRef"]["key"] == "namespaces"
    config = find(objects, "ConfigMap", "gpufleet-agent")["data"]
    assert config["namespaces"] == "gpufleet"
    assert config["dcgm-url"] == "http://gpufleet-dcgm-exporter.gpu-operator.svc:9400/metrics"
    # no RBAC for the agent: nothing binds its ServiceAccount
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert all(s["name"] != "gpufleet-agent" for b in bindings for s in b["subjects"])


async def drive(settings: KubeSettings, api: FakeApiServer, cfg: client.Configuration) -> None:
    """Every kind of call the control plane makes to a member cluster of this gang mode."""
    run_a, run_b = "run-0123456789abcdef0123-1", "run-0123456789abcdef0456-1"
    first = KubernetesCluster("east", cfg, settings, pools())
    second = KubernetesCluster("east", cfg, settings, pools())
    try:
        await first.apply(replace(training_order(run_id=run_a), priority_class="batch", priority=100))
        await second.apply(replace(training_order(run_id=run_a), priority_class="batch", priority=100))
        await second.apply(replace(training_order(run_id=run_b), priority_class="batch", priority=200))
        await first.list_owned()
        await first.reconcile({run_a: 3})
        await first.delete(run_a)
        await list_nodes(first.api_client)
        await list_live_pod_objects(first.api_client)
    finally:
        first.close()
        second.close()

    async def sink(report: PodReport) -> None:
        return None

    watcher = PodStatusWatcher(cfg, NAMESPACE, sink, watch_timeout_seconds=1, retry_seconds=0.1)
    task = asyncio.create_task(watcher.run())
    try:
        for _ in range(200):
            if any(r.query.get("watch") == "true" for r in api.requests):
                break
            await asyncio.sleep(0.02)
    finally:
        watcher.stop()
        await asyncio.wait_for(task, 10)
        watcher.close()


def observed(api: FakeApiServer) -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
    """(namespaced, cluster-scoped) (group, resource, verb) of every request the fake received."""
    namespaced: set[tuple[str, str, str]] = set()
    cluster: set[tuple[str, str, str]] = set()
    for request in api.requests:
        m = _PATH.match(request.path)
        assert m is not None, request.path
        if request.method == "GET":
            verb = "watch" if request.query.get("watch") == "true" else ("get" if m["name"] else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(request.method) or (
                "delete" if m["name"] else "deletecollection"
            )
        key = (m["group"] or "", m["plural"], verb)
        if m["ns"]:
            assert m["ns"] == NAMESPACE
            namespaced.add(key)
        else:
            cluster.add(key)
    return namespaced, cluster


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
async def test_rbac_grants_exactly_what_the_control_plane_calls(
    overlay: str, fake_api: FakeApiServer, kube_config: client.Configuration
) -> None:
    objects = render(overlay)
    role = granted(find(objects, "Role", "gpufleet-controller")["rules"])
    cluster_role = granted(find(objects, "ClusterRole", "gpufleet-controller")["rules"])
    await drive(OVERLAYS[overlay], fake_api, kube_config)
    namespaced, cluster = observed(fake_api)
    assert namespaced <= role, f"calls the Role does not grant: {sorted(namespaced - role)}"
    assert cluster <= cluster_role, f"calls the ClusterRole does not grant: {sorted(cluster - cluster_role)}"
    assert role <= namespaced, f"granted and never used: {sorted(role - namespaced)}"
    assert cluster_role <= cluster | GRANTED_AHEAD, f"granted and never used: {sorted(cluster_role - cluster)}"
