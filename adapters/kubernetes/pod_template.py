"""The pod side of a run's manifests: the pod template (resources, tolerations, container, affinity,
spread), gpufleet's and the workload's labels, and the PriorityClass gpufleet owns.

Separate from `manifests`, which wraps these templates in Jobs or a JobSet and the gang object."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from adapters.kubernetes.manifest_model import (
    ANNOTATION_INDICES,
    ANNOTATION_SERVING,
    CONTAINER_NAME,
    COSCHEDULING_GROUP_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    ENV_POD_INDICES,
    ENV_POD_SET,
    ENV_RUN_ID,
    ENV_WORLD_SIZE,
    HOSTNAME_LABEL,
    LABEL_ATTEMPT,
    LABEL_EPOCH,
    LABEL_KEY_NAME,
    LABEL_POD_SET,
    LABEL_PRIORITY_CLASS,
    LABEL_RUN,
    LABEL_VALUE,
    LABEL_WORKLOAD,
    MANAGED_BY,
    MANAGER,
    PRIORITY_CLASS,
    VOLCANO_GROUP_ANNOTATION,
    JobUnit,
    KubeSettings,
    Manifest,
    ManifestError,
    PlacementGroup,
    PodSetSpread,
)
from controlplane.domain.model import CPU, MEM, SHARE, NodePool, Taint, reserved_label
from controlplane.domain.resource_names import ResourceOverrides, requested_resource
from controlplane.service.ports import RunOrder


def priority_class_manifest(name: str, gpufleet_class: str, value: int) -> Manifest:
    """The cluster-scoped PriorityClass gpufleet owns for one of its classes.

    `preemptionPolicy: Never`: gpufleet's core decides preemption and removes the victims before it
    dispatches, so the cluster's scheduler must not evict pods (gpufleet's or anyone's) on its own.
    """
    if not DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise ManifestError(f"priority class {gpufleet_class!r} gives the invalid PriorityClass name {name!r}")
    if not -1_000_000_000 <= value <= 1_000_000_000:
        raise ManifestError(f"priority {value} is outside the range of user PriorityClasses (±1e9)")
    return Manifest(
        PRIORITY_CLASS,
        name,
        {
            "apiVersion": PRIORITY_CLASS.api_version,
            "kind": PRIORITY_CLASS.kind,
            "metadata": {
                "name": name,
                "labels": {MANAGED_BY: MANAGER, LABEL_PRIORITY_CLASS: _label_value(gpufleet_class, "priority class")},
            },
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": f"gpufleet priority class {gpufleet_class}; created and owned by gpufleet",
        },
    )


def _overrides(settings: KubeSettings) -> ResourceOverrides:
    return ResourceOverrides(
        settings.gpu_resource, settings.timeslice_resource, settings.mps_resource, settings.mig_strategy
    )


def resource_amounts(demand: Mapping[str, int], pool: NodePool, settings: KubeSettings) -> dict[str, str]:
    """Kubernetes resource quantities for one pod's demand on a node of `pool`."""
    overrides = _overrides(settings)
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
        else:
            found = requested_resource(key, pool.sharing.kind, pool.resource_names, overrides)
            if found is None:
                raise ManifestError(
                    f"pool {pool.name} is {pool.sharing}, it has no shared GPUs"
                    if key == SHARE
                    else f"unknown demand key {key!r}"
                )
            name = found
            if key == SHARE and pool.max_shares_per_pod and amount > pool.max_shares_per_pod:
                # The kubelet would refuse the pod at admission; the core never plans this.
                raise ManifestError(
                    f"{amount} shares of {name} in one container; pool {pool.name}'s device plugin serves "
                    f"at most {pool.max_shares_per_pod}"
                )
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
        if not isinstance(name, str) or not ENV_NAME.match(name):
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
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise ManifestError(f"{what} {value!r} cannot be a Kubernetes label value")
    return value


def ownership_labels(order: RunOrder) -> dict[str, str]:
    """gpufleet's labels on every object and pod of a run.

    `gpufleet.io/run` holds the full run id, attempt included (`run-<20 hex>-<attempt>`): the
    status watcher and the telemetry agent (through dcgm-exporter's pod labels, where it reads
    `gpufleet_io_run`) find the run by it.
    """
    return {
        MANAGED_BY: MANAGER,
        LABEL_RUN: _label_value(order.run_id, "run id"),
        LABEL_WORKLOAD: _label_value(order.workload_id, "workload id"),
        LABEL_EPOCH: str(order.epoch),
        LABEL_ATTEMPT: str(order.attempt),
    }


def workload_labels(raw: Mapping[str, str]) -> dict[str, str]:
    """The workload's own labels, checked as Kubernetes labels; reserved keys are refused."""
    labels: dict[str, str] = {}
    for key, value in sorted(raw.items()):
        prefix, _, local = key.rpartition("/")
        if (
            (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)))
            or len(local) > 63
            or not LABEL_KEY_NAME.match(local)
        ):
            raise ManifestError(f"workload label key {key!r} is not a valid Kubernetes label key")
        if reserved_label(key):
            raise ManifestError(f"workload label {key} is reserved for gpufleet and the controllers it drives")
        if not isinstance(value, str):
            raise ManifestError(f"workload label {key} must be a string")
        labels[key] = _label_value(value, f"workload label {key}")
    return labels


def _node_affinity(unit: JobUnit) -> dict[str, Any]:
    nodes = [unit.node] if isinstance(unit, PlacementGroup) else list(unit.nodes)
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                # matchFields on metadata.name (what the DaemonSet controller uses) matches the
                # Node object's name, not a hostname label that may differ from it. The API server
                # allows exactly one value per `metadata.name` field selector, so several nodes are
                # several terms, which are ORed.
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]} for node in nodes
                ]
            }
        }
    }
    return affinity


def _spread_anti_affinity(order: RunOrder, pod_set: str) -> dict[str, Any]:
    """At most one pod of the pod set per node: with n pods and n allowed nodes, one on each."""
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {LABEL_RUN: order.run_id, LABEL_POD_SET: pod_set}},
                    "topologyKey": HOSTNAME_LABEL,
                }
            ]
        }
    }


def _even_spread(order: RunOrder, pod_set: str) -> list[dict[str, Any]]:
    """Pod counts per allowed node never more than 1 apart: k*n pods on n nodes, k on each.

    `nodeAffinityPolicy: Honor` counts only the nodes the pod's node affinity allows (the set's
    own), so nodes elsewhere at zero do not hold the spread down.
    """
    return [
        {
            "maxSkew": 1,
            "topologyKey": HOSTNAME_LABEL,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {LABEL_RUN: order.run_id, LABEL_POD_SET: pod_set}},
            "nodeAffinityPolicy": "Honor",
        }
    ]


def pod_template(
    order: RunOrder,
    unit: JobUnit,
    pool: NodePool,
    settings: KubeSettings,
    gang_name: str,
    world_size: int,
    extra_labels: Mapping[str, str],
) -> dict[str, Any]:
    resources = resource_amounts(unit.demand, pool, settings)
    requests_gpu = any(name.startswith("nvidia.com/") for name in resources)
    indices = ",".join(str(i) for i in unit.indices)
    # The workload's labels first, so gpufleet's own (and the gang scheduler's) always win.
    labels = dict(extra_labels) | ownership_labels(order) | {LABEL_POD_SET: _label_value(unit.pod_set, "pod set")}
    annotations = {ANNOTATION_INDICES: indices}
    if order.serving:
        annotations[ANNOTATION_SERVING] = json.dumps(dict(order.serving), separators=(",", ":"), sort_keys=True)
    if settings.gang == "volcano":
        annotations[VOLCANO_GROUP_ANNOTATION] = gang_name
    elif settings.gang == "coscheduling":
        labels[COSCHEDULING_GROUP_LABEL] = gang_name
    extra_env = [
        (ENV_RUN_ID, order.run_id),
        (ENV_POD_SET, unit.pod_set),
        (ENV_POD_INDICES, indices),
        (ENV_WORLD_SIZE, str(world_size)),
    ]
    affinity = _node_affinity(unit)
    if isinstance(unit, PodSetSpread) and unit.per_node == 1:
        affinity |= _spread_anti_affinity(order, unit.pod_set)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # Workloads do not call the Kubernetes API; no token is mounted unless they ask elsewhere.
        "automountServiceAccountToken": False,
        "affinity": affinity,
        "containers": [container_spec(order.container, settings, resources, extra_env)],
    }
    if order.max_runtime_seconds is not None:
        # The declared bound, on the pod rather than the Job: the kubelet counts a pod's
        # activeDeadlineSeconds from when it took the pod on its node, whereas a Job's counts from
        # the Job's start and so would also spend the time the gang waited to be scheduled. When it
        # passes the pod fails (DeadlineExceeded) and, with backoffLimit 0, so does its Job and the
        # gang. (`duration_seconds` is the simulator's, never a bound.)
        spec["activeDeadlineSeconds"] = max(1, math.ceil(order.max_runtime_seconds))
    priority_class = settings.priority_class_name(order.priority_class)
    if priority_class:
        spec["priorityClassName"] = priority_class
    if isinstance(unit, PodSetSpread) and unit.per_node > 1:
        spec["topologySpreadConstraints"] = _even_spread(order, unit.pod_set)
    scheduler = settings.effective_scheduler
    if scheduler:
        spec["schedulerName"] = scheduler
    tolerations = tolerations_for(pool, settings, requests_gpu)
    if tolerations:
        spec["tolerations"] = tolerations
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}
