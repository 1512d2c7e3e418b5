"""`KubernetesCluster` against the fake API server: apply, delete, list, reconcile."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from adapters.kubernetes.api_client import configuration_for
from adapters.kubernetes.driver import KubernetesCluster
from adapters.kubernetes.manifests import KubeSettings, ManifestError
from adapters.kubernetes.reconcile_records import Drift
from tests.kubernetes.conftest import NAMESPACE, pools, training_order
from tests.kubernetes.fake_apiserver import (
    COSCHEDULING_PODGROUPS,
    JOBS,
    JOBSETS,
    PODS,
    VOLCANO_PODGROUPS,
    FakeApiServer,
    Request,
    run_job_controller,
)

PRIORITY_CLASSES = ("scheduling.k8s.io", "v1", "priorityclasses")
RUN = "run-0123456789abcdef0123"
OTHER = "run-ffffffffffffffffffff"


MakeDriver = Callable[..., KubernetesCluster]


@pytest.fixture
def make_driver(kube_config: client.Configuration) -> Iterator[MakeDriver]:
    """A driver for cluster `east`; each call is a fresh instance (a restarted control plane)."""
    made: list[KubernetesCluster] = []

    def make(settings: KubeSettings | None = None) -> KubernetesCluster:
        driver = KubernetesCluster("east", kube_config, settings or KubeSettings(namespace=NAMESPACE), pools())
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


def names(api: FakeApiServer, resource: tuple[str, str, str]) -> list[str]:
    return [o["metadata"]["name"] for o in api.objects_of(resource, NAMESPACE)]


async def test_apply_creates_each_object_once_and_a_restarted_driver_sees_them(
    fake_api: FakeApiServer, make_driver: MakeDriver
) -> None:
    settings = KubeSettings(gang="volcano")
    driver = make_driver(settings)

    assert await driver.apply(training_order()) is True
    assert [(r, n) for r, _, n in fake_api.creations] == [
        (PRIORITY_CLASSES, "gpufleet-high"),  # before any pod names it
        (VOLCANO_PODGROUPS, RUN),
        (JOBS, f"{RUN}-launcher-0"),
        (JOBS, f"{RUN}-worker-0"),
        (JOBS, f"{RUN}-worker-1"),
    ]
    assert driver.created == 4  # the run's own objects
    assert await driver.apply(training_order()) is False

    restarted = make_driver(settings)
    assert await restarted.apply(training_order()) is False
    assert len(fake_api.creations) == 5  # nothing new: every later POST met AlreadyExists
    assert len(fake_api.requests_to("POST", "jobs")) == 9
    assert restarted.created == 0
    assert await restarted.list_owned() == {RUN}


async def test_partial_apply_is_completed_by_the_retry(fake_api: FakeApiServer, make_driver: MakeDriver) -> None:
    """A crash after the first object: the retried apply creates the rest and reports True."""
    driver = make_driver(KubeSettings(gang="coscheduling"))
    assert await driver.apply(training_order()) is True
    fake_api.remove(JOBS, NAMESPACE, f"{RUN}-worker-1")

    assert await driver.apply(training_order()) is True
    assert names(fake_api, JOBS) == [f"{RUN}-launcher-0", f"{RUN}-worker-0", f"{RUN}-worker-1"]
    assert names(fake_api, COSCHEDULING_PODGROUPS) == [RUN]


async def test_apply_refuses_to_adopt_a_foreign_object_with_our_name(
    fake_api: FakeApiServer, make_driver: MakeDriver
) -> None:
    driver = make_driver()
    await driver.apply(training_order())
    job = fake_api.get(JOBS, NAMESPACE, f"{RUN}-worker-0")
    assert job is not None
    job["metadata"]["labels"]["gpufleet.io/run"] = "someone-else"
    fake_api.put(JOBS, job)

    with pytest.raises(ManifestError, match="not owned by run"):
        await driver.apply(training_order())


async def test_apply_rejects_an_order_for_another_cluster(make_driver: MakeDriver) -> None:
    driver = make_driver()
    order = training_order()
    misrouted = type(order)(**{**order.__dict__, "cluster": "west"})
    with pytest.raises(ManifestError, match="west"):
        await driver.apply(misrouted)


async def test_delete_removes_every_object_of_the_run_in_background(
    fake_api: FakeApiServer, make_driver: MakeDriver
) -> None:
    driver = make_driver(KubeSettings(gang="volcano"))
    await driver.apply(training_order())
    await driver.apply(training_order(run_id=OTHER))
    run_job_controller(fake_api, NAMESPACE)
    assert len(fake_api.objects_of(PODS, NAMESPACE)) == 10

    assert await driver.delete(RUN) is True
    assert names(fake_api, VOLCANO_PODGROUPS) == [OTHER]
    assert all(n.startswith(OTHER) for n in names(fake_api, JOBS))
    # the pods went with their Jobs (the garbage collector follows ownerReferences)
    assert {p["metadata"]["labels"]["gpufleet.io/run"] for p in fake_api.objects_of(PODS, NAMESPACE)} == {OTHER}
    deleted = [(r, n, policy) for r, _, n, policy in fake_api.deletions if n.startswith(RUN) and r != PODS]
    assert sorted(deleted) == sorted(
        [
            (JOBS, f"{RUN}-launcher-0", "Background"),
            (JOBS, f"{RUN}-worker-0", "Background"),
            (JOBS, f"{RUN}-worker-1", "Background"),
            (VOLCANO_PODGROUPS, RUN, "Background"),
        ]
    )
    # Jobs go before the PodGroup their pods point at
    order = [r for r, _, n, _ in fake_api.deletions if n.startswith(RUN) and r != PODS]
    assert order[-1] == VOLCANO_PODGROUPS

    assert await driver.delete(RUN) is False  # already gone: still success, nothing to do
    assert await driver.list_owned() == {OTHER}


async def test_delete_tolerates_an_object_vanishing_midway(fake_api: FakeApiServer, make_driver: MakeDriver) -> None:
    """Another actor deletes a Job between our list and our delete: the 404 counts as done."""
    driver = make_driver()
    await driver.apply(training_order())
    raced: list[str] = []

    def race(request: Request) -> None:
        if request.method == "DELETE" and not raced:
            name = request.path.rsplit("/", 1)[1]
            raced.append(name)
            fake_api.remove(JOBS, NAMESPACE, name)

    fake_api.before_request = race
    assert await driver.delete(RUN) is True
    assert len(raced) == 1
    assert names(fake_api, JOBS) == []
    assert len(fake_api.requests_to("DELETE", "jobs")) == 3  # the raced one answered 404, no retry loop


async def test_jobset_mode_creates_one_jobset(fake_api: FakeApiServer, make_driver: MakeDriver) -> None:
    driver = make_driver(KubeSettings(gang="kueue", use_jobset=True))
    assert await driver.apply(training_order()) is True
    assert names(fake_api, JOBSETS) == [RUN]
    assert names(fake_api, JOBS) == []
    assert await driver.apply(training_order()) is False
    assert await driver.list_owned() == {RUN}
    assert await driver.delete(RUN) is True
    assert names(fake_api, JOBSETS) == []


async def test_missing_crd_means_nothing_owned_but_apply_fails_loudly(
    make_driver: MakeDriver, fake_api: FakeApiServer
) -> None:
    fake_api.served.discard(VOLCANO_PODGROUPS)
    driver = make_driver(KubeSettings(gang="volcano"))
    assert await driver.list_owned() == set()
    with pytest.raises(ApiException) as info:
        await driver.apply(training_order())
    assert info.value.status == 404
    assert [r for r, _, _ in fake_api.creations] == [PRIORITY_CLASSES]  # no pod-bearing object


async def test_wrong_token_is_an_error_not_an_empty_cluster(fake_api: FakeApiServer) -> None:
    driver = KubernetesCluster("east", configuration_for(fake_api.url, "wrong"), KubeSettings(), pools())
    try:
        with pytest.raises(ApiException) as info:
            await driver.list_owned()
        assert info.value.status == 401
    finally:
        driver.close()


async def test_reconcile_deletes_orphans_and_reports_drift(fake_api: FakeApiServer, make_driver: MakeDriver) -> None:
    driver = make_driver(KubeSettings(gang="volcano"))
    await driver.apply(training_order(run_id=RUN, epoch=3))
    await driver.apply(training_order(run_id=OTHER, epoch=1))  # gpufleet forgot this one
    await driver.apply(training_order(run_id="run-epoch", epoch=2))
    await driver.apply(training_order(run_id="run-partial", epoch=1))
    fake_api.remove(JOBS, NAMESPACE, "run-partial-worker-1")

    report = await driver.reconcile({RUN: 3, "run-epoch": 5, "run-partial": 1, "run-never-created": 4})

    assert report.orphans_deleted == (OTHER,)
    assert report.errors == ()
    assert not [n for n in names(fake_api, JOBS) + names(fake_api, VOLCANO_PODGROUPS) if n.startswith(OTHER)]
    assert report.drift == (
        Drift("run-epoch", "epoch", "objects carry epoch 2, run has 5"),
        Drift("run-never-created", "missing", "no objects on the cluster"),
        Drift(
            "run-partial",
            "incomplete",
            "3 of 4 objects (jobs/run-partial-launcher-0, jobs/run-partial-worker-0, podgroups/run-partial)",
        ),
    )
    assert await driver.list_owned() == {RUN, "run-epoch", "run-partial"}
    # a plain set of live runs skips the epoch check
    again = await driver.reconcile({RUN, "run-epoch", "run-partial"})
    assert again.orphans_deleted == ()
    assert [d.reason for d in again.drift] == ["incomplete"]
