"""The vocabulary of gpufleet's Kubernetes objects: label, annotation and env names, Kubernetes name
rules, the resource types, per-cluster `KubeSettings`, the manifest and placement dataclasses,
and the deterministic object names and selectors.

Separate from the builders (`manifests`, `pod_template`, `placement`) because the driver and the
status watcher read these too."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from controlplane.domain.kubernetes_syntax import is_extended_resource
from controlplane.domain.model import GPU_TAINT_KEYS

GangMode = Literal["volcano", "coscheduling", "kueue", "none"]
GANG_MODES: tuple[GangMode, ...] = ("volcano", "coscheduling", "kueue", "none")

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpufleet"
LABEL_RUN = "gpufleet.io/run"
LABEL_WORKLOAD = "gpufleet.io/workload"
LABEL_EPOCH = "gpufleet.io/epoch"
LABEL_ATTEMPT = "gpufleet.io/attempt"
LABEL_POD_SET = "gpufleet.io/pod-set"
ANNOTATION_INDICES = "gpufleet.io/pod-indices"
ANNOTATION_OBJECTS = "gpufleet.io/object-count"
ANNOTATION_WORKLOAD_NAME = "gpufleet.io/workload-name"
# An inference workload's declared serving signal, as compact JSON, on each of its pods: the agent
# scrapes the pod's metrics endpoint it names (controlplane/agent/serving.py).
ANNOTATION_SERVING = "gpufleet.io/serving"
OWNED_SELECTOR = f"{MANAGED_BY}={MANAGER}"

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

CONTAINER_NAME = "main"

# Env vars gpufleet sets on every container; a workload may not override them.
ENV_RUN_ID = "GPUFLEET_RUN_ID"
ENV_POD_SET = "GPUFLEET_POD_SET"
ENV_POD_INDICES = "GPUFLEET_POD_INDICES"
ENV_WORLD_SIZE = "GPUFLEET_WORLD_SIZE"

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_KEY_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

# Indexed Job pods get the hostname `<job>-<index>`, which must itself be a DNS label; keeping Job
# names to 52 characters leaves room for indices up to 10 digits.
JOB_NAME_MAX = 52
# A run id (`run-<20 hex>-<attempt>`, 26 characters for attempts below 10) names the JobSet and
# the gang object unchanged, so pod names start with the full run id.
JOBSET_NAME_MAX = 30
# JobSet's webhook requires `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>` plus the 5-character
# random suffix the Job controller appends (`-abcde`) to be a DNS-1035 label of at most 63.
POD_NAME_MAX = 63
POD_NAME_SUFFIX = len("-abcde")
DEFAULT_KUEUE_MAX_POD_SETS = 8  # Kueue <= v0.17; v0.18 allows 10, v0.19+ 18
HOSTNAME_LABEL = "kubernetes.io/hostname"
OWNED_PRIORITY_CLASS_PREFIX = "gpufleet-"
LABEL_PRIORITY_CLASS = "gpufleet.io/priority-class"


class ManifestError(ValueError):
    """The order cannot be expressed as Kubernetes objects; retrying the same order will not help."""


@dataclass(frozen=True)
class ApiResource:
    """One Kubernetes resource type: where its objects live in the API."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


JOB = ApiResource("batch", "v1", "jobs", "Job")
JOBSET = ApiResource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
VOLCANO_POD_GROUP = ApiResource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
COSCHEDULING_POD_GROUP = ApiResource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
PRIORITY_CLASS = ApiResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass")


@dataclass(frozen=True)
class KubeSettings:
    """How gpufleet talks to one member cluster's scheduler stack."""

    namespace: str = "gpufleet"
    gang: GangMode = "none"
    use_jobset: bool = False
    kueue_queue: str = "gpufleet"  # LocalQueue in `namespace`
    default_image: str = "busybox:1.36"
    # Keys whose taints every GPU pod tolerates even when the inventory did not record them
    # (GKE adds `nvidia.com/gpu=present` by itself; AKS recommends `sku=gpu`).
    gpu_taint_keys: tuple[str, ...] = tuple(sorted(GPU_TAINT_KEYS))
    # None picks the usual name for the gang mode: `volcano` for Volcano, the scheduler-plugins
    # second scheduler for coscheduling, the default scheduler otherwise.
    scheduler_name: str | None = None
    volcano_queue: str = "default"
    coscheduling_timeout_seconds: int = 600
    # Resource names. None (the default) requests what the pool's nodes advertise (recorded on the pool
    # by the node inventory: `nvidia.com/gpu`, `nvidia.com/gpu.shared` under renameByDefault,
    # `nvidia.com/mig-<profile>` under the mixed MIG strategy, `nvidia.com/gpu` under the single
    # strategy and on GKE), else the device plugin's defaults. A value overrides that for the cluster.
    mig_strategy: Literal["mixed", "single"] | None = None
    timeslice_resource: str | None = None
    mps_resource: str | None = None
    gpu_resource: str | None = None
    # gpufleet priority class -> an existing PriorityClass of this cluster. Classes not listed
    # become `gpufleet-<class>`, which the driver creates (and owns) before first use.
    priority_class_map: Mapping[str, str] = field(default_factory=dict)
    # Most pod sets Kueue accepts in one Workload (one per replicatedJob of a JobSet).
    kueue_max_pod_sets: int = DEFAULT_KUEUE_MAX_POD_SETS

    def __post_init__(self) -> None:
        if self.gang not in GANG_MODES:
            raise ManifestError(f"gang mode {self.gang!r} is not one of {', '.join(GANG_MODES)}")
        for resource in (self.timeslice_resource, self.mps_resource, self.gpu_resource):
            if resource is not None and not is_extended_resource(resource):
                raise ManifestError(f"{resource!r} is not a Kubernetes extended resource name")
        if not DNS_LABEL.match(self.namespace) or len(self.namespace) > 63:
            raise ManifestError(f"namespace {self.namespace!r} is not a DNS-1123 label")
        if self.gang == "kueue" and not LABEL_VALUE.match(self.kueue_queue):
            raise ManifestError(f"kueue queue {self.kueue_queue!r} is not a valid label value")
        for gpufleet_class, cluster_class in self.priority_class_map.items():
            if not DNS_SUBDOMAIN.match(cluster_class) or len(cluster_class) > 253:
                raise ManifestError(
                    f"priority_class_map[{gpufleet_class}] = {cluster_class!r} is not a PriorityClass name"
                )
        if not 1 <= self.kueue_max_pod_sets <= 64:
            raise ManifestError(f"kueue_max_pod_sets {self.kueue_max_pod_sets} must be between 1 and 64")

    @property
    def jobset(self) -> bool:
        """One JobSet per run: asked for, or required because Kueue admits each Job on its own."""
        return self.use_jobset or self.gang == "kueue"

    @property
    def effective_scheduler(self) -> str | None:
        if self.scheduler_name is not None:
            return self.scheduler_name
        if self.gang == "volcano":
            return "volcano"
        if self.gang == "coscheduling":
            return "scheduler-plugins-scheduler"
        return None

    @property
    def gang_resource(self) -> ApiResource | None:
        if self.gang == "volcano":
            return VOLCANO_POD_GROUP
        if self.gang == "coscheduling":
            return COSCHEDULING_POD_GROUP
        return None

    @property
    def workload_resource(self) -> ApiResource:
        return JOBSET if self.jobset else JOB

    def priority_class_name(self, gpufleet_class: str) -> str | None:
        """The cluster PriorityClass a pod of `gpufleet_class` names (None: no class at all)."""
        if not gpufleet_class:
            return None
        mapped = self.priority_class_map.get(gpufleet_class)
        if mapped is not None:
            return mapped
        return owned_priority_class_name(gpufleet_class)

    def owned_resources(self) -> tuple[ApiResource, ...]:
        """Every resource type gpufleet creates on this cluster (the gang object first)."""
        gang = self.gang_resource
        return ((gang,) if gang else ()) + (self.workload_resource,)


@dataclass(frozen=True)
class Manifest:
    resource: ApiResource
    name: str
    body: dict[str, Any]


@dataclass(frozen=True)
class PlacementGroup:
    """Pods of one pod set the core put on one node: one Indexed Job."""

    pod_set: str
    ordinal: int  # 0.. within the pod set, ordered by the lowest pod index
    node: str
    pool: str
    demand: Mapping[str, int]
    indices: tuple[int, ...]


@dataclass(frozen=True)
class PodSetSpread:
    """A whole pod set as one Indexed Job whose pods go `per_node` to each of its nodes.

    Used under Kueue when one replicatedJob per placement group would exceed Kueue's pod-set
    limit; only pod sets with the same number of pods (of one demand) on each of their nodes can
    be expressed this way.
    """

    pod_set: str
    nodes: tuple[str, ...]
    per_node: int
    pool: str  # the pool of the first node: taints and resource names come from it
    pools: tuple[str, ...]
    demand: Mapping[str, int]
    indices: tuple[int, ...]


JobUnit = PlacementGroup | PodSetSpread


@dataclass(frozen=True)
class RunManifests:
    run_id: str
    groups: tuple[PlacementGroup, ...]
    gang: Manifest | None
    workloads: tuple[Manifest, ...] = field(default_factory=tuple)
    # The cluster PriorityClass gpufleet owns and must exist before the pods (None: mapped or none).
    priority_class: Manifest | None = None

    def all(self) -> tuple[Manifest, ...]:
        """Namespaced objects in creation order: the gang object before the pods that reference it.

        The cluster-scoped `priority_class` is not among them: the driver ensures it first.
        """
        return ((self.gang,) if self.gang else ()) + self.workloads


def dns_label(text: str, max_len: int = 63) -> str:
    """A DNS-1123 label for `text`; when it had to be changed or cut, a hash keeps it unique."""
    clean = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower())).strip("-")
    if clean == text and len(clean) <= max_len:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    head = clean[: max_len - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}" if head else digest


def run_name(run_id: str) -> str:
    """Name of the run's gang object (and JobSet); shared prefix of its Jobs.

    It starts with a letter (JobSet's webhook wants DNS-1035 names for the Jobs and pods it
    derives from it); run ids (`run-...`) always do and are kept unchanged when they fit.
    """
    name = dns_label(run_id, JOBSET_NAME_MAX)
    return name if name[:1].isalpha() else dns_label(f"r-{name}", JOBSET_NAME_MAX)


def job_name(run_id: str, pod_set: str, ordinal: int) -> str:
    return dns_label(f"{run_name(run_id)}-{pod_set}-{ordinal}", JOB_NAME_MAX)


def replicated_job_name(jobset: str, pod_set: str, ordinal: int | None, completions: int) -> str:
    """A replicatedJob name short enough that JobSet's longest pod name fits 63 characters.

    JobSet names a pod `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>-<5 random>`; gpufleet
    runs one Job per replicatedJob (job index 0) with `completions` pods.
    """
    fixed = len(jobset) + len("-") + len("-0-") + len(str(max(0, completions - 1))) + POD_NAME_SUFFIX
    budget = POD_NAME_MAX - fixed
    if budget < 1:
        raise ManifestError(f"JobSet {jobset} leaves no room for a replicatedJob name in 63-character pod names")
    text = pod_set if ordinal is None else f"{pod_set}-{ordinal}"
    return dns_label(text, budget) if budget >= 9 else hashlib.sha256(text.encode()).hexdigest()[:budget]


def jobset_pod_name_length(jobset: str, replicated_job: str, completions: int) -> int:
    """Length of the longest pod name JobSet derives, random suffix included (what its webhook checks)."""
    return len(f"{jobset}-{replicated_job}-0-{max(0, completions - 1)}") + POD_NAME_SUFFIX


def owned_priority_class_name(gpufleet_class: str) -> str:
    return f"{OWNED_PRIORITY_CLASS_PREFIX}{gpufleet_class}"


def core_pod_index(annotations: Mapping[str, str], completion_index: int) -> int | None:
    """The core's pod index of completion index `completion_index` of a placement group's Job."""
    raw = annotations.get(ANNOTATION_INDICES, "")
    try:
        indices = [int(x) for x in raw.split(",") if x]
    except ValueError:
        return None
    if 0 <= completion_index < len(indices):
        return indices[completion_index]
    return None


def selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def run_selector(run_id: str) -> str:
    return selector({MANAGED_BY: MANAGER, LABEL_RUN: run_id})
