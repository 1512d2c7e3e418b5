"""The API's edge against a real server (uvicorn as `gpufleet server serve` runs it, over a real nats-server),
as issue 21 found it: /metrics open to anyone and to any Host header, no bound on failed
authentications, and an `X-Forwarded-Proto` believed from any local peer.

- /metrics, on the API port and on the metrics port, answers only a token of role metrics or
  admin, and carries the process collectors (`process_*`, `python_*`);
- a Host name the API was not told to answer gets a 400 (probes and the scrape answer any);
- failed authentications from one address (bad bearer tokens, submits, logins, scrapes) get a 429
  with Retry-After once over the limit, until the bucket drains;
- the dashboard cookie is `Secure` only when a trusted proxy says https, and behind it failures are
  counted per forwarded client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from adapters.nats.server import free_port
from controlplane.bootstrap import Wiring, run_components
from controlplane.config import Settings
from tests.integration.fleet import admin_headers

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
PROCESS_FAMILIES = (
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
    "process_start_time_seconds",
    "python_info",
    "python_gc_objects_collected_total",
)


@asynccontextmanager
async def _api(settings: Settings, **update: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The API component of `settings` (plus `update`) on a free port, until the block ends."""
    settings = settings.model_copy(update={"api_port": free_port(), "metrics_fleet_interval": 0.0, **update})
    stop = asyncio.Event()
    task = asyncio.create_task(run_components(settings, ("api",), stop))
    base = f"http://127.0.0.1:{settings.api_port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            for _ in range(300):
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert not task.done(), task
                await asyncio.sleep(0.1)
            yield client
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def _tenant(api: httpx.AsyncClient, admin: dict[str, str], team: str) -> dict[str, str]:
    for path, body in (
        ("/v1/teams", {"name": team}),
        ("/v1/queues", {"name": f"{team}-train", "team": team}),
    ):
        r = await api.post(path, json=body, headers=admin)
        assert r.status_code == 201, r.text
    r = await api.post("/v1/tokens", json={"name": f"{team}-ci", "team": team}, headers=admin)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def admin_headers_for(settings: Settings) -> dict[str, str]:
    wiring = Wiring(settings)
    try:
        return admin_headers(wiring)
    finally:
        wiring.close()


def _base(api: httpx.AsyncClient) -> str:
    return str(api.base_url).rstrip("/")


def _login_form(token: str, origin: str) -> dict[str, Any]:
    return {"data": {"token": token}, "headers": {"Origin": origin}, "follow_redirects": False}


async def test_metrics_answer_only_a_scrape_token_on_the_api_and_the_metrics_port(settings: Settings) -> None:
    admin = admin_headers_for(settings)
    metrics_port = free_port()
    async with _api(settings, metrics_port=metrics_port) as api:
        vision = await _tenant(api, admin, "vision")
        await _tenant(api, admin, "llm")
        urls = (f"{_base(api)}/metrics", f"http://127.0.0.1:{metrics_port}/metrics")
        for url in urls:
            for headers, status in (({}, 401), ({"Authorization": "Bearer gpf_guess"}, 401), (vision, 403)):
                refused = await api.get(url, headers=headers)
                assert refused.status_code == status, (url, headers, refused.text)
                assert "gpufleet_" not in refused.text
                assert 'team="llm"' not in refused.text  # another team's labels: never shown to vision
        r = await api.post("/v1/tokens", json={"name": "prometheus", "role": "metrics"}, headers=admin)
        assert r.status_code == 201, r.text
        scraper = {"Authorization": f"Bearer {r.json()['token']}"}
        for url in urls:
            for headers in (scraper, admin):
                shown = await api.get(url, headers=headers)
                assert shown.status_code == 200, (url, shown.text)
                assert shown.headers["content-type"].startswith("text/plain")
                assert 'team="llm"' in shown.text
                lines = shown.text.splitlines()
                for family in PROCESS_FAMILIES:
                    assert any(line.startswith(family) for line in lines), (url, family)
        # the metrics token opens nothing else
        assert (await api.get("/v1/teams", headers=scraper)).status_code == 401
        login = await api.post("/ui/login", **_login_form(scraper["Authorization"][7:], _base(api)))
        assert login.status_code == 401


async def test_the_api_answers_only_the_host_names_it_was_given(settings: Settings) -> None:
    admin = admin_headers_for(settings)
    async with _api(settings) as api:
        port = api.base_url.port
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.nip.io", ""):
            for path in ("/v1/teams", "/ui/login", "/openapi.json"):
                r = await api.get(path, headers={**admin, "Host": host})
                assert r.status_code == 400, (host, path, r.status_code)
                assert "does not answer to the host name" in r.json()["detail"]
            # what kubelets and Prometheus address by pod IP answers any host (metrics still want a token)
            assert (await api.get("/healthz", headers={"Host": host})).status_code == 200
            assert (await api.get("/metrics", headers={"Host": host})).status_code == 401
            assert (await api.get("/metrics", headers={**admin, "Host": host})).status_code == 200
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
            assert (await api.get("/v1/teams", headers={**admin, "Host": host})).status_code == 200, host
    async with _api(settings, api_trusted_hosts=["gpufleet.example.com", "*.gpufleet.internal"]) as api:
        for host, status in (
            ("gpufleet.example.com", 200),
            ("api.gpufleet.internal:443", 200),
            ("gpufleet.internal", 400),
            ("127.0.0.1", 400),
        ):
            assert (await api.get("/v1/teams", headers={**admin, "Host": host})).status_code == status, host


async def test_repeated_failed_authentications_from_one_address_get_429(settings: Settings) -> None:
    admin = admin_headers_for(settings)
    metrics_port = free_port()
    async with _api(settings, auth_failure_limit=5, auth_failure_window=10.0, metrics_port=metrics_port) as api:
        origin = _base(api)
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        bad = {"Authorization": "Bearer gpf_guess"}
        # five failures of every kind: bearer tokens, a submit, a dashboard login, a scrape
        assert (await api.get("/v1/teams", headers=bad)).status_code == 401
        assert (await api.get("/v1/workloads", headers=bad)).status_code == 401
        assert (await api.post("/v1/workloads", json={}, headers=bad)).status_code == 401
        assert (await api.post("/ui/login", **_login_form("gpf_guess", origin))).status_code == 401
        assert (await api.get(metrics_url, headers=bad)).status_code == 401
        # now this address is refused before any credential is looked up, good ones included
        for answer in (
            await api.get("/v1/teams", headers=admin),
            await api.get("/v1/teams", headers=bad),
            await api.post("/v1/workloads", json={}, headers=admin),
            await api.get("/ui/fleet", headers=admin),
            await api.post("/ui/login", **_login_form(admin["Authorization"][7:], origin)),
            await api.get("/metrics", headers=admin),
            await api.get(metrics_url, headers=admin),
        ):
            assert answer.status_code == 429, (answer.request.url, answer.text)
            assert 1 <= int(answer.headers["retry-after"]) <= 20
            assert "too many failed authentications" in answer.text
        wait = int((await api.get("/v1/teams", headers=admin)).headers["retry-after"])
        # a request without any credential is not an attempt: refused as before, not counted
        assert (await api.get("/v1/teams")).status_code == 401
        assert (await api.get("/healthz")).status_code == 200
        await asyncio.sleep(wait + 0.2)  # the bucket drains at 5 per 10 s: one more attempt fits
        assert (await api.get("/v1/teams", headers=admin)).status_code == 200


async def test_the_cookie_is_secure_and_failures_counted_per_client_only_behind_a_trusted_proxy(
    settings: Settings,
) -> None:
    admin = admin_headers_for(settings)
    token = admin["Authorization"][7:]
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    async with _api(settings) as api:  # no trusted proxy: the headers are anybody's words
        origin = _base(api)
        r = await api.post("/ui/login", data={"token": token}, headers={**forwarded, "Origin": origin})
        assert r.status_code == 303, r.text
        assert "Secure" not in r.headers["set-cookie"]
        assert "HttpOnly" in r.headers["set-cookie"]
    async with _api(settings, api_trusted_proxies=["127.0.0.1"], auth_failure_limit=3) as api:
        origin = "https://" + _base(api).removeprefix("http://")  # the browser saw https at the proxy
        plain_origin = _base(api)
        r = await api.post("/ui/login", data={"token": token}, headers={**forwarded, "Origin": origin})
        assert r.status_code == 303, r.text
        assert "Secure" in r.headers["set-cookie"]
        plain = await api.post(
            "/ui/login", data={"token": token}, headers={"X-Forwarded-Proto": "http", "Origin": plain_origin}
        )
        assert plain.status_code == 303
        assert "Secure" not in plain.headers["set-cookie"]
        # failures count per forwarded client: one client is stopped, the next behind the proxy is not
        guess = {"Authorization": "Bearer gpf_guess"}
        for _ in range(3):
            r = await api.get("/v1/teams", headers={**guess, "X-Forwarded-For": "203.0.113.9"})
            assert r.status_code == 401
        r = await api.get("/v1/teams", headers={**admin, "X-Forwarded-For": "203.0.113.9"})
        assert r.status_code == 429
        other = await api.get("/v1/teams", headers={**admin, "X-Forwarded-For": "198.51.100.4, 203.0.113.9"})
        assert other.status_code == 429  # the nearest untrusted hop is the client: the rest is its word
        r = await api.get("/v1/teams", headers={**admin, "X-Forwarded-For": "203.0.113.9, 198.51.100.4"})
        assert r.status_code == 200
