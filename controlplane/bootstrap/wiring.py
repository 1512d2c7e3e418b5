"""The composition root's core wiring: the SQL engine and unit of work factory (`Wiring`), the
clock, migrations, the default simulated fleet and private token files.

Separate from the components because everything else here, and most tests, start from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, text

from adapters.files import private_dir, private_sqlite, write_private
from adapters.sim.fleet import default_fleet
from adapters.sql.engine import make_engine, make_session_factory
from adapters.sql.migrate import upgrade_to_head
from adapters.sql.uow import SqlUnitOfWork
from controlplane.config import Settings
from controlplane.service import admin
from controlplane.service.cluster_specs import ClusterSpec
from controlplane.service.ports import UnitOfWork


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Wiring:
    settings: Settings
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        url = self.settings.effective_database_url
        if url.startswith("sqlite"):
            private_dir(self.settings.state_dir)
            private_sqlite(url)
        self.engine = make_engine(url)
        self._sessions = make_session_factory(self.engine)

    def uow(self) -> UnitOfWork:
        return SqlUnitOfWork(self._sessions)

    def database_ready(self) -> str | None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return None

    def close(self) -> None:
        self.engine.dispose()


def migrate(settings: Settings) -> None:
    if settings.effective_database_url.startswith("sqlite"):
        private_dir(settings.state_dir)
        private_sqlite(settings.effective_database_url)
    upgrade_to_head(settings.effective_database_url)


def register_default_fleet(wiring: Wiring) -> int:
    """Register the simulated four-cluster fleet on an installation that has no clusters yet."""
    if admin.list_clusters(wiring.uow()):
        return 0
    for spec in default_fleet():
        admin.create_cluster(wiring.uow(), ClusterSpec.model_validate(spec), "bootstrap", utc_now())
    return len(default_fleet())


def write_secret(path: Path, value: str) -> None:
    """A token file: 0600 in a 0700 directory, also when an older one was readable by others."""
    write_private(path, value + "\n")
