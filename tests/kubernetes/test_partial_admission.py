"""A gang admitted partially (pod-set minimums, issue 12) renders exactly its admitted pods: the
core places a launcher (1 of 1) and workers (at least 2 of 4) on a cluster with three free nodes,
and every gang mode's objects carry the launcher and three workers, nothing for the fourth; every
object checked against the real schemas (kubernetes-validate, strict, and the vendored CRDs)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from adapters.kubernetes.manifest_model import ANNOTATION_INDICES, ENV_WORLD_SIZE, JOB, JOBSET, GangMode
from adapters.kubernetes.manifests import KubeSettings, RunManifests, build_run_manifests
from controlplane.core.capacity import FleetCapacity
from controlplane.domain.model import Cluster, Node, PodSet, Toleration, Workload, WorkloadKind
from controlplane.service.ports import PodOrder, RunOrder
from tests.kubernetes.conftest import pools, training_order
from tests.kubernetes.test_gangs import validate

H100 = pools()["h100"]


def _admitted_order() -> RunOrder:
    """What the core admits on four H100 nodes with one of them taken, as a run order."""
    nodes = [Node(f"node-{i}", H100.cluster_id, H100.id, f"node-{i}") for i in range(4)]
    fleet = FleetCapacity([Cluster(H100.cluster_id, "east", "sim", pools=(H100,))], nodes)
    fleet.free["node-0"]["gpu"] = 0  # an occupant holds every GPU of node-0
    workload = Workload(
        id="wl-42",
        team_id="t",
        queue_id="q",
        name="mpi",
        priority_class="high",
        priority=0,
        kind=WorkloadKind.TRAINING,
        pod_sets=(
            PodSet("launcher", 1, cpu_millis=2_000, memory_mib=8_192),
            PodSet("workers", 4, gpus=8, cpu_millis=16_000, memory_mib=200_000, min_replicas=2),
        ),
        min_available=3,
        tolerations=(Toleration("team", value="ml"),),  # the pool's own taint
    )
    [placement, *_] = fleet.fits(workload).placements
    pods = tuple(PodOrder(a.pod_set, a.index, a.node_id, H100.name, dict(a.demand)) for a in placement.assignments)
    return replace(training_order(), pods=pods, min_available=workload.min_available)


def _pods_per_pod_set(run: RunManifests) -> Counter[str]:
    """Pods the objects ask for, per pod set: completions (= parallelism) of every Job, inside a
    JobSet or not, times its replicas; indices per pod set must be 0..n-1 without repeats."""
    counted: Counter[str] = Counter()
    indices: dict[str, list[int]] = {}
    for manifest in run.workloads:
        if manifest.resource == JOBSET:
            jobs = [(r["replicas"], r["template"]) for r in manifest.body["spec"]["replicatedJobs"]]
        else:
            assert manifest.resource == JOB
            jobs = [(1, manifest.body)]
        for replicas, job in jobs:
            spec = job["spec"]
            assert spec["parallelism"] == spec["completions"]
            template = spec["template"]
            pod_set = template["metadata"]["labels"]["gpufleet.io/pod-set"]
            counted[pod_set] += replicas * spec["completions"]
            indices.setdefault(pod_set, []).extend(
                int(i) for i in template["metadata"]["annotations"][ANNOTATION_INDICES].split(",")
            )
            env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
            assert env[ENV_WORLD_SIZE] == "4"  # the admitted pods, not the 5 asked for
    assert {name: sorted(found) for name, found in indices.items()} == {
        name: list(range(count)) for name, count in counted.items()
    }
    return counted


def test_the_core_admits_the_launcher_and_three_workers() -> None:
    order = _admitted_order()
    assert Counter(p.pod_set for p in order.pods) == {"launcher": 1, "workers": 3}
    assert "node-0" not in {p.node for p in order.pods if p.pod_set == "workers"}


@pytest.mark.parametrize("gang", ["volcano", "coscheduling", "kueue", "none"])
@pytest.mark.parametrize("use_jobset", [False, True])
def test_every_gang_mode_renders_exactly_the_admitted_pods(gang: GangMode, use_jobset: bool) -> None:
    run = build_run_manifests(_admitted_order(), pools(), KubeSettings(gang=gang, use_jobset=use_jobset))
    validate(run)
    assert _pods_per_pod_set(run) == {"launcher": 1, "workers": 3}
    if run.gang is not None:
        # The gang object asks for the gang's minimum (launcher + 2 workers), never more pods than exist.
        assert run.gang.body["spec"]["minMember"] == 3
    if gang == "kueue":
        [jobset] = run.workloads
        # gpufleet decided the counts: Kueue gets the admitted pods as they are, with no minimum of
        # its own to reduce them further (no partial-admission annotation on any Job).
        for rjob in jobset.body["spec"]["replicatedJobs"]:
            assert "kueue.x-k8s.io/job-min-parallelism" not in (rjob["template"].get("metadata") or {}).get(
                "annotations", {}
            )
