"""Manifests built from run orders, checked field by field (pure, no server)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

from adapters.kubernetes.manifest_model import (
    COSCHEDULING_POD_GROUP,
    JOB,
    JOBSET,
    VOLCANO_POD_GROUP,
    dns_label,
    job_name,
)
from adapters.kubernetes.manifests import KubeSettings, ManifestError, build_run_manifests
from adapters.kubernetes.placement import placement_groups
from controlplane.domain.model import CPU, MEM
from tests.kubernetes.conftest import SHARED_DEMAND, pools, small_order, training_order
from tests.kubernetes.fake_apiserver import Invalid, _validate_coscheduling_pod_group, _validate_job, _validate_jobset
from tests.kubernetes.fake_apiserver import _validate_volcano_pod_group as validate_volcano

DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RUN = "run-0123456789abcdef0123"


def pod_spec(job_body: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job_body["spec"]["template"]["spec"]
    return spec


def node_of(job_body: dict[str, Any]) -> str:
    terms = pod_spec(job_body)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    [term] = terms["nodeSelectorTerms"]
    [req] = term["matchFields"]
    assert req["key"] == "metadata.name"
    assert req["operator"] == "In"
    [node] = req["values"]
    return str(node)


def test_one_indexed_job_per_pod_set_and_node_pins_every_pod() -> None:
    run = build_run_manifests(training_order(), pools(), KubeSettings())

    assert run.gang is None
    assert [m.resource for m in run.workloads] == [JOB, JOB, JOB]
    by_name = {m.name: m.body for m in run.workloads}
    assert set(by_name) == {f"{RUN}-launcher-0", f"{RUN}-worker-0", f"{RUN}-worker-1"}
    plan = {
        name: (node_of(b), b["spec"]["template"]["metadata"]["annotations"]["gpufleet.io/pod-indices"])
        for name, b in by_name.items()
    }
    assert plan == {
        f"{RUN}-launcher-0": ("node-c", "0"),
        f"{RUN}-worker-0": ("node-a", "0,2"),
        f"{RUN}-worker-1": ("node-b", "1,3"),
    }
    worker = by_name[f"{RUN}-worker-0"]
    assert worker["apiVersion"] == "batch/v1"
    assert worker["kind"] == "Job"
    assert worker["metadata"]["namespace"] == "gpufleet"
    spec = worker["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] == 0
    assert "suspend" not in spec
    assert "activeDeadlineSeconds" not in spec
    assert "activeDeadlineSeconds" not in spec["template"]["spec"]
    ps = pod_spec(worker)
    assert ps["restartPolicy"] == "Never"
    assert ps["priorityClassName"] == "gpufleet-high"
    assert "schedulerName" not in ps
    assert ps["automountServiceAccountToken"] is False


def test_labels_annotations_and_container() -> None:
    order = training_order(
        container={
            "image": "trainer:1.2",
            "command": ["torchrun"],
            "args": ["--nnodes=2", "train.py"],
            "env": {"B": 2, "A": "x", "FLAG": True},
            "sim": {"fail": True},  # simulator hint: must not leak into the pod
        },
        duration=50.0,  # the simulator's, never a bound on a real cluster
    )
    order = replace(order, max_runtime_seconds=3600.2)
    run = build_run_manifests(order, pools(), KubeSettings())
    body = next(m.body for m in run.workloads if m.name.endswith("worker-1"))
    owner = {
        "app.kubernetes.io/managed-by": "gpufleet",
        "gpufleet.io/run": RUN,
        "gpufleet.io/workload": "wl-42",
        "gpufleet.io/epoch": "3",
        "gpufleet.io/attempt": "1",
    }
    assert body["metadata"]["labels"] == owner
    assert body["metadata"]["annotations"] == {
        "gpufleet.io/object-count": "3",
        "gpufleet.io/workload-name": "llm-pretrain",
    }
    template_meta = body["spec"]["template"]["metadata"]
    assert template_meta["labels"] == owner | {"gpufleet.io/pod-set": "worker"}
    assert pod_spec(body)["activeDeadlineSeconds"] == 3601
    [container] = pod_spec(body)["containers"]
    assert container["name"] == "main"
    assert container["image"] == "trainer:1.2"
    assert container["command"] == ["torchrun"]
    assert container["args"] == ["--nnodes=2", "train.py"]
    assert container["env"] == [
        {"name": "A", "value": "x"},
        {"name": "B", "value": "2"},
        {"name": "FLAG", "value": "true"},
        {"name": "GPUFLEET_RUN_ID", "value": RUN},
        {"name": "GPUFLEET_POD_SET", "value": "worker"},
        {"name": "GPUFLEET_POD_INDICES", "value": "1,3"},
        {"name": "GPUFLEET_WORLD_SIZE", "value": "5"},
    ]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False}
    assert "sim" not in json.dumps(body)
    resources = {"cpu": "16000m", "memory": "200000Mi", "nvidia.com/gpu": "4"}
    assert container["resources"] == {"limits": resources, "requests": resources}


def test_defaults_when_container_is_empty() -> None:
    order = training_order(container={})
    run = build_run_manifests(order, pools(), KubeSettings(default_image="pause:3.9"))
    [container] = pod_spec(run.workloads[0].body)["containers"]
    assert container["image"] == "pause:3.9"
    assert "command" not in container
    assert "args" not in container


@pytest.mark.parametrize(
    "container",
    [
        {"image": ""},
        {"image": 7},
        {"command": "python train.py"},
        {"args": [1, 2]},
        {"env": {"GPUFLEET_RUN_ID": "spoof"}},
        {"env": {"bad name": "x"}},
        {"env": [{"name": "A", "value": "1", "valueFrom": {}}]},
        {"env": {"A": {"nested": 1}}},
        {"workingDir": "relative"},
    ],
)
def test_invalid_container_documents_are_refused(container: dict[str, Any]) -> None:
    with pytest.raises(ManifestError):
        build_run_manifests(training_order(container=container), pools(), KubeSettings())


def test_tolerations_cover_the_pool_taints_and_gpu_taint_keys() -> None:
    run = build_run_manifests(training_order(), pools(), KubeSettings())
    assert pod_spec(run.workloads[0].body)["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "sku", "operator": "Exists"},
        {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
    ]
    # A pool taint without a value is tolerated with Exists; a pod without GPUs gets no GPU keys.
    cpu_only = small_order("run-cpu", "l4-mps", {CPU: 500, MEM: 512})
    [job] = build_run_manifests(cpu_only, pools(), KubeSettings()).workloads
    assert pod_spec(job.body)["tolerations"] == [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod_spec(job.body)["containers"][0]["resources"]["limits"] == {"cpu": "500m", "memory": "512Mi"}


def test_mig_resource_names_per_strategy() -> None:
    order = small_order("run-mig", "a100-mig", {CPU: 4_000, MEM: 16_384, "mig:3g.40gb": 1})
    [mixed] = build_run_manifests(order, pools(), KubeSettings()).workloads
    limits = pod_spec(mixed.body)["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "4000m", "memory": "16384Mi", "nvidia.com/mig-3g.40gb": "1"}
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in pod_spec(mixed.body)[
        "tolerations"
    ]
    [single] = build_run_manifests(order, pools(), KubeSettings(mig_strategy="single")).workloads
    assert pod_spec(single.body)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/mig-3g.40gb" not in pod_spec(single.body)["containers"][0]["resources"]["limits"]


def test_shared_gpus_count_replicas_of_the_advertised_resource() -> None:
    ts = small_order("run-ts", "l4-ts", SHARED_DEMAND)
    [job] = build_run_manifests(ts, pools(), KubeSettings()).workloads
    assert pod_spec(job.body)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    mps = small_order("run-mps", "l4-mps", SHARED_DEMAND)
    renamed = KubeSettings(mps_resource="nvidia.com/gpu.shared")
    [job] = build_run_manifests(mps, pools(), renamed).workloads
    limits = pod_spec(job.body)["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "1000m", "memory": "4096Mi", "nvidia.com/gpu.shared": "2"}
    # A share demand on a pool that does not share GPUs is a core bug, not something to send.
    with pytest.raises(ManifestError, match="no shared GPUs"):
        build_run_manifests(small_order("run-x", "h100", SHARED_DEMAND), pools(), KubeSettings())


def test_unknown_demand_key_and_unknown_pool_are_refused() -> None:
    with pytest.raises(ManifestError, match="unknown demand key"):
        build_run_manifests(small_order("run-x", "h100", {"tpu": 1}), pools(), KubeSettings())
    with pytest.raises(ManifestError, match="pool nope"):
        build_run_manifests(small_order("run-x", "nope", {CPU: 1}), pools(), KubeSettings())


def test_volcano_pod_group_and_pod_annotation() -> None:
    run = build_run_manifests(training_order(), pools(), KubeSettings(gang="volcano", volcano_queue="gpu"))
    assert run.gang is not None
    assert run.gang.resource == VOLCANO_POD_GROUP
    assert run.all()[0] is run.gang  # created before the pods that reference it
    assert run.gang.body == {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": RUN,
            "namespace": "gpufleet",
            "labels": run.workloads[0].body["metadata"]["labels"],
            "annotations": {"gpufleet.io/object-count": "4", "gpufleet.io/workload-name": "llm-pretrain"},
        },
        "spec": {"minMember": 5, "queue": "gpu", "priorityClassName": "gpufleet-high"},
    }
    validate_volcano(run.gang.body)
    for job in run.workloads:
        template = job.body["spec"]["template"]
        assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == RUN
        assert template["spec"]["schedulerName"] == "volcano"
        assert "scheduling.x-k8s.io/pod-group" not in template["metadata"]["labels"]


def test_coscheduling_pod_group_and_pod_label() -> None:
    settings = KubeSettings(gang="coscheduling", coscheduling_timeout_seconds=120)
    run = build_run_manifests(training_order(), pools(), settings)
    assert run.gang is not None
    assert run.gang.resource == COSCHEDULING_POD_GROUP
    assert run.gang.body["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert run.gang.body["spec"] == {"minMember": 5, "scheduleTimeoutSeconds": 120}
    _validate_coscheduling_pod_group(run.gang.body)
    for job in run.workloads:
        template = job.body["spec"]["template"]
        assert template["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == RUN
        assert "scheduling.k8s.io/group-name" not in template["metadata"]["annotations"]
        assert template["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    custom = KubeSettings(gang="coscheduling", scheduler_name="default-scheduler")
    assert pod_spec(build_run_manifests(training_order(), pools(), custom).workloads[0].body)["schedulerName"] == (
        "default-scheduler"
    )


def test_kueue_always_gets_one_jobset_never_separate_jobs() -> None:
    """Kueue admits one Workload per Job: separate Jobs would be admitted one by one."""
    for use_jobset in (False, True):
        settings = KubeSettings(gang="kueue", kueue_queue="team-a", use_jobset=use_jobset)
        run = build_run_manifests(training_order(), pools(), settings)
        assert run.gang is None
        [jobset] = run.workloads
        assert jobset.resource == JOBSET
        assert settings.owned_resources() == (JOBSET,)
        assert jobset.body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert jobset.body["spec"]["suspend"] is True
        for rjob in jobset.body["spec"]["replicatedJobs"]:
            # the queue label belongs on the JobSet only; pods are Kueue's business through it
            assert "kueue.x-k8s.io/queue-name" not in rjob["template"]["spec"]["template"]["metadata"]["labels"]
            assert "schedulerName" not in rjob["template"]["spec"]["template"]["spec"]


def test_jobset_holds_one_replicated_job_per_placement_group() -> None:
    settings = KubeSettings(gang="kueue", use_jobset=True)
    run = build_run_manifests(replace(training_order(duration=5), max_runtime_seconds=60), pools(), settings)
    [jobset] = run.workloads
    assert jobset.resource == JOBSET
    assert jobset.name == RUN
    body = jobset.body
    assert body["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert body["kind"] == "JobSet"
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpufleet"
    assert body["metadata"]["annotations"]["gpufleet.io/object-count"] == "1"
    spec = body["spec"]
    assert spec["suspend"] is True
    assert spec["failurePolicy"] == {"maxRestarts": 0}
    assert [r["name"] for r in spec["replicatedJobs"]] == ["launcher-0", "worker-0", "worker-1"]
    for rjob in spec["replicatedJobs"]:
        assert rjob["replicas"] == 1
        job_spec = rjob["template"]["spec"]
        assert job_spec["completionMode"] == "Indexed"
        assert "suspend" not in job_spec  # Kueue suspends the JobSet, never its child Jobs
        assert job_spec["template"]["spec"]["activeDeadlineSeconds"] == 60
    workers = spec["replicatedJobs"][2]["template"]
    assert node_of(workers) == "node-b"
    assert workers["spec"]["completions"] == 2
    _validate_jobset(body)


@pytest.mark.parametrize("gang", ["volcano", "coscheduling", "kueue", "none"])
@pytest.mark.parametrize("use_jobset", [False, True])
def test_every_gang_mode_passes_the_api_server_validation(gang: str, use_jobset: bool) -> None:
    settings = KubeSettings(gang=gang, use_jobset=use_jobset)  # type: ignore[arg-type]
    run = build_run_manifests(training_order(duration=10), pools(), settings)
    for manifest in run.all():
        validators = {
            JOB: _validate_job,
            JOBSET: _validate_jobset,
            VOLCANO_POD_GROUP: validate_volcano,
            COSCHEDULING_POD_GROUP: _validate_coscheduling_pod_group,
        }
        validators[manifest.resource](json.loads(json.dumps(manifest.body)))


def test_names_are_deterministic_valid_and_unique() -> None:
    a = build_run_manifests(training_order(), pools(), KubeSettings(gang="volcano"))
    b = build_run_manifests(training_order(), pools(), KubeSettings(gang="volcano"))
    assert a == b
    long_set = "p" * 63
    name = job_name("run-" + "f" * 36, long_set, 12)
    assert len(name) <= 52
    assert DNS.match(name)
    assert name == job_name("run-" + "f" * 36, long_set, 12)
    assert name != job_name("run-" + "f" * 36, long_set, 13)
    for text in ["Run_ABC", "run..x", "-x-", "a" * 100, "ünïcode"]:
        label = dns_label(text, 40)
        assert DNS.match(label), text
        assert len(label) <= 40
    assert dns_label("Run_ABC") != dns_label("run-abc")  # a changed name carries a hash


def test_placement_groups_are_ordered_and_refuse_duplicates() -> None:
    groups = placement_groups(training_order().pods)
    assert [(g.pod_set, g.ordinal, g.node, g.indices) for g in groups] == [
        ("launcher", 0, "node-c", (0,)),
        ("worker", 0, "node-a", (0, 2)),
        ("worker", 1, "node-b", (1, 3)),
    ]
    order = training_order()
    with pytest.raises(ManifestError, match="twice"):
        placement_groups((*order.pods, order.pods[0]))
    with pytest.raises(ManifestError, match="no pods"):
        placement_groups(())


def test_bad_settings_and_label_values_are_refused() -> None:
    with pytest.raises(ManifestError):
        KubeSettings(gang="slurm")  # type: ignore[arg-type]
    with pytest.raises(ManifestError):
        KubeSettings(namespace="Not_A_Namespace")
    bad_run = training_order(run_id="run with spaces")
    with pytest.raises(ManifestError, match="label value"):
        build_run_manifests(bad_run, pools(), KubeSettings())


def test_fake_server_validation_catches_a_misspelled_field() -> None:
    [job] = build_run_manifests(training_order(), pools(), KubeSettings()).workloads[:1]
    body = json.loads(json.dumps(job.body))
    body["spec"]["completionmode"] = body["spec"].pop("completionMode")
    with pytest.raises(Invalid, match="completionmode"):
        _validate_job(body)
    body = json.loads(json.dumps(job.body))
    body["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "7"
    with pytest.raises(Invalid, match=r"must be equal to nvidia\.com/gpu limit"):
        _validate_job(body)
