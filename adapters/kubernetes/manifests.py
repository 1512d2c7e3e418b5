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
Volcano or scheduler-plugins PodGroup spanning every Job of the run, or Kueue. Kueue admits one
Workload per Job, so separate Jobs would be admitted one by one; a `kueue` cluster therefore
always gets one JobSet per run (one Kueue Workload, admitted whole), whatever `use_jobset` says.
Kueue's plain-pod groups are no way around that: their pod sets ("roles") are keyed by a hash of
the pod spec including its affinity, so per-node pinning makes one role per node there too.

Kueue gives every replicatedJob its own pod set and refuses a Workload with more pod sets than
its limit (8 up to Kueue v0.17, 10 in v0.18, 18 since v0.19: `kueue_max_pod_sets`). When the
placement groups outnumber it, pod sets with the same number k of pods on each of their n nodes
are folded into one replicatedJob: required node affinity over exactly the set's nodes, plus
required pod anti-affinity on `kubernetes.io/hostname` when k = 1, or a hard topology spread
(maxSkew 1 over those nodes) when k > 1, so the k*n pods land k per node on the n nodes the core
chose (which pod lands where is left to the scheduler; the pods of a set are interchangeable). A
placement that still needs more pod sets than the limit is refused.

Priority: a gpufleet class becomes the cluster PriorityClass `gpufleet-<class>` (created and
owned by gpufleet, value = the class value) unless the cluster maps it to one of its own
(`priority_class_map`). A workload's `max_runtime_seconds` becomes every pod's
`activeDeadlineSeconds`; its labels go on every object and pod template, under gpufleet's own.

Names are deterministic functions of the run id (and pod set and group ordinal), so a retried
apply after a crash meets AlreadyExists instead of creating duplicates.

This module builds the workload objects (Jobs or one JobSet) and the gang object (Volcano or
coscheduling PodGroup) of a run; the pod template, labels and priority class are in `pod_template`,
placement groups and Kueue folding in `placement`, the names, types and settings they share in
`manifest_model` (`KubeSettings` and `ManifestError`, used all over, are re-exported here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.kubernetes.manifest_model import (
    ANNOTATION_OBJECTS,
    ANNOTATION_WORKLOAD_NAME,
    JOB,
    JOBSET,
    KUEUE_QUEUE_LABEL,
    VOLCANO_POD_GROUP,
    JobUnit,
    KubeSettings,
    Manifest,
    ManifestError,
    PlacementGroup,
    RunManifests,
    job_name,
    replicated_job_name,
    run_name,
)
from adapters.kubernetes.placement import kueue_units, placement_groups
from adapters.kubernetes.pod_template import ownership_labels, pod_template, priority_class_manifest, workload_labels
from controlplane.domain.model import NodePool
from controlplane.service.ports import RunOrder

__all__ = ["KubeSettings", "ManifestError", "RunManifests", "build_run_manifests"]


def _job_spec(completions: int, template: dict[str, Any], suspend: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": completions,
        "parallelism": completions,
        # gpufleet retries a failed gang as a new run (attempt) on possibly other nodes; a pod
        # restarted in place would rejoin a gang whose peers may already be gone.
        "backoffLimit": 0,
        "template": template,
    }
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


def _unit_name(unit: JobUnit) -> tuple[str, int | None]:
    return (unit.pod_set, unit.ordinal) if isinstance(unit, PlacementGroup) else (unit.pod_set, None)


def build_run_manifests(order: RunOrder, pools: Mapping[str, NodePool], settings: KubeSettings) -> RunManifests:
    """Every object the run needs on its cluster, in creation order."""
    if order.min_available < 1 or order.min_available > len(order.pods):
        raise ManifestError(f"min_available {order.min_available} does not fit a gang of {len(order.pods)} pods")
    groups = placement_groups(order.pods)
    gang_name = run_name(order.run_id)
    user_labels = workload_labels(order.labels)
    labels = user_labels | ownership_labels(order)
    world_size = len(order.pods)
    kueue = settings.gang == "kueue"
    top_labels = labels | ({KUEUE_QUEUE_LABEL: settings.kueue_queue} if kueue else {})

    units: tuple[JobUnit, ...] = groups
    if kueue:
        units = kueue_units(groups, settings.kueue_max_pod_sets, pools)
    templates: list[tuple[JobUnit, dict[str, Any]]] = []
    for unit in units:
        pool = pools.get(unit.pool)
        if pool is None:
            where = unit.node if isinstance(unit, PlacementGroup) else ", ".join(unit.nodes)
            raise ManifestError(f"pool {unit.pool} of node {where} is not known for cluster {order.cluster}")
        templates.append((unit, pod_template(order, unit, pool, settings, gang_name, world_size, user_labels)))

    priority_manifest: Manifest | None = None
    priority_name = settings.priority_class_name(order.priority_class)
    if priority_name is not None and order.priority_class not in settings.priority_class_map:
        priority_manifest = priority_class_manifest(priority_name, order.priority_class, order.priority)

    gang_resource = settings.gang_resource
    object_count = (1 if gang_resource else 0) + (1 if settings.jobset else len(templates))
    gang: Manifest | None = None
    if gang_resource is not None:
        gang_spec: dict[str, Any] = {"minMember": order.min_available}
        if gang_resource is VOLCANO_POD_GROUP:
            gang_spec["queue"] = settings.volcano_queue
            if priority_name:
                gang_spec["priorityClassName"] = priority_name
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
    if settings.jobset:
        replicated = []
        for unit, template in templates:
            pod_set, ordinal = _unit_name(unit)
            completions = len(unit.indices)
            name = replicated_job_name(gang_name, pod_set, ordinal, completions)
            replicated.append(
                {
                    "name": name,
                    "replicas": 1,
                    # Kueue suspends at the JobSet level; child Jobs must not carry their own suspend.
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": _job_spec(completions, template, suspend=False),
                    },
                }
            )
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
                    "metadata": _metadata(gang_name, settings, top_labels, order, object_count),
                    "spec": spec,
                },
            )
        )
    else:
        for unit, template in templates:
            assert isinstance(unit, PlacementGroup)  # folding happens under Kueue, which uses JobSets
            name = job_name(order.run_id, unit.pod_set, unit.ordinal)
            workloads.append(
                Manifest(
                    JOB,
                    name,
                    {
                        "apiVersion": JOB.api_version,
                        "kind": JOB.kind,
                        "metadata": _metadata(name, settings, top_labels, order, object_count),
                        "spec": _job_spec(len(unit.indices), template, suspend=False),
                    },
                )
            )
        names = [m.name for m in workloads]
        if len(set(names)) != len(names):
            raise ManifestError("two placement groups map to the same Job name")
    return RunManifests(order.run_id, groups, gang, tuple(workloads), priority_manifest)
