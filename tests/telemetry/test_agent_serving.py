"""The agent's serving scrape against real local HTTP servers: vLLM's metrics text into request rates
and latencies, pods found through a Kubernetes API listing, and the readings published in the batch;
and simulated clusters publishing their runs' `sim.traffic_rps`."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from kubernetes import client

from adapters.dcgm.exposition import RunResolver
from adapters.kubernetes.serving_pods import pod_lister
from adapters.sim.cluster import SimCluster
from controlplane.agent.dcgm import AgentConfig, scrape_once
from controlplane.agent.serving import (
    SERVING_ANNOTATION,
    ServingRound,
    ServingScraper,
    ServingTarget,
    lister_targets,
    pod_targets,
)
from controlplane.service.ports import PodOrder, RunOrder
from controlplane.service.telemetry_wire import decode_message
from tests.telemetry import samples
from tests.telemetry.vllm_samples import vllm_metrics

T0 = 1_767_600_000.0


class Server:
    """A local HTTP server answering GET with whatever `answer(path)` returns: (status, body)."""

    def __init__(self, answer: Callable[[str], tuple[int, str]]) -> None:
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.paths.append(self.path)
                status, body = answer(self.path)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Vllm:
    """A vLLM server whose counters the test moves between scrapes."""

    def __init__(self) -> None:
        self.totals = (0, 0, 0.0, 0)  # stop, length, latency sum (s), latency count
        self.server = Server(lambda path: (200, vllm_metrics(*self.totals)) if path == "/metrics" else (404, ""))
        self.url = f"http://127.0.0.1:{self.server.port}/metrics"


@pytest.fixture
def vllm() -> Iterator[Vllm]:
    server = Vllm()
    yield server
    server.server.close()


def target(url: str, run: str = "run-a", pod: str = "gpufleet/run-a-0") -> ServingTarget:
    return ServingTarget(run, pod, url, "vllm:request_success_total", "vllm:e2e_request_latency_seconds")


async def test_rates_and_latency_from_two_scrapes_of_vllm(vllm: Vllm) -> None:
    scraper = ServingScraper()
    async with httpx.AsyncClient() as http:
        vllm.totals = (100, 20, 60.0, 120)
        assert await scraper.scrape(http, [target(vllm.url)], T0) == []  # no previous totals: no rate yet
        vllm.totals = (150, 30, 96.0, 180)  # 60 more requests in 10 s, 36 s of latency among them
        [reading] = await scraper.scrape(http, [target(vllm.url)], T0 + 10)
        assert reading.run_id == "run-a"
        assert reading.observed_at == datetime.fromtimestamp(T0 + 10, UTC)
        assert reading.requests_per_second == pytest.approx(6.0)
        assert reading.latency_ms == pytest.approx(600.0)
        # No request in the interval: zero traffic, and no latency (not a latency of zero).
        [quiet] = await scraper.scrape(http, [target(vllm.url)], T0 + 20)
        assert (quiet.requests_per_second, quiet.latency_ms) == (0.0, None)
        # The server restarted: its counters start again from zero and count as the increase.
        vllm.totals = (5, 0, 1.0, 5)
        [restarted] = await scraper.scrape(http, [target(vllm.url)], T0 + 30)
        assert restarted.requests_per_second == pytest.approx(0.5)
        assert restarted.latency_ms == pytest.approx(200.0)


async def test_a_runs_pods_add_up_and_failures_give_no_reading(vllm: Vllm) -> None:
    other = Vllm()
    broken = Server(lambda _path: (500, "oops"))
    try:
        pods = [
            target(vllm.url, pod="gpufleet/run-a-0"),
            target(other.url, pod="gpufleet/run-a-1"),
            target(f"http://127.0.0.1:{broken.port}/metrics", run="run-b", pod="gpufleet/run-b-0"),
        ]
        scraper = ServingScraper()
        async with httpx.AsyncClient() as http:
            await scraper.scrape(http, pods, T0)
            vllm.totals, other.totals = (10, 0, 1.0, 10), (30, 0, 9.0, 30)
            readings = await scraper.scrape(http, pods, T0 + 10)
        assert [r.run_id for r in readings] == ["run-a"]  # run-b's server fails: unknown, not zero
        assert readings[0].requests_per_second == pytest.approx(4.0)
        assert readings[0].latency_ms == pytest.approx(250.0)  # 10 s over 40 requests
        assert scraper.failures == 2
    finally:
        other.server.close()
        broken.close()


def _pod(name: str, run: str, serving: dict[str, Any] | str | None, **status: str) -> dict[str, Any]:
    annotations = (
        {} if serving is None else {SERVING_ANNOTATION: serving if isinstance(serving, str) else json.dumps(serving)}
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "gpufleet",
            "labels": {"gpufleet.io/run": run},
            "annotations": annotations,
        },
        "status": {"phase": "Running", "podIP": "10.0.0.7", **status},
    }


def test_targets_from_pods_take_only_running_declared_pods() -> None:
    declared = {"traffic_metric": "vllm:request_success_total", "metrics_port": 8000, "metrics_path": "/metrics"}
    pods = [
        _pod("a-0", "run-a", declared),
        _pod("b-0", "run-b", None),  # declares nothing
        _pod("c-0", "run-c", declared, phase="Pending"),
        _pod("d-0", "run-d", "{not json"),
        _pod("e-0", "run-e", {"traffic_metric": "bad name!"}),
        _pod("f-0", "run-f", declared, podIP="fd00::7"),
        {
            **_pod("g-0", "run-g", declared),
            "metadata": {**_pod("g-0", "run-g", declared)["metadata"], "namespace": "x"},
        },
    ]
    found = pod_targets(pods, ["gpufleet"])
    assert [(t.run_id, t.url) for t in found] == [
        ("run-a", "http://10.0.0.7:8000/metrics"),
        ("run-f", "http://[fd00::7]:8000/metrics"),
    ]
    assert found[0].traffic_metric == "vllm:request_success_total"
    assert found[0].latency_metric is None


async def test_pods_listed_through_the_kubernetes_api_then_scraped_and_published(vllm: Vllm) -> None:
    declared = {
        "traffic_metric": "vllm:request_success_total",
        "latency_metric": "vllm:e2e_request_latency_seconds",
        "metrics_port": vllm.server.port,
        "metrics_path": "/metrics",
    }
    pod = _pod("chat-0", "run-chat", declared, podIP="127.0.0.1")
    api = Server(lambda path: (200, json.dumps({"kind": "PodList", "items": [pod]})))
    dcgm = Server(lambda _path: (200, samples.L40S_POD))
    published: list[tuple[str, bytes, str]] = []

    class Publisher:
        async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
            published.append((subject, payload, msg_id))

    try:
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{api.port}"
        lister = pod_lister(client.ApiClient(cfg), node="gpu-node-1")
        round_ = ServingRound(lister_targets(lister, ["gpufleet"]), ServingScraper())
        config = AgentConfig(cluster="c1", dcgm_url=f"http://127.0.0.1:{dcgm.port}/metrics", node="gpu-node-1")
        resolver = RunResolver(pod_run=lambda _ns, _pod: None)
        async with httpx.AsyncClient() as http:
            vllm.totals = (10, 0, 2.0, 10)
            first = await scrape_once(http, config, resolver, Publisher(), T0, round_)
            vllm.totals = (40, 0, 11.0, 40)
            second = await scrape_once(http, config, resolver, Publisher(), T0 + 10, round_)
    finally:
        api.close()
        dcgm.close()
    # The listing asked for gpufleet's pods on this node only.
    listed = urlsplit(api.paths[0])
    assert listed.path == "/api/v1/namespaces/gpufleet/pods"
    assert parse_qs(listed.query) == {
        "labelSelector": ["gpufleet.io/run"],
        "fieldSelector": ["spec.nodeName=gpu-node-1"],
    }
    assert (first.serving, second.serving) == (0, 1)
    subject, payload, _ = published[-1]
    assert subject == "gpufleet.telemetry.c1.dcgm"
    items, readings = decode_message(payload, "c1", datetime.fromtimestamp(T0 + 10, UTC))
    assert len(items) == 1  # the DCGM sample rides along as before
    [reading] = readings
    assert reading.run_id == "run-chat"
    assert reading.requests_per_second == pytest.approx(3.0)
    assert reading.latency_ms == pytest.approx(300.0)


async def test_simulated_clusters_publish_the_declared_traffic_of_their_runs(tmp_path: Path) -> None:
    sent: list[tuple[str, bytes, str]] = []

    async def publish(subject: str, payload: bytes, msg_id: str) -> None:
        sent.append((subject, payload, msg_id))

    now = [T0]
    cluster = SimCluster("sim-l4", publish, "p", tmp_path / "sim.json", start_delay=1.0, clock=lambda: now[0])
    cluster.telemetry_interval = 10.0

    def order(run_id: str, sim: dict[str, Any]) -> RunOrder:
        pod = PodOrder("s", 0, "node-1", "pool", {"gpu": 1})
        return RunOrder(run_id, "w", "w", "t", "q", "sim-l4", 1, 1, "batch", 1, (pod,), None, {"sim": sim})

    await cluster.apply(order("run-quiet", {"traffic_rps": 0, "latency_ms": 80}))
    await cluster.apply(order("run-chat", {"traffic_rps": 12.5}))
    await cluster.apply(order("run-train", {}))
    await cluster.apply(order("run-bad", {"traffic_rps": "lots"}))
    now[0] += 5  # the pods run
    # Another process driving the same cluster file sees the same runs and signals.
    again = SimCluster("sim-l4", publish, "p", tmp_path / "sim.json", clock=lambda: now[0])
    assert again.runs["run-chat"].traffic_rps == 12.5
    assert await cluster.emit_telemetry() == 4  # one GPU sample per run
    subject, payload, _ = sent[-1]
    assert subject == "p.telemetry.sim-l4.dcgm"
    _, readings = decode_message(payload, "sim-l4", datetime.fromtimestamp(now[0], UTC))
    assert [(r.run_id, r.requests_per_second, r.latency_ms) for r in readings] == [
        ("run-quiet", 0.0, 80.0),
        ("run-chat", 12.5, None),
    ]
