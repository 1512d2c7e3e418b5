"""Structured logs and request ids.

In process: the API keeps a sane `X-Request-ID`, replaces any other, echoes it on every answer (also
the body guard's refusals) and puts it on the request's log line. As an operator runs it: `gpufleet
run api scheduler --log-format json --metrics-port N` in its own process writes one JSON object per
line on stderr, with the request id of an API call and the epoch of the scheduler's lease, never the
caller's bearer token, and serves its metrics on the metrics port.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from adapters.nats.server import NatsServerProcess, free_port
from controlplane import logs
from controlplane.api.request_ids import HEADER
from controlplane.bootstrap import Wiring, utc_now
from controlplane.config import Settings
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logs.JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def access_lines() -> Iterator[_Lines]:
    handler = _Lines()
    logger = logging.getLogger("gpufleet.api.access")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # probes (/healthz) are logged at debug level
    yield handler
    logger.removeHandler(handler)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_request_ids_are_kept_when_sane_and_made_otherwise(client: TestClient, access_lines: _Lines) -> None:
    kept = client.get("/healthz", headers={HEADER: "trace-7.a:b_c"})
    assert kept.headers[HEADER] == "trace-7.a:b_c"
    fresh = client.get("/healthz")
    assert len(fresh.headers[HEADER]) == 32
    assert fresh.headers[HEADER] != client.get("/healthz").headers[HEADER]
    for hostile in ("has space", "x" * 129, "new\tline", "é-accent".encode(), b"\xff\xfe", ""):
        answered = client.get("/healthz", headers={HEADER: hostile})
        assert answered.headers[HEADER] != hostile
        assert len(answered.headers[HEADER]) == 32
    # Refusals before any route (the 1 MiB body cap) and unknown paths carry it too.
    too_big = client.post("/v1/teams", content=b"x" * (2 << 20), headers={HEADER: "big-1"})
    assert too_big.status_code == 413
    assert too_big.headers[HEADER] == "big-1"
    missing = client.get("/v1/nothing-here", headers={HEADER: "gone-1"})
    assert missing.status_code == 404
    assert missing.headers[HEADER] == "gone-1"
    forged = client.get("/v1/x%0A%7B%22level%22:%22error%22%7D", headers={HEADER: "forged-1"})
    assert forged.status_code == 404
    entries = [json.loads(line) for line in access_lines.lines]
    by_id = {e.get("request_id"): e for e in entries}
    assert by_id["trace-7.a:b_c"]["path"] == "/healthz"
    assert by_id["trace-7.a:b_c"]["status"] == 200
    assert by_id["big-1"]["status"] == 413
    assert by_id["gone-1"]["status"] == 404
    assert by_id["gone-1"]["level"] == "info"
    assert by_id["trace-7.a:b_c"]["level"] == "debug"
    assert "\n" not in by_id["forged-1"]["path"]
    assert all({"ts", "level", "logger", "message", "duration_ms"} <= e.keys() for e in entries)
    assert not any("has space" in line for line in access_lines.lines)


def test_json_formatter_carries_context_and_blanks_secrets() -> None:
    record = logging.LogRecord(
        "controlplane.service.dispatch", logging.WARNING, __file__, 1, "dispatch of %s failed: %s", None, None
    )
    record.args = ("run-1", "401 for Authorization: Bearer abc.def and token gpf_SECRETSECRETSECRET")
    record.__dict__.update(run="run-1", workload="wl-1", cluster="eks-1", epoch=4)
    token = logs.request_id.set("req-9")
    try:
        line = logs.JsonFormatter().format(record)
    finally:
        logs.request_id.reset(token)
    entry = json.loads(line)
    assert entry["level"] == "warning"
    assert entry["logger"] == "controlplane.service.dispatch"
    assert (entry["run"], entry["workload"], entry["cluster"], entry["epoch"]) == ("run-1", "wl-1", "eks-1", 4)
    assert entry["request_id"] == "req-9"
    assert "abc.def" not in line
    assert "SECRETSECRET" not in line
    assert "[redacted]" in entry["message"]
    assert entry["ts"].endswith("+00:00")


@pytest.mark.timeout(120)
def test_a_server_process_logs_json_lines_and_serves_metrics(
    empty_postgresql: str, running_nats: NatsServerProcess, tmp_path: Path
) -> None:
    # An emptied database: a scheduler lease an earlier test left would keep this process from
    # leading (and its cycle metrics at zero) until it expired.
    postgresql_database = empty_postgresql
    wiring_env = {
        "GPUFLEET_DATABASE_URL": postgresql_database,
        "GPUFLEET_NATS_URL": running_nats.url,
        "GPUFLEET_SUBJECT_PREFIX": f"logs{os.getpid()}",
        "GPUFLEET_STATE_DIR": str(tmp_path / "state"),
        "GPUFLEET_API_PORT": str(free_port()),
        "GPUFLEET_SCHEDULER_INTERVAL": "0.2",
    }
    env = {**os.environ, **wiring_env}
    wiring = Wiring(Settings(database_url=postgresql_database, state_dir=tmp_path / "state"))
    _, admin_token = issue_token(wiring.uow(), TokenSpec(name="logs", role="admin"), "test", utc_now())
    wiring.close()
    metrics_port = free_port()
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "controlplane.cli.main",
                "server",
                "run",
                "api",
                "scheduler",
                "--log-format",
                "json",
                "--metrics-port",
                str(metrics_port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    base = f"http://127.0.0.1:{wiring_env['GPUFLEET_API_PORT']}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, stderr_path.read_text()
            assert process.poll() is None, stderr_path.read_text()
            time.sleep(0.2)
        answer = httpx.get(
            f"{base}/v1/teams", headers={"Authorization": f"Bearer {admin_token}", HEADER: "from-the-test-1"}
        )
        assert answer.status_code == 200
        assert answer.headers[HEADER] == "from-the-test-1"
        scraped = None
        while time.monotonic() < deadline:
            body = httpx.get(
                f"http://127.0.0.1:{metrics_port}/metrics",
                headers={"Authorization": f"Bearer {admin_token}"},  # the metrics port wants a token too
                timeout=5,
            ).text
            scraped = {f.name: f for f in text_string_to_metric_families(body)}
            cycles = [s.value for s in scraped["gpufleet_scheduler_cycle_seconds"].samples if s.name.endswith("_count")]
            if cycles and cycles[0] > 0:
                break
            time.sleep(0.2)
        assert scraped is not None
        assert "gpufleet_pending_gangs" in scraped  # the API runs here: the SQL gauges too
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    text = stderr_path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "message"} <= e.keys() for e in entries)
    [request] = [e for e in entries if e.get("request_id") == "from-the-test-1"]
    assert request["path"] == "/v1/teams"
    assert request["status"] == 200
    assert any("leads scheduler" in e["message"] and e.get("epoch", 0) >= 1 for e in entries)
    assert admin_token not in text
