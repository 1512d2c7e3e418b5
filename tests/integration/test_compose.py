"""docker-compose.yml and the image's build context: the compose file is valid Compose (the
vendored compose-spec schema), every gpufleet container shares the one state volume (so a
`kubernetes` cluster registered through the API has its kubeconfig where the dispatcher reads it),
NATS runs with gpufleet's own authentication from a config nats-server accepts, published ports
bind the loopback interface only, the one-shot `migrate` service registers the simulated fleet of
`gpufleet up` (run here against real PostgreSQL), and .dockerignore
keeps the virtualenv, .git, caches and local state out of the build context while letting through
everything deploy/Dockerfile copies."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from adapters.nats.server import find_binary
from adapters.sim.fleet import default_fleet
from controlplane.bootstrap import COMPONENTS, Wiring
from controlplane.cli.main import main
from controlplane.config import Settings
from controlplane.service.admin import list_clusters

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(__file__).parent / "vendored" / "compose-spec.json"
IMAGE = "gpufleet:local"


@cache
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # resolves anchors and <<
    return loaded


def gpufleet_services() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose()["services"].items() if s.get("image") == IMAGE}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> named volume (short syntax `volume:path[:mode]`)."""
    out: dict[str, str] = {}
    for entry in service.get("volumes", []):
        source, target, *_ = entry.split(":")
        out[target] = source
    return out


def test_the_compose_file_is_valid_compose() -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5])
    declared = set(compose()["volumes"])
    used = {m for s in compose()["services"].values() for m in mounts(s).values()}
    assert used == declared, f"volumes used but not declared, or declared and unused: {used ^ declared}"


def test_every_gpufleet_container_mounts_the_one_state_volume_at_the_state_dir() -> None:
    services = gpufleet_services()
    components = {name for name, s in services.items() if s.get("restart") == "unless-stopped"}
    assert components == set(COMPONENTS)
    volumes: set[str] = set()
    for name, service in services.items():
        state_dir = (service.get("environment") or {}).get("GPUFLEET_STATE_DIR", "/state")  # the image's default
        assert state_dir in mounts(service), f"{name} does not mount its state dir {state_dir}"
        volumes.add(mounts(service)[state_dir])
    assert volumes == {"state"}, f"gpufleet containers keep state in different volumes: {volumes}"
    # The two that share kubeconfigs, explicitly: the API writes them, the dispatcher reads them.
    assert mounts(services["api"])["/state"] == mounts(services["dispatcher"])["/state"]


def _nats_config_command() -> list[str]:
    service = gpufleet_services()["nats-config"]
    [script] = service["command"]
    gpufleet, _, rest = script.partition("&&")
    assert shlex.split(rest) == ["chown", "10001:10001", "/state/nats-secrets.json"]
    words = shlex.split(gpufleet)
    assert words[:3] == ["gpufleet", "server", "nats-auth-config"]
    return words[1:]


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_nats_runs_with_gpufleet_authentication_from_the_config_nats_config_writes(tmp_path: Path) -> None:
    services = compose()["services"]
    words = _nats_config_command()
    secrets_path, config_path = _option(words, "--secrets-file"), _option(words, "--out")
    # Every component connects as the control plane's user, with the secrets nats-config made.
    for name in COMPONENTS:
        environment = services[name]["environment"]
        assert environment["GPUFLEET_NATS_SECRETS_FILE"] == secrets_path, name
        assert mounts(services[name])["/state"] == mounts(services["nats-config"])["/state"], name
        assert services[name]["depends_on"]["nats"] == {"condition": "service_healthy"}
    # nats-server reads the config nats-config wrote, through the volume only they share.
    nats = services["nats"]
    assert nats["command"][:2] == ["-c", config_path]
    config_dir = str(Path(config_path).parent)
    assert mounts(nats)[config_dir] == mounts(services["nats-config"])[config_dir] == "natsconf"
    assert [s for s, svc in services.items() if "natsconf" in mounts(svc).values()] == ["nats-config", "nats"]
    assert nats["depends_on"] == {"nats-config": {"condition": "service_completed_successfully"}}
    assert mounts(nats)["/data"] == "natsdata"
    assert _option(words, "--store-dir") == "/data"

    # The same command, run here with its paths moved under tmp_path, writes a config that the
    # real nats-server accepts, with gpufleet's accounts and auth callout.
    moved = [re.sub(r"^/(state|nats-config)/", f"{tmp_path}/\\1/", w) for w in words]
    result = CliRunner().invoke(main, moved)
    assert result.exit_code == 0, result.output
    written = Path(re.sub(r"^/nats-config/", f"{tmp_path}/nats-config/", config_path))
    text = written.read_text()
    assert "auth_callout" in text
    assert 'listen: "0.0.0.0:4222"' in text
    checked = subprocess.run([find_binary(), "-c", str(written), "-t"], check=False, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _published(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port, short or long syntax."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            out.append((str(entry.get("host_ip", "")), str(entry.get("published", "")), str(entry["target"])))
            continue
        *host, container = str(entry).rsplit(":", 1)
        address, _, port = (host[0] if host else "").rpartition(":")
        out.append((address, port, container))
    return out


def test_published_ports_bind_the_loopback_interface_only() -> None:
    published = {name: _published(s) for name, s in compose()["services"].items() if s.get("ports")}
    assert set(published) == {"api"}, "only the API is published; PostgreSQL and NATS stay on the compose network"
    for name, ports in published.items():
        for address, _, _ in ports:
            assert address in ("127.0.0.1", "[::1]"), f"{name} publishes on {address or 'every interface'}"
    # the port published is the one the API listens on
    [(_, host_port, container_port)] = published["api"]
    words = compose()["services"]["api"]["command"]
    assert words[words.index("--port") + 1] == container_port == host_port == "8080"


def test_the_migrate_service_registers_the_simulated_fleet_of_up(tmp_path: Path, empty_postgresql: str) -> None:
    """The one-shot `migrate` service's command, run as compose runs it (paths moved under tmp_path)
    against PostgreSQL, registers the clusters `gpufleet up` registers; a second run (compose up
    again) adds none."""
    migrate = compose()["services"]["migrate"]
    assert migrate["restart"] == "no"
    assert {s for s, svc in compose()["services"].items() if "migrate" in (svc.get("depends_on") or {})} == set(
        COMPONENTS
    ), "every component starts after it"
    words = [re.sub(r"^/state/", f"{tmp_path}/state/", w) for w in migrate["command"]]
    env = {"GPUFLEET_DATABASE_URL": empty_postgresql, "GPUFLEET_STATE_DIR": str(tmp_path / "state")}
    first = CliRunner().invoke(main, words, env=env)
    assert first.exit_code == 0, first.output
    assert f"registered {len(default_fleet())} simulated clusters" in first.output
    again = CliRunner().invoke(main, words, env=env)
    assert again.exit_code == 0, again.output
    assert "registered 0 simulated clusters" in again.output
    wiring = Wiring(Settings(database_url=empty_postgresql, state_dir=tmp_path / "state"))
    try:
        clusters = {(c.name, c.provider) for c in list_clusters(wiring.uow())}
    finally:
        wiring.close()
    assert clusters == {(spec["name"], "sim") for spec in default_fleet()}
    assert (tmp_path / "state" / "admin.token").exists()


# --- .dockerignore ---------------------------------------------------------------------------


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`, anchored at the context root)."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + "$")


@cache
def _ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((negated, _pattern(line.removeprefix("!").strip("/"))))
    return rules


def excluded(path: str) -> bool:
    """As Docker decides: a path is left out if it or a parent directory matches a pattern, the
    last matching pattern winning (`!` lets it back in)."""
    parts = path.split("/")
    result = False
    for negated, regex in _ignore_rules():
        if any(regex.match("/".join(parts[: i + 1])) for i in range(len(parts))):
            result = not negated
    return result


def _copied_sources() -> list[str]:
    sources = []
    for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            *paths, _ = [w for w in line.split()[1:] if not w.startswith("--")]
            sources += paths
    return sources


def test_the_build_context_excludes_the_virtualenv_git_caches_and_state() -> None:
    for path in (
        ".venv/lib/python3.11/site-packages/x.py",
        ".git/HEAD",
        "controlplane/__pycache__/config.cpython-311.pyc",
        "adapters/nats/__pycache__/server.cpython-311.pyc",
        ".pytest_cache/v/cache/nodeids",
        ".mypy_cache/3.11/x.json",
        ".ruff_cache/content",
        "state/gpufleet.db",
        ".gpufleet/admin.token",
        "gpufleet.db",
        "tests/conftest.py",
    ):
        assert excluded(path), path


def test_the_build_context_keeps_everything_the_dockerfile_copies() -> None:
    sources = _copied_sources()
    assert sources == ["pyproject.toml", "uv.lock", "README.md", "controlplane", "adapters", "migrations"]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    files = tracked.stdout.split()
    needed = [f for f in files if any(f == s or f.startswith(f"{s}/") for s in sources)]
    assert len(needed) > 50
    assert not [f for f in needed if excluded(f)], "files the image needs are left out of the build context"
