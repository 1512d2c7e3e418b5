"""The fake API server itself behaves like the real one where the adapter depends on it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.kubernetes.conftest import NAMESPACE, TOKEN
from tests.kubernetes.fake_apiserver import VOLCANO_PODGROUPS, FakeApiServer, matches_selector

# Raw `call_api` bypasses the generated methods, and with them the bearer-token auth setting.
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def read_all(resp: Any) -> bytes:
    resp.read()
    data: bytes = resp.data
    return data


def pod_group(name: str, min_member: object = 2) -> dict[str, object]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"minMember": min_member},
    }


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

        with pytest.raises(ApiException) as invalid:
            custom.create_namespaced_custom_object(*args, pod_group("pg2", min_member=0))
        assert invalid.value.status == 422
        assert "minMember" in json.loads(invalid.value.body or "")["message"]
        assert [name for _, _, name in fake_api.creations] == ["pg"]
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_jobs_with_unknown_fields_are_refused(fake_api: FakeApiServer, kube_config: client.Configuration) -> None:
    api = client.ApiClient(kube_config)
    try:
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j"},
            "spec": {
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}},
                "paralelism": 2,  # misspelled: the client model drops it, the fake notices
            },
        }
        resp = api.call_api(
            "POST", f"{fake_api.url}/apis/batch/v1/namespaces/{NAMESPACE}/jobs", header_params=AUTH, body=job
        )
        data = read_all(resp)
        assert resp.status == 422
        assert "paralelism" in json.loads(data)["message"]
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
        resp = api.call_api(
            "GET",
            f"{url}?watch=true&resourceVersion=1&timeoutSeconds=1",
            header_params=AUTH,
        )
        [line] = read_all(resp).decode().splitlines()
        event = json.loads(line)
        assert event["type"] == "ERROR"
        assert event["object"]["code"] == 410
    finally:
        api.close()  # type: ignore[no-untyped-call]
