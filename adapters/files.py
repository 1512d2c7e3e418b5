"""Files and directories gpufleet writes are private to the user that runs it.

The SQLite database (and its -wal/-shm, which SQLite creates with the database file's mode), the
state directory, the NATS store, API token files and kubeconfigs hold everything an attacker on
the same host would want: they are created 0600 (files) and 0700 (directories), and tightened
when an older installation left them readable by others.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PRIVATE_UMASK = 0o077


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Whatever is created meanwhile (by us, SQLite or a child process) is private."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) as 0700; make an existing one 0700."""
    with private_umask():
        path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    os.chmod(path, PRIVATE_DIR)
    return path


def private_parent(path: Path) -> None:
    """Create the missing directories above `path` as 0700, and leave existing ones as they are: a
    directory gpufleet did not create (/tmp, a home, a shared volume) is not ours to tighten."""
    with private_umask():
        path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)


def private_file(path: Path) -> Path:
    """Create `path` empty as 0600 if missing; make an existing one 0600."""
    with private_umask():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE)
    os.close(fd)
    os.chmod(path, PRIVATE_FILE)
    return path


def write_private(path: Path, text: str) -> None:
    """Write `text` to a 0600 file: a temporary file renamed into place, never world-readable."""
    private_parent(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with private_umask():
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def sqlite_path(url: str) -> Path | None:
    """The database file of a `sqlite:///...` URL (None for in-memory or other databases)."""
    if not url.startswith("sqlite") or ":///" not in url:
        return None
    path = url.split(":///", 1)[1].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def private_sqlite(url: str) -> None:
    """Make the SQLite database file private before SQLite opens it (its -wal and -shm then get the
    same mode), and tighten the companions an older version left behind."""
    path = sqlite_path(url)
    if path is None:
        return
    private_parent(path)  # e.g. sqlite:////tmp/x.db must not make /tmp private
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            os.chmod(companion, PRIVATE_FILE)
