"""The REST API against a careless or hostile client: every attack of issue 11 that is not about
authentication is refused with a sentence (413/422/503), and nothing it sends reaches the database."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from adapters.nats.server import free_port
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring
from controlplane.config import Settings
from controlplane.domain.limits import MAX_OFFSET, MAX_PAGE, MAX_PODS_PER_GANG, MAX_QUOTA_AMOUNT
from tests.integration.fleet import Tenant, gang


def _raw(client: TestClient, path: str, body: bytes, headers: dict[str, str], **extra: str) -> Any:
    return client.post(path, content=body, headers={**headers, "Content-Type": "application/json", **extra})


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e309"])
def test_non_finite_quotas_and_prices_are_refused_with_a_sentence(
    client: TestClient, admin: dict[str, str], tenant: Tenant, literal: str
) -> None:
    # Python's json.dumps writes float("inf") as Infinity: what a careless client sends.
    queue = f'{{"name": "inf-queue", "team": "{tenant.team}", "limit": {{"gpu-eq": {literal}}}}}'
    r = _raw(client, "/v1/queues", queue.encode(), admin)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "body"
    assert "infinit" in r.json()["detail"] or "NaN" in r.json()["detail"]
    patch = f'{{"guaranteed": {{"gpu-eq": {literal}}}}}'.encode()
    r = client.patch(f"/v1/queues/{tenant.queue}", content=patch, headers={**admin, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    pool = {
        "name": "p",
        "gpu_model": "L4",
        "gpus_per_node": 1,
        "cpu_millis": 8000,
        "memory_mib": 32000,
        "node_count": 1,
    }
    cluster = json.dumps({"name": "inf-price", "pools": [{**pool, "price_per_gpu_hour": 1.0}]}).replace("1.0", literal)
    assert _raw(client, "/v1/clusters", cluster.encode(), admin).status_code == 422
    assert client.get("/v1/clusters/inf-price", headers=admin).status_code == 404
    # The cluster list (which the issue saw broken by an Infinity price) still renders.
    assert client.get("/v1/clusters", headers=admin).status_code == 200


def test_absurd_but_finite_quotas_are_bounded(client: TestClient, admin: dict[str, str], tenant: Tenant) -> None:
    r = client.post("/v1/queues", json={"name": "huge", "team": tenant.team, "limit": {"gpu-eq": 1e300}}, headers=admin)
    assert r.status_code == 422
    assert str(int(MAX_QUOTA_AMOUNT)) in r.json()["detail"]
    ok = client.post(
        "/v1/queues", json={"name": "big", "team": tenant.team, "limit": {"gpu-eq": MAX_QUOTA_AMOUNT}}, headers=admin
    )
    assert ok.status_code == 201, ok.text


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "levels deep"),
        (b'{"name": "a", "name": "b"}', "appears twice"),
        (b'{"name": "\xff"}', "UTF-8"),
        (b'{"name": "x", "queue": "q", "pod_sets": [{"replicas": ' + b"9" * 5000 + b"}]}", "digits"),
    ],
)
def test_hostile_json_bodies_get_422_not_500(client: TestClient, tenant: Tenant, body: bytes, words: str) -> None:
    r = _raw(client, "/v1/workloads", body, tenant.headers)
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"]


def test_the_body_cap_holds_for_chunked_bodies(client: TestClient, tenant: Tenant) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"name": "big", "queue": "' + tenant.queue.encode() + b'", "labels": {"a": "'
        for _ in range(1100):
            yield b"x" * 1024
        yield b'"}}'

    r = client.post("/v1/workloads", content=chunks(), headers={**tenant.headers, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json() == {"detail": "request body larger than 1 MiB"}
    assert client.get("/v1/workloads", headers=tenant.headers).json() == {"items": [], "next": None}


@pytest.mark.parametrize(
    "query",
    [f"offset={2**63}", f"offset={MAX_OFFSET + 1}", "offset=-1", f"limit={MAX_PAGE + 1}", "limit=1000000", "limit=0"],
)
def test_page_bounds_are_422(client: TestClient, tenant: Tenant, query: str) -> None:
    r = client.get(f"/v1/workloads?{query}", headers=tenant.headers)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


def test_largest_page_and_offset_are_served(client: TestClient, tenant: Tenant) -> None:
    r = client.get(f"/v1/workloads?limit={MAX_PAGE}&offset={MAX_OFFSET}", headers=tenant.headers)
    assert r.status_code == 200
    assert r.json() == {"items": [], "next": None}


def test_gang_size_is_bounded_by_what_a_pod_report_can_carry(client: TestClient, tenant: Tenant) -> None:
    too_big = gang("huge", tenant.queue, replicas=MAX_PODS_PER_GANG, gpus=1)
    too_big["pod_sets"].append({"name": "more", "replicas": 1, "gpus": 1})
    r = client.post("/v1/workloads", json=too_big, headers=tenant.headers)
    assert r.status_code == 422
    assert f"at most {MAX_PODS_PER_GANG} pods" in r.json()["detail"]
    many_sets = gang("sets", tenant.queue, replicas=1, gpus=1)
    many_sets["pod_sets"] = [{"name": f"s{i}", "replicas": 1, "gpus": 1} for i in range(17)]
    assert client.post("/v1/workloads", json=many_sets, headers=tenant.headers).status_code == 422
    env = gang("env", tenant.queue, replicas=1, gpus=1, container={"env": {f"V{i}": "1" for i in range(257)}})
    assert client.post("/v1/workloads", json=env, headers=tenant.headers).status_code == 422


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"labels": {"team": "has space"}}, "value"),
        ({"labels": {"-bad": "x"}}, "label key"),
        ({"labels": {"Example.COM/x": "y"}}, "prefix"),
        ({"labels": {("a" * 64): "y"}}, "name part"),
        ({"labels": {"a/b/c": "y"}}, "prefix"),
        ({"labels": {"ok": "v" * 64}}, "at most 63"),
        ({"tolerations": [{"key": "bad key", "operator": "Exists"}]}, "toleration"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "takes no value"),
        ({"tolerations": [{"key": "k", "value": "no/slash"}]}, "value"),
        ({"tolerations": [{"key": "k", "effect": "Sometimes"}]}, "effect"),
        ({"name": "Upper-Case"}, "name"),
        ({"name": "x" * 64}, "name"),
    ],
)
def test_kubernetes_syntax_is_checked_at_submit(
    client: TestClient, tenant: Tenant, extra: dict[str, Any], words: str
) -> None:
    body = {**gang("k8s-syntax", tenant.queue, replicas=1, gpus=1), **extra}
    r = client.post("/v1/workloads", json=body, headers=tenant.headers)
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"]


def test_valid_kubernetes_labels_and_tolerations_are_accepted(client: TestClient, tenant: Tenant) -> None:
    body = gang(
        "k8s-ok",
        tenant.queue,
        replicas=1,
        gpus=1,
        labels={"app.kubernetes.io/name": "trainer", "example.com/empty": "", "a_b.c-d": "X.y_z-1"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    r = client.post("/v1/workloads", json=body, headers=tenant.headers)
    assert r.status_code == 201, r.text


def test_security_headers_and_no_store_on_secrets(client: TestClient, admin: dict[str, str], tenant: Tenant) -> None:
    issued = client.post("/v1/tokens", json={"name": "ci-2", "team": tenant.team}, headers=admin)
    assert issued.status_code == 201
    for r in (issued, client.get("/v1/workloads", headers=tenant.headers), client.get("/healthz")):
        assert r.headers["cache-control"] == "no-store"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["content-security-policy"] == "default-src 'none'; frame-ancestors 'none'"
    refused = _raw(client, "/v1/workloads", b"[" * 1000, tenant.headers)
    assert refused.headers["cache-control"] == "no-store"
    assert "content-security-policy" not in client.get("/docs").headers


def test_a_database_outage_answers_503_with_retry_after(wiring: Wiring, tmp_path: Any) -> None:
    # A database nobody listens on: every transaction fails the way an outage does.
    dead = Wiring(Settings(database_url="postgresql://postgres@127.0.0.1:9/gpufleet", state_dir=tmp_path))
    try:
        app = create_app(ApiContext(uow_factory=dead.uow, subject_prefix=wiring.settings.subject_prefix))
        with TestClient(app) as c:
            r = c.get("/v1/workloads", headers={"Authorization": "Bearer gpf_whatever"})
            assert r.status_code == 503
            assert r.headers["retry-after"] == "5"
            assert r.headers["content-type"] == "application/json"
            assert "database is unavailable" in r.json()["detail"]
    finally:
        dead.close()


def test_chunked_body_over_the_cap_is_refused_by_a_real_http_server(wiring: Wiring, tenant: Tenant) -> None:
    """Through uvicorn and a raw socket, as the attack in the issue was made: no Content-Length."""
    app = create_app(ApiContext(uow_factory=wiring.uow, subject_prefix=wiring.settings.subject_prefix))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = (
                "POST /v1/workloads HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {tenant.token}\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            sock.sendall(head.encode())
            chunk = b"x" * 65536
            with contextlib.suppress(OSError):  # the server may answer and close before we finish
                for _ in range(20):  # 1.25 MiB
                    sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sock.sendall(b"0\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 413"), answer[:300]
        assert b'{"detail":"request body larger than 1 MiB"}' in rest
    finally:
        server.should_exit = True
        thread.join(timeout=10)
