"""Kubernetes objects for one run, built as plain dicts (pure: no I/O, no client library).

Pinning design: one Indexed `batch/v1` Job per *placement group*.

The scheduling core decides, for every pod of a gang, the exact node it runs on, and it packs
nodes counting the demand of every run it placed there. If the cluster's scheduler were free to
move pods between the chosen nodes (one Job per pod set with node affinity over all of the set's
nodes), two pods could land where the core planned one, and the core's capacity accounting would
silently diverge from the cluster. A Job has a single pod template, so per-index pinning is
impossible inside one Job; one Job per pod, on the other hand, multiplies objects (a 256-pod gang
becomes 256 Jobs).

A placement group is the set of pods of one pod set that the core put on the same node. Those
pods are interchangeable (same pod set, same node, same demand), so one Indexed Job per group,
with `completions = parallelism = len(group)` and required node affinity on exactly that node
(`matchFields metadata.name`, what the DaemonSet controller uses, so it matches the Node object's
name rather than a hostname label that may differ), pins every pod precisely with as few objects
as the placement allows: a gang with one pod per node still needs one Job per node, a gang
packed several pods per node needs fewer. Completion index `k` of a group maps to the core's pod
index `indices[k]`; the list travels as the pod annotation `gpufleet.io/pod-indices` (read back
by the status watcher) and as the env var `GPUFLEET_POD_INDICES` (a worker's rank is
`indices[JOB_COMPLETION_INDEX]`).

The gang (all-or-nothing) guarantee comes from the gang object of the cluster's scheduler: a
Volcano or scheduler-plugins PodGroup spanning every Job of the run, or Kueue. Kueue admits per
Job (or per JobSet), so for Kueue clusters `use_jobset=True` is the setting that keeps the whole
run one Kueue Workload. With `use_jobset` the placement groups become the replicatedJobs of one
JobSet instead of separate Jobs.

Names are deterministic functions of the run id (and pod set and group ordinal), so a retried
apply after a crash meets AlreadyExists instead of creating duplicates.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from controlplane.domain.model import CPU, GPU, GPU_TAINT_KEYS, MEM, SHARE, NodePool, Taint
from controlplane.domain.sharing import SharingKind
from controlplane.service.commands import EXTENDED_RESOURCE
from controlplane.service.ports import PodOrder, RunOrder

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
OWNED_SELECTOR = f"{MANAGED_BY}={MANAGER}"

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER_NAME = "main"

# Env vars gpufleet sets on every container; a workload may not override them.
ENV_RUN_ID = "GPUFLEET_RUN_ID"
ENV_POD_SET = "GPUFLEET_POD_SET"
ENV_POD_INDICES = "GPUFLEET_POD_INDICES"
ENV_WORLD_SIZE = "GPUFLEET_WORLD_SIZE"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

# Indexed Job pods get the hostname `<job>-<index>`, which must itself be a DNS label; keeping Job
# names to 52 characters leaves room for indices up to 10 digits.
JOB_NAME_MAX = 52
# JobSet pods get the hostname `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>` (63 at most), so
# both parts are kept short; a run id (24 characters) fits the JobSet name unchanged.
JOBSET_NAME_MAX = 30
REPLICATED_JOB_NAME_MAX = 24


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

    def __post_init__(self) -> None:
        if self.gang not in GANG_MODES:
            raise ManifestError(f"gang mode {self.gang!r} is not one of {', '.join(GANG_MODES)}")
        for resource in (self.timeslice_resource, self.mps_resource, self.gpu_resource):
            if resource is not None and not EXTENDED_RESOURCE.match(resource):
                raise ManifestError(f"{resource!r} is not a Kubernetes extended resource name")
        if not _DNS_LABEL.match(self.namespace) or len(self.namespace) > 63:
            raise ManifestError(f"namespace {self.namespace!r} is not a DNS-1123 label")
        if self.gang == "kueue" and not _LABEL_VALUE.match(self.kueue_queue):
            raise ManifestError(f"kueue queue {self.kueue_queue!r} is not a valid label value")

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
        return JOBSET if self.use_jobset else JOB

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
class RunManifests:
    run_id: str
    groups: tuple[PlacementGroup, ...]
    gang: Manifest | None
    workloads: tuple[Manifest, ...] = field(default_factory=tuple)

    def all(self) -> tuple[Manifest, ...]:
        """Creation order: the gang object before the pods that reference it."""
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
    """Name of the run's gang object (and JobSet); shared prefix of its Jobs."""
    return dns_label(run_id, JOBSET_NAME_MAX)


def job_name(run_id: str, pod_set: str, ordinal: int) -> str:
    return dns_label(f"{run_name(run_id)}-{pod_set}-{ordinal}", JOB_NAME_MAX)


def replicated_job_name(pod_set: str, ordinal: int) -> str:
    return dns_label(f"{pod_set}-{ordinal}", REPLICATED_JOB_NAME_MAX)


def placement_groups(pods: Sequence[PodOrder]) -> tuple[PlacementGroup, ...]:
    """Pods grouped by (pod set, node, pool, demand), in a deterministic order."""
    if not pods:
        raise ManifestError("the order has no pods")
    seen: set[tuple[str, int]] = set()
    set_order: list[str] = []
    buckets: dict[tuple[str, str, str, tuple[tuple[str, int], ...]], list[int]] = {}
    for pod in sorted(pods, key=lambda p: (p.pod_set, p.index)):
        if (pod.pod_set, pod.index) in seen:
            raise ManifestError(f"pod {pod.pod_set}-{pod.index} appears twice in the order")
        seen.add((pod.pod_set, pod.index))
        if pod.pod_set not in set_order:
            set_order.append(pod.pod_set)
        key = (pod.pod_set, pod.node, pod.pool, tuple(sorted(pod.demand.items())))
        buckets.setdefault(key, []).append(pod.index)
    groups: list[PlacementGroup] = []
    for pod_set in set_order:
        keyed = sorted(((k, v) for k, v in buckets.items() if k[0] == pod_set), key=lambda kv: kv[1][0])
        for ordinal, ((_, node, pool, demand), indices) in enumerate(keyed):
            groups.append(PlacementGroup(pod_set, ordinal, node, pool, dict(demand), tuple(indices)))
    return tuple(groups)


def resource_amounts(demand: Mapping[str, int], pool: NodePool, settings: KubeSettings) -> dict[str, str]:
    """Kubernetes resource quantities for one pod's demand on a node of `pool`."""
    totals: dict[str, int] = {}
    for key, amount in demand.items():
        if amount < 0:
            raise ManifestError(f"negative demand {key}={amount}")
        if amount == 0:
            continue
        if key == CPU:
            name = "cpu"
        elif key == MEM:
            name = "memory"
        elif key == GPU:
            name = settings.gpu_resource or pool.resource_names.get(GPU) or GPU_RESOURCE
        elif key == SHARE:
            if pool.sharing.kind is SharingKind.MPS:
                override = settings.mps_resource
            elif pool.sharing.kind is SharingKind.TIMESLICE:
                override = settings.timeslice_resource
            else:
                raise ManifestError(f"pool {pool.name} is {pool.sharing}, it has no shared GPUs")
            name = override or pool.resource_names.get(SHARE) or GPU_RESOURCE
            if pool.max_shares_per_pod and amount > pool.max_shares_per_pod:
                # The kubelet would refuse the pod at admission; the core never plans this.
                raise ManifestError(
                    f"{amount} shares of {name} in one container; pool {pool.name}'s device plugin serves "
                    f"at most {pool.max_shares_per_pod}"
                )
        elif key.startswith("mig:") and len(key) > 4:
            if settings.mig_strategy is not None:  # the cluster's setting wins over what nodes said
                name = f"nvidia.com/mig-{key[4:]}" if settings.mig_strategy == "mixed" else GPU_RESOURCE
            else:
                name = pool.resource_names.get(key) or f"nvidia.com/mig-{key[4:]}"
        else:
            raise ManifestError(f"unknown demand key {key!r}")
        totals[name] = totals.get(name, 0) + amount
    quantities: dict[str, str] = {}
    for name, amount in sorted(totals.items()):
        if name == "cpu":
            quantities[name] = f"{amount}m"
        elif name == "memory":
            quantities[name] = f"{amount}Mi"
        else:
            quantities[name] = str(amount)
    return quantities


def tolerations_for(pool: NodePool, settings: KubeSettings, requests_gpu: bool) -> list[dict[str, str]]:
    """Tolerations for the pool's taints, plus the cluster's GPU taint keys for GPU pods.

    The core only places a gang on a pool whose non-GPU taints the workload tolerates, so every
    taint of the chosen pool is either a GPU taint gpufleet tolerates on the workload's behalf or
    one the workload itself tolerates: tolerating exactly the pool's taints is the intersection of
    what the pod needs and what it is allowed.
    """
    wanted: set[tuple[str, str, str, str]] = set()
    for taint in pool.taints:
        wanted.add(_toleration_key(taint))
    if requests_gpu:
        for key in settings.gpu_taint_keys:
            wanted.add((key, "Exists", "", ""))  # any value, any effect
    result: list[dict[str, str]] = []
    for key, operator, value, effect in sorted(wanted):
        item = {"key": key, "operator": operator}
        if value:
            item["value"] = value
        if effect:
            item["effect"] = effect
        result.append(item)
    return result


def _toleration_key(taint: Taint) -> tuple[str, str, str, str]:
    if taint.value:
        return (taint.key, "Equal", taint.value, taint.effect)
    return (taint.key, "Exists", "", taint.effect)


def _env_list(raw: Any) -> list[dict[str, str]]:
    """`env` given as a mapping or as a list of {name, value}; values are rendered as strings."""
    if raw is None:
        return []
    items: list[tuple[Any, Any]]
    if isinstance(raw, Mapping):
        items = sorted(raw.items(), key=lambda kv: str(kv[0]))
    elif isinstance(raw, list):
        items = []
        for entry in raw:
            if not isinstance(entry, Mapping) or set(entry) - {"name", "value"} or "name" not in entry:
                raise ManifestError("container.env entries must be {name, value}")
            items.append((entry["name"], entry.get("value", "")))
    else:
        raise ManifestError("container.env must be a mapping or a list of {name, value}")
    env: list[dict[str, str]] = []
    for name, value in items:
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ManifestError(f"container.env name {name!r} is not a valid environment variable name")
        if name.startswith("GPUFLEET_"):
            raise ManifestError(f"container.env {name} is reserved for gpufleet")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str | int | float):
            text = str(value)
        else:
            raise ManifestError(f"container.env {name} must be a string or a number")
        env.append({"name": name, "value": text})
    return env


def _string_list(container: Mapping[str, Any], key: str) -> list[str] | None:
    raw = container.get(key)
    if raw is None:
        return None
    if isinstance(raw, str):
        raise ManifestError(f"container.{key} must be a list of strings, not one string")
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ManifestError(f"container.{key} must be a list of strings")
    return list(raw)


def container_spec(
    container: Mapping[str, Any],
    settings: KubeSettings,
    resources: Mapping[str, str],
    extra_env: Sequence[tuple[str, str]],
) -> dict[str, Any]:
    """The single container of a pod from the workload's opaque `container` document.

    Only image, command, args, env and workingDir are read; anything else (e.g. the simulator's
    `sim` hints) is ignored rather than passed through, so a submitted document cannot smuggle
    privileged settings into the pod.
    """
    image = container.get("image", settings.default_image)
    if not isinstance(image, str) or not image.strip():
        raise ManifestError("container.image must be a non-empty string")
    spec: dict[str, Any] = {"name": CONTAINER_NAME, "image": image}
    command = _string_list(container, "command")
    if command is not None:
        spec["command"] = command
    args = _string_list(container, "args")
    if args is not None:
        spec["args"] = args
    working_dir = container.get("workingDir", container.get("working_dir"))
    if working_dir is not None:
        if not isinstance(working_dir, str) or not working_dir.startswith("/"):
            raise ManifestError("container.workingDir must be an absolute path")
        spec["workingDir"] = working_dir
    spec["env"] = _env_list(container.get("env")) + [{"name": k, "value": v} for k, v in extra_env]
    # Requests equal to limits: the core reserved exactly this much, and extended resources
    # (GPUs) must have equal requests and limits anyway; it also gives Guaranteed QoS.
    spec["resources"] = {"limits": dict(resources), "requests": dict(resources)}
    spec["securityContext"] = {"allowPrivilegeEscalation": False}
    return spec


def _label_value(value: str, what: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ManifestError(f"{what} {value!r} cannot be a Kubernetes label value")
    return value


def ownership_labels(order: RunOrder) -> dict[str, str]:
    return {
        MANAGED_BY: MANAGER,
        LABEL_RUN: _label_value(order.run_id, "run id"),
        LABEL_WORKLOAD: _label_value(order.workload_id, "workload id"),
        LABEL_EPOCH: str(order.epoch),
        LABEL_ATTEMPT: str(order.attempt),
    }


def _pod_template(
    order: RunOrder,
    group: PlacementGroup,
    pool: NodePool,
    settings: KubeSettings,
    gang_name: str,
    world_size: int,
) -> dict[str, Any]:
    resources = resource_amounts(group.demand, pool, settings)
    requests_gpu = any(name.startswith("nvidia.com/") for name in resources)
    indices = ",".join(str(i) for i in group.indices)
    labels = ownership_labels(order) | {LABEL_POD_SET: _label_value(group.pod_set, "pod set")}
    annotations = {ANNOTATION_INDICES: indices}
    if settings.gang == "volcano":
        annotations[VOLCANO_GROUP_ANNOTATION] = gang_name
    elif settings.gang == "coscheduling":
        labels[COSCHEDULING_GROUP_LABEL] = gang_name
    extra_env = [
        (ENV_RUN_ID, order.run_id),
        (ENV_POD_SET, group.pod_set),
        (ENV_POD_INDICES, indices),
        (ENV_WORLD_SIZE, str(world_size)),
    ]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # Workloads do not call the Kubernetes API; no token is mounted unless they ask elsewhere.
        "automountServiceAccountToken": False,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [group.node]}]}
                    ]
                }
            }
        },
        "containers": [container_spec(order.container, settings, resources, extra_env)],
    }
    if order.priority_class:
        spec["priorityClassName"] = order.priority_class
    scheduler = settings.effective_scheduler
    if scheduler:
        spec["schedulerName"] = scheduler
    tolerations = tolerations_for(pool, settings, requests_gpu)
    if tolerations:
        spec["tolerations"] = tolerations
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}


def _job_spec(order: RunOrder, group: PlacementGroup, template: dict[str, Any], suspend: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": len(group.indices),
        "parallelism": len(group.indices),
        # gpufleet retries a failed gang as a new run (attempt) on possibly other nodes; a pod
        # restarted in place would rejoin a gang whose peers may already be gone.
        "backoffLimit": 0,
        "template": template,
    }
    if order.duration_seconds is not None:
        spec["activeDeadlineSeconds"] = max(1, math.ceil(order.duration_seconds))
    if suspend:
        spec["suspend"] = True
    return spec


def _metadata(
    name: str, settings: KubeSettings, labels: Mapping[str, str], order: RunOrder, count: int
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": settings.namespace,
        "labels": dict(labels),
        "annotations": {ANNOTATION_OBJECTS: str(count), ANNOTATION_WORKLOAD_NAME: order.workload_name},
    }


def build_run_manifests(order: RunOrder, pools: Mapping[str, NodePool], settings: KubeSettings) -> RunManifests:
    """Every object the run needs on its cluster, in creation order."""
    if order.min_available < 1 or order.min_available > len(order.pods):
        raise ManifestError(f"min_available {order.min_available} does not fit a gang of {len(order.pods)} pods")
    groups = placement_groups(order.pods)
    gang_name = run_name(order.run_id)
    labels = ownership_labels(order)
    world_size = len(order.pods)
    kueue = settings.gang == "kueue"
    workload_labels = labels | ({KUEUE_QUEUE_LABEL: settings.kueue_queue} if kueue else {})

    templates: list[tuple[PlacementGroup, dict[str, Any]]] = []
    for group in groups:
        pool = pools.get(group.pool)
        if pool is None:
            raise ManifestError(f"pool {group.pool} of node {group.node} is not known for cluster {order.cluster}")
        templates.append((group, _pod_template(order, group, pool, settings, gang_name, world_size)))

    gang_resource = settings.gang_resource
    object_count = (1 if gang_resource else 0) + (1 if settings.use_jobset else len(groups))
    gang: Manifest | None = None
    if gang_resource is not None:
        gang_spec: dict[str, Any] = {"minMember": order.min_available}
        if gang_resource is VOLCANO_POD_GROUP:
            gang_spec["queue"] = settings.volcano_queue
            if order.priority_class:
                gang_spec["priorityClassName"] = order.priority_class
        else:
            gang_spec["scheduleTimeoutSeconds"] = settings.coscheduling_timeout_seconds
        gang = Manifest(
            gang_resource,
            gang_name,
            {
                "apiVersion": gang_resource.api_version,
                "kind": gang_resource.kind,
                "metadata": _metadata(gang_name, settings, labels, order, object_count),
                "spec": gang_spec,
            },
        )

    workloads: list[Manifest] = []
    if settings.use_jobset:
        replicated = [
            {
                "name": replicated_job_name(group.pod_set, group.ordinal),
                "replicas": 1,
                # Kueue suspends at the JobSet level; child Jobs must not carry their own suspend.
                "template": {"spec": _job_spec(order, group, template, suspend=False)},
            }
            for group, template in templates
        ]
        names = [r["name"] for r in replicated]
        if len(set(names)) != len(names):
            raise ManifestError("two placement groups map to the same replicatedJob name")
        spec: dict[str, Any] = {
            "replicatedJobs": replicated,
            # One failed pod fails the gang; gpufleet decides whether to try again.
            "failurePolicy": {"maxRestarts": 0},
            "successPolicy": {"operator": "All"},
        }
        if kueue:
            spec["suspend"] = True
        workloads.append(
            Manifest(
                JOBSET,
                gang_name,
                {
                    "apiVersion": JOBSET.api_version,
                    "kind": JOBSET.kind,
                    "metadata": _metadata(gang_name, settings, workload_labels, order, object_count),
                    "spec": spec,
                },
            )
        )
    else:
        for group, template in templates:
            name = job_name(order.run_id, group.pod_set, group.ordinal)
            workloads.append(
                Manifest(
                    JOB,
                    name,
                    {
                        "apiVersion": JOB.api_version,
                        "kind": JOB.kind,
                        "metadata": _metadata(name, settings, workload_labels, order, object_count),
                        # Kueue expects queued Jobs to be created suspended; it unsuspends on admission.
                        "spec": _job_spec(order, group, template, suspend=kueue),
                    },
                )
            )
        names = [m.name for m in workloads]
        if len(set(names)) != len(names):
            raise ManifestError("two placement groups map to the same Job name")
    return RunManifests(order.run_id, groups, gang, tuple(workloads))


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
