"""The cluster's actors as the fake API server plays them: JobSet and Job controllers, the
scheduler (with Volcano / scheduler-plugins gangs), the kubelet, the pod garbage collector and
Kueue's admission. Each is a function a test calls when it wants that actor to act: deterministic,
no threads, no clocks to wait for.

Upstream behaviour reproduced (names and labels exactly):
- JobSet controller (`kubernetes-sigs/jobset` `pkg/controllers/jobset_controller.go` constructJob,
  labelAndAnnotateObject): child Job `<jobset>-<replicatedJob>-<jobIndex>` per replica, labels and
  annotations `jobset.sigs.k8s.io/*`, pod subdomain = network.subdomain or the JobSet name when DNS
  hostnames are enabled (the default), child Jobs suspended while the JobSet is.
- Job controller (`kubernetes/kubernetes` `pkg/controller/job`): Indexed pods named
  `<job>-<index>-<5 random>` (generateName `<job>-<index>-`, cut to 58 characters), hostname
  `<job>-<index>`, the completion index as annotation, label and `JOB_COMPLETION_INDEX` env;
  NonIndexed pods `<job>-<5 random>`; at most `parallelism` active pods; `Complete` when every
  index succeeded, `Failed` (BackoffLimitExceeded) when failures exceed `backoffLimit`, active
  pods deleted then. A pod the API server refuses (422, or 403 from the Priority admission plugin)
  is not created: the Job controller records a FailedCreate event and retries, the run never
  starts (here: `api.failed_creates`).
- PodGC (`pkg/controller/podgc`): pods bound to a node that no longer exists are marked Failed
  with a `DisruptionTarget` condition (reason DeletionByPodGC) and deleted.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from tests.kubernetes.admission import (
    Forbidden,
    Invalid,
    default_jobset,
    pod_requests,
    validate_job,
    validate_jobset,
)
from tests.kubernetes.kinds import (
    COSCHEDULING_PODGROUPS,
    JOBS,
    JOBSETS,
    NODES,
    PODS,
    VOLCANO_PODGROUPS,
    FailedCreate,
    ResourceKey,
)
from tests.kubernetes.scheduler import TERMINAL_PHASES, node_ready, node_states, place

if TYPE_CHECKING:
    from tests.kubernetes.fake_apiserver import FakeApiServer

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
MAX_GENERATED_NAME = 58  # names.MaxGeneratedNameLength (63 - 5 random characters)
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery util/rand alphanumerics
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _copy(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def _owner(api_version: str, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    uid = owner["metadata"]["uid"]
    return any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])


def random_suffix(seed: str) -> str:
    """Five characters from the apiserver's name-generation alphabet, deterministic per seed."""
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:5])


# -- JobSet controller ---------------------------------------------------------------------------


def _jobset_labels(jobset: dict[str, Any], rjob: dict[str, Any], index: int) -> dict[str, str]:
    spec = jobset["spec"]
    rjobs = spec["replicatedJobs"]
    name, ns = jobset["metadata"]["name"], jobset["metadata"].get("namespace", "")
    group = rjob.get("groupName", "default")
    job_name = f"{name}-{rjob['name']}-{index}"
    before = sum(r.get("replicas", 1) for r in rjobs[: rjobs.index(rjob)])
    group_before = sum(
        r.get("replicas", 1) for r in rjobs[: rjobs.index(rjob)] if r.get("groupName", "default") == group
    )
    return {
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/jobset-uid": jobset["metadata"]["uid"],
        "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
        "jobset.sigs.k8s.io/restart-attempt": str((jobset.get("status") or {}).get("restarts", 0)),
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob.get("replicas", 1)),
        "jobset.sigs.k8s.io/global-replicas": str(sum(r.get("replicas", 1) for r in rjobs)),
        "jobset.sigs.k8s.io/job-index": str(index),
        "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{ns}/{job_name}".encode()).hexdigest(),
        "jobset.sigs.k8s.io/job-global-index": str(before + index),
        "jobset.sigs.k8s.io/group-name": group,
        "jobset.sigs.k8s.io/group-replicas": str(
            sum(r.get("replicas", 1) for r in rjobs if r.get("groupName", "default") == group)
        ),
        "jobset.sigs.k8s.io/job-group-index": str(group_before + index),
    }


def child_jobs(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    """The Jobs the JobSet controller creates for a (defaulted) JobSet (constructJob)."""
    spec = jobset["spec"]
    network = spec.get("network") or {}
    suspended = bool(spec.get("suspend"))
    jobs = []
    for rjob in spec["replicatedJobs"]:
        for index in range(rjob.get("replicas", 1)):
            template = _copy(rjob["template"])
            extra = _jobset_labels(jobset, rjob, index)
            meta = template.get("metadata") or {}
            job_spec = template["spec"]
            pod_meta = job_spec.setdefault("template", {}).setdefault("metadata", {})
            pod_meta["labels"] = dict(pod_meta.get("labels") or {}) | extra
            pod_meta["annotations"] = dict(pod_meta.get("annotations") or {}) | extra
            if network.get("enableDNSHostnames", True):
                job_spec["template"].setdefault("spec", {})["subdomain"] = (
                    network.get("subdomain") or jobset["metadata"]["name"]
                )
            job_spec["suspend"] = suspended
            jobs.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": f"{jobset['metadata']['name']}-{rjob['name']}-{index}",
                        "namespace": jobset["metadata"].get("namespace", ""),
                        "labels": dict(meta.get("labels") or {}) | extra,
                        "annotations": dict(meta.get("annotations") or {}) | extra,
                        "ownerReferences": [_owner("jobset.x-k8s.io/v1alpha2", "JobSet", jobset)],
                    },
                    "spec": job_spec,
                }
            )
    return jobs


def validate_jobset_and_children(body: dict[str, Any]) -> None:
    """The JobSet as its create meets it, then each Job its controller would create from it."""
    validate_jobset(body)
    jobset = _copy(body)
    jobset.setdefault("metadata", {}).setdefault("uid", "00000000-0000-0000-0000-000000000000")
    default_jobset(jobset)
    for job in child_jobs(jobset):
        validate_job(job)


def _run_jobset_controller(api: FakeApiServer, namespace: str) -> None:
    for jobset in api.objects_of(JOBSETS, namespace):
        for job in child_jobs(jobset):
            existing = api.get(JOBS, namespace, job["metadata"]["name"])
            if existing is None:
                api.create_as_controller(JOBS, job, f"jobset/{jobset['metadata']['name']}")
            elif existing["spec"].get("suspend") and not jobset["spec"].get("suspend"):
                resumed = _copy(existing)
                resumed["spec"]["suspend"] = False  # the JobSet controller resumes its Jobs
                api.put(JOBS, resumed)


# -- Job controller ------------------------------------------------------------------------------


def _pod_name(api: FakeApiServer, job_name: str, index: int | None, ordinal: int) -> str:
    if not api.generated_pod_names:
        return f"{job_name}-{index if index is not None else ordinal}"
    prefix = f"{job_name}-{index}-" if index is not None else f"{job_name}-"
    if len(prefix) > MAX_GENERATED_NAME:
        tail = f"-{index}-" if index is not None else "-"
        prefix = prefix[: MAX_GENERATED_NAME - len(tail)] + tail
    return prefix + random_suffix(f"{job_name}/{index}/{ordinal}")


def _pod_for(api: FakeApiServer, job: dict[str, Any], index: int | None, ordinal: int) -> dict[str, Any]:
    template = _copy(job["spec"]["template"])
    meta = template.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    spec = template["spec"]
    if index is not None:
        annotations[COMPLETION_INDEX] = str(index)
        labels[COMPLETION_INDEX] = str(index)
        spec.setdefault("hostname", f"{job['metadata']['name']}-{index}")
        env_var = {
            "name": "JOB_COMPLETION_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
        }
        for container in spec.get("containers") or []:
            container["env"] = [*(container.get("env") or []), env_var]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": _pod_name(api, job["metadata"]["name"], index, ordinal),
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [_owner("batch/v1", "Job", job)],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def _pod_index(pod: dict[str, Any]) -> int | None:
    raw = (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX)
    return int(raw) if raw is not None and raw.isdigit() else None


def _finished(job: dict[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _sync_job(api: FakeApiServer, job: dict[str, Any], created: list[str]) -> None:
    spec, ns = job["spec"], job["metadata"]["namespace"]
    pods = [p for p in api.objects_of(PODS, ns) if _owned_by(p, job)]
    indexed = spec.get("completionMode") == "Indexed"
    completions = spec.get("completions") or 1
    parallelism = spec.get("parallelism", 1)
    active = [p for p in pods if p["status"].get("phase") not in TERMINAL_PHASES]
    failed = [p for p in pods if p["status"].get("phase") == "Failed"]
    succeeded = [p for p in pods if p["status"].get("phase") == "Succeeded"]
    done = {_pod_index(p) for p in succeeded} if indexed else set()
    if len(failed) > spec.get("backoffLimit", 6):
        for pod in active:  # the Job controller terminates what still runs
            api.remove(PODS, ns, pod["metadata"]["name"])
        _set_job_status(api, job, [("FailureTarget", "BackoffLimitExceeded"), ("Failed", "BackoffLimitExceeded")], pods)
        return
    if (indexed and len(done) >= completions) or (not indexed and len(succeeded) >= completions):
        _set_job_status(
            api, job, [("SuccessCriteriaMet", "CompletionsReached"), ("Complete", "CompletionsReached")], pods
        )
        return
    if spec.get("suspend"):
        return
    room = parallelism - len(active)
    if indexed:
        busy = {_pod_index(p) for p in active} | done
        wanted: list[int | None] = [i for i in range(completions) if i not in busy]
    else:
        wanted = [None] * max(0, completions - len(succeeded) - len(active))
    for ordinal, index in enumerate(wanted[: max(0, room)]):
        pod = _pod_for(api, job, index, len(pods) + ordinal)
        stored = api.create_as_controller(PODS, pod, f"job/{job['metadata']['name']}")
        if stored is not None:
            created.append(stored["metadata"]["name"])
    _set_job_status(api, job, [], _pods_of(api, job))


def _pods_of(api: FakeApiServer, job: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in api.objects_of(PODS, job["metadata"]["namespace"]) if _owned_by(p, job)]


def _set_job_status(
    api: FakeApiServer, job: dict[str, Any], conditions: list[tuple[str, str]], pods: list[dict[str, Any]]
) -> None:
    status: dict[str, Any] = {
        "active": sum(1 for p in pods if p["status"].get("phase") not in TERMINAL_PHASES),
        "succeeded": sum(1 for p in pods if p["status"].get("phase") == "Succeeded"),
        "failed": sum(1 for p in pods if p["status"].get("phase") == "Failed"),
    }
    if conditions:
        status["conditions"] = [{"type": t, "status": "True", "reason": r} for t, r in conditions]
    current = api.get(JOBS, job["metadata"]["namespace"], job["metadata"]["name"])
    if current is None or current.get("status") == status:
        return
    updated = _copy(current)
    updated["status"] = status
    api.put(JOBS, updated)


def run_job_controller(api: FakeApiServer, namespace: str) -> list[dict[str, Any]]:
    """One pass of the JobSet and Job controllers, then of the scheduler. Idempotent; returns
    the pods created by this call (as stored after scheduling)."""
    _run_jobset_controller(api, namespace)
    created: list[str] = []
    for job in api.objects_of(JOBS, namespace):
        if not _finished(job):
            _sync_job(api, job, created)
    schedule(api)
    return [p for name in created if (p := api.get(PODS, namespace, name)) is not None]


# -- scheduler -----------------------------------------------------------------------------------


def _gang_of(pod: dict[str, Any]) -> tuple[ResourceKey, str] | None:
    scheduler = pod["spec"].get("schedulerName", "default-scheduler")
    meta = pod["metadata"]
    if scheduler == VOLCANO_SCHEDULER and (meta.get("annotations") or {}).get(VOLCANO_GROUP_ANNOTATION):
        return VOLCANO_PODGROUPS, meta["annotations"][VOLCANO_GROUP_ANNOTATION]
    if scheduler == COSCHEDULING_SCHEDULER and (meta.get("labels") or {}).get(COSCHEDULING_GROUP_LABEL):
        return COSCHEDULING_PODGROUPS, meta["labels"][COSCHEDULING_GROUP_LABEL]
    return None


def _mark_unschedulable(api: FakeApiServer, pod: dict[str, Any], message: str) -> None:
    updated = _copy(pod)
    status = updated.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    conditions.append(
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": api.now(),
        }
    )
    status["conditions"] = conditions
    if updated != pod:
        api.put(PODS, updated)


def _bind(api: FakeApiServer, pod: dict[str, Any], node: str) -> None:
    updated = _copy(pod)
    updated["spec"]["nodeName"] = node
    conditions = [c for c in updated["status"].get("conditions") or [] if c.get("type") != "PodScheduled"]
    conditions.append(
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": api.now()}
    )
    updated["status"]["conditions"] = conditions
    api.put(PODS, updated)


def schedule(api: FakeApiServer) -> list[str]:
    """Bind every pending pod that fits (gangs all-or-nothing); the rest get the scheduler's
    PodScheduled=False Unschedulable condition. Returns the names of the pods bound."""
    pods = api.objects_of(PODS)
    states = node_states(api.objects_of(NODES), pods)
    pending = sorted(
        (
            p
            for p in pods
            if not p["spec"].get("nodeName")
            and p["status"].get("phase", "Pending") == "Pending"
            and p["spec"].get("schedulerName", "default-scheduler") in api.schedulers
            and not p["spec"].get("schedulingGates")
        ),
        key=lambda p: (-(p["spec"].get("priority") or 0), int(p["metadata"]["resourceVersion"])),
    )
    bound: list[str] = []
    gangs: dict[tuple[str, ResourceKey, str], list[dict[str, Any]]] = {}
    for pod in pending:
        gang = _gang_of(pod)
        if gang is not None:
            gangs.setdefault((pod["metadata"]["namespace"], *gang), []).append(pod)
            continue
        node, message = place(pod["spec"], states)
        if node is None:
            _mark_unschedulable(api, pod, message)
        else:
            states[node].hold(pod_requests(pod["spec"]))
            _bind(api, pod, node)
            bound.append(pod["metadata"]["name"])
    for (ns, key, group), members in gangs.items():
        bound.extend(_schedule_gang(api, states, pods, ns, key, group, members))
    return bound


def _schedule_gang(
    api: FakeApiServer,
    states: dict[str, Any],
    pods: list[dict[str, Any]],
    ns: str,
    key: ResourceKey,
    group: str,
    members: list[dict[str, Any]],
) -> list[str]:
    pod_group = api.get(key, ns, group)
    if pod_group is None:
        for pod in members:
            _mark_unschedulable(api, pod, f'pod group "{group}" not found')
        return []
    min_member = int(pod_group["spec"].get("minMember", 1))
    running = [
        p
        for p in pods
        if p["spec"].get("nodeName") and p["status"].get("phase") not in TERMINAL_PHASES and _gang_of(p) == (key, group)
    ]
    placed: list[tuple[dict[str, Any], str]] = []
    first_error = ""
    for pod in members:
        node, message = place(pod["spec"], states)
        if node is None:
            first_error = first_error or message
            continue
        states[node].hold(pod_requests(pod["spec"]))
        placed.append((pod, node))
    if len(running) + len(placed) < min_member:
        for pod, node in placed:
            states[node].release(pod_requests(pod["spec"]))
        message = (
            f"{len(running) + len(placed)}/{len(running) + len(members)} pods of gang {group} fit, "
            f"minMember is {min_member}: {first_error}"
        )
        for pod in members:
            _mark_unschedulable(api, pod, message)
        return []
    for pod, node in placed:
        _bind(api, pod, node)
    placed_names = {p["metadata"]["name"] for p, _ in placed}
    for pod in members:
        if pod["metadata"]["name"] not in placed_names:
            _mark_unschedulable(api, pod, first_error)
    return sorted(placed_names)


# -- kubelet, pod GC, Kueue ----------------------------------------------------------------------


def _node_ip(node: dict[str, Any]) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address["address"])
    return "10.0.0.1"


def _pod_ip(name: str) -> str:
    digest = hashlib.sha256(name.encode()).digest()
    return f"10.{100 + digest[0] % 100}.{digest[1]}.{1 + digest[2] % 254}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


SHARED_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")


def device_plugin_refusal(pod: dict[str, Any], node: dict[str, Any], strict_time_slicing: bool) -> str | None:
    """The NVIDIA device plugin's Allocate check (internal/rm/rm.go ValidateRequest): on a node whose
    GPUs are replicated, a container asking more than one replica is refused when
    failRequestsGreaterThanOne holds, which is the default for MPS (api/config/v1/config.go) and
    opt-in for time-slicing; GKE's time-sharing and MPS allow one GPU per container."""
    labels = node["metadata"].get("labels") or {}
    strategy = labels.get("nvidia.com/gpu.sharing-strategy", "none")
    gke_shared = "cloud.google.com/gke-gpu-sharing-strategy" in labels
    strict = gke_shared or strategy == "mps" or (strategy == "time-slicing" and strict_time_slicing)
    if not strict:
        return None
    for container in pod["spec"].get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        for name in SHARED_RESOURCES:
            asked = int(str(limits.get(name, 0)))
            if asked > 1:
                return (
                    "Allocate failed due to rpc error: code = Unknown desc = invalid request: "
                    f"maximum request size for shared resources is 1; found {asked}, which is unexpected"
                )
    return None


def run_kubelet(api: FakeApiServer, namespace: str | None = None) -> list[str]:
    """Every kubelet starts the pods bound to its node (if the node exists and is Ready):
    Pending -> Running, with container statuses, IPs and Ready conditions. A pod whose devices
    the device plugin refuses fails at admission (UnexpectedAdmissionError) instead.
    Returns the names of the pods started."""
    started = []
    for pod in api.objects_of(PODS, namespace):
        node_name = pod["spec"].get("nodeName")
        if not node_name or pod["status"].get("phase", "Pending") != "Pending":
            continue
        node = api.get(NODES, "", node_name)
        if node is None or node_ready(node) != "True":
            continue
        now = api.now()
        refusal = device_plugin_refusal(pod, node, node_name in api.strict_time_slicing_nodes)
        if refusal is not None:
            failed = _copy(pod)
            failed["status"] = {
                "phase": "Failed",
                "reason": "UnexpectedAdmissionError",
                "message": refusal,
                "startTime": now,
            }
            api.put(PODS, failed)
            continue
        updated = _copy(pod)
        updated["status"] = {
            "phase": "Running",
            "hostIP": _node_ip(node),
            "podIP": _pod_ip(pod["metadata"]["name"]),
            "startTime": now,
            "qosClass": "Guaranteed",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": f"{c.get('image', '')}@sha256:{_digest(c.get('image', ''))}",
                    "containerID": f"containerd://{_digest(pod['metadata']['uid'] + c['name'])}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in pod["spec"].get("containers") or []
            ],
        }
        api.put(PODS, updated)
        started.append(pod["metadata"]["name"])
    return started


def finish_pods(
    api: FakeApiServer, namespace: str, names: list[str] | None = None, *, exit_code: int = 0, reason: str | None = None
) -> list[str]:
    """Running containers exit with `exit_code`: the pods become Succeeded (0) or Failed."""
    finished = []
    for pod in api.objects_of(PODS, namespace):
        if pod["status"].get("phase") != "Running" or (names is not None and pod["metadata"]["name"] not in names):
            continue
        now = api.now()
        updated = _copy(pod)
        updated["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        for status in updated["status"].get("containerStatuses") or []:
            started = (status.get("state") or {}).get("running", {}).get("startedAt", now)
            terminated = {
                "exitCode": exit_code,
                "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": started,
                "finishedAt": now,
            }
            status.update(ready=False, started=False, state={"terminated": terminated})
        for cond in updated["status"].get("conditions") or []:
            if cond["type"] in ("Ready", "ContainersReady"):
                cond.update(status="False", reason="PodCompleted")
        api.put(PODS, updated)
        finished.append(pod["metadata"]["name"])
    return finished


def collect_orphaned_pods(api: FakeApiServer) -> list[str]:
    """PodGC: pods bound to a node that no longer exists are failed and deleted."""
    gone = []
    nodes = {n["metadata"]["name"] for n in api.objects_of(NODES)}
    for pod in api.objects_of(PODS):
        node = pod["spec"].get("nodeName")
        if not node or node in nodes:
            continue
        updated = _copy(pod)
        if updated["status"].get("phase") not in TERMINAL_PHASES:
            updated["status"]["phase"] = "Failed"
        updated["status"].setdefault("conditions", []).append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "DeletionByPodGC",
                "message": "PodGC: node no longer exists",
                "lastProbeTime": None,
                "lastTransitionTime": api.now(),
            }
        )
        api.put(PODS, updated)
        api.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        gone.append(pod["metadata"]["name"])
    return gone


KUEUE_MAX_POD_SETS = 8  # kueue.x-k8s.io Workload spec.podSets: +kubebuilder:validation:MaxItems=8


def admit_kueue(api: FakeApiServer, namespace: str, local_queues: set[str] | None = None) -> list[str]:
    """Kueue admits every queued (suspended, queue-labelled) Job and JobSet: it unsuspends them.

    What Kueue would refuse is refused: a queue name with no LocalQueue (when `local_queues` is
    given) stays suspended; a JobSet with more replicatedJobs than a Workload may have pod sets
    (one pod set per replicatedJob, at most 8) gets no Workload at all (recorded in
    `api.failed_creates`). Quota, flavors and preemption are not modelled."""
    admitted = []
    for key in (JOBS, JOBSETS):
        for obj in api.objects_of(key, namespace):
            queue = (obj["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL)
            if not obj["spec"].get("suspend") or not queue:
                continue
            if local_queues is not None and queue not in local_queues:
                continue
            pod_sets = len(obj["spec"].get("replicatedJobs") or []) if key == JOBSETS else 1
            if pod_sets > KUEUE_MAX_POD_SETS:
                name = obj["metadata"]["name"]
                api.failed_creates.append(
                    FailedCreate(
                        ("kueue.x-k8s.io", "v1beta1", "workloads"),
                        namespace,
                        f"jobset-{name}",
                        "kueue",
                        422,
                        f"spec.podSets: Too many: {pod_sets}: must have at most {KUEUE_MAX_POD_SETS} items",
                    )
                )
                continue
            updated = _copy(obj)
            updated["spec"]["suspend"] = False
            api.put(key, updated)
            admitted.append(obj["metadata"]["name"])
    return admitted


def set_pod_status(api: FakeApiServer, namespace: str, name: str, phase: str, **status: Any) -> dict[str, Any]:
    """What the kubelet does: move a pod to `phase`, with extra status fields (message, reason, …)."""
    pod = api.get(PODS, namespace, name)
    assert pod is not None, f"no pod {name}"
    pod = _copy(pod)
    pod["status"] = {"phase": phase, **status}
    return api.put(PODS, pod)


__all__ = [
    "Forbidden",
    "Invalid",
    "admit_kueue",
    "child_jobs",
    "collect_orphaned_pods",
    "finish_pods",
    "random_suffix",
    "run_job_controller",
    "run_kubelet",
    "schedule",
    "set_pod_status",
    "validate_jobset_and_children",
]
