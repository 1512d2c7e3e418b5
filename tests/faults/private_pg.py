"""A PostgreSQL server of the fault suite's own, in a temporary directory on a free port, so that
killing it with SIGKILL disturbs no other test (the shared server on 5432 is never touched)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from adapters.nats.server import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"{name} not found under /usr/lib/postgresql/*/bin")
    return found[-1]


def available() -> bool:
    return bool(glob.glob("/usr/lib/postgresql/*/bin/postgres"))


class PrivatePostgres:
    """`start` runs the postmaster in its own process group; `kill` SIGKILLs the whole group (the
    postmaster and every backend), as a crash of the database host's PostgreSQL would; `start`
    again goes through crash recovery from the WAL."""

    def __init__(self) -> None:
        self.port = free_port()
        # initdb refuses to run as root: when root, the server runs as the `postgres` user, which
        # needs a directory it owns (pytest's tmp_path is private to root).
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-faults-pg-"))
        self.data = self.root / "data"
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            shutil.chown(self.root, self.user)
        self.process: subprocess.Popen[bytes] | None = None
        subprocess.run(
            [_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            user=self.user,
        )

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, timeout: float = 30.0) -> None:
        log = (self.root / "postgres.log").open("ab")
        self.process = subprocess.Popen(
            [
                _bin("postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self.root),
                "-c",
                "shared_buffers=16MB",
                "-c",
                "max_connections=60",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=self.user,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}; see {self.root / 'postgres.log'}")
            try:
                with psycopg.connect(
                    f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", connect_timeout=1
                ):
                    return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError("private postgres did not accept connections in time")

    def kill(self) -> None:
        """SIGKILL the postmaster and all its backends at once."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        # Backends in the group die with it; wait until none is left holding the data directory.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_alive(self.process.pid):
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
