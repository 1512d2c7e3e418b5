"""Files gpufleet writes are private to the user running it (issue 11, deliverable 6)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import nats
from sqlalchemy import text

from adapters.files import private_dir, private_sqlite, write_private
from adapters.nats.server import NatsServerProcess, free_port
from controlplane.bootstrap import Wiring, migrate
from controlplane.bootstrap.wiring import write_secret
from controlplane.config import Settings
from controlplane.service.kubeconfigs import FileKubeconfigStore


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_sqlite_database_wal_shm_and_state_dir_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    old = os.umask(0o022)  # a permissive umask, as most shells have
    try:
        settings = Settings(state_dir=state, database_url="")
        migrate(settings)
        wiring = Wiring(settings)
        with wiring.engine.begin() as conn:  # a write creates -wal and -shm
            conn.execute(text("CREATE TABLE IF NOT EXISTS probe (x INTEGER)"))
            conn.execute(text("INSERT INTO probe VALUES (1)"))
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL: a 201 survives power loss
        db = state / "gpufleet.db"
        for path in (db, db.with_name("gpufleet.db-wal"), db.with_name("gpufleet.db-shm")):
            assert path.exists(), path
            assert mode(path) == 0o600, (path, oct(mode(path)))
        assert mode(state) == 0o700
        wiring.close()
    finally:
        os.umask(old)


def test_an_older_world_readable_installation_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    db = state / "gpufleet.db"
    db.touch(mode=0o644)
    os.chmod(db, 0o644)
    token = state / "admin.token"
    token.write_text("old\n")
    os.chmod(token, 0o644)
    Wiring(Settings(state_dir=state, database_url="")).close()
    write_secret(token, "gpf_new")
    assert (mode(state), mode(db), mode(token)) == (0o700, 0o600, 0o600)
    assert token.read_text() == "gpf_new\n"


def test_token_and_kubeconfig_files_are_0600_in_0700_dirs(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        write_secret(tmp_path / "tokens" / "admin.token", "gpf_x")
        write_private(tmp_path / "other" / "secret", "s")
        store = FileKubeconfigStore(tmp_path / "kubeconfigs")
        name = store.put("c1", "apiVersion: v1\nkind: Config\n")
        assert mode(tmp_path / "tokens" / "admin.token") == 0o600
        assert mode(tmp_path / "tokens") == 0o700
        assert mode(tmp_path / "other" / "secret") == 0o600
        assert mode(tmp_path / "kubeconfigs") == 0o700
        assert mode(tmp_path / "kubeconfigs" / name) == 0o600
    finally:
        os.umask(old)


def test_the_embedded_nats_store_is_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    server = NatsServerProcess(free_port(), tmp_path / "nats", log_file=tmp_path / "nats.log")
    try:
        server.start()

        async def touch_jetstream() -> None:
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await js.add_stream(name="PRIVATE", subjects=["private.>"])
            await js.publish("private.x", b"secret")
            await nc.close()

        asyncio.run(touch_jetstream())
    finally:
        server.stop()
        os.umask(old)
    assert mode(tmp_path / "nats") == 0o700
    loose = [p for p in (tmp_path / "nats").rglob("*") if mode(p) & 0o077]
    assert loose == [], [(str(p), oct(mode(p))) for p in loose]
    assert mode(tmp_path / "nats.log") & 0o077 == 0


def test_private_dir_is_idempotent(tmp_path: Path) -> None:
    d = private_dir(tmp_path / "a" / "b")
    private_dir(d)
    assert mode(d) == 0o700


def test_files_in_a_shared_directory_leave_the_directory_alone(tmp_path: Path) -> None:
    """A database or secret placed in a directory gpufleet did not create (/tmp, say) is private, and
    the directory keeps its mode: tightening /tmp to 0700 would lock every other user out of it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private_sqlite(f"sqlite:///{shared / 'gpufleet.db'}")
    write_private(shared / "admin.token", "gpf_x")
    assert mode(shared) == 0o1777
    assert (mode(shared / "gpufleet.db"), mode(shared / "admin.token")) == (0o600, 0o600)
    fresh = tmp_path / "new" / "deeper" / "secret"
    write_private(fresh, "x")
    assert (mode(fresh.parent), mode(fresh.parent.parent)) == (0o700, 0o700)
