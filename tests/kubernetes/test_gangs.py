"""Gangs a real cluster admits whole: Kueue pod-set limits, JobSet name limits with the pod
suffix, priority classes, runtime bounds and workload labels; every object checked against the
real schemas (kubernetes-validate, strict, and the vendored CRDs)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.kubernetes.manifest_model import JOBSET, PRIORITY_CLASS, GangMode, jobset_pod_name_length
from adapters.kubernetes.manifests import KubeSettings, ManifestError, RunManifests, build_run_manifests
from controlplane.domain.model import CPU, GPU, MEM
from controlplane.service.cluster_specs import KubernetesSettingsSpec
from controlplane.service.ports import PodOrder, RunOrder
from tests.kubernetes.conftest import pools, training_order
from tests.kubernetes.fake_apiserver import _validate_jobset
from tests.kubernetes.schemas import validate_object

RUN = "run-0123456789abcdef0123-2"  # what gpufleet's run ids look like: attempt included
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
WORKER = {CPU: 16_000, MEM: 200_000, GPU: 8}


def gang(pods: list[PodOrder], **changes: Any) -> RunOrder:
    base = training_order(run_id=RUN)
    return replace(base, pods=tuple(pods), min_available=len(pods), **changes)


def one_per_node(pod_set: str, count: int, prefix: str = "n") -> list[PodOrder]:
    return [PodOrder(pod_set, i, f"{prefix}{i:02d}", "h100", WORKER) for i in range(count)]


def templates(run: RunManifests) -> list[dict[str, Any]]:
    """Every pod template the run's objects carry."""
    out: list[dict[str, Any]] = []
    for manifest in run.workloads:
        if manifest.resource == JOBSET:
            out += [r["template"]["spec"]["template"] for r in manifest.body["spec"]["replicatedJobs"]]
        else:
            out.append(manifest.body["spec"]["template"])
    return out


def validate(run: RunManifests) -> None:
    for manifest in run.all() + ((run.priority_class,) if run.priority_class else ()):
        validate_object(manifest.body)
        if manifest.resource == JOBSET:
            _validate_jobset(manifest.body)


def required_nodes(template: dict[str, Any]) -> list[str]:
    terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    values: list[str] = []
    for term in terms["nodeSelectorTerms"]:  # ORed; one node per term, as the API server requires
        [field] = term["matchFields"]
        assert (field["key"], field["operator"]) == ("metadata.name", "In")
        [node] = field["values"]
        values.append(node)
    return values


# -- Kueue: one Workload, within its pod-set limit ----------------------------------------------


def test_kueue_keeps_one_replicated_job_per_node_group_while_within_the_limit() -> None:
    run = build_run_manifests(gang(one_per_node("worker", 8)), pools(), KubeSettings(gang="kueue"))
    [jobset] = run.workloads
    rjobs = jobset.body["spec"]["replicatedJobs"]
    assert len(rjobs) == 8  # Kueue's default limit, exactly
    assert [required_nodes(r["template"]["spec"]["template"]) for r in rjobs] == [[f"n{i:02d}"] for i in range(8)]
    validate(run)


def test_kueue_folds_one_pod_per_node_sets_into_one_replicated_job_beyond_the_limit() -> None:
    pods = [*one_per_node("worker", 12), PodOrder("launcher", 0, "n00", "h100", {CPU: 2000, MEM: 8192})]
    run = build_run_manifests(gang(pods), pools(), KubeSettings(gang="kueue"))
    [jobset] = run.workloads
    rjobs = {r["name"]: r for r in jobset.body["spec"]["replicatedJobs"]}
    assert sorted(rjobs) == ["launcher-0", "worker"]  # 2 Kueue pod sets instead of 13
    worker = rjobs["worker"]["template"]["spec"]
    assert worker["completions"] == worker["parallelism"] == 12
    pod = worker["template"]
    assert required_nodes(pod) == [f"n{i:02d}" for i in range(12)]
    # n pods, n nodes, at most one of the set per node: exactly one on each
    [anti] = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == {"gpufleet.io/run": RUN, "gpufleet.io/pod-set": "worker"}
    assert pod["metadata"]["labels"]["gpufleet.io/pod-set"] == "worker"
    assert pod["metadata"]["annotations"]["gpufleet.io/pod-indices"] == ",".join(str(i) for i in range(12))
    # the launcher keeps its exact node
    assert required_nodes(rjobs["launcher-0"]["template"]["spec"]["template"]) == ["n00"]
    validate(run)


def test_a_higher_kueue_limit_keeps_exact_pinning() -> None:
    run = build_run_manifests(
        gang(one_per_node("worker", 12)), pools(), KubeSettings(gang="kueue", kueue_max_pod_sets=18)
    )
    [jobset] = run.workloads
    assert len(jobset.body["spec"]["replicatedJobs"]) == 12


def test_kueue_folds_an_evenly_packed_set_with_a_hard_topology_spread() -> None:
    # 18 workers, two per node on 9 nodes: 9 groups > 8, folded into one replicatedJob of 18 pods
    pods = [PodOrder("worker", i, f"n{i // 2:02d}", "h100", {CPU: 8_000, MEM: 100_000, GPU: 4}) for i in range(18)]
    run = build_run_manifests(gang(pods), pools(), KubeSettings(gang="kueue"))
    [jobset] = run.workloads
    [rjob] = jobset.body["spec"]["replicatedJobs"]
    assert rjob["template"]["spec"]["completions"] == 18
    pod = rjob["template"]["spec"]["template"]
    assert required_nodes(pod) == [f"n{i:02d}" for i in range(9)]
    assert "podAntiAffinity" not in pod["spec"]["affinity"]
    [spread] = pod["spec"]["topologySpreadConstraints"]
    # counts per allowed node at most 1 apart: 18 pods on 9 nodes, 2 on each
    assert spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["nodeAffinityPolicy"] == "Honor"  # only the set's own nodes count
    assert spread["labelSelector"]["matchLabels"] == {"gpufleet.io/run": RUN, "gpufleet.io/pod-set": "worker"}
    assert pod["metadata"]["annotations"]["gpufleet.io/pod-indices"] == ",".join(str(i) for i in range(18))
    validate(run)


def test_kueue_refuses_an_unevenly_packed_placement_it_cannot_express() -> None:
    # 3 pods on the first node, 1 on each of 8 others: 9 groups > 8, and no spread pins 3-1-1-...
    pods = [
        PodOrder("worker", i, f"n{max(0, i - 2):02d}", "h100", {CPU: 8_000, MEM: 100_000, GPU: 2}) for i in range(11)
    ]
    with pytest.raises(ManifestError, match=r"needs 9 Kueue pod sets .* at most 8 .* worker put different numbers"):
        build_run_manifests(gang(pods), pools(), KubeSettings(gang="kueue"))


def test_kueue_refuses_more_pod_sets_than_it_admits() -> None:
    pods = [PodOrder(f"set{i}", 0, f"n{i:02d}", "h100", WORKER) for i in range(9)]
    with pytest.raises(ManifestError, match="9 pod sets; Kueue admits at most 8"):
        build_run_manifests(gang(pods), pools(), KubeSettings(gang="kueue"))


def test_other_gang_modes_keep_one_job_per_node_group() -> None:
    """Volcano and coscheduling gang through their PodGroup; no pod-set limit applies."""
    for mode in ("volcano", "coscheduling"):
        run = build_run_manifests(gang(one_per_node("worker", 12)), pools(), KubeSettings(gang=mode))
        assert len(run.workloads) == 12
        assert run.gang is not None
        assert run.gang.body["spec"]["minMember"] == 12
        validate(run)


# -- names within the JobSet webhook's limit, generated pod suffix included -----------------------


@pytest.mark.parametrize("run_id", [RUN, "run-0123456789abcdef0123-1234567"])
@pytest.mark.parametrize("completions", [1, 9, 10, 1000])
def test_jobset_pod_names_fit_63_characters_with_the_random_suffix(run_id: str, completions: int) -> None:
    long_set = "a" * 63
    pods = [PodOrder(long_set, i, "n00", "h100", {CPU: 100, MEM: 100}) for i in range(completions)]
    pods.append(PodOrder("w", 0, "n01", "h100", WORKER))
    order = replace(training_order(run_id=run_id), pods=tuple(pods), min_available=len(pods))
    run = build_run_manifests(order, pools(), KubeSettings(gang="none", use_jobset=True))
    [jobset] = run.workloads
    name = jobset.name
    assert DNS_1035.match(name)
    for rjob in jobset.body["spec"]["replicatedJobs"]:
        count = rjob["template"]["spec"]["completions"]
        # JobSet's webhook: <jobset>-<rjob>-<jobIndex>-<podIndex> plus "-abcde" is a DNS-1035 label <= 63
        longest = f"{name}-{rjob['name']}-{rjob['replicas'] - 1}-{count - 1}-abcde"
        assert len(longest) == jobset_pod_name_length(name, rjob["name"], count) <= 63
        assert DNS_1035.match(longest)
        assert len(f"{name}-{rjob['name']}-0") <= 63  # the child Job's name
    validate(run)


def test_pod_names_start_with_the_full_run_id() -> None:
    """Job and JobSet pods are named `<run id>-...`: the attempt is in every pod name."""
    for settings in (KubeSettings(), KubeSettings(gang="kueue")):
        run = build_run_manifests(gang(one_per_node("worker", 2)), pools(), settings)
        for manifest in run.workloads:
            assert manifest.name.startswith(f"{RUN}-") or manifest.name == RUN


# -- priority classes -----------------------------------------------------------------------------


def test_an_unmapped_class_becomes_a_gpufleet_owned_priority_class() -> None:
    order = gang(one_per_node("worker", 2), priority_class="batch", priority=100)
    for settings in (KubeSettings(gang="volcano"), KubeSettings(gang="kueue"), KubeSettings()):
        run = build_run_manifests(order, pools(), settings)
        assert all(t["spec"]["priorityClassName"] == "gpufleet-batch" for t in templates(run))
        assert run.priority_class is not None
        assert run.priority_class.resource == PRIORITY_CLASS
        body = run.priority_class.body
        assert body["metadata"]["name"] == "gpufleet-batch"
        assert body["metadata"]["labels"] == {
            "app.kubernetes.io/managed-by": "gpufleet",
            "gpufleet.io/priority-class": "batch",
        }
        assert body["value"] == 100
        assert body["globalDefault"] is False
        assert body["preemptionPolicy"] == "Never"  # gpufleet's core decides preemption
        validate(run)
    volcano = build_run_manifests(order, pools(), KubeSettings(gang="volcano"))
    assert volcano.gang is not None
    assert volcano.gang.body["spec"]["priorityClassName"] == "gpufleet-batch"


def test_a_mapped_class_names_the_clusters_own_and_creates_nothing() -> None:
    order = gang(one_per_node("worker", 2), priority_class="production", priority=1000)
    settings = KubeSettings(gang="volcano", priority_class_map={"production": "high-priority"})
    run = build_run_manifests(order, pools(), settings)
    assert run.priority_class is None
    assert {t["spec"]["priorityClassName"] for t in templates(run)} == {"high-priority"}
    assert run.gang is not None
    assert run.gang.body["spec"]["priorityClassName"] == "high-priority"


def test_no_class_no_priority_class_name() -> None:
    run = build_run_manifests(gang(one_per_node("worker", 1), priority_class=""), pools(), KubeSettings())
    assert run.priority_class is None
    assert all("priorityClassName" not in t["spec"] for t in templates(run))


def test_a_priority_class_map_value_must_be_a_priority_class_name() -> None:
    with pytest.raises(ManifestError, match="not a PriorityClass name"):
        KubeSettings(priority_class_map={"batch": "Not_A_Name"})


# -- runtime bound and labels ---------------------------------------------------------------------


@pytest.mark.parametrize("settings", [KubeSettings(), KubeSettings(gang="kueue"), KubeSettings(use_jobset=True)])
def test_max_runtime_bounds_every_pod_and_duration_does_not(settings: KubeSettings) -> None:
    """Counted by the kubelet from the pod's start on its node, not from the Job's (which would
    include the time the gang waited to be scheduled)."""
    bounded = build_run_manifests(
        gang(one_per_node("worker", 2), max_runtime_seconds=7199.5, duration_seconds=60.0), pools(), settings
    )
    unbounded = build_run_manifests(gang(one_per_node("worker", 2), duration_seconds=60.0), pools(), settings)
    for run, want in ((bounded, 7200), (unbounded, None)):
        assert [t["spec"].get("activeDeadlineSeconds") for t in templates(run)] == [want] * len(templates(run))
        for manifest in run.workloads:
            jobs = (
                [r["template"]["spec"] for r in manifest.body["spec"]["replicatedJobs"]]
                if manifest.resource == JOBSET
                else [manifest.body["spec"]]
            )
            assert all("activeDeadlineSeconds" not in job for job in jobs)
        validate(run)


@pytest.mark.parametrize("mode", ["none", "volcano", "coscheduling", "kueue"])
def test_workload_labels_reach_every_object_and_pod_and_gpufleets_stay(mode: GangMode) -> None:
    labels = {"project": "llama", "example.com/cost-center": "4711"}
    run = build_run_manifests(gang(one_per_node("worker", 2), labels=labels), pools(), KubeSettings(gang=mode))
    objects = [m.body for m in run.all()]
    for manifest in run.workloads:
        if manifest.resource == JOBSET:
            objects += [r["template"] for r in manifest.body["spec"]["replicatedJobs"]]  # the child Jobs
    for body in objects + templates(run):
        got = body["metadata"]["labels"]
        assert got.items() >= labels.items()
        assert got["gpufleet.io/run"] == RUN
        assert got["app.kubernetes.io/managed-by"] == "gpufleet"
    for template in templates(run):
        assert template["metadata"]["labels"]["gpufleet.io/run"] == RUN  # full run id, attempt included
    validate(run)


@pytest.mark.parametrize(
    "labels",
    [
        {"gpufleet.io/run": "run-x"},
        {"app.kubernetes.io/managed-by": "me"},
        {"kueue.x-k8s.io/queue-name": "other"},
        {"batch.kubernetes.io/job-name": "x"},
        {"ok": "not a value"},
        {"Bad Key": "x"},
    ],
)
def test_reserved_or_invalid_workload_labels_are_refused(labels: dict[str, str]) -> None:
    with pytest.raises(ManifestError):
        build_run_manifests(gang(one_per_node("worker", 1), labels=labels), pools(), KubeSettings())


def test_cluster_settings_from_the_api_become_driver_settings() -> None:
    """What `POST /v1/clusters` stores (`kubernetes`) is what the composition root builds KubeSettings from."""
    spec = KubernetesSettingsSpec(gang="kueue", priority_class_map={"production": "prod-high"}, kueue_max_pod_sets=18)
    known = {f.name for f in dataclasses.fields(KubeSettings)}  # as the composition root filters them
    settings = KubeSettings(**{k: v for k, v in spec.model_dump().items() if k in known})
    assert settings.jobset
    assert settings.priority_class_name("production") == "prod-high"
    assert settings.priority_class_name("batch") == "gpufleet-batch"
    for bad in ({"priority_class_map": {"batch": "Not_A_Name"}}, {"kueue_max_pod_sets": 19}):
        with pytest.raises(ValidationError):
            KubernetesSettingsSpec.model_validate(bad)
