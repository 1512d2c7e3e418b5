"""The dashboard's working pages over HTTP: the workload list (GPU ask, model, priority, age, state
filters with counts, sorting, grouping, server-side paging), cancelling from a page (the API's
service call and ownership rule, behind a per-session form token and a same-origin check), the
fleet's per-pool figures, pending demand and node view, folded and filtered events, relative
times and the utilization range picker."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text as sql

from controlplane.api.ui.session import COOKIE, csrf_token
from controlplane.bootstrap import utc_now
from controlplane.service.events import envelope
from tests.integration.fleet import gang
from tests.ui.conftest import BASE, ORIGIN, Seeded
from tests.ui.test_dashboard_http import _mark_idle, _text


def _form_token(browser: TestClient, path: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', browser.get(path).text)
    assert found is not None, path
    return found.group(1)


def _submit(seeded: Seeded, body: dict[str, object]) -> str:
    r = seeded.client.post("/v1/workloads", json=body, headers=seeded.vision.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _state(seeded: Seeded, workload_id: str) -> str:
    return str(seeded.client.get(f"/v1/workloads/{workload_id}", headers=seeded.admin).json()["state"])


def test_the_list_shows_gpus_model_priority_and_age_and_a_mig_gang_as_mig(seeded: Seeded) -> None:
    mig = _submit(
        seeded,
        gang(
            "slices",
            "vision-train",
            pod_sets=[{"name": "workers", "replicas": 2, "mig_profile": "1g.10gb", "gpu_models": ["A100-80GB"]}],
        ),
    )
    vision = seeded.login(seeded.vision.token)
    html = vision.get("/ui/workloads").text
    text = _text(html)
    assert re.search(
        r" slices vision vision-train queued 2 \u00d7 MIG 1g\.10gb A100-80GB batch \(100\) just now ", text
    )
    assert re.search(
        r" c vision vision-train queued 4 \u00d7 8 GPU H100-80GB batch \(100\) (just now|\d+ s ago) ", text
    )
    assert re.search(r" b vision vision-train admitted 2 \u00d7 8 GPU any batch \(100\) ", text)
    # The exact time is on hover (and machine-readable), the relative one is what is read.
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">', html)
    page = _text(vision.get(f"/ui/workloads/{mig}").text)
    assert "pods workers: 2 \u00d7 MIG 1g.10gb (A100-80GB)" in page
    assert "GPU model A100-80GB" in page
    # An admitted gang that asked for any model shows the model it was placed on.
    placed = _text(vision.get(f"/ui/workloads/{seeded.ids['b']}").text)
    assert "GPU model H100-80GB (where its latest run was placed)" in placed


def test_state_filters_carry_counts_and_combine(seeded: Seeded) -> None:
    admin = seeded.login(seeded.admin_token)
    html = admin.get("/ui/workloads?state=queued&state=admitted").text
    chips = _text(html.split('id="workload-filters"', 1)[1].split("</fieldset>", 1)[0])
    assert "queued 1" in chips  # c
    assert "admitted 3" in chips  # a, b and secret
    assert "running 0" in chips
    assert "1\u20134 of 4 workloads" in _text(html)
    only_queued = _text(admin.get("/ui/workloads?state=queued").text)
    assert "1\u20131 of 1 workloads" in only_queued
    assert " c vision" in only_queued
    assert " a vision" not in only_queued
    # A team's counts are its own.
    vision = _text(seeded.login(seeded.vision.token).get("/ui/workloads").text)
    assert "1\u20133 of 3 workloads" in vision


def test_sorting_grouping_and_server_side_paging(seeded: Seeded) -> None:
    ids = [_submit(seeded, gang(f"bulk-{i:02d}", "vision-train", replicas=1, gpus=1)) for i in range(52)]
    vision = seeded.login(seeded.vision.token)
    first = vision.get("/ui/workloads?sort=oldest").text
    names = re.findall(r'<a href="/ui/workloads/[^"]+">([^<]+)</a>', first)
    assert names[:4] == ["a", "b", "c", "bulk-00"]
    assert len(names) == 50
    assert "1\u201350 of 55 workloads" in _text(first)
    following = re.search(r'href="([^"]+)" rel="next"', first)
    assert following is not None
    second = vision.get(following.group(1).replace("&amp;", "&")).text
    assert re.findall(r'<a href="/ui/workloads/[^"]+">([^<]+)</a>', second) == [
        "bulk-47",
        "bulk-48",
        "bulk-49",
        "bulk-50",
        "bulk-51",
    ]
    assert "51\u201355 of 55 workloads" in _text(second)
    assert 'rel="prev"' in second
    by_name = re.findall(r'<a href="/ui/workloads/[^"]+">([^<]+)</a>', vision.get("/ui/workloads?sort=name").text)
    assert by_name[:3] == ["a", "b", "bulk-00"]
    # Grouped by state: rows in state order, each group headed by its count (of all pages).
    grouped = vision.get("/ui/workloads?group=state").text
    headings = re.findall(r'<tr class="group"><th[^>]*>([^<]+)<span class="count">([^<]+)</span>', grouped)
    assert [(h.strip(), n) for h, n in headings] == [
        ("state admitted", "2 workloads"),
        ("state queued", "53 workloads"),
    ]
    assert re.search(r"grouped by state: admitted 2 ?, queued 53", _text(grouped))
    assert len(ids) == 52


def test_cancel_from_the_page_uses_the_apis_rules_and_needs_the_sessions_form_token(seeded: Seeded) -> None:
    vision = seeded.login(seeded.vision.token)
    c = seeded.ids["c"]
    token = _form_token(vision, "/ui/workloads")
    assert token == csrf_token_of(vision)
    # A cross-site post without the token (what a forged form on another site sends) is refused,
    # and so is one with the token from another host, or with no token at all from this host.
    forged = vision.post(f"/ui/workloads/{c}/cancel", data={}, headers={"Origin": "https://evil.example"})
    assert forged.status_code == 403
    assert (
        vision.post(
            f"/ui/workloads/{c}/cancel", data={"csrf": token}, headers={"Origin": "https://evil.example"}
        ).status_code
        == 403
    )
    assert vision.post(f"/ui/workloads/{c}/cancel", data={}, headers=ORIGIN).status_code == 403
    assert vision.post(f"/ui/workloads/{c}/cancel", data={"csrf": "0" * 64}, headers=ORIGIN).status_code == 403
    # Another session's token does not do: it is tied to the session.
    other = seeded.login(seeded.vision.token)
    assert _form_token(other, "/ui/workloads") != token
    assert (
        vision.post(
            f"/ui/workloads/{c}/cancel", data={"csrf": _form_token(other, "/ui/workloads")}, headers=ORIGIN
        ).status_code
        == 403
    )
    assert _state(seeded, c) == "queued"
    # Another team's workload is not found, exactly as the API answers.
    secret = vision.post(f"/ui/workloads/{seeded.ids['secret']}/cancel", data={"csrf": token}, headers=ORIGIN)
    assert secret.status_code == 404
    assert _state(seeded, seeded.ids["secret"]) == "admitted"
    # The real thing: cancelled, back to the page the form was on (never to another site).
    done = vision.post(
        f"/ui/workloads/{c}/cancel",
        data={"csrf": token, "back": "/ui/workloads?state=queued&offset=0"},
        headers=ORIGIN,
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/ui/workloads?state=queued&offset=0"
    assert _state(seeded, c) == "cancelled"
    events = seeded.client.get("/ui/events.json", headers=seeded.vision.headers).json()
    assert any(e["type"] == "workload.cancelled" and e["workload_id"] == c for e in events)
    assert "cancelled from the dashboard by its team" in _text(vision.get(f"/ui/workloads/{c}").text)
    # No cancel button on a cancelled workload; the running ones keep theirs.
    assert f'action="/ui/workloads/{c}/cancel"' not in vision.get("/ui/workloads").text
    assert f'action="/ui/workloads/{seeded.ids["a"]}/cancel"' in vision.get("/ui/workloads").text
    away = vision.post(
        f"/ui/workloads/{seeded.ids['a']}/cancel",
        data={"csrf": token, "back": "//evil.example/x"},
        headers=ORIGIN,
        follow_redirects=False,
    )
    assert away.headers["location"] == f"/ui/workloads/{seeded.ids['a']}"
    # A finished workload cannot be cancelled: the API's 409, as a page.
    with seeded.wiring.engine.begin() as conn:
        conn.execute(sql("UPDATE workloads SET state = 'succeeded' WHERE id = :id"), {"id": seeded.ids["b"]})
    finished = vision.post(f"/ui/workloads/{seeded.ids['b']}/cancel", data={"csrf": token}, headers=ORIGIN)
    assert finished.status_code == 409
    assert "already succeeded" in finished.text
    # A script with a Bearer header carries no ambient credential: the origin check is enough.
    script = TestClient(seeded.client.app, base_url=BASE)
    r = script.post(
        f"/ui/workloads/{seeded.ids['secret']}/cancel", headers={**seeded.llm.headers, **ORIGIN}, follow_redirects=False
    )
    assert r.status_code == 303
    assert _state(seeded, seeded.ids["secret"]) == "cancelled"


def csrf_token_of(browser: TestClient) -> str:
    """The form token the server derives for this browser's session (what its pages carry)."""
    session = browser.cookies.get(COOKIE)
    assert session

    class _Request:  # the one attribute `csrf_token` reads
        cookies = {COOKIE: session}

    return csrf_token(_Request())  # type: ignore[arg-type]


def test_fleet_page_shows_allocated_used_idle_and_pending_per_pool_and_a_node_view(seeded: Seeded) -> None:
    _mark_idle(seeded, ("a",))
    admin = seeded.login(seeded.admin_token)
    text = _text(admin.get("/ui/fleet").text)
    # h100: 4 nodes x 8; a, b and secret hold 32; a (8) is flagged idle; c (4 x 8 on H100) waits.
    # No DCGM windows in this test: "used" says unmeasured rather than 0.
    assert "h100 H100-80GB exclusive 4 32 32 unmeasured 8 0 32 no" in text, text
    assert "a100-mig A100-80GB MIG (all-balanced) 2 4 0 unmeasured 0 4 0 no" in text
    assert "H100-80GB 1 4 32" in text.split("Pending demand", 1)[1]  # accepted models, gangs, pods, gpu-eq
    assert "live runs: 1 running, 2 admitted" in text
    nodes = admin.get("/ui/fleet/sim-h100/h100")
    assert nodes.status_code == 200
    rows = _text(nodes.text.split('id="pool-nodes"', 1)[1])
    assert len(re.findall(r" yes 8 8 0 1 ", rows)) == 4  # every node full: one pod of 8 GPUs each
    for name in ("a", "b", "secret"):
        assert f">{name}</a>" in nodes.text
    # A team sees the capacity, and only its own workloads named on the nodes.
    vision = seeded.login(seeded.vision.token).get("/ui/fleet/sim-h100/h100").text
    assert ">a</a>" in vision
    assert "secret" not in vision
    assert "other teams' work" in vision
    assert admin.get("/ui/fleet/sim-h100/nope").status_code == 404
    assert admin.get("/ui/fleet/nope/h100").status_code == 404


def test_events_fold_repeats_and_filter_by_family_and_workload(seeded: Seeded) -> None:
    prefix, now = seeded.wiring.settings.subject_prefix, utc_now()
    with seeded.wiring.uow() as uow:
        for i in range(3):  # the same sentence three times about one workload
            data = {
                "workload_id": seeded.ids["a"],
                "workload": "a",
                "team": "vision",
                "reason": "all pods succeeded",
                "message": "all pods succeeded",
            }
            event_id, payload = envelope("workload.succeeded", data, now + timedelta(seconds=i))
            uow.outbox.add(f"{prefix}.events.workload.vision.vision-train.succeeded", event_id, payload, now)
        data = {"workload_id": seeded.ids["a"], "workload": "a", "team": "vision", "stage": "notify"}
        event_id, payload = envelope("idle.notify", data, now)
        uow.outbox.add(f"{prefix}.events.idle.sim-h100", event_id, payload, now)
        uow.commit()
    vision = seeded.login(seeded.vision.token)
    html = vision.get("/ui/events").text
    text = _text(html)
    assert "workload.succeeded \u00d7 3 a vision all pods succeeded " in text  # said once, counted
    assert "all pods succeeded; all pods succeeded" not in text
    idle_only = _text(vision.get("/ui/events?family=idle").text)
    assert "idle.notify" in idle_only
    assert "workload.succeeded" not in idle_only
    only_c = _text(vision.get("/ui/events?workload=c").text)
    assert " c vision" in only_c
    assert " a vision" not in only_c
    feed = vision.get("/ui/events.json?family=idle").json()
    assert [e["type"] for e in feed] == ["idle.notify"]
    assert vision.get("/ui/events?family=cluster").status_code == 200  # fleet-wide: none for a team
    assert "No events match." in vision.get("/ui/events?family=cluster").text
    assert 'data-family="idle"' in vision.get("/ui/events?family=idle").text  # the live feed keeps the filter


def test_utilization_offers_ranges_and_narrows_its_default_for_a_young_fleet(seeded: Seeded) -> None:
    admin = seeded.login(seeded.admin_token)
    html = admin.get("/ui/utilization").text
    picker = _text(html.split('id="range-picker"', 1)[1].split("</nav>", 1)[0])
    assert "range: 1h · 6h · 24h · 7d · 30d" in picker
    # Every run began within the hour: the default is the last hour, in 5-minute buckets.
    assert '<strong aria-current="true">1h</strong>' in html
    assert "allocated vs used GPU-hours per 5 min" in html
    day = admin.get("/ui/utilization?range=24h").text
    assert '<strong aria-current="true">24h</strong>' in day
    assert "per 1 h" in day


@pytest.mark.parametrize(
    "path",
    [
        "/ui/workloads?sort=size",
        "/ui/workloads?group=gpus",
        "/ui/events?family=secret",
        "/ui/events.json?workload=" + "w" * 64,
    ],
)
def test_new_parameters_are_bounded(seeded: Seeded, path: str) -> None:
    assert seeded.login(seeded.admin_token).get(path).status_code == 422, path


def test_queue_page_heads_each_cohort_with_its_teams_sums_for_admins(seeded: Seeded) -> None:
    admin = seeded.admin
    r = seeded.client.post("/v1/cohorts", json={"name": "research", "limit": {"gpu-eq": 40}}, headers=admin)
    assert r.status_code == 201, r.text
    for team in ("nlp", "speech"):
        r = seeded.client.post("/v1/teams", json={"name": team, "cohort": "research"}, headers=admin)
        assert r.status_code == 201, r.text
        r = seeded.client.post("/v1/queues", json={"name": f"{team}-q", "team": team}, headers=admin)
        assert r.status_code == 201, r.text
        r = seeded.client.post(
            "/v1/workloads", json=gang(f"{team}-job", f"{team}-q", replicas=1, gpus=1), headers=admin
        )
        assert r.status_code == 201, r.text
    text = _text(seeded.login(seeded.admin_token).get("/ui/queues").text)
    # Nothing runs in the cohort yet; both gangs wait (not yet decided): the cohort sums its teams.
    assert re.search(r"cohort research gpu-eq 0 0 0 40 1 100% 0 0 2 unscheduled 2 \d+ s team nlp ", text), text
    assert text.index("cohort research") < text.index("team nlp") < text.index("team speech")
    assert "cohort research" not in _text(seeded.login(seeded.vision.token).get("/ui/queues").text)
