"""`gpufleet up` killed with SIGKILL mid-run and started again loses no workload and
dispatches none twice (the simulated clusters keep their state, like real clusters would)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from adapters.nats.server import free_port
from tests.integration.fleet import gang


def _start(state: Path, port: int, nats_port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("GPUFLEET_DATABASE_URL", None)
    log = (state.parent / "up.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controlplane.cli.main",
            "up",
            "--state-dir",
            str(state),
            "--port",
            str(port),
            "--nats-port",
            str(nats_port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def _wait_ready(base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("gpufleet up did not become ready")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return status != "Z"


@pytest.mark.timeout(240)
def test_sigkill_mid_run_loses_nothing_and_dispatches_nothing_twice(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port, nats_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    up = _start(state, port, nats_port)
    try:
        _wait_ready(base)
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        assert httpx.post(f"{base}/v1/teams", json={"name": "llm"}, headers=admin).status_code == 201
        assert httpx.post(f"{base}/v1/queues", json={"name": "train", "team": "llm"}, headers=admin).status_code == 201
        token = httpx.post(f"{base}/v1/tokens", json={"name": "t", "team": "llm"}, headers=admin).json()["token"]
        team = {"Authorization": f"Bearer {token}"}
        ids = []
        for i in range(6):
            body = gang(f"g{i}", "train", replicas=2, gpus=8, duration_seconds=6)
            body["pod_sets"][0]["gpu_models"] = ["H100-80GB"]
            r = httpx.post(f"{base}/v1/workloads", json=body, headers=team)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = [httpx.get(f"{base}/v1/workloads/{i}", headers=team).json()["state"] for i in ids]
            if states.count("running") >= 2:
                break
            time.sleep(0.2)
        assert states.count("running") >= 2, states
        nats_pids = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-f", f"nats-server -c {state / 'nats' / 'gpufleet-nats.conf'}"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split()
        ]
        assert nats_pids, "the embedded nats-server runs with its generated, authenticated config"
        for secret in (state / "nats-secrets.json", state / "nats" / "gpufleet-nats.conf"):
            assert secret.stat().st_mode & 0o777 == 0o600, secret
        up.send_signal(signal.SIGKILL)
        up.wait(10)
        deadline = time.monotonic() + 10
        while any(_pid_alive(p) for p in nats_pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_pid_alive(p) for p in nats_pids), "nats-server outlived its parent"

        up = _start(state, port, nats_port)
        _wait_ready(base)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            views = [httpx.get(f"{base}/v1/workloads/{i}", headers=team).json() for i in ids]
            if all(v["state"] == "succeeded" for v in views):
                break
            time.sleep(0.3)
        assert [v["state"] for v in views] == ["succeeded"] * len(ids)
        assert all(len(v["runs"]) == 1 for v in views)
        created = sum(json.loads(f.read_text())["created"] for f in (state / "sim").glob("*.json"))
        assert created == len(ids)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
    assert up.returncode == 0
