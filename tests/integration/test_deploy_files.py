"""The files in deploy/ stay in step with the code that declares the same things."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from click.testing import CliRunner

from adapters.nats.server import find_binary
from adapters.nats.topology import as_json
from controlplane.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_exported_jetstream_topology_matches_the_code() -> None:
    exported = json.loads((ROOT / "deploy" / "nats" / "jetstream.json").read_text())
    assert exported == json.loads(json.dumps(as_json("gpufleet")))
    names = [s["name"] for s in exported["streams"]]
    assert names == ["GPUFLEET_IN", "GPUFLEET_EVENTS", "GPUFLEET_DLQ", "GPUFLEET_TELEMETRY"]


def test_nats_topology_command_prints_the_declarations() -> None:
    result = CliRunner().invoke(main, ["server", "nats-topology", "--prefix", "acme"])
    assert result.exit_code == 0
    streams = json.loads(result.output)["streams"]
    assert streams[0]["subjects"] == ["acme.in.submit.>", "acme.in.cancel.>", "acme.in.cluster.>"]


def test_compose_runs_every_component_with_health_checks() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in ("postgres", "nats", "migrate", "api", "scheduler", "dispatcher", "ingest", "relay"):
        assert name in services
    for name in ("postgres", "nats", "api"):
        assert "healthcheck" in services[name]
    assert services["migrate"]["command"][:2] == ["server", "init"]
    assert services["scheduler"]["command"] == ["server", "scheduler"]


def test_nats_topology_replicates_every_stream_and_consumer_on_request() -> None:
    result = CliRunner().invoke(main, ["server", "nats-topology", "--replicas", "3"])
    assert result.exit_code == 0, result.output
    declared = json.loads(result.output)
    assert [s["num_replicas"] for s in declared["streams"]] == [3, 3, 3, 3]
    # Consumers inherit their stream's replicas (so they follow a stream scaled in place).
    assert [c["config"].get("num_replicas") for c in declared["consumers"]] == [None] * 4
    # The exported file is the single-server default, what GPUFLEET_NATS_REPLICAS=1 creates.
    exported = json.loads((ROOT / "deploy" / "nats" / "jetstream.json").read_text())
    assert {s["num_replicas"] for s in exported["streams"]} == {1}
    assert CliRunner().invoke(main, ["server", "nats-topology", "--replicas", "6"]).exit_code != 0


def test_nats_auth_config_writes_a_cluster_member_that_nats_server_accepts(tmp_path: Path) -> None:
    """Each server of a JetStream cluster: gpufleet's accounts and callout, its own name, every route."""
    secrets_file, config = tmp_path / "secrets.json", tmp_path / "nats.conf"
    routes = [f"nats-route://nats-{i}.nats:6222" for i in range(3)]
    args = ["server", "nats-auth-config", "--secrets-file", str(secrets_file), "--out", str(config)]
    args += ["--store-dir", str(tmp_path / "js"), "--server-name", "nats-0"]
    args += [arg for route in routes for arg in ("--route", route)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    written = config.read_text()
    assert 'server_name: "nats-0"' in written
    assert f"routes: [{', '.join(json.dumps(r) for r in routes)}]" in written
    assert "auth_callout" in written
    checked = subprocess.run(
        [find_binary(), "-c", str(config), "-t"], check=False, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "is valid" in checked.stdout + checked.stderr
    # a member without routes (or routes without a name) is refused, not half-written
    lonely = CliRunner().invoke(main, [*args[:8], "--server-name", "nats-0"])
    assert lonely.exit_code != 0
    assert "--route" in lonely.output
