"""Reads bounded by bytes (issue 21, finding 7): with ten 5,000-pod gangs, some admitted and the
rest queued, the workload list carried every pod's placement (2.8 MB for `?limit=50`) and one
workload's view its 5,000 assignments. Now a list item is a summary (pod sets, counts), a page
stops before `MAX_PAGE_BYTES` with a `next` cursor, and a workload's placement is counted per pool.
Times are measured by `gpufleet dev bench reads`, not asserted here."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.domain.limits import MAX_LABELS, MAX_NODES_SHOWN, MAX_PAGE_BYTES, MAX_PODS_PER_GANG
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import add_tenant, gang, h100_cluster, setup_fleet

GANGS = 10
# 1 GPU per pod on 8-GPU nodes: a gang spans 625 nodes; 1,900 nodes hold three gangs at once.
NODES = 1_900
ADMITTED = 3


def _schedule(wiring: Wiring) -> int:
    epoch = acquire_leadership(wiring.uow, "reads", utc_now(), 60)
    assert epoch is not None
    admitted = 0
    while result := run_cycle(wiring.uow, "reads", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 60):
        admitted += result.admitted
        if not result.admitted:
            return admitted
    return admitted


def _keys(value: Any) -> set[str]:
    """Every key anywhere in a JSON value."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_ten_big_gangs_are_listed_as_summaries_and_shown_with_counted_placements(
    client: TestClient, admin: dict[str, str], wiring: Wiring
) -> None:
    setup_fleet(client, admin, h100_cluster(nodes=NODES))
    team = add_tenant(client, admin, "llm", "llm-train")
    for i in range(GANGS):
        r = client.post(
            "/v1/workloads", json=gang(f"big-{i}", team.queue, replicas=MAX_PODS_PER_GANG, gpus=1), headers=team.headers
        )
        assert r.status_code == 201, r.text
    assert _schedule(wiring) == ADMITTED

    page = client.get("/v1/workloads", params={"limit": 50}, headers=team.headers)
    assert page.status_code == 200, page.text
    assert len(page.content) <= MAX_PAGE_BYTES
    body = page.json()
    assert body["next"] is None
    items = body["items"]
    assert len(items) == GANGS
    assert sorted(w["state"] for w in items) == ["admitted"] * ADMITTED + ["queued"] * (GANGS - ADMITTED)
    # No per-pod detail anywhere in the list: pod sets, counts and the current cluster only.
    assert not _keys(items) & {"runs", "assignments", "nodes", "placement", "index"}
    for w in items:
        assert len(json.dumps(w)) < 2_000, w
        assert w["pods"] == MAX_PODS_PER_GANG
        assert w["pod_sets"] == [{**w["pod_sets"][0], "name": "workers", "replicas": MAX_PODS_PER_GANG, "gpus": 1}]
    running = [w for w in items if w["state"] == "admitted"]
    assert all(w["cluster"] == "sim-h100" and w["node_count"] == 625 and w["attempts"] == 1 for w in running)

    # One admitted gang's view: its placement counted per pod set and pool, a bounded node list.
    shown = client.get(f"/v1/workloads/{running[0]['id']}", headers=team.headers)
    assert shown.status_code == 200, shown.text
    assert len(shown.content) < 16_000, len(shown.content)
    view = shown.json()
    assert "assignments" not in _keys(view)
    [run] = view["runs"]
    assert run["placement"] == [{"pod_set": "workers", "pool": "h100", "pods": MAX_PODS_PER_GANG, "nodes": 625}]
    assert view["node_count"] == 625
    assert view["nodes"] == sorted(view["nodes"])
    assert len(view["nodes"]) == MAX_NODES_SHOWN

    # The dashboard's pages read the same summaries and counts.
    listing = client.get("/ui/workloads", headers=team.headers)
    assert listing.status_code == 200
    assert listing.text.count('<a href="/ui/workloads/wl-') == GANGS  # one link each (and a cancel form)
    page_of_one = client.get(f"/ui/workloads/{running[0]['id']}", headers=team.headers)
    assert page_of_one.status_code == 200
    assert "625 nodes:" in page_of_one.text
    assert f"workers: {MAX_PODS_PER_GANG} on 625 nodes of h100" in page_of_one.text
    assert len(page_of_one.content) < 16_000, len(page_of_one.content)


def test_a_page_stops_before_its_byte_cap_and_next_goes_on(
    client: TestClient, admin: dict[str, str], wiring: Wiring
) -> None:
    setup_fleet(client, admin, h100_cluster(nodes=4))
    team = add_tenant(client, admin, "tagged", "tagged-train")
    # The largest labels a workload may carry (~25 KB a summary): 45 of them pass 1 MiB.
    prefix = ("a" * 62 + ".") * 3 + "a" * 60
    labels = {f"{prefix}/k{n:02d}" + "k" * 59: "v" * 63 for n in range(MAX_LABELS)}
    count = 45
    for i in range(count):
        r = client.post("/v1/workloads", json=gang(f"t-{i}", team.queue, labels=labels), headers=team.headers)
        assert r.status_code == 201, r.text
    seen: list[str] = []
    pages = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        r = client.get("/v1/workloads", params=params, headers=team.headers)
        assert r.status_code == 200, r.text
        assert len(r.content) <= MAX_PAGE_BYTES
        pages += 1
        body = r.json()
        assert body["items"], "a page always carries at least one item"
        seen += [w["name"] for w in body["items"]]
        cursor = body["next"]
        if cursor is None:
            break
    assert pages == 2
    # Newest first, each once, none skipped.
    assert seen == [f"t-{i}" for i in reversed(range(count))]


def test_a_cursor_continues_under_the_same_filters_and_a_malformed_one_gets_a_sentence(
    client: TestClient, admin: dict[str, str], wiring: Wiring
) -> None:
    setup_fleet(client, admin, h100_cluster(nodes=4))
    team = add_tenant(client, admin, "paged", "paged-train")
    for i in range(5):
        assert client.post("/v1/workloads", json=gang(f"p-{i}", team.queue), headers=team.headers).status_code == 201
    first = client.get("/v1/workloads", params={"limit": 2}, headers=team.headers).json()
    assert [w["name"] for w in first["items"]] == ["p-4", "p-3"]
    second = client.get("/v1/workloads", params={"limit": 2, "cursor": first["next"]}, headers=team.headers).json()
    assert [w["name"] for w in second["items"]] == ["p-2", "p-1"]
    last = client.get("/v1/workloads", params={"limit": 2, "cursor": second["next"]}, headers=team.headers).json()
    assert [w["name"] for w in last["items"]] == ["p-0"]
    assert last["next"] is None
    for bad in ("x", "12", "1.", "-1.wl-0", "1.wl 0"):
        r = client.get("/v1/workloads", params={"cursor": bad}, headers=team.headers)
        assert r.status_code == 422, (bad, r.text)
        assert "cursor" in r.json()["detail"]
