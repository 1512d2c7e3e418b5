"""Kubernetes dispatch: manifests (pure), the `ClusterDriver`, and pod status read back."""

from adapters.kubernetes.api_client import configuration_for
from adapters.kubernetes.cluster_reads import NodeInfo, list_nodes
from adapters.kubernetes.driver import KubernetesCluster
from adapters.kubernetes.manifest_model import GangMode
from adapters.kubernetes.manifests import KubeSettings, ManifestError, RunManifests, build_run_manifests
from adapters.kubernetes.reconcile_records import Drift, ReconcileReport
from adapters.kubernetes.status import PodStatusWatcher, ReportSink, reports_from_pods

__all__ = [
    "Drift",
    "GangMode",
    "KubeSettings",
    "KubernetesCluster",
    "ManifestError",
    "NodeInfo",
    "PodStatusWatcher",
    "ReconcileReport",
    "ReportSink",
    "RunManifests",
    "build_run_manifests",
    "configuration_for",
    "list_nodes",
    "reports_from_pods",
]
