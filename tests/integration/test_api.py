"""The REST API against a real database: admin, tokens, workloads, validation and tenancy."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from adapters.sql.tables import ApiTokenRow
from controlplane.bootstrap import Wiring
from tests.integration.fleet import add_tenant, gang, h100_cluster, mixed_cluster, setup_fleet


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok"}


def test_openapi_lists_versioned_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/workloads" in paths
    assert "/v1/workloads/{workload_id}/cancel" in paths
    assert all(p.startswith("/v1/") or p in ("/healthz", "/readyz") for p in paths)


def test_requests_without_a_valid_token_are_refused(client: TestClient) -> None:
    assert client.get("/v1/workloads").status_code == 401
    assert client.get("/v1/workloads", headers={"Authorization": "Bearer gpf_nope"}).status_code == 401


@pytest.mark.parametrize("method", ["GET", "POST"])  # POST /v1/workloads authenticates as a submitter
@pytest.mark.parametrize(
    ("header", "says"),
    [
        (None, "no API token: send the header `Authorization: Bearer <token>`"),
        ("gpf_secretvalue", "the Authorization header is not `Bearer <token>`: put `Bearer ` before the token"),
        ("Basic gpf_secretvalue", "the Authorization header is not `Bearer <token>`"),
        ("Bearer ", "the Authorization header has no token after `Bearer`"),
        ("Bearer gpf_secretvalue", "unknown or revoked API token"),
    ],
)
def test_each_reason_for_a_401_gets_its_own_sentence(
    client: TestClient, method: str, header: str | None, says: str
) -> None:
    """A missing header, one without the `Bearer ` scheme and a token that is not one are told
    apart; the header's value is never repeated."""
    headers = {} if header is None else {"Authorization": header}
    r = client.request(method, "/v1/workloads", headers=headers, json={} if method == "POST" else None)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert says in r.json()["detail"]
    assert "secretvalue" not in r.text


@pytest.mark.parametrize("media", ["application/x-www-form-urlencoded", "text/plain; charset=utf-8"])
def test_a_body_not_sent_as_json_is_refused_with_the_header_to_send(
    client: TestClient, admin: dict[str, str], media: str
) -> None:
    """`curl -d @job.json` sends a form type: the answer says which header to send, not a field error."""
    r = client.post("/v1/clusters", content=b'{"name": "c"}', headers={**admin, "Content-Type": media})
    assert r.status_code == 415
    detail = r.json()["detail"]
    assert f"the body is sent as `{media.split(';', maxsplit=1)[0]}`" in detail
    assert "Content-Type: application/json" in detail


def test_a_body_with_no_content_type_is_read_as_json(client: TestClient, admin: dict[str, str]) -> None:
    r = client.post("/v1/clusters", content=b'{"name": "NOT A LABEL"}', headers=admin)
    assert r.status_code == 422  # read and validated as JSON, not refused for its type
    assert "Content-Type" not in r.json()["detail"]


@pytest.mark.parametrize("key", ["H100", "cpu", "nvidia.com/gpu", "L4"])
def test_a_quota_key_that_names_no_gpu_model_of_the_fleet_is_refused_with_the_accepted_keys(
    client: TestClient, admin: dict[str, str], key: str
) -> None:
    """`H100` for `H100-80GB` (or a resource the ledger does not charge) would be stored and never
    enforced. A model becomes a key once a pool of it is registered (L4 here, by the mixed cluster)."""
    r = client.post("/v1/teams", json={"name": "nlp", "limit": {key: 8}}, headers=admin)
    assert r.status_code == 409
    detail = r.json()["detail"]
    assert f"quota key `{key}` names no GPU model of the fleet" in detail
    assert "use `gpu-eq` or one of A100-40GB, A100-80GB, H100-80GB, H200-141GB" in detail
    assert client.get("/v1/teams", headers=admin).json() == []  # nothing stored
    ok = client.post("/v1/teams", json={"name": "nlp", "guaranteed": {"H100-80GB": 8, "gpu-eq": 8}}, headers=admin)
    assert ok.status_code == 201, ok.text
    assert client.patch("/v1/teams/nlp", json={"borrowing_limit": {key: 1}}, headers=admin).status_code == 409
    if key == "L4":
        assert client.post("/v1/clusters", json=mixed_cluster(), headers=admin).status_code == 201
        r = client.patch("/v1/teams/nlp", json={"borrowing_limit": {key: 1}}, headers=admin)
        assert r.status_code == 200, r.text


def test_admin_creates_cluster_with_pools_and_nodes(client: TestClient, admin: dict[str, str]) -> None:
    r = client.post("/v1/clusters", json=mixed_cluster(), headers=admin)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["provider"] == "sim"
    pools = {p["name"]: p for p in body["pools"]}
    assert pools["a100-mig"]["sharing"] == "mig:all-balanced"
    assert [n["name"] for n in pools["l4-shared"]["nodes"]] == ["sim-mixed-l4-shared-0", "sim-mixed-l4-shared-1"]
    listed = client.get("/v1/clusters", headers=admin).json()
    assert [c["name"] for c in listed] == ["sim-mixed"]
    assert client.post("/v1/clusters", json=mixed_cluster(), headers=admin).status_code == 409


def test_cluster_update_and_delete(client: TestClient, admin: dict[str, str]) -> None:
    client.post("/v1/clusters", json=h100_cluster(nodes=2), headers=admin)
    spec = h100_cluster(nodes=3)
    r = client.patch("/v1/clusters/sim-h100", json={"pools": spec["pools"], "region": "eu-west-1"}, headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["region"] == "eu-west-1"
    assert len(r.json()["pools"][0]["nodes"]) == 3
    assert client.delete("/v1/clusters/sim-h100", headers=admin).status_code == 204
    assert client.get("/v1/clusters/sim-h100", headers=admin).status_code == 404


def test_invalid_pool_sharing_mode_is_a_clear_422(client: TestClient, admin: dict[str, str]) -> None:
    spec = h100_cluster()
    spec["pools"][0]["sharing"] = "mig:all-9g.99gb"
    r = client.post("/v1/clusters", json=spec, headers=admin)
    assert r.status_code == 422
    assert "H100-80GB has no MIG profile 9g.99gb" in r.json()["detail"]


def test_tokens_are_stored_hashed_and_can_be_revoked(client: TestClient, admin: dict[str, str], wiring: Wiring) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "vision", "vision-train")
    with wiring.uow() as uow:
        stored = [row.token_hash for row in uow.session.query(ApiTokenRow).all()]  # type: ignore[attr-defined]
    assert tenant.token not in stored
    assert all(len(h) == 64 for h in stored)
    assert client.get("/v1/workloads", headers=tenant.headers).status_code == 200
    token_id = next(t["id"] for t in client.get("/v1/tokens", headers=admin).json() if t["name"] == "vision-ci")
    assert client.delete(f"/v1/tokens/{token_id}", headers=admin).status_code == 204
    assert client.get("/v1/workloads", headers=tenant.headers).status_code == 401


def test_team_tokens_cannot_use_admin_routes(client: TestClient, admin: dict[str, str]) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "vision", "vision-train")
    schema = client.get("/openapi.json").json()
    admin_only = {
        ("post", "/v1/clusters"),
        ("patch", "/v1/clusters/{ref}"),
        ("delete", "/v1/clusters/{ref}"),
        ("post", "/v1/teams"),
        ("get", "/v1/teams"),
        ("post", "/v1/queues"),
        ("post", "/v1/cohorts"),
        ("post", "/v1/priority-classes"),
        ("post", "/v1/tokens"),
        ("get", "/v1/tokens"),
        ("delete", "/v1/tokens/{token_id}"),
        ("delete", "/v1/queues/{ref}"),
        ("patch", "/v1/queues/{ref}"),
    }
    for method, path in admin_only:
        assert method in schema["paths"][path]
        url = path.replace("{ref}", "vision-train").replace("{token_id}", "tok-x")
        r = client.request(method.upper(), url, headers=tenant.headers, json={})
        assert r.status_code == 403, (method, path, r.status_code)


def test_submit_show_list_and_cancel(client: TestClient, admin: dict[str, str]) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "vision", "vision-train")
    r = client.post("/v1/workloads", json=gang("resnet", tenant.queue), headers=tenant.headers)
    assert r.status_code == 201, r.text
    workload = r.json()
    assert workload["state"] == "queued"
    assert workload["team"] == "vision"
    assert workload["min_available"] == 4
    assert workload["priority_class"] == "batch"
    shown = client.get(f"/v1/workloads/{workload['id']}", headers=tenant.headers).json()
    assert shown["id"] == workload["id"]
    listed = client.get("/v1/workloads", params={"state": "queued", "queue": tenant.queue}, headers=tenant.headers)
    assert [w["id"] for w in listed.json()["items"]] == [workload["id"]]
    assert client.get("/v1/workloads", params={"state": "running"}, headers=tenant.headers).json()["items"] == []
    cancelled = client.post(
        f"/v1/workloads/{workload['id']}/cancel", json={"reason": "wrong data"}, headers=tenant.headers
    )
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["reason"] == "wrong data"


def test_the_list_filters_by_team_and_a_team_lists_none_of_another_teams(
    client: TestClient, admin: dict[str, str]
) -> None:
    setup_fleet(client, admin)
    vision = add_tenant(client, admin, "vision", "vision-train")
    speech = add_tenant(client, admin, "speech", "speech-train")
    mine = client.post("/v1/workloads", json=gang("resnet", vision.queue), headers=vision.headers).json()["id"]
    theirs = client.post("/v1/workloads", json=gang("wav2vec", speech.queue), headers=speech.headers).json()["id"]

    def listed(team: str, headers: dict[str, str]) -> list[str]:
        r = client.get("/v1/workloads", params={"team": team}, headers=headers)
        assert r.status_code == 200, r.text
        return [w["id"] for w in r.json()["items"]]

    assert listed("vision", admin) == [mine]
    assert listed("speech", admin) == [theirs]
    assert listed("nobody", admin) == []  # as an unknown queue: none, not an error
    assert listed("vision", vision.headers) == [mine]
    # A team's token lists none of another team's, as if it did not exist.
    assert listed("speech", vision.headers) == []
    assert listed("nobody", vision.headers) == []


def test_idempotent_submit_returns_the_same_workload(client: TestClient, admin: dict[str, str]) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "vision", "vision-train")
    headers = {**tenant.headers, "Idempotency-Key": "build-1234"}
    first = client.post("/v1/workloads", json=gang("resnet", tenant.queue), headers=headers)
    again = client.post("/v1/workloads", json=gang("resnet", tenant.queue), headers=headers)
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert len(client.get("/v1/workloads", headers=tenant.headers).json()["items"]) == 1


@pytest.mark.parametrize(
    ("body_change", "status", "message"),
    [
        ({"pod_sets": [{"name": "w", "replicas": 1, "gpus": -1}]}, 422, "greater than or equal to 0"),
        ({"pod_sets": [{"name": "w", "replicas": 0, "gpus": 8}]}, 422, "greater than or equal to 1"),
        ({"pod_sets": [{"name": "w", "replicas": 2, "gpus": 0}]}, 422, "must request at least one GPU"),
        # What the request names does not exist (404), or the fleet as it stands cannot take it (409):
        # the state, not the request alone, is in the way, so no 422 (the OpenAPI states every 422 rule).
        ({"queue": "nobody-has-this"}, 404, "unknown queue 'nobody-has-this'"),
        ({"priority_class": "platinum"}, 404, "unknown priority class 'platinum'"),
        ({"pod_sets": [{"name": "w", "replicas": 9, "gpus": 8}]}, 409, "no cluster in the fleet could ever hold"),
        ({"pod_sets": [{"name": "w", "replicas": 1, "gpus": 16}]}, 409, "no cluster in the fleet could ever hold"),
        (
            {"pod_sets": [{"name": "w", "replicas": 1, "mig_profile": "3g.40gb"}]},
            409,
            "no pool in the fleet offers MIG",
        ),
        ({"min_available": 5}, 422, "min_available 5 is more than the 4 pods"),
        ({"labels": {"gpufleet.io/epoch": "7"}}, 422, "set by gpufleet"),
        ({"labels": {"kueue.x-k8s.io/queue-name": "other"}}, 422, "set by gpufleet or the controllers it drives"),
        ({"labels": {"app.kubernetes.io/managed-by": "me"}}, 422, "set by gpufleet or the controllers it drives"),
        ({"labels": {"project": "not a label value"}}, 422, "label 'project' value"),
        ({"state": "running"}, 422, "Extra inputs are not permitted"),
    ],
)
def test_refused_submissions_get_a_clear_sentence(
    client: TestClient, admin: dict[str, str], body_change: dict[str, object], status: int, message: str
) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "vision", "vision-train")
    body = gang("bad", tenant.queue)
    body.update(body_change)
    r = client.post("/v1/workloads", json=body, headers=tenant.headers)
    assert r.status_code == status, r.text
    assert message in r.json()["detail"]
    assert client.get("/v1/workloads", headers=tenant.headers).json()["items"] == []


def test_mig_profile_offered_by_a_pool_is_accepted(client: TestClient, admin: dict[str, str]) -> None:
    setup_fleet(client, admin, mixed_cluster())
    tenant = add_tenant(client, admin, "serving", "serving-prod")
    body = {
        "name": "llm",
        "queue": tenant.queue,
        "kind": "inference",
        "pod_sets": [{"name": "server", "replicas": 2, "mig_profile": "3g.40gb"}],
    }
    r = client.post("/v1/workloads", json=body, headers=tenant.headers)
    assert r.status_code == 201, r.text
    assert r.json()["requires_isolation"] is True


def test_a_team_sees_and_touches_only_its_own_objects(client: TestClient, admin: dict[str, str]) -> None:
    setup_fleet(client, admin)
    vision = add_tenant(client, admin, "vision", "vision-train")
    speech = add_tenant(client, admin, "speech", "speech-train")
    theirs = client.post("/v1/workloads", json=gang("asr", speech.queue), headers=speech.headers).json()
    assert client.get(f"/v1/workloads/{theirs['id']}", headers=vision.headers).status_code == 404
    assert client.post(f"/v1/workloads/{theirs['id']}/cancel", headers=vision.headers).status_code == 404
    assert client.get("/v1/workloads", headers=vision.headers).json()["items"] == []
    assert [q["name"] for q in client.get("/v1/queues", headers=vision.headers).json()] == ["vision-train"]
    assert client.get("/v1/queues/speech-train", headers=vision.headers).status_code == 404
    submit_to_theirs = client.post("/v1/workloads", json=gang("sneaky", speech.queue), headers=vision.headers)
    assert submit_to_theirs.status_code == 404  # as if the queue did not exist
    assert client.get(f"/v1/workloads/{theirs['id']}", headers=speech.headers).json()["state"] == "queued"


def test_queue_tree_with_cohort_and_quota_update(client: TestClient, admin: dict[str, str]) -> None:
    assert (
        client.post("/v1/cohorts", json={"name": "research", "limit": {"gpu-eq": 64}}, headers=admin).status_code == 201
    )
    r = client.post(
        "/v1/teams", json={"name": "nlp", "cohort": "research", "guaranteed": {"H100-80GB": 16}}, headers=admin
    )
    assert r.status_code == 201, r.text
    cohort_id = client.get("/v1/cohorts", headers=admin).json()[0]["id"]
    assert r.json()["parent_id"] == cohort_id
    bad = client.patch("/v1/teams/nlp", json={"limit": {"H100-80GB": 8}}, headers=admin)
    assert bad.status_code == 409  # below the stored guarantee: the state is in the way
    assert "above its limit" in bad.json()["detail"]
    ok = client.patch("/v1/teams/nlp", json={"limit": {"H100-80GB": 32}, "weight": 2}, headers=admin)
    assert ok.json()["limit"] == {"H100-80GB": 32}
    assert ok.json()["weight"] == 2
    assert client.delete("/v1/cohorts/research", headers=admin).status_code == 409
    assert client.post("/v1/teams", json={"name": "x", "cohort": "missing"}, headers=admin).status_code == 404


def test_oversized_body_is_refused(client: TestClient, admin: dict[str, str]) -> None:
    r = client.post(
        "/v1/clusters", content=b"{" + b" " * (1 << 20) + b"}", headers={**admin, "Content-Type": "application/json"}
    )
    assert r.status_code == 413


def test_reusing_an_idempotency_key_for_a_different_request_is_a_conflict(
    client: TestClient, admin: dict[str, str]
) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "vision", "vision-train")
    headers = {**tenant.headers, "Idempotency-Key": "nightly-7"}
    first = client.post("/v1/workloads", json=gang("resnet", tenant.queue), headers=headers)
    other = client.post("/v1/workloads", json=gang("resnet", tenant.queue, replicas=2), headers=headers)
    assert first.status_code == 201
    assert other.status_code == 409
    assert "already used for a different request" in other.json()["detail"]


def test_cancel_reason_is_bounded(client: TestClient, admin: dict[str, str]) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "vision", "vision-train")
    wid = client.post("/v1/workloads", json=gang("resnet", tenant.queue), headers=tenant.headers).json()["id"]
    r = client.post(f"/v1/workloads/{wid}/cancel", json={"reason": "x" * 201}, headers=tenant.headers)
    assert r.status_code == 422
    assert client.get(f"/v1/workloads/{wid}", headers=tenant.headers).json()["state"] == "queued"


def test_a_team_sees_the_team_of_its_queues(client: TestClient, admin: dict[str, str]) -> None:
    setup_fleet(client, admin)
    tenant = add_tenant(client, admin, "vision", "vision-train")
    [queue] = client.get("/v1/queues", headers=tenant.headers).json()
    assert queue["parent"] == "vision"
    team = client.get("/v1/teams/vision", headers=admin).json()
    assert team["parent"] is None


def test_same_pool_required_is_refused_when_no_single_pool_could_hold_the_gang(
    client: TestClient, admin: dict[str, str]
) -> None:
    setup_fleet(client, admin, h100_cluster(nodes=4))
    tenant = add_tenant(client, admin, "vision", "vision-train")
    ok = client.post("/v1/workloads", json=gang("fits", tenant.queue, same_pool="required"), headers=tenant.headers)
    assert ok.status_code == 201, ok.text
    assert ok.json()["same_pool"] == "required"
    too_big = gang("spread", tenant.queue, replicas=5, same_pool="required")
    r = client.post("/v1/workloads", json=too_big, headers=tenant.headers)
    assert r.status_code == 409
    assert "no cluster in the fleet could ever hold" in r.json()["detail"]
