"""The driver creates gpufleet's PriorityClasses once, before the pods that name them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from kubernetes import client

from adapters.kubernetes.driver import KubernetesCluster
from adapters.kubernetes.manifests import KubeSettings, ManifestError
from tests.kubernetes.conftest import pools, training_order
from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.kinds import PRIORITY_CLASSES

RUNS = [f"run-0123456789abcdef{i:04d}-1" for i in range(3)]


@pytest.fixture
def drivers(kube_config: client.Configuration) -> Iterator[list[KubernetesCluster]]:
    made: list[KubernetesCluster] = []
    yield made
    for driver in made:
        driver.close()


def driver(made: list[KubernetesCluster], cfg: client.Configuration, **settings: object) -> KubernetesCluster:
    made.append(KubernetesCluster("east", cfg, KubeSettings(gang="kueue", **settings), pools()))  # type: ignore[arg-type]
    return made[-1]


async def test_created_once_before_the_first_run_and_reused(
    fake_api: FakeApiServer, kube_config: client.Configuration, drivers: list[KubernetesCluster]
) -> None:
    first = driver(drivers, kube_config)
    for run_id in RUNS[:2]:
        await first.apply(replace(training_order(run_id=run_id), priority_class="batch", priority=100))
    created = [(r, n) for r, _, n in fake_api.creations]
    assert created[0] == (PRIORITY_CLASSES, "gpufleet-batch")  # before the JobSet whose pods name it
    assert created.count((PRIORITY_CLASSES, "gpufleet-batch")) == 1
    assert len(fake_api.requests_to("POST", "priorityclasses")) == 1  # the second run asked nothing
    [pc] = fake_api.objects_of(PRIORITY_CLASSES)
    assert pc["value"] == 100
    assert pc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufleet"

    # a restarted control plane meets AlreadyExists, reads it back, and leaves it as it is
    restarted = driver(drivers, kube_config)
    await restarted.apply(replace(training_order(run_id=RUNS[2]), priority_class="batch", priority=100))
    assert [(r, n) for r, _, n in fake_api.creations].count((PRIORITY_CLASSES, "gpufleet-batch")) == 1
    assert len(fake_api.requests_to("GET", "priorityclasses/gpufleet-batch")) == 1
    assert len(fake_api.requests_to("DELETE", "priorityclasses")) == 0


async def test_a_changed_class_value_replaces_gpufleets_priority_class(
    fake_api: FakeApiServer, kube_config: client.Configuration, drivers: list[KubernetesCluster]
) -> None:
    await driver(drivers, kube_config).apply(
        replace(training_order(run_id=RUNS[0]), priority_class="batch", priority=100)
    )
    # the admin raised the class; a PriorityClass value is immutable, so it is deleted and created again
    await driver(drivers, kube_config).apply(
        replace(training_order(run_id=RUNS[1]), priority_class="batch", priority=250)
    )
    [pc] = fake_api.objects_of(PRIORITY_CLASSES)
    assert pc["value"] == 250
    assert len(fake_api.requests_to("DELETE", "priorityclasses/gpufleet-batch")) == 1


async def test_a_foreign_class_with_gpufleets_name_is_never_touched(
    fake_api: FakeApiServer, kube_config: client.Configuration, drivers: list[KubernetesCluster]
) -> None:
    foreign = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "gpufleet-batch"}}
    fake_api.put(PRIORITY_CLASSES, foreign | {"value": 7})
    with pytest.raises(ManifestError, match="not gpufleet's; map the class"):
        await driver(drivers, kube_config).apply(
            replace(training_order(run_id=RUNS[0]), priority_class="batch", priority=100)
        )
    [pc] = fake_api.objects_of(PRIORITY_CLASSES)
    assert pc["value"] == 7
    assert fake_api.requests_to("POST", "jobsets") == []  # no pod names a class it cannot trust


async def test_a_mapped_class_creates_nothing(
    fake_api: FakeApiServer, kube_config: client.Configuration, drivers: list[KubernetesCluster]
) -> None:
    mapped = driver(drivers, kube_config, priority_class_map={"batch": "cluster-batch"})
    await mapped.apply(replace(training_order(run_id=RUNS[0]), priority_class="batch", priority=100))
    assert fake_api.requests_to("POST", "priorityclasses") == []
    [jobset] = fake_api.objects_of(("jobset.x-k8s.io", "v1alpha2", "jobsets"), "gpufleet")
    names = {r["template"]["spec"]["template"]["spec"]["priorityClassName"] for r in jobset["spec"]["replicatedJobs"]}
    assert names == {"cluster-batch"}


async def test_a_priority_class_deleted_by_hand_comes_back_at_the_next_check(
    fake_api: FakeApiServer, kube_config: client.Configuration, drivers: list[KubernetesCluster]
) -> None:
    cluster = driver(drivers, kube_config)
    cluster.priority_class_recheck_seconds = 0.0  # check before every run
    await cluster.apply(replace(training_order(run_id=RUNS[0]), priority_class="batch", priority=100))
    fake_api.remove(PRIORITY_CLASSES, "", "gpufleet-batch")
    await cluster.apply(replace(training_order(run_id=RUNS[1]), priority_class="batch", priority=100))
    [pc] = fake_api.objects_of(PRIORITY_CLASSES)
    assert pc["metadata"]["name"] == "gpufleet-batch"
