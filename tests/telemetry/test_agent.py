"""The agent scrapes a real HTTP endpoint serving dcgm-exporter output and publishes what it read."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import nats
import pytest
from click.testing import CliRunner
from nats.aio.client import Client

from adapters.dcgm.exposition import RunResolver
from adapters.nats.connection import JetStreamPublisher
from adapters.nats.server import NatsServerProcess
from adapters.nats.topology import TELEMETRY_STREAM, ensure_topology
from controlplane.agent.dcgm import AgentConfig, default_resolver, run_agent, scrape_once
from controlplane.cli.main import main
from controlplane.service.telemetry_wire import decode_batch
from tests.gateway import inbound_gateway, inbound_gateway_thread
from tests.telemetry import samples

EXPOSITION = samples.A100_MIG + samples.L40S_FULL


class Exporter:
    """A stand-in dcgm-exporter: serves a fixed exposition on /metrics, or fails on demand."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.status = 200
        self.hits = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                exporter.hits += 1
                data = exporter.body.encode()
                self.send_response(exporter.status if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass  # keep test output quiet; requests are counted in `hits`

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    server = Exporter(EXPOSITION)
    yield server
    server.close()


@pytest.fixture
async def nc(running_nats: NatsServerProcess) -> AsyncIterator[Client]:
    client = await nats.connect(running_nats.url)
    js = client.jetstream()
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream(TELEMETRY_STREAM)
    await ensure_topology(js, "agenttest")
    async with inbound_gateway(client, "agenttest"):  # the agent's batches reach the stream through it
        yield client
    await client.close()


async def _published(nc: Client, n: int) -> list[nats.aio.msg.Msg]:
    sub = await nc.jetstream().pull_subscribe("agenttest.in.telemetry.>", stream=TELEMETRY_STREAM)
    return await sub.fetch(n, timeout=5)


async def test_agent_publishes_what_it_scraped(exporter: Exporter, nc: Client, tmp_path: Path) -> None:
    assignments = tmp_path / "assignments.json"
    assignments.write_text(json.dumps({"ub20-a100-k8s/0/13": "run-slice"}))
    config = AgentConfig(cluster="east", dcgm_url=exporter.url, prefix="agenttest", node="n-default")
    publisher = JetStreamPublisher(nc.jetstream())
    resolver = RunResolver(pod_run=lambda ns, pod: "run-tf" if pod == "tensorflow-0" else None)
    resolver.slot_run = default_resolver(assignments).slot_run
    async with httpx.AsyncClient() as client:
        report = await scrape_once(client, config, resolver, publisher, 1_767_600_000.0)
    assert (report.samples, report.messages, report.attributed, report.blanks) == (3, 1, 2, 2)
    [msg] = await _published(nc, 1)
    assert msg.subject == "agenttest.in.telemetry.east.dcgm"  # stored by the gateway
    assert msg.headers is not None
    assert msg.headers["Gpufleet-Msg-Id"] == "dcgm:east:n-default:1767600000000:0"
    assert msg.headers["Nats-Msg-Id"] == "cluster:east/dcgm:east:n-default:1767600000000:0"  # scoped to the sender
    now = datetime.fromtimestamp(1_767_600_000.0, UTC)
    sent = {(s.gpu_uuid, s.mig_instance): s for s in decode_batch(msg.data, "east", now)}
    assert set(sent) == {
        ("GPU-34319582-d595-d1c7-d1d2-179bcfa61660", None),
        ("GPU-34319582-d595-d1c7-d1d2-179bcfa61660", 13),
        ("GPU-585834da-79ca-0599-5140-4ffdb131ae93", None),
    }
    l40s = sent[("GPU-585834da-79ca-0599-5140-4ffdb131ae93", None)]
    assert (l40s.run_id, l40s.pod, l40s.metrics["xid"], l40s.metrics["fb_used_mib"]) == (
        "run-tf",
        "tensorflow-0",
        79,
        31000,
    )
    assert "power_w" not in l40s.metrics  # the blank sentinel never left the node
    assert sent[("GPU-34319582-d595-d1c7-d1d2-179bcfa61660", 13)].run_id == "run-slice"
    assert sent[("GPU-34319582-d595-d1c7-d1d2-179bcfa61660", None)].run_id is None


async def test_agent_survives_a_failing_exporter_and_publishes_when_it_recovers(exporter: Exporter, nc: Client) -> None:
    exporter.status = 503
    config = AgentConfig(cluster="east", dcgm_url=exporter.url, prefix="agenttest", interval=0.5)
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(config, JetStreamPublisher(nc.jetstream()), RunResolver(), stop))
    for _ in range(100):
        if exporter.hits >= 2:
            break
        await asyncio.sleep(0.05)
    assert exporter.hits >= 2  # the loop kept going after the failed round
    exporter.status = 200
    msgs = await _published(nc, 1)
    stop.set()
    report = await asyncio.wait_for(task, 5)
    assert report is not None
    assert report.samples == 3
    assert msgs[0].subject == "agenttest.in.telemetry.east.dcgm"


def test_agent_command_once_prints_what_it_sent(exporter: Exporter, running_nats: NatsServerProcess) -> None:
    async def streams() -> None:
        client = await nats.connect(running_nats.url)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await client.jetstream().delete_stream(TELEMETRY_STREAM)
        await ensure_topology(client.jetstream(), "clitest")
        await client.close()

    asyncio.run(streams())
    args = ["agent", "--cluster", "west", "--dcgm-url", exporter.url, "--nats-url", running_nats.url]
    with inbound_gateway_thread(running_nats.url, "clitest"):
        result = CliRunner().invoke(main, [*args, "--prefix", "clitest", "--once"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report == {
        "subject": "clitest.telemetry.west.dcgm",
        "samples": 3,
        "messages": 1,
        "attributed": 0,
        "blanks": 2,
        "unidentified": 0,
        "serving": 0,  # no --serving-pods: no serving readings
    }


def test_agent_command_refuses_a_cluster_name_that_is_not_a_subject_token() -> None:
    result = CliRunner().invoke(main, ["agent", "--cluster", "a.b", "--dcgm-url", "http://x", "--once"])
    assert result.exit_code != 0
    assert "subject token" in result.output
