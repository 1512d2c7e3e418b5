"""The dashboard over HTTP, on SQLite and PostgreSQL: the login, its server-side session and the
cookie that names it, what each page shows, team isolation, escaping of hostile text, the CSP
header and bounded parameters."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from adapters.sql.gauges_repo import SqlFleetGauges
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.api.ui.session import COOKIE
from controlplane.bootstrap import utc_now
from controlplane.service.events import envelope
from controlplane.service.idle_records import IdleFinding
from controlplane.service.ui_sessions import MAX_SESSIONS_PER_TOKEN
from tests.ui.conftest import BASE, ORIGIN, Seeded

PAGES = ["/ui/fleet", "/ui/queues", "/ui/workloads", "/ui/idle", "/ui/utilization", "/ui/audit", "/ui/events"]
HOSTILE = "<img src=x onerror=alert(1)>"


def _text(html: str) -> str:
    """Roughly what a person reads: tags and SVG dropped, whitespace folded."""
    html = re.sub(r"<svg.*?</svg>", " ", html, flags=re.S)
    html = re.sub(r"<[^>]+>", " ", html)
    return re.sub(r"\s+", " ", html).replace("&amp;", "&")


def test_every_page_sends_a_browser_without_a_session_to_the_login_page(seeded: Seeded) -> None:
    for path in [*PAGES, f"/ui/workloads/{seeded.ids['a']}"]:
        r = seeded.client.get(path, follow_redirects=False)
        assert r.status_code == 303, path
        assert r.headers["location"] == "/ui/login"
    assert seeded.client.get("/ui/events.json").status_code == 401  # the feed's script gets a status
    login = seeded.client.get("/ui/login")
    assert login.status_code == 200
    assert 'name="token"' in login.text


def test_login_sets_a_strict_httponly_cookie_and_refuses_bad_tokens_and_other_sites(seeded: Seeded) -> None:
    c = seeded.client
    bad = c.post("/ui/login", data={"token": "gpf_not-a-real-token"}, headers=ORIGIN, follow_redirects=False)
    assert bad.status_code == 401
    assert "unknown or revoked token" in bad.text
    assert "set-cookie" not in bad.headers
    for headers in ({}, {"Origin": "https://evil.example"}, {"Referer": "http://evil.example/x"}):
        r = c.post("/ui/login", data={"token": seeded.vision.token}, headers=headers, follow_redirects=False)
        assert r.status_code == 403, headers
        assert "set-cookie" not in r.headers
    good = c.post("/ui/login", data={"token": seeded.vision.token}, headers=ORIGIN, follow_redirects=False)
    assert good.status_code == 303
    assert good.headers["location"] == "/ui/fleet"
    cookie = good.headers["set-cookie"]
    assert cookie.startswith("gpufleet_ui=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/ui" in cookie
    assert "Secure" not in cookie  # plain http here; over https the cookie is Secure


def test_the_cookie_is_secure_over_https(seeded: Seeded) -> None:
    r = seeded.client.post(
        "https://testserver/ui/login",
        data={"token": seeded.vision.token},
        headers={"Origin": "https://testserver"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert "Secure" in r.headers["set-cookie"]


def test_a_revoked_token_goes_back_to_the_login_page_and_logout_forgets_the_cookie(seeded: Seeded) -> None:
    browser = seeded.login(seeded.vision.token)
    assert browser.get("/ui/fleet").status_code == 200
    tokens = seeded.client.get("/v1/tokens?team=vision", headers=seeded.admin).json()
    for token in tokens:
        assert seeded.client.delete(f"/v1/tokens/{token['id']}", headers=seeded.admin).status_code == 204
    r = browser.get("/ui/fleet", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login"
    assert 'gpufleet_ui=""' in r.headers["set-cookie"]  # the revoked token is dropped from the browser

    admin = seeded.login(seeded.admin_token)
    assert admin.post("/ui/logout", follow_redirects=False).status_code == 403  # no Origin: refused
    out = admin.post("/ui/logout", headers=ORIGIN, follow_redirects=False)
    assert out.status_code == 303
    assert 'gpufleet_ui=""' in out.headers["set-cookie"]
    assert admin.get("/ui/fleet", follow_redirects=False).status_code == 303


def _session_cookie(browser: TestClient) -> str:
    value = browser.cookies.get(COOKIE)
    assert value
    return str(value)


def test_the_cookie_is_a_random_session_id_kept_hashed_never_the_token(seeded: Seeded) -> None:
    """Finding 9 of issue 21: the cookie was the raw API token. Now it names a server-side session."""
    r = seeded.client.post("/ui/login", data={"token": seeded.vision.token}, headers=ORIGIN, follow_redirects=False)
    assert r.status_code == 303
    assert seeded.vision.token not in r.headers["set-cookie"]
    assert seeded.vision.token.removeprefix("gpf_") not in r.headers["set-cookie"]
    assert "Max-Age=28800" in r.headers["set-cookie"]  # 8 hours, as the session in SQL
    first, second = (
        _session_cookie(seeded.login(seeded.vision.token)),
        _session_cookie(seeded.login(seeded.vision.token)),
    )
    assert first != second
    assert first.startswith("gps_")
    assert len(first) >= 40
    with seeded.wiring.engine.connect() as conn:
        stored = {row[0] for row in conn.execute(text("SELECT id_hash FROM ui_sessions"))}
    assert hashlib.sha256(first.encode()).hexdigest() in stored  # only the hash is kept
    assert not [s for s in stored if first in s or seeded.vision.token in s]
    # the session id is no API token: the REST API refuses it
    bearer = {"Authorization": f"Bearer {first}"}
    assert seeded.client.get("/v1/workloads", headers=bearer).status_code == 401


def test_logout_ends_the_session_on_the_server_not_just_in_the_browser(seeded: Seeded) -> None:
    browser = seeded.login(seeded.vision.token)
    stolen = _session_cookie(browser)
    assert browser.post("/ui/logout", headers=ORIGIN, follow_redirects=False).status_code == 303
    replay = TestClient(seeded.client.app, base_url=BASE, cookies={COOKIE: stolen})
    r = replay.get("/ui/fleet", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login"
    assert seeded.login(seeded.vision.token).get("/ui/fleet").status_code == 200  # the token itself still works


def test_a_session_expires(seeded: Seeded) -> None:
    now = [utc_now()]
    app = create_app(
        ApiContext(
            uow_factory=seeded.wiring.uow,
            subject_prefix=seeded.wiring.settings.subject_prefix,
            gauges=SqlFleetGauges(seeded.wiring.engine),
            clock=lambda: now[0],
            session_ttl=timedelta(hours=1),
        )
    )
    browser = TestClient(app, base_url=BASE)
    login = browser.post("/ui/login", data={"token": seeded.vision.token}, headers=ORIGIN, follow_redirects=False)
    assert login.status_code == 303
    assert "Max-Age=3600" in login.headers["set-cookie"]
    kept = _session_cookie(browser)
    now[0] += timedelta(minutes=59)
    assert browser.get("/ui/queues").status_code == 200
    now[0] += timedelta(minutes=2)
    late = TestClient(app, base_url=BASE, cookies={COOKIE: kept})  # a browser that kept it past Max-Age
    r = late.get("/ui/queues", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login"


def test_deleting_the_tokens_team_ends_its_sessions(seeded: Seeded) -> None:
    c, admin = seeded.client, seeded.admin
    assert c.post("/v1/teams", json={"name": "ops"}, headers=admin).status_code == 201
    token = c.post("/v1/tokens", json={"name": "ops-ci", "team": "ops"}, headers=admin).json()["token"]
    browser = seeded.login(token)
    assert browser.get("/ui/workloads").status_code == 200
    assert c.delete("/v1/teams/ops", headers=admin).status_code == 204
    r = browser.get("/ui/workloads", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login"
    with seeded.wiring.engine.connect() as conn:  # the token went with its team, and its sessions with it
        assert conn.execute(text("SELECT count(*) FROM ui_sessions")).scalar() == 0


def test_a_token_holds_a_bounded_number_of_sessions(seeded: Seeded) -> None:
    browsers = [seeded.login(seeded.llm.token) for _ in range(MAX_SESSIONS_PER_TOKEN + 2)]
    with seeded.wiring.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ui_sessions")).scalar() == MAX_SESSIONS_PER_TOKEN
    assert browsers[-1].get("/ui/fleet").status_code == 200
    assert browsers[0].get("/ui/fleet", follow_redirects=False).status_code == 303  # the oldest one ended


def test_a_bearer_header_works_like_the_cookie(seeded: Seeded) -> None:
    r = seeded.client.get("/ui/queues", headers=seeded.vision.headers)
    assert r.status_code == 200
    assert "vision-train" in r.text


def test_pages_carry_a_strict_content_security_policy_and_no_inline_script(seeded: Seeded) -> None:
    browser = seeded.login(seeded.admin_token)
    for path in ["/ui/login", *PAGES]:
        r = browser.get(path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "default-src 'none'" in csp
        assert "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        assert r.headers["cache-control"] == "no-store"
        assert not re.search(r"<script(?![^>]*\bsrc=)", r.text), path  # every script is a file
        assert not re.search(r"<[^>]*\son[a-z]+\s*=", r.text, flags=re.I), path  # no inline handlers


def test_fleet_page_shows_clusters_and_gpus_by_model_and_sharing_mode(seeded: Seeded) -> None:
    text = _text(seeded.login(seeded.vision.token).get("/ui/fleet").text)
    assert "2 clusters; 32 of 44 GPUs allocated to live runs, 12 free." in text
    assert "Cluster sim-h100" in text
    assert "Cluster sim-mixed" in text
    assert "H100-80GB exclusive 32 32 0" in text  # a, b (vision) and secret (llm): 4 nodes x 8 taken
    assert "L4 time-slice, 4 per GPU 8 0 8" in text
    assert "A100-80GB MIG (all-balanced) 4 0 4" in text


def test_queue_page_shows_bars_and_only_the_callers_own_team(seeded: Seeded) -> None:
    admin = seeded.login(seeded.admin_token).get("/ui/queues").text
    assert "llm-train" in admin
    assert "vision-train" in admin
    vision = seeded.login(seeded.vision.token).get("/ui/queues")
    text = _text(vision.text)
    assert "llm" not in text
    # vision-train: 24 gpu-eq used of a 48 limit, nothing guaranteed so all of it borrowed; a and b
    # admitted (not running: no cluster reported yet), c waits, and has waited seconds.
    assert re.search(r"queue vision-train gpu-eq 0 24 24 48 1 100% 0 2 1 quota-limit 1 \d+ s", text), text
    svg = re.search(r"<svg.*?</svg>", vision.text, flags=re.S)
    assert svg is not None
    assert 'class="quota-row" data-name="· vision-train"' in svg.group(0)
    assert "vision-train: used 24 gpu-eq" in svg.group(0)


def test_workload_page_says_why_it_waits_and_other_teams_workloads_are_404(seeded: Seeded) -> None:
    vision = seeded.login(seeded.vision.token)
    text = _text(vision.get(f"/ui/workloads/{seeded.ids['c']}").text)
    assert (
        "why pending quota: vision-train limit is 48 gpu-eq and its work in use leaves less than the 32 this gang needs"
        in text
    )
    assert "queue position 1" in text
    assert "pods workers: 4 \u00d7 8 GPU (H100-80GB)" in text  # the models it asks for
    listing = _text(vision.get("/ui/workloads?state=queued").text)
    assert re.search(
        r" c vision vision-train queued 4 \u00d7 8 GPU H100-80GB batch \(100\) (just now|\d+ s ago) 1 quota:", listing
    ), listing
    assert "secret" not in _text(vision.get("/ui/workloads").text)
    other = vision.get(f"/ui/workloads/{seeded.ids['secret']}")
    assert other.status_code == 404
    assert "secret" not in other.text
    assert "no workload" in other.text
    assert seeded.login(seeded.llm.token).get(f"/ui/workloads/{seeded.ids['secret']}").status_code == 200
    assert vision.get("/ui/workloads/" + "x" * 500).status_code == 404  # a long id is not looked up


def test_a_run_on_lent_capacity_names_the_gang_it_was_held_for(seeded: Seeded) -> None:
    """A run admitted on capacity a reservation lent links the waiting gang it borrowed from (it
    takes the capacity back when it can start); a run not lent says nothing of the kind."""
    with seeded.wiring.engine.begin() as conn:
        conn.execute(
            text("UPDATE runs SET lent_to = :owner WHERE workload_id = :borrower"),
            {"owner": seeded.ids["c"], "borrower": seeded.ids["a"]},
        )
    vision = seeded.login(seeded.vision.token)
    page = vision.get(f"/ui/workloads/{seeded.ids['a']}")
    assert page.status_code == 200
    assert f'(on capacity held for <a href="/ui/workloads/{seeded.ids["c"]}">' in page.text
    assert "on capacity held for" not in vision.get(f"/ui/workloads/{seeded.ids['b']}").text


def test_hostile_text_is_shown_as_text(seeded: Seeded) -> None:
    # Names are DNS labels, so the hostile string cannot be a workload name: refused with a reason.
    r = seeded.client.post(
        "/v1/workloads", json={"name": HOSTILE, "queue": "vision-train", "pod_sets": []}, headers=seeded.vision.headers
    )
    assert r.status_code == 422
    # Free text can hold it: a cancel reason is shown on the workload page and in the feed.
    r = seeded.client.post(
        f"/v1/workloads/{seeded.ids['c']}/cancel", json={"reason": HOSTILE}, headers=seeded.vision.headers
    )
    assert r.status_code == 200, r.text
    browser = seeded.login(seeded.vision.token)
    escaped = "&lt;img src=x onerror=alert(1)&gt;"
    for path in [f"/ui/workloads/{seeded.ids['c']}", "/ui/events", f"/ui/workloads?name={HOSTILE[:60]}"]:
        page = browser.get(path)
        assert page.status_code == 200, path
        assert HOSTILE not in page.text, path
        assert escaped in page.text, path
    feed = browser.get("/ui/events.json").json()
    assert any(HOSTILE in e["summary"] for e in feed)  # JSON for textContent, never parsed as markup


@pytest.mark.parametrize(
    "path",
    [
        "/ui/workloads?name=" + "x" * 64,
        "/ui/workloads?queue=" + "q" * 64,
        "/ui/workloads?offset=-1",
        "/ui/workloads?offset=99999999999",
        "/ui/workloads?state=sleeping",
        "/ui/utilization?range=1y",
        "/ui/events.json?limit=1000",
        "/ui/events.json?after=-5",
    ],
)
def test_parameters_are_bounded(seeded: Seeded, path: str) -> None:
    r = seeded.login(seeded.admin_token).get(path)
    assert r.status_code == 422, path
    if ".json" not in path:
        assert "Not understood" in r.text
        assert r.headers["content-type"].startswith("text/html")


def _mark_idle(seeded: Seeded, names: tuple[str, ...]) -> None:
    """Start these workloads' runs and record the idle policy's notify finding for each."""
    now = utc_now()
    with seeded.wiring.uow() as uow:
        for name in names:  # the idle policy judges running runs: these now run
            view = uow.workloads.view(seeded.ids[name])
            assert view is not None
            assert uow.runs.set_state(view.runs[-1].id, ("admitted",), "running", "started", now)
        runs = {c.workload_id: c for c in uow.idle.candidates()}
        for name in names:
            run = runs[seeded.ids[name]]
            window = {"window_start": (now - timedelta(minutes=5)).isoformat(), "status": "idle"}
            finding = IdleFinding(
                run.run_id,
                run.workload_id,
                run.cluster,
                "idle",
                "notify",
                2,
                f"GPU activity of {name} below 5% for 2 windows",
                ({**window, "gpus_reporting": 8, "max_activity": 0.01},),
                "requeue",
                now,
                now,
            )
            uow.idle.put_finding(finding)
        uow.commit()


def test_idle_page_and_event_feed_show_only_the_callers_team(seeded: Seeded) -> None:
    _mark_idle(seeded, ("a", "secret"))
    vision = _text(seeded.login(seeded.vision.token).get("/ui/idle").text)
    assert "flagged: notify" in vision
    assert "GPU activity of a below 5% for 2 windows" in vision
    assert "secret" not in vision
    admin = _text(seeded.login(seeded.admin_token).get("/ui/idle").text)
    assert "GPU activity of secret below 5%" in admin

    feed = seeded.login(seeded.vision.token).get("/ui/events.json").json()
    assert feed
    assert {e["team"] for e in feed} == {"vision"}
    assert [e["seq"] for e in feed] == sorted((e["seq"] for e in feed), reverse=True)
    newest = feed[0]["seq"]
    assert seeded.login(seeded.vision.token).get(f"/ui/events.json?after={newest}").json() == []
    everyone = seeded.login(seeded.admin_token).get("/ui/events.json").json()
    assert {"vision", "llm"} <= {e["team"] for e in everyone}


def test_utilization_page_plots_allocated_and_used_per_team(seeded: Seeded) -> None:
    admin = seeded.login(seeded.admin_token).get("/ui/utilization?range=6h")
    assert admin.status_code == 200
    # Admitted runs hold GPUs from admission on: each team has a chart with both lines.
    for team in ("vision", "llm"):
        assert f"Team {team}: allocated vs used GPU-hours per 15 min" in admin.text
    assert admin.text.count("<svg") == 2
    vision = seeded.login(seeded.vision.token).get("/ui/utilization").text
    assert "Team vision" in vision
    assert "Team llm" not in vision


def test_idle_decisions_stay_visible_behind_many_newer_workload_events(seeded: Seeded) -> None:
    prefix, now = seeded.wiring.settings.subject_prefix, utc_now()
    with seeded.wiring.uow() as uow:
        for team, workload in (("vision", "a"), ("llm", "secret")):
            data = {"workload_id": seeded.ids[workload], "workload": workload, "team": team, "stage": "reclaim"}
            event_id, payload = envelope("idle.reclaim", data, now)
            uow.outbox.add(f"{prefix}.events.idle.sim-h100", event_id, payload, now)
        busy = []
        for i in range(300):  # a busy fleet: far more workload events than one page reads
            event_id, payload = envelope("workload.queued", {"team": "vision", "name": f"w{i}"}, now)
            busy.append((f"{prefix}.events.workload.vision.vision-train.queued", event_id, payload))
        uow.outbox.add_many(busy, now)
        uow.commit()
    vision = seeded.login(seeded.vision.token).get("/ui/idle").text
    decisions = _text(vision.split('id="idle-decisions"', 1)[1])
    assert "idle.reclaim a vision stage reclaim" in decisions
    assert "secret" not in decisions
    admin = _text(seeded.login(seeded.admin_token).get("/ui/idle").text.split('id="idle-decisions"', 1)[1])
    assert "idle.reclaim secret llm stage reclaim" in admin


def test_audit_page_shows_the_callers_findings_with_evidence_and_fix(seeded: Seeded) -> None:
    _mark_idle(seeded, ("a", "secret"))
    vision = _text(seeded.login(seeded.vision.token).get("/ui/audit").text)
    assert "run holds idle GPUs idle-run" in vision
    assert "of a (team vision, 8 GPUs) has been idle for 2 window(s): stage notify" in vision
    assert "stop or scale down the idle run" in vision
    assert "secret" not in vision  # another team's run is not shown
    assert "llm" not in vision
    html = seeded.login(seeded.admin_token).get("/ui/audit").text
    admin = _text(html)
    assert "of secret (team llm" in admin
    counts = re.search(r"(\d+) critical (\d+) high (\d+) warning (\d+) info", admin)
    assert counts is not None
    assert sum(int(n) for n in counts.groups()) == html.count('<tr class="severity-') >= 2
