"""Real parts for the tests: PostgreSQL, SQLite and a nats-server started for this session."""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from adapters.nats import secrets as nats_secrets
from adapters.nats.server import NatsServerProcess, free_port
from adapters.sql.migrate import upgrade_to_head
from adapters.sql.tables import Base
from controlplane.bootstrap import Wiring
from controlplane.config import Settings

# The client's saved contexts (`gpufleet login`) must not leak in from the machine's home: every
# test, and every process it starts, reads a config file of its own that does not exist.
os.environ["GPUFLEET_CLIENT_CONFIG"] = os.path.join(tempfile.gettempdir(), f"gpufleet-test-{os.getpid()}-client.yaml")
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment, and the CLI sizes
# its tables by COLUMNS (else 400 wide when piped): a suite run with workers must print what one
# without does.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

PG_ADMIN_URL = os.environ.get("GPUFLEET_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
# Test databases are named with this prefix and a random suffix (on a shared server, each user of
# it can keep to names of its own).
PG_DATABASE_PREFIX = os.environ.get("GPUFLEET_TEST_PG_PREFIX", "gpufleet_test_")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServerProcess]:
    server = NatsServerProcess(free_port(), tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def running_nats(nats_server: NatsServerProcess) -> NatsServerProcess:
    """The session's server, restarted first if an earlier test stopped it."""
    if nats_server.process is None or nats_server.process.poll() is not None:
        nats_server.start()
    return nats_server


@pytest.fixture(scope="session")
def postgresql_database() -> Iterator[str]:
    name = f"{PG_DATABASE_PREFIX}{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    upgrade_to_head(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def sqlite_database(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'gpufleet.db'}"
    upgrade_to_head(url)
    return url


def _empty_all_tables(url: str) -> None:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


@pytest.fixture
def empty_postgresql(postgresql_database: str) -> str:
    _empty_all_tables(postgresql_database)
    return postgresql_database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A migrated, empty database on each backend."""
    url: str = request.getfixturevalue(f"{request.param}_database")
    _empty_all_tables(url)
    return url


@pytest.fixture
def settings(database_url: str, tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    return Settings(
        database_url=database_url,
        nats_url=nats_server.url,
        state_dir=tmp_path / "state",
        subject_prefix=f"t{secrets.token_hex(3)}",
        scheduler_interval=0.2,
        dispatcher_interval=0.1,
        relay_interval=0.05,
        sim_start_delay=0.2,
        check_invariants=True,
    )


@pytest.fixture
def wiring(settings: Settings) -> Iterator[Wiring]:
    w = Wiring(settings)
    yield w
    w.close()


@pytest.fixture
def secure_nats(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A nats-server as `gpufleet up` runs it: fixed control-plane users, everyone else through auth
    callout (answered by the control plane's ingest component). Its secrets file is `secure_nats.secrets`."""
    secrets_file = tmp_path / "nats-secrets.json"
    auth = nats_secrets.load_or_create(secrets_file).server_auth()
    server = NatsServerProcess(free_port(), tmp_path / "nats-secure", tmp_path / "nats-secure.log", auth=auth)
    server.secrets_file = secrets_file  # type: ignore[attr-defined]
    server.start()
    yield server
    server.stop()


@pytest.fixture
def secure_settings(settings: Settings, secure_nats: NatsServerProcess) -> Settings:
    """`settings` pointed at `secure_nats`, with the control plane's NATS secrets."""
    return settings.model_copy(
        update={
            "nats_url": secure_nats.url,
            "nats_secrets_file": secure_nats.secrets_file,
            "nats_revocation_sweep": 0.5,
        }  # type: ignore[attr-defined]
    )
