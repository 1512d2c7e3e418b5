"""The dashboard in a real headless browser: Debian's chromium driven by Playwright, against the
whole control plane as `gpufleet up` runs it (API under uvicorn, scheduler, dispatcher, simulated
clusters publishing DCGM telemetry, nats-server, ingest, relay, idle pass).

A person logs in through the form, visits every page and reads what it says: the clusters and
their GPU counts, a queue's bar, a waiting gang's reason, the hoarder flagged and then reclaimed
for another team's gang, a utilization plot, and events arriving in the live feed. Each page is
saved as a PNG under `$GPUFLEET_TEST_ARTEFACTS/ui` (default `test-artefacts/ui`)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.nats.server import free_port
from controlplane.bootstrap import COMPONENTS, Wiring, run_components, utc_now
from controlplane.config import Settings
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec
from tests.integration.fleet import FAST_IDLE_POLICY, FAST_WINDOW, HOARDER_CONTAINER, gang, h100_cluster, mixed_cluster

CHROMIUM = shutil.which("chromium")
try:
    from playwright.async_api import Page, async_playwright, expect
except ImportError:  # pragma: no cover - the dev group installs it
    async_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"),
    pytest.mark.skipif(async_playwright is None, reason="playwright is not installed (uv sync --frozen)"),
]

WINDOW = FAST_WINDOW
IDLE_POLICY = FAST_IDLE_POLICY
HOARDER = HOARDER_CONTAINER
TIMEOUT_MS = 60_000


def artefacts() -> Path:
    root = Path(os.environ.get("GPUFLEET_TEST_ARTEFACTS", "test-artefacts")) / "ui"
    root.mkdir(parents=True, exist_ok=True)
    return root


async def _until_ready(api: httpx.AsyncClient) -> None:
    for _ in range(150):
        try:
            if (await api.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("the API never became ready")


@asynccontextmanager
async def _plane(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    wiring = Wiring(settings)
    _, admin_token = issue_token(wiring.uow(), TokenSpec(name="browser", role="admin"), "test", utc_now())
    wiring.close()
    stop = asyncio.Event()
    plane = asyncio.create_task(run_components(settings, COMPONENTS, stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.api_port}", timeout=10) as api:
            await _until_ready(api)
            yield api, admin_token
    finally:
        stop.set()
        await asyncio.wait_for(plane, 30)


async def _post(api: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    r = await api.post(path, json=body, headers=headers)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _shot(page: Page, name: str, taken: list[Path]) -> None:
    path = artefacts() / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    taken.append(path)


async def _reload_until(page: Page, text: str, seconds: float) -> None:
    """Reload until `text` is visible: server-rendered pages show new facts on the next load."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        await page.reload()
        if await page.get_by_text(text).first.is_visible():
            return
        if loop.time() > deadline:
            raise AssertionError(f"{text!r} not shown on {page.url} within {seconds:.0f} s")
        await asyncio.sleep(0.5)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_person_reads_the_fleet_in_a_real_browser(settings: Settings) -> None:
    settings = settings.model_copy(
        update={
            "api_port": free_port(),
            "telemetry_window_seconds": WINDOW,
            "telemetry_interval": 0.2,
            "idle": IDLE_POLICY,
            "idle_interval": 0.3,
        }
    )
    taken: list[Path] = []
    async with _plane(settings) as (api, admin_token):
        admin = {"Authorization": f"Bearer {admin_token}"}
        await _post(api, "/v1/clusters", h100_cluster(nodes=2), admin)
        await _post(api, "/v1/clusters", mixed_cluster(), admin)
        await _post(api, "/v1/priority-classes", {"name": "batch", "value": 1, "is_default": True}, admin)
        tokens = {}
        for team, limit in (("llm", {}), ("vision", {}), ("ops", {"gpu-eq": 4})):
            await _post(api, "/v1/teams", {"name": team}, admin)
            await _post(api, "/v1/queues", {"name": f"{team}-train", "team": team, "limit": limit}, admin)
            tokens[team] = (await _post(api, "/v1/tokens", {"name": f"{team}-ui", "team": team}, admin))["token"]
        llm, vision, ops = ({"Authorization": f"Bearer {tokens[team]}"} for team in ("llm", "vision", "ops"))
        # The hoarder takes every H100 and goes idle; vision's gang waits for exactly those GPUs, and
        # gets them once the hoarder is reclaimed. ops' gang is larger than its queue's limit: it waits
        # for as long as the test runs, whatever the hoarding story's timing.
        hoarder = await _post(api, "/v1/workloads", gang("hoarder", "llm-train", replicas=2, container=HOARDER), llm)
        for _ in range(150):
            if (await api.get(f"/v1/workloads/{hoarder['id']}", headers=llm)).json()["state"] == "running":
                break
            await asyncio.sleep(0.2)
        await _post(api, "/v1/workloads", gang("finetune", "vision-train", replicas=2), vision)
        wide = await _post(api, "/v1/workloads", gang("too-wide", "ops-train", replicas=1), ops)
        view: dict[str, Any] = {}
        for _ in range(100):
            view = (await api.get(f"/v1/workloads/{wide['id']}", headers=ops)).json()
            if view["state"] == "queued" and view.get("reason_detail"):
                break
            await asyncio.sleep(0.2)
        reason, kind = view["reason"], view["reason_detail"]["kind"]
        assert reason.startswith("quota: never under the current limits: ops-train limit is 4 gpu-eq"), reason

        base = f"http://127.0.0.1:{settings.api_port}"
        assert async_playwright is not None
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            failed: list[str] = []
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            try:
                # Not logged in: the login page. A wrong token is refused on the page itself.
                await page.goto(f"{base}/ui")
                await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
                await page.get_by_label("API token").fill("gpf_wrong")
                await page.get_by_role("button", name="Log in").click()
                await expect(page.get_by_role("alert")).to_have_text("unknown or revoked token")
                await _shot(page, "01-login-refused", taken)
                assert failed == [f"401 {base}/ui/login"], failed
                errors.clear()
                failed.clear()
                await page.get_by_label("API token").fill(admin_token)
                await page.get_by_role("button", name="Log in").click()

                # Fleet: clusters, pools, GPUs by model and sharing mode.
                await expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
                # The browser holds an opaque session id, never the token (issue 21, finding 9).
                session = {c["name"]: c for c in await page.context.cookies()}["gpufleet_ui"]
                assert session["value"].startswith("gps_")
                assert admin_token not in session["value"]
                assert session["httpOnly"]
                assert session["sameSite"] == "Strict"
                await expect(page.locator("p.lead")).to_contain_text("2 clusters;")
                await expect(page.locator("p.lead")).to_contain_text("of 28 GPUs allocated to live runs")
                await expect(page.get_by_role("heading", name="Cluster sim-h100")).to_be_visible()
                await expect(page.get_by_role("heading", name="Cluster sim-mixed")).to_be_visible()
                models = page.locator("table").first
                await expect(models.locator("tr", has_text="L4")).to_contain_text("time-slice, 4 per GPU")
                await expect(models.locator("tr", has_text="H100-80GB").locator("td").nth(2)).to_have_text("16")
                await expect(models.locator("tr", has_text="A100-80GB")).to_contain_text("MIG (all-balanced)")
                # Per pool: allocated vs used vs idle, pending demand; the hoarder holds every H100.
                h100 = page.locator("#cluster-sim-h100 table.pools tr", has_text="H100-80GB")
                await expect(h100.locator("td").nth(5)).to_have_text("16")  # allocated
                await expect(page.locator("#pending-demand")).to_be_visible()
                await _shot(page, "02-fleet", taken)
                # The node view: each H100 node and the workload on it.
                await h100.get_by_role("link", name="h100").click()
                await expect(page.get_by_role("heading", name="Node pool h100")).to_be_visible()
                await expect(page.locator("#pool-nodes tbody tr")).to_have_count(2)
                await expect(page.locator("#pool-nodes tbody tr").first).to_contain_text("hoarder")
                await _shot(page, "02b-fleet-pool-nodes", taken)

                # Queues: a bar per team and queue, labelled, in an SVG chart; vision's gang pending.
                await page.get_by_role("link", name="Queues").click()
                chart = page.get_by_role("img", name="Quota and use (gpu-eq)")
                await expect(chart).to_be_visible()
                await expect(chart.locator("text", has_text="· ops-train")).to_be_visible()
                ops_line = page.locator("tr", has_text="queue ops-train")
                await expect(ops_line).to_contain_text(f"{kind} 1")
                await expect(ops_line.locator("td.oldest-wait")).to_have_text(re.compile(r"^\d+ (s|min)$"))
                await _shot(page, "03-queues", taken)

                # Workloads: the waiting gang and why it waits, in the scheduler's own words.
                await page.get_by_role("link", name="Workloads").click()
                await page.get_by_role("checkbox", name=re.compile(r"^queued \d+$")).check()
                await page.get_by_role("button", name="Filter").click()
                await expect(page.get_by_role("link", name="too-wide")).to_be_visible()
                row = page.locator("#workload-list tr", has_text="too-wide")
                await expect(row.locator("td.gpus")).to_have_text("1 \u00d7 8 GPU")
                await expect(row.locator("td.when time")).to_have_attribute("title", re.compile(r"UTC$"))
                await _shot(page, "04-workloads-queued", taken)
                # Every state, grouped by queue: a heading per queue with its count.
                await page.get_by_role("checkbox", name=re.compile(r"^queued \d+$")).uncheck()
                await page.get_by_label("group").select_option("queue")
                await page.get_by_label("sort").select_option("priority")
                await page.get_by_role("button", name="Filter").click()
                await expect(page.locator("tr.group", has_text="queue ops-train")).to_contain_text("1 workload")
                await expect(page.locator("tr.group", has_text="queue llm-train")).to_be_visible()
                await _shot(page, "04b-workloads-grouped", taken)
                await page.get_by_role("link", name="too-wide").click()
                await expect(page.locator("dd.reason")).to_have_text(reason)
                await expect(page.locator("dt", has_text="queue position")).to_be_visible()
                await _shot(page, "05-workload-pending", taken)
                # It can never fit: cancel it from its page (the form carries the session's token).
                await page.get_by_role("button", name="Cancel this workload").click()
                await expect(page.locator("dd.state")).to_have_text("cancelled")
                await expect(page.get_by_role("button", name="Cancel this workload")).to_have_count(0)
                assert (await api.get(f"/v1/workloads/{wide['id']}", headers=ops)).json()["state"] == "cancelled"
                await _shot(page, "05b-workload-cancelled", taken)

                # Idle GPUs: the hoarder flagged, then reclaimed for vision's gang.
                await page.get_by_role("link", name="Idle GPUs").click()
                # The story moves in seconds here, so the first look may already find it reclaimed:
                # the recent decisions keep each step (the live finding table is checked over HTTP).
                await _reload_until(page, "idle.notify", 60)
                await _shot(page, "06-idle-flagged", taken)
                await _reload_until(page, "idle.reclaim", 60)
                decisions = page.locator("#idle-decisions")
                await expect(decisions.locator("tr.idle-notify", has_text="hoarder").first).to_contain_text("llm")
                await expect(decisions.locator("tr.idle-reclaim", has_text="hoarder").first).to_contain_text(
                    "stage reclaim"
                )
                await _shot(page, "07-idle-reclaimed", taken)
                await page.goto(f"{base}/ui/workloads/{hoarder['id']}")
                await _reload_until(page, "reclaimed-idle", 30)
                await _shot(page, "08-hoarder-reclaimed", taken)

                # Utilization: allocated vs used GPU-hours per team, plotted.
                await page.get_by_role("link", name="Utilization").click()
                # A young fleet: the default range narrows to the last hour, in 5-minute buckets.
                plot = page.get_by_role("img", name="Team llm: allocated vs used GPU-hours per 5 min")
                await expect(plot).to_be_visible()
                await expect(page.locator("#range-picker strong")).to_have_text("1h")
                await _shot(page, "09-utilization", taken)
                await page.locator("#range-picker").get_by_role("link", name="24h").click()
                await expect(
                    page.get_by_role("img", name="Team llm: allocated vs used GPU-hours per 1 h")
                ).to_be_visible()

                # Audit: the checklist's findings, the hoarder among them, each with its evidence and fix.
                await page.get_by_role("link", name="Audit").click()
                findings = page.locator("#audit-findings")
                hoarding = findings.locator("tr", has_text="idle-reclaimed")
                await expect(hoarding).to_contain_text("hoarder")
                await expect(hoarding).to_contain_text("release GPUs when the work pauses")
                await expect(findings.locator("tr", has_text="team-without-limit").first).to_contain_text("team llm")
                await _shot(page, "10-audit", taken)

                # Events: the feed shows what happened, and a new submit appears without a reload.
                await page.get_by_role("link", name="Events").click()
                await expect(page.locator("#feed")).to_contain_text("idle.reclaim")
                await _post(api, "/v1/workloads", gang("late-arrival", "vision-train", replicas=1, gpus=1), vision)
                await expect(page.locator("#feed tr.new", has_text="late-arrival").first).to_be_visible()
                await expect(page.locator("#feed-status")).to_contain_text("Live")
                await _shot(page, "11-events-live", taken)
                # Only the idle policy's decisions, about the hoarder.
                await page.get_by_label("family").select_option("idle")
                await page.get_by_role("textbox", name="workload").fill("hoarder")
                await page.get_by_role("button", name="Filter").click()
                await expect(page.locator("#feed tbody tr").first).to_contain_text("idle.")
                await expect(page.locator("#feed")).not_to_contain_text("workload.")
                await expect(page.locator("#feed-status")).to_contain_text("Live")
                await _shot(page, "11b-events-filtered", taken)

                # A team sees its own team only; logging out ends the session.
                await page.get_by_role("button", name="Log out").click()
                await page.get_by_label("API token").fill(tokens["vision"])
                await page.get_by_role("button", name="Log in").click()
                await page.get_by_role("link", name="Workloads").click()
                await expect(page.get_by_role("link", name="finetune")).to_be_visible()
                await expect(page.get_by_role("link", name="hoarder")).to_have_count(0)
                await expect(page.locator("header .who")).to_have_text("team vision")
                await _shot(page, "12-team-workloads", taken)
                await page.get_by_role("link", name="Audit").click()
                await expect(page.locator("#audit-counts")).to_be_visible()
                await expect(page.locator("#audit-findings")).not_to_contain_text("hoarder")  # llm's, not vision's
                assert not errors, errors  # no CSP violation, no script error
                assert not failed, failed  # no missing file, no refused request
            finally:
                await browser.close()
    for path in taken:
        print(f"screenshot: {path.resolve()}")
    assert len(taken) == 16  # 12 pages, and the node view, grouping, cancel and event filter
