"""The fake API server itself behaves like a real one: it refuses what a real cluster refuses (each
rule once with a breaking object, once with a valid one), schedules like kube-scheduler, runs pods
like the kubelet, and its nodes look like real ones of each provider."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from adapters.kubernetes.driver import KubernetesCluster
from adapters.kubernetes.manifests import KubeSettings, ManifestError, build_run_manifests
from controlplane.domain.model import CPU, GPU, MEM, SHARE
from controlplane.service.ports import PodOrder, RunOrder
from tests.kubernetes import nodes
from tests.kubernetes.admission import (
    Invalid,
    validate_coscheduling_pod_group,
    validate_job,
    validate_jobset,
    validate_namespace,
    validate_node,
    validate_pod,
    validate_volcano_pod_group,
)
from tests.kubernetes.conftest import NAMESPACE, SHARED_DEMAND, TOKEN, pools, small_order, training_order
from tests.kubernetes.controllers import validate_jobset_and_children
from tests.kubernetes.fake_apiserver import (
    JOBS,
    JOBSETS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    VOLCANO_PODGROUPS,
    FakeApiServer,
    admit_kueue,
    collect_orphaned_pods,
    finish_pods,
    matches_selector,
    run_job_controller,
    run_kubelet,
    schedule,
)
from tests.kubernetes.nodes import presets
from tests.kubernetes.quantity import parse_quantity
from tests.kubernetes.schemas import KUBERNETES_VERSION, _structural

# Raw `call_api` bypasses the generated methods, and with them the bearer-token auth setting.
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
NS = NAMESPACE
RUN = "run-0123456789abcdef0123"


def read_all(resp: Any) -> bytes:
    resp.read()
    data: bytes = resp.data
    return data


def pod_group(name: str, min_member: object = 2) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"minMember": min_member},
    }


def container(gpus: int = 0, cpu: str = "1", memory: str = "1Gi", resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        amounts[resource] = str(gpus)
    return {"name": "main", "image": "trainer:1", "resources": {"limits": dict(amounts), "requests": dict(amounts)}}


def pod_body(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "x"}},
        "spec": {"restartPolicy": "Never", "containers": [container()], **spec},
    }


def job_body(name: str = "j", completions: int | None = 2, **spec: Any) -> dict[str, Any]:
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "parallelism": 2,
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": {"app": "x"}},
            "spec": {"restartPolicy": "Never", "containers": [container()]},
        },
    }
    if completions is not None:
        job_spec["completions"] = completions
    job_spec.update(spec)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS}, "spec": job_spec}


def jobset_body(name: str = "js", rjobs: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    job_template = job_body()["spec"]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicatedJobs": rjobs or [{"name": "workers", "replicas": 2, "template": {"spec": job_template}}],
            **spec,
        },
    }


# -- HTTP behaviour ------------------------------------------------------------------------------


def test_create_conflict_not_found_and_invalid_have_status_bodies(
    fake_api: FakeApiServer, kube_config: client.Configuration
) -> None:
    api = client.ApiClient(kube_config)
    custom = client.CustomObjectsApi(api)
    args = ("scheduling.volcano.sh", "v1beta1", NAMESPACE, "podgroups")
    try:
        created: dict[str, Any] = custom.create_namespaced_custom_object(*args, pod_group("pg"))  # type: ignore[assignment]
        assert created["metadata"]["namespace"] == NAMESPACE
        assert created["metadata"]["resourceVersion"] == "1"

        with pytest.raises(ApiException) as conflict:
            custom.create_namespaced_custom_object(*args, pod_group("pg"))
        assert conflict.value.status == 409
        body = json.loads(conflict.value.body or "")
        assert (body["kind"], body["status"], body["reason"], body["code"]) == (
            "Status",
            "Failure",
            "AlreadyExists",
            409,
        )
        assert body["details"]["name"] == "pg"

        with pytest.raises(ApiException) as missing:
            custom.get_namespaced_custom_object(*args, "nope")
        assert missing.value.status == 404
        assert json.loads(missing.value.body or "")["reason"] == "NotFound"

        # Volcano's webhook: the queue must exist and be Open
        with pytest.raises(ApiException) as no_queue:
            custom.create_namespaced_custom_object(*args, pod_group("pgq") | {"spec": {"minMember": 1, "queue": "ml"}})
        assert no_queue.value.status == 400
        denied = json.loads(no_queue.value.body or "")["message"]
        assert 'denied the request: unable to find queue: queue.scheduling.volcano.sh "ml" not found' in denied
        fake_api.volcano_queues["ml"] = "Closed"
        with pytest.raises(ApiException, match="queue with state `Open`"):
            custom.create_namespaced_custom_object(*args, pod_group("pgq") | {"spec": {"minMember": 1, "queue": "ml"}})

        # Volcano's CRD allows minMember 0 (minimum: 0) but not a negative one
        custom.create_namespaced_custom_object(*args, pod_group("pg0", min_member=0))
        with pytest.raises(ApiException) as invalid:
            custom.create_namespaced_custom_object(*args, pod_group("pg2", min_member=-1))
        assert invalid.value.status == 422
        refused = json.loads(invalid.value.body or "")
        assert "spec.minMember: -1 is less than the minimum of 0" in refused["message"]
        assert refused["details"]["causes"]
        assert [name for _, _, name in fake_api.creations] == ["pg", "pg0"]
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_jobs_with_unknown_fields_are_refused(fake_api: FakeApiServer, kube_config: client.Configuration) -> None:
    api = client.ApiClient(kube_config)
    try:
        job = job_body(paralelism=2)  # misspelled: a strict server refuses it, a lax one drops it
        resp = api.call_api(
            "POST", f"{fake_api.url}/apis/batch/v1/namespaces/{NAMESPACE}/jobs", header_params=AUTH, body=job
        )
        data = read_all(resp)
        assert resp.status == 422
        assert "'paralelism' was unexpected" in json.loads(data)["message"]
        assert fake_api.creations == []
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_label_selectors() -> None:
    labels = {"app": "x", "tier": "gpu"}
    assert matches_selector(labels, "app=x,tier==gpu")
    assert matches_selector(labels, "app,!missing")
    assert matches_selector(labels, "tier in (gpu, cpu),app notin (y)")
    assert not matches_selector(labels, "app!=x")
    assert not matches_selector(labels, "tier notin (gpu)")
    assert not matches_selector(labels, "missing")
    assert matches_selector(labels, None)


def test_compacted_history_answers_410(fake_api: FakeApiServer, kube_config: client.Configuration) -> None:
    fake_api.put(VOLCANO_PODGROUPS, pod_group("a") | {"metadata": {"name": "a", "namespace": NAMESPACE}})
    fake_api.put(VOLCANO_PODGROUPS, pod_group("b") | {"metadata": {"name": "b", "namespace": NAMESPACE}})
    fake_api.compact()
    api = client.ApiClient(kube_config)
    try:
        url = f"{fake_api.url}/apis/scheduling.volcano.sh/v1beta1/namespaces/{NAMESPACE}/podgroups"
        resp = api.call_api("GET", f"{url}?watch=true&resourceVersion=1&timeoutSeconds=1", header_params=AUTH)
        [line] = read_all(resp).decode().splitlines()
        event = json.loads(line)
        assert event["type"] == "ERROR"
        assert event["object"]["code"] == 410
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_priority_admission_refuses_pods_of_unknown_classes(
    fake_api: FakeApiServer, kube_config: client.Configuration
) -> None:
    api = client.ApiClient(kube_config)
    # plain dicts as bodies, as the adapter sends them
    core: Any = client.CoreV1Api(api)
    scheduling: Any = client.SchedulingV1Api(api)
    try:
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(NS, pod_body("a", priorityClassName="gpufleet-high"))
        assert refused.value.status == 403
        assert "no PriorityClass with name gpufleet-high was found" in json.loads(refused.value.body or "")["message"]
        with pytest.raises(ApiException) as system:
            core.create_namespaced_pod(NS, pod_body("b", priorityClassName="system-node-critical"))
        assert system.value.status == 403
        with pytest.raises(ApiException) as too_high:
            scheduling.create_priority_class({"metadata": {"name": "x"}, "value": 2_000_000_000})
        assert too_high.value.status == 422

        scheduling.create_priority_class(
            {"metadata": {"name": "gpufleet-high"}, "value": 1000, "preemptionPolicy": "Never"}
        )
        core.create_namespaced_pod(NS, pod_body("a", priorityClassName="gpufleet-high"))
        stored = fake_api.get(PODS, NS, "a")
        assert stored is not None
        assert stored["spec"]["priority"] == 1000
        assert fake_api.get(PRIORITY_CLASSES, "", "gpufleet-high") is not None
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_put_patch_and_namespace_lifecycle(fake_api: FakeApiServer, kube_config: client.Configuration) -> None:
    api = client.ApiClient(kube_config)
    core: Any = client.CoreV1Api(api)
    try:
        fake_api.put(NODES, nodes.onprem_node("gpu-1"))
        patched = core.patch_node("gpu-1", {"spec": {"unschedulable": True}})  # kubectl cordon
        assert patched.spec.unschedulable is True
        with pytest.raises(ApiException) as invalid:
            core.patch_node("gpu-1", {"spec": {"taints": [{"key": "bad key", "effect": "NoSchedule"}]}})
        assert invalid.value.status == 422

        fake_api.require_namespaces = True
        with pytest.raises(ApiException) as missing:
            core.create_namespaced_pod("nowhere", pod_body("p") | {"metadata": {"name": "p"}})
        assert missing.value.status == 404
        assert 'namespaces "nowhere" not found' in json.loads(missing.value.body or "")["message"]
        core.create_namespace({"metadata": {"name": "nowhere"}})
        core.create_namespaced_pod("nowhere", pod_body("p") | {"metadata": {"name": "p"}})
        with pytest.raises(Invalid, match="RFC 1123 label"):
            validate_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a.b"}})
        assert fake_api.get(NAMESPACES, "", "nowhere") is not None
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_field_selectors(fake_api: FakeApiServer, kube_config: client.Configuration) -> None:
    fake_api.put(NODES, nodes.onprem_node("n1"))
    fake_api.put(NODES, nodes.onprem_node("n2", unschedulable=True))
    fake_api.put(PODS, pod_body("a", nodeName="n1"))
    fake_api.put(PODS, pod_body("b", nodeName="n2"))
    api = client.ApiClient(kube_config)
    core: Any = client.CoreV1Api(api)
    try:
        on_n1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")  # what a node agent asks
        assert [p.metadata.name for p in on_n1.items] == ["a"]
        assert [n.metadata.name for n in core.list_node(field_selector="spec.unschedulable!=true").items] == ["n1"]
        with pytest.raises(ApiException) as bad:
            core.list_namespaced_pod(NS, field_selector="spec.containers=main")
        assert bad.value.status == 400
        assert "field label not supported: spec.containers" in (bad.value.body or "")
    finally:
        api.close()  # type: ignore[no-untyped-call]


# -- validation rules ----------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def apply(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = body
        for part in parents:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return apply


POD_RULES: list[tuple[str, Mutation, str]] = [
    ("name-too-long", _set("metadata.name", "p" * 254), "must be no more than 253 characters"),
    ("name-uppercase", _set("metadata.name", "Pod"), "RFC 1123 subdomain"),
    ("label-value-too-long", _set("metadata.labels.app", "x" * 64), "must be no more than 63 characters"),
    ("label-value-syntax", _set("metadata.labels.app", "a b"), "a valid label must be an empty string"),
    ("label-key-syntax", _set("metadata.labels", {"bad key": "x"}), "name part must consist of"),
    ("label-key-prefix", _set("metadata.labels", {"Example.com/a": "x"}), "prefix part"),
    ("annotation-key", _set("metadata.annotations", {"a/b/c": "x"}), "a qualified name must consist of"),
    ("hostname", _set("spec.hostname", "h" * 64), "spec.hostname"),
    ("subdomain", _set("spec.subdomain", "a.b"), "spec.subdomain"),
    ("unknown-field", _set("spec.containers.0.resourcez", {}), "'resourcez' was unexpected"),
    ("no-image", _set("spec.containers.0.image", ""), "spec.containers[0].image: Required value"),
    ("gpu-fraction", _set("spec.containers.0.resources.limits", {"nvidia.com/gpu": "0.5"}), "must be an integer"),
    (
        "gpu-no-limit",
        _set("spec.containers.0.resources", {"requests": {"nvidia.com/gpu": "1"}}),
        "Limit must be set for non overcommitable resources",
    ),
    (
        "gpu-overcommit",
        _set("spec.containers.0.resources", {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}),
        "must be equal to nvidia.com/gpu limit of 2",
    ),
    (
        "cpu-request-above-limit",
        _set("spec.containers.0.resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
        "must be less than or equal to cpu limit of 1",
    ),
    ("bad-quantity", _set("spec.containers.0.resources.limits.memory", "1GB"), "quantities must match"),
    ("unknown-resource", _set("spec.containers.0.resources.limits", {"gpu": "1"}), "must be a standard resource"),
    (
        "toleration-exists-with-value",
        _set("spec.tolerations", [{"key": "k", "operator": "Exists", "value": "v"}]),
        "value must be empty",
    ),
    (
        "toleration-seconds-without-noexecute",
        _set("spec.tolerations", [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]),
        "effect must be 'NoExecute'",
    ),
    (
        "match-fields-two-values",
        _set(
            "spec.affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}
                        ]
                    }
                }
            },
        ),
        "must be only one value",
    ),
    (
        "match-expression-in-without-values",
        _set(
            "spec.affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]}]
                    }
                }
            },
        ),
        "must be specified when `operator` is 'In' or 'NotIn'",
    ),
    ("priority-class-name", _set("spec.priorityClassName", "High"), "spec.priorityClassName"),
    ("node-selector", _set("spec.nodeSelector", {"zone": "a b"}), "spec.nodeSelector"),
]


@pytest.mark.parametrize(("mutate", "message"), [(m, msg) for _, m, msg in POD_RULES], ids=[r[0] for r in POD_RULES])
def test_pod_rules(mutate: Mutation, message: str) -> None:
    validate_pod(pod_body())
    body = pod_body()
    mutate(body)
    with pytest.raises(Invalid) as refused:
        validate_pod(body)
    assert message in str(refused.value)


def test_pod_rules_accept_what_kubernetes_accepts() -> None:
    body = pod_body("p" * 253)  # a DNS subdomain, not a label
    body["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/mig-1g.10gb": 1, "cpu": "500m"}
    }  # request = limit
    body["spec"]["tolerations"] = [{"operator": "Exists"}]
    body["spec"]["hostname"] = "h" * 63
    validate_pod(body)


JOB_RULES: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    # the job-name labels the API server adds must be label values
    ("name-over-63", lambda: job_body("j" * 64, completions=1), "(label batch.kubernetes.io/job-name)"),
    (
        "indexed-without-completions",
        lambda: job_body(completions=None),
        "completions: Required value: when completion mode is Indexed",
    ),
    (
        "indexed-hostname",
        lambda: job_body("j" * 58, completions=100_000),
        "will not able to create pod with invalid DNS label: " + "j" * 58 + "-99999",
    ),
    (
        "indexed-parallelism",
        lambda: job_body(completions=5, parallelism=100_001),
        "must be less than or equal to 100000 when completion mode is Indexed",
    ),
    (
        "per-index-needs-indexed",
        lambda: job_body(completionMode="NonIndexed", backoffLimitPerIndex=1),
        "requires indexed completion mode",
    ),
    (
        "max-failed-needs-per-index",
        lambda: job_body(maxFailedIndexes=1),
        "Required value: when maxFailedIndexes is specified",
    ),
    (
        "max-failed-above-completions",
        lambda: job_body(backoffLimitPerIndex=1, maxFailedIndexes=3),
        "must be less than or equal to completions",
    ),
    (
        "high-completions-per-index",
        lambda: job_body(completions=100_001, backoffLimitPerIndex=1),
        "must be specified when completions is above 100000",
    ),
    (
        "restart-always",
        lambda: _with(job_body(), "spec.template.spec.restartPolicy", "Always"),
        'valid values: "OnFailure", "Never"',
    ),
    (
        "pod-failure-policy-needs-never",
        lambda: _with(
            _with(job_body(), "spec.template.spec.restartPolicy", "OnFailure"), "spec.podFailurePolicy", {"rules": []}
        ),
        'only "Never" is supported when podFailurePolicy is specified',
    ),
    (
        "template-label",
        lambda: _with(job_body(), "spec.template.metadata.labels", {"app": "-x"}),
        "spec.template.metadata.labels",
    ),
    (
        "template-resources",
        lambda: _with(job_body(), "spec.template.spec.containers.0.resources.limits.nvidia.com/gpu", "1.5"),
        "must be an integer",
    ),
]


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    if path.endswith("nvidia.com/gpu"):  # a resource name with dots
        parent = body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        parent["nvidia.com/gpu"] = value
        body["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = value
        return body
    _set(path, value)(body)
    return body


@pytest.mark.parametrize(("make", "message"), [(m, msg) for _, m, msg in JOB_RULES], ids=[r[0] for r in JOB_RULES])
def test_job_rules(make: Callable[[], dict[str, Any]], message: str) -> None:
    with pytest.raises(Invalid) as refused:
        validate_job(make())
    assert message in str(refused.value)


def test_job_rules_accept_what_kubernetes_accepts() -> None:
    validate_job(job_body("j" * 63, completionMode="NonIndexed", completions=1))  # 63: still a label value
    # Kubernetes refuses neither parallelism above completions nor (without backoffLimitPerIndex)
    # completions above 100000: the controller just never runs more pods than indexes remain.
    validate_job(job_body(completions=2, parallelism=8))
    validate_job(job_body(completions=200_000, parallelism=10))
    validate_job(job_body(completionMode="NonIndexed", completions=None))
    validate_job(job_body(backoffLimitPerIndex=1, maxFailedIndexes=2))


def test_job_name_plus_index_must_stay_a_hostname() -> None:
    validate_job(job_body("j" * 61, completions=1))  # hostname j..j-0 is 63
    with pytest.raises(Invalid, match="invalid DNS label"):
        validate_job(job_body("j" * 61, completions=11))  # j..j-10 is 64


# -- custom resources against the real CRDs ------------------------------------------------------


def test_volcano_pod_group_against_its_crd() -> None:
    validate_volcano_pod_group(
        pod_group("pg", 0)
        | {"spec": {"minMember": 3, "queue": "default", "minResources": {"nvidia.com/gpu": 8, "cpu": "16"}}}
    )
    for spec, message in (
        ({"minMember": -1}, "less than the minimum of 0"),
        ({"minMember": 1, "queue": "Bad_Queue"}, "does not match"),
        ({"minMember": 1, "minResources": {"cpu": "1x"}}, "does not match"),
        ({"minMember": 1, "minMembers": 2}, "'minMembers' was unexpected"),
        ({"minMember": "2"}, "is not of type 'integer'"),
    ):
        with pytest.raises(Invalid, match=r"PodGroup\.scheduling\.volcano\.sh") as refused:
            validate_volcano_pod_group(pod_group("pg") | {"spec": spec})
        assert message in str(refused.value)


def test_structural_schema_extensions() -> None:
    schema = {
        "type": "object",
        "properties": {
            "port": {"x-kubernetes-int-or-string": True},
            "free": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"a": {"type": "string"}},
            },
            "strict": {"type": "object", "properties": {"a": {"type": "string", "nullable": True}}},
            "embedded": {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "properties": {"spec": {"type": "object"}},
            },
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "count": {"type": "integer", "format": "int32"},
        },
    }
    validator = jsonschema.Draft7Validator(_structural(schema))
    good = {
        "port": "http",
        "free": {"anything": 1},
        "strict": {"a": None},
        "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}},
        "tags": ["a", "b"],
        "count": 2**31 - 1,
    }
    assert list(validator.iter_errors(good)) == []
    bads: list[dict[str, Any]] = [
        {"port": 1.5},
        {"strict": {"b": 1}},
        {"embedded": {"status": {}}},
        {"tags": ["a", "a"]},
        {"count": 2**31},
    ]
    for bad in bads:
        assert list(validator.iter_errors(bad)), bad


def test_coscheduling_pod_group_against_its_crd() -> None:
    base = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "pg"}}
    validate_coscheduling_pod_group(base | {"spec": {"minMember": 2, "scheduleTimeoutSeconds": 60}})
    with pytest.raises(Invalid, match="less than the minimum of 1"):
        validate_coscheduling_pod_group(base | {"spec": {"minMember": 0}})
    with pytest.raises(Invalid, match="'queue' was unexpected"):
        validate_coscheduling_pod_group(base | {"spec": {"minMember": 1, "queue": "q"}})
    with pytest.raises(Invalid, match=r"expected scheduling\.x-k8s\.io/v1alpha1 PodGroup"):
        validate_coscheduling_pod_group(base | {"apiVersion": "scheduling.x-k8s.io/v1beta1", "spec": {"minMember": 1}})


def test_jobset_against_its_crd_and_webhook() -> None:
    validate_jobset(jobset_body())
    two = jobset_body()["spec"]["replicatedJobs"] * 2
    cases: list[tuple[dict[str, Any], str]] = [
        (jobset_body(rjobs=two), "Duplicate value: {'name': 'workers'}"),
        (jobset_body(rjobs=[{"name": "w", "replicaz": 1, "template": {}}]), "'replicaz' was unexpected"),
        (
            jobset_body(rjobs=[{"name": "w", "template": {"spec": {"completions": "2", "template": {}}}}]),
            "is not of type 'integer'",
        ),
        # the webhook: generated Job names `<js>-<rjob>-<i>` are DNS-1035 labels of at most 63
        (
            jobset_body("j" * 50, rjobs=[_rjob("workers-long", 1)]),
            "job names generated for this JobSet will exceed 63 characters",
        ),
        # ... and so are the pod names with their 5-character random suffix
        (
            jobset_body("j" * 30, rjobs=[_rjob("w" * 24, 2)]),
            "pod names generated for this JobSet will exceed 63 characters",
        ),
        (jobset_body("1js"), "start with a letter"),
        (
            jobset_body(rjobs=[_rjob("a", 1) | {"dependsOn": [{"name": "b", "status": "Ready"}]}]),
            "DependsOn can't be set for the first ReplicatedJob",
        ),
        (
            jobset_body(successPolicy={"operator": "All", "targetReplicatedJobs": ["nope"]}),
            "invalid replicatedJob name 'nope'",
        ),
        (
            jobset_body(
                rjobs=[_rjob("a", 1), _rjob("b", 1) | {"dependsOn": [{"name": "a", "status": "Ready"}]}],
                startupPolicy={"startupPolicyOrder": "InOrder"},
            ),
            "StartupPolicy and DependsOn APIs are mutually exclusive",
        ),
    ]
    for body, message in cases:
        with pytest.raises(Invalid) as refused:
            validate_jobset(body)
        assert message in str(refused.value), body
    validate_jobset(jobset_body("j" * 30, rjobs=[_rjob("w" * 22, 2)]))  # 30+1+22+"-0-1-abcde" = 63


def _rjob(name: str, completions: int) -> dict[str, Any]:
    spec = job_body(completions=completions)["spec"]
    return {"name": name, "replicas": 1, "template": {"spec": spec}}


def test_jobset_children_are_validated_as_jobs() -> None:
    body = jobset_body()
    body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    validate_jobset(body)  # the API server and the webhook accept it ...
    with pytest.raises(Invalid, match="restartPolicy"):
        validate_jobset_and_children(body)  # ... but the JobSet controller's Jobs are refused


def _long_jobset_order() -> RunOrder:
    worker = {CPU: 1_000, MEM: 1_024, GPU: 1}
    return RunOrder(
        run_id="run-0123456789abcdef0123456789",  # 30 characters, JOBSET_NAME_MAX
        workload_id="wl-1",
        workload_name="long",
        team="t",
        queue="q",
        cluster="east",
        epoch=1,
        attempt=1,
        priority_class="",
        min_available=2,
        pods=tuple(PodOrder("w" * 22, i, "node-a", "h100", worker) for i in range(2)),
        duration_seconds=None,
    )


def test_product_jobset_names_at_their_maximum_pass_the_webhook() -> None:
    run = build_run_manifests(_long_jobset_order(), pools(), KubeSettings(gang="kueue", use_jobset=True))
    [jobset] = run.workloads
    validate_jobset_and_children(json.loads(json.dumps(jobset.body)))


# -- the scheduler, the controllers and the kubelet ----------------------------------------------


def _node_names(api: FakeApiServer) -> list[str]:
    return [n["metadata"]["name"] for n in api.objects_of(NODES)]


def _pending_message(api: FakeApiServer, name: str) -> str:
    pod = api.get(PODS, NS, name)
    assert pod is not None
    assert not pod["spec"].get("nodeName"), f"{name} was bound to {pod['spec'].get('nodeName')}"
    [cond] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    return str(cond["message"])


def _pin(node: str) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_pods_bind_only_where_a_real_scheduler_would_put_them() -> None:
    api = FakeApiServer()
    eks = nodes.eks_managed_node(0, nodegroup="h100")
    gke = nodes.gke_node(0, pool="h100")
    for node in (eks, gke):
        api.put(NODES, node)
    eks_name, gke_name = eks["metadata"]["name"], gke["metadata"]["name"]
    cases = {
        "missing-node": pod_body(containers=[container(1)], affinity=_pin("node-that-does-not-exist")),
        "mig-on-whole-gpus": pod_body(
            containers=[container(1, resource="nvidia.com/mig-1g.10gb")], affinity=_pin(eks_name)
        ),
        "gke-taint": pod_body(containers=[container(1)], affinity=_pin(gke_name)),
        "gke-tolerated": pod_body(containers=[container(1)], affinity=_pin(gke_name), tolerations=GPU_TOLERATION),
        "all-the-cpus": pod_body(
            containers=[container(0, cpu="192")], affinity=_pin(eks_name)
        ),  # capacity, not allocatable
        "selector": pod_body(nodeSelector={"eks.amazonaws.com/nodegroup": "h100"}),
    }
    for name, body in cases.items():
        api.put(PODS, body | {"metadata": {"name": name, "namespace": NS}})
    bound = schedule(api)
    assert sorted(bound) == ["gke-tolerated", "selector"]
    assert api.get(PODS, NS, "gke-tolerated")["spec"]["nodeName"] == gke_name  # type: ignore[index]
    assert api.get(PODS, NS, "selector")["spec"]["nodeName"] == eks_name  # type: ignore[index]
    # TaintToleration runs before NodeAffinity: the GKE node fails on its taint first
    assert _pending_message(api, "missing-node") == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: present}."
    )
    assert "1 Insufficient nvidia.com/mig-1g.10gb" in _pending_message(api, "mig-on-whole-gpus")
    assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in _pending_message(api, "gke-taint")
    assert "1 Insufficient cpu" in _pending_message(api, "all-the-cpus")


def test_cordoned_not_ready_and_full_nodes_take_no_pods() -> None:
    api = FakeApiServer()
    api.put(NODES, nodes.onprem_node("cordoned", unschedulable=True))
    api.put(NODES, nodes.onprem_node("not-ready", ready=False))
    api.put(NODES, nodes.onprem_node("ok"))
    for i in range(3):
        api.put(PODS, pod_body(f"p{i}", containers=[container(3)]))
    assert schedule(api) == ["p0", "p1"]  # 8 GPUs: 3 + 3, the third pod would need 9
    message = _pending_message(api, "p2")
    assert message == (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, "
        "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 1 node(s) were unschedulable."
    )
    assert run_kubelet(api) == ["p0", "p1"]
    assert finish_pods(api, NS, ["p0"]) == ["p0"]
    assert schedule(api) == ["p2"]  # a finished pod holds nothing


def test_shared_and_partitioned_gpus_are_asked_for_by_the_advertised_name() -> None:
    api = FakeApiServer()
    renamed = nodes.GpuSetup("A10", 1, "time-slicing", replicas=4, rename_by_default=True)
    api.put(NODES, nodes.onprem_node("renamed", instance_type="VM.GPU.A10.1", gpu=renamed))
    api.put(NODES, nodes.onprem_node("mig", gpu=nodes.GpuSetup("A100-80GB", 8, "mig", mig_layout={"3g.40gb": 2})))
    api.put(PODS, pod_body("whole", containers=[container(1)], nodeSelector={"kubernetes.io/hostname": "renamed"}))
    for i in range(5):
        api.put(PODS, pod_body(f"share-{i}", containers=[container(1, cpu="100m", resource="nvidia.com/gpu.shared")]))
    for i in range(17):
        api.put(PODS, pod_body(f"mig-{i}", containers=[container(1, cpu="100m", resource="nvidia.com/mig-3g.40gb")]))
    bound = schedule(api)
    assert [n for n in bound if n.startswith("share")] == [f"share-{i}" for i in range(4)]  # 4 replicas of one GPU
    assert len([n for n in bound if n.startswith("mig")]) == 16  # 8 GPUs x 2 instances
    assert _pending_message(api, "share-4") == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.shared."
    assert "Insufficient nvidia.com/gpu" in _pending_message(api, "whole")  # renamed: no nvidia.com/gpu left


def test_device_plugin_refuses_more_than_one_replica_where_configured() -> None:
    api = FakeApiServer()
    mps = nodes.GpuSetup("A10", 1, "mps", replicas=4)
    api.put(NODES, nodes.onprem_node("mps", instance_type="VM.GPU.A10.1", gpu=mps))
    api.put(
        NODES,
        nodes.gke_node(0, pool="l4", machine_type="g2-standard-8", gpu_sharing="time-sharing", max_shared_clients=4),
    )
    ts = nodes.GpuSetup("A10", 1, "time-slicing", replicas=4)
    for name in ("ts-lax", "ts-strict"):
        api.put(NODES, nodes.onprem_node(name, instance_type="VM.GPU.A10.1", gpu=ts))
    api.strict_time_slicing_nodes.add("ts-strict")
    gke = next(n for n in _node_names(api) if n.startswith("gke-"))
    asks = {
        "mps-1": ("mps", 1),
        "mps-2": ("mps", 2),
        "gke-2": (gke, 2),
        "lax-2": ("ts-lax", 2),
        "strict-2": ("ts-strict", 2),
    }
    for name, (node, gpus) in asks.items():
        api.put(
            PODS,
            pod_body(name, containers=[container(gpus, cpu="100m")], affinity=_pin(node), tolerations=GPU_TOLERATION),
        )
    schedule(api)
    assert sorted(run_kubelet(api)) == ["lax-2", "mps-1"]
    for name in ("mps-2", "gke-2", "strict-2"):
        pod = api.get(PODS, NS, name)
        assert pod is not None
        assert (pod["status"]["phase"], pod["status"]["reason"]) == ("Failed", "UnexpectedAdmissionError")
        assert "maximum request size for shared resources is 1; found 2" in pod["status"]["message"]


def test_node_selector_and_affinity_operators() -> None:
    api = FakeApiServer()
    api.put(NODES, nodes.onprem_node("a", labels={"zone": "a", "tier": "1"}))
    api.put(NODES, nodes.onprem_node("b", labels={"zone": "b"}))

    def expressions(*exprs: dict[str, Any]) -> dict[str, Any]:
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]
                }
            }
        }

    want = {
        "in": (expressions({"key": "zone", "operator": "In", "values": ["b"]}), "b"),
        "notin": (expressions({"key": "zone", "operator": "NotIn", "values": ["a"]}), "b"),
        "exists": (expressions({"key": "tier", "operator": "Exists"}), "a"),
        "absent": (expressions({"key": "tier", "operator": "DoesNotExist"}), "b"),
        "gt": (expressions({"key": "tier", "operator": "Gt", "values": ["0"]}), "a"),
    }
    for name, (affinity, _) in want.items():
        api.put(PODS, pod_body(name, affinity=affinity))
    schedule(api)
    assert {name: api.get(PODS, NS, name)["spec"]["nodeName"] for name in want} == {n: w[1] for n, w in want.items()}  # type: ignore[index]


def test_gang_is_bound_all_or_nothing() -> None:
    api = FakeApiServer()
    api.put(NODES, nodes.onprem_node("n1"))
    api.put(VOLCANO_PODGROUPS, pod_group("gang", 3) | {"metadata": {"name": "gang", "namespace": NS}})
    for i in range(3):
        body = pod_body(f"g{i}", containers=[container(4)], schedulerName="volcano")
        body["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "gang"}
        api.put(PODS, body)
    assert schedule(api) == []  # two fit on 8 GPUs, the gang needs three
    assert "2/3 pods of gang gang fit, minMember is 3" in _pending_message(api, "g0")
    api.put(NODES, nodes.onprem_node("n2"))
    assert sorted(schedule(api)) == ["g0", "g1", "g2"]
    # a pod for a scheduler nobody runs waits untouched
    api.put(PODS, pod_body("other", schedulerName="kai-scheduler"))
    schedule(api)
    assert "conditions" not in api.get(PODS, NS, "other")["status"]  # type: ignore[index]


def test_jobset_controller_job_controller_and_kubelet() -> None:
    api = FakeApiServer(generated_pod_names=True)
    api.put(NODES, nodes.onprem_node("n1"))
    body = jobset_body("train")
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    body["spec"]["suspend"] = True
    api.put(JOBSETS, body)
    run_job_controller(api, NS)
    jobs = api.objects_of(JOBS, NS)
    assert [j["metadata"]["name"] for j in jobs] == ["train-workers-0", "train-workers-1"]
    assert all(j["spec"]["suspend"] for j in jobs)
    assert api.objects_of(PODS, NS) == []
    labels = jobs[1]["metadata"]["labels"]
    assert (labels["jobset.sigs.k8s.io/jobset-name"], labels["jobset.sigs.k8s.io/job-index"]) == ("train", "1")
    assert labels["jobset.sigs.k8s.io/job-global-index"] == "1"
    assert jobs[0]["spec"]["template"]["spec"]["subdomain"] == "train"

    assert admit_kueue(api, NS) == ["train"]
    pods = run_job_controller(api, NS)
    names = sorted(p["metadata"]["name"] for p in pods)
    assert [n[: -len("-xxxxx")] for n in names] == [
        "train-workers-0-0",
        "train-workers-0-1",
        "train-workers-1-0",
        "train-workers-1-1",
    ]
    pod = api.get(PODS, NS, names[1])
    assert pod is not None
    assert pod["spec"]["hostname"] == "train-workers-0-1"
    assert pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert pod["metadata"]["labels"]["job-name"] == "train-workers-0"
    assert pod["spec"]["nodeName"] == "n1"
    assert sorted(run_kubelet(api, NS)) == names
    running = api.get(PODS, NS, names[0])
    assert running is not None
    assert running["status"]["phase"] == "Running"
    assert running["status"]["podIP"]
    finish_pods(api, NS)
    run_job_controller(api, NS)
    done = api.get(JOBS, NS, "train-workers-0")
    assert done is not None
    assert [c["type"] for c in done["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert run_job_controller(api, NS) == []  # idempotent: finished Jobs make no new pods


def test_kueue_admits_only_what_it_can_make_a_workload_of() -> None:
    api = FakeApiServer()
    queued = {"kueue.x-k8s.io/queue-name": "team-a"}
    nine = [_rjob(f"w{i}", 1) for i in range(9)]
    for name, rjobs in (("eight", nine[:8]), ("nine", nine)):
        body = jobset_body(name, rjobs=rjobs, suspend=True)
        body["metadata"]["labels"] = dict(queued)
        api.put(JOBSETS, body)
    other = jobset_body("elsewhere", suspend=True)
    other["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-b"}
    api.put(JOBSETS, other)
    assert admit_kueue(api, NS, local_queues={"team-a"}) == ["eight"]
    [failed] = api.failed_creates
    assert (failed.controller, failed.name) == ("kueue", "jobset-nine")
    assert "must have at most 8 items" in failed.message


def _gang_on_nine_nodes() -> RunOrder:
    worker = {CPU: 1_000, MEM: 1_024, GPU: 8}
    order = _long_jobset_order()
    pods = tuple(PodOrder("worker", i, f"node-{i}", "h100", worker) for i in range(9))
    return RunOrder(**{**order.__dict__, "run_id": "run-0123456789abcdef0123-1", "pods": pods, "min_available": 9})


def test_product_kueue_jobset_gang_on_nine_nodes_is_admitted() -> None:
    api = FakeApiServer()
    run = build_run_manifests(_gang_on_nine_nodes(), pools(), KubeSettings(gang="kueue", use_jobset=True))
    [jobset] = run.workloads
    api.put(JOBSETS, jobset.body)
    assert admit_kueue(api, "gpufleet") == [jobset.name]


def test_refused_pods_are_failed_creates_and_vanished_nodes_lose_their_pods() -> None:
    api = FakeApiServer()
    api.put(NODES, nodes.onprem_node("n1"))
    job = job_body(completions=1)
    job["spec"]["template"]["spec"]["priorityClassName"] = "batch"
    api.put(JOBS, job)
    assert run_job_controller(api, NS) == []
    [failed] = api.failed_creates
    assert (failed.code, failed.controller) == (403, "job/j")
    assert "no PriorityClass with name batch was found" in failed.message

    api.put(PODS, pod_body("bound"))
    schedule(api)
    api.remove(NODES, "", "n1")
    assert collect_orphaned_pods(api) == ["bound"]
    assert api.get(PODS, NS, "bound") is None


def test_failed_pod_fails_the_job_and_its_other_pods_go() -> None:
    api = FakeApiServer()
    api.put(NODES, nodes.onprem_node("n1"))
    api.put(JOBS, job_body(completions=2))
    run_job_controller(api, NS)
    run_kubelet(api, NS)
    finish_pods(api, NS, ["j-0"], exit_code=1)
    run_job_controller(api, NS)
    job = api.get(JOBS, NS, "j")
    assert job is not None
    assert [c["reason"] for c in job["status"]["conditions"]] == ["BackoffLimitExceeded", "BackoffLimitExceeded"]
    assert [p["metadata"]["name"] for p in api.objects_of(PODS, NS)] == ["j-0"]


# -- gpufleet's own objects on real-looking nodes ---------------------------------------------------

POOL_TAINTS = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "team", "value": "ml", "effect": "NoExecute"},
]


def _conftest_cluster(api: FakeApiServer) -> None:
    """Nodes matching tests/kubernetes/conftest.pools(), built as real ones look."""
    for name in ("node-a", "node-b", "node-c"):
        api.put(NODES, nodes.onprem_node(name, taints=POOL_TAINTS))
    mig = nodes.GpuSetup("A100-80GB", 8, "mig", mig_layout={"1g.10gb": 7})
    sku = [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]
    api.put(NODES, nodes.onprem_node("a100-mig-node", instance_type="BM.GPU.A100-v2.8", gpu=mig, taints=sku))
    ts = nodes.GpuSetup("L4", 1, "time-slicing", replicas=4)
    api.put(NODES, nodes.onprem_node("l4-ts-node", instance_type="g2-standard-8", gpu=ts))
    mps = nodes.GpuSetup("L4", 1, "mps", replicas=4)
    dedicated = [{"key": "dedicated", "effect": "NoSchedule"}]
    api.put(NODES, nodes.onprem_node("l4-mps-node", instance_type="g2-standard-8", gpu=mps, taints=dedicated))
    api.put(
        PRIORITY_CLASSES,
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000},
    )


async def _run_on_cluster(
    api: FakeApiServer, kube_config: client.Configuration, order: RunOrder, gang: str
) -> list[dict[str, Any]]:
    driver = KubernetesCluster("east", kube_config, KubeSettings(namespace=NS, gang=gang), pools())  # type: ignore[arg-type]
    try:
        await driver.apply(order)
    finally:
        driver.close()
    run_job_controller(api, NS)
    run_kubelet(api, NS)
    return [p for p in api.objects_of(PODS, NS) if p["metadata"]["labels"].get("gpufleet.io/run") == order.run_id]


async def test_product_gangs_run_on_matching_nodes(fake_api: FakeApiServer, kube_config: client.Configuration) -> None:
    _conftest_cluster(fake_api)
    volcano = await _run_on_cluster(fake_api, kube_config, training_order(), "volcano")
    assert {p["metadata"]["name"]: p["spec"]["nodeName"] for p in volcano} == {
        f"{RUN}-launcher-0-0": "node-c",
        f"{RUN}-worker-0-0": "node-a",
        f"{RUN}-worker-0-1": "node-a",
        f"{RUN}-worker-1-0": "node-b",
        f"{RUN}-worker-1-1": "node-b",
    }
    mig = await _run_on_cluster(
        fake_api,
        kube_config,
        small_order("run-mig", "a100-mig", {CPU: 1_000, MEM: 4_096, "mig:1g.10gb": 1}, 2),
        "coscheduling",
    )
    shared = await _run_on_cluster(fake_api, kube_config, small_order("run-ts", "l4-ts", SHARED_DEMAND), "none")
    assert {p["status"]["phase"] for p in volcano + mig + shared} == {"Running"}, fake_api.failed_creates


async def test_product_mps_shares_are_one_per_container(
    fake_api: FakeApiServer, kube_config: client.Configuration
) -> None:
    """The device plugin's MPS rule (internal/rm/rm.go: failRequestsGreaterThanOne is always on for MPS):
    a 2-share pod would fail the kubelet's Allocate, so the product refuses it before it reaches the
    cluster; a 1-share pod runs on the MPS node."""
    _conftest_cluster(fake_api)
    planned = dict(pools())
    planned["l4-mps"] = dataclasses.replace(planned["l4-mps"], max_shares_per_pod=1)  # as the inventory plans MPS
    driver = KubernetesCluster("east", kube_config, KubeSettings(namespace=NS), planned)
    try:
        with pytest.raises(ManifestError, match="share"):
            await driver.apply(small_order("run-mps2", "l4-mps", SHARED_DEMAND))
        await driver.apply(small_order("run-mps1", "l4-mps", {**SHARED_DEMAND, SHARE: 1}))
    finally:
        driver.close()
    run_job_controller(fake_api, NS)
    run_kubelet(fake_api, NS)
    [pod] = [p for p in fake_api.objects_of(PODS, NS) if p["metadata"]["labels"].get("gpufleet.io/run") == "run-mps1"]
    assert pod["status"]["phase"] == "Running", pod["status"]
    assert not [
        p for p in fake_api.objects_of(PODS, NS) if p["metadata"]["labels"].get("gpufleet.io/run") == "run-mps2"
    ]


# -- nodes as real clusters report them ----------------------------------------------------------

FLAVOURS = nodes.EXAMPLES


@pytest.mark.parametrize("build", FLAVOURS.values(), ids=FLAVOURS.keys())
def test_nodes_pass_the_real_schema_and_reserve_like_a_kubelet(build: Callable[[], dict[str, Any]]) -> None:
    node = build()
    validate_node(node)  # kubernetes-validate strict for KUBERNETES_VERSION, plus label syntax
    status = node["status"]
    for resource in ("cpu", "memory"):
        assert parse_quantity(status["allocatable"][resource]) < parse_quantity(status["capacity"][resource])
    api = FakeApiServer()
    assert api.put(NODES, node)["metadata"]["name"] in _node_names(api)
    assert api.kubernetes_version == KUBERNETES_VERSION


PRESETS: list[Callable[[str], dict[str, Any]]] = [
    presets.eks_p5,
    presets.karpenter_l40s,
    presets.aks_h100_timeslice,
    presets.gke_h100_mig,
    presets.gke_l4_time_sharing,
    presets.oke_h100_mps,
    presets.onprem_a100_mixed,
    presets.onprem_a100_single,
    presets.cpu_node,
    presets.onprem_h100,
]


@pytest.mark.parametrize("build", PRESETS, ids=[b.__name__ for b in PRESETS])
def test_named_presets_pass_the_real_schema(build: Callable[[str], dict[str, Any]]) -> None:
    validate_node(build("node-1"))


def test_provider_labels_and_advertised_resources() -> None:
    eks = FLAVOURS["eks-managed"]()
    assert eks["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] == "gpu-h100"
    assert eks["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert eks["metadata"]["name"].endswith(".ec2.internal")
    assert eks["spec"]["providerID"].startswith("aws:///us-east-1a/i-")
    assert FLAVOURS["eks-karpenter"]()["metadata"]["labels"]["karpenter.sh/capacity-type"] == "spot"
    aks_spot = FLAVOURS["aks-spot"]()
    assert (
        aks_spot["metadata"]["labels"]["kubernetes.azure.com/agentpool"]
        == "t4spot"
        == aks_spot["metadata"]["labels"]["agentpool"]
    )
    assert {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"} in aks_spot[
        "spec"
    ]["taints"]
    gke = FLAVOURS["gke"]()
    assert gke["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert "nvidia.com/gpu.product" not in gke["metadata"]["labels"]  # no GFD on GKE's managed stack
    gke_mig = FLAVOURS["gke-mig"]()
    assert gke_mig["status"]["allocatable"]["nvidia.com/gpu"] == "56"  # 8 GPUs x 7 partitions, as nvidia.com/gpu
    assert gke_mig["metadata"]["labels"]["cloud.google.com/gke-gpu-partition-size"] == "1g.10gb"
    assert FLAVOURS["gke-time-sharing"]()["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    oke = FLAVOURS["oke"]()
    assert oke["metadata"]["annotations"]["oci.oraclecloud.com/node-pool-id"].startswith("ocid1.nodepool.")
    assert "oci.oraclecloud.com/node-pool-id" not in oke["metadata"]["labels"]
    assert oke["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "BM.GPU.H100.8"

    mixed = FLAVOURS["onprem-mig-mixed"]()
    labels = mixed["metadata"]["labels"]
    assert mixed["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "56"
    assert "nvidia.com/gpu" not in mixed["status"]["allocatable"]
    assert (labels["nvidia.com/mig.strategy"], labels["nvidia.com/mig-1g.10gb.count"]) == ("mixed", "56")
    assert labels["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.replicas"] == "0"
    single = FLAVOURS["onprem-mig-single"]()
    assert single["status"]["allocatable"]["nvidia.com/gpu"] == "16"
    assert single["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
    shared = FLAVOURS["onprem-time-slicing"]()["metadata"]["labels"]
    assert (
        shared["nvidia.com/gpu.product"],
        shared["nvidia.com/gpu.replicas"],
        shared["nvidia.com/gpu.sharing-strategy"],
    ) == (
        "NVIDIA-A10-SHARED",
        "4",
        "time-slicing",
    )
    renamed = FLAVOURS["onprem-renamed"]()
    assert renamed["status"]["allocatable"]["nvidia.com/gpu.shared"] == "4"
    assert renamed["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A10"  # renamed: no -SHARED
    assert FLAVOURS["onprem-mps"]()["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "mps"


async def test_product_inventory_reads_every_providers_pool_key(
    fake_api: FakeApiServer, kube_config: client.Configuration
) -> None:
    from adapters.kubernetes.cluster_reads import list_nodes  # noqa: PLC0415 - the inventory helper may reshape it

    expected = {
        "eks-managed": "gpu-h100",
        "eks-karpenter": "gpu",
        "aks": "gpuh100",
        "gke": "a3",
        "oke": "",  # named after the annotation's OCID or the pool's name: any, but one
    }
    names = {}
    for flavour in expected:
        node = FLAVOURS[flavour]()
        fake_api.put(NODES, node)
        names[node["metadata"]["name"]] = flavour
    api = client.ApiClient(kube_config)
    try:
        listed = await list_nodes(api)
    finally:
        api.close()  # type: ignore[no-untyped-call]
    pools_read = {names[n.name]: n.pool for n in listed}
    assert pools_read.pop("oke")
    assert pools_read == {k: v for k, v in expected.items() if k != "oke"}
