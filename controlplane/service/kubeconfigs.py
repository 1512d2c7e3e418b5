"""User kubeconfigs (provider `kubernetes`) kept out of the database: one 0600 file per cluster.

A kubeconfig holds a bearer token or a client key, so it is a secret: it is validated before it is
stored (no exec, auth-provider or file references), written with owner-only permissions, never
logged, and the database keeps only its file name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

_REF = re.compile(r"^[A-Za-z0-9_-]{1,64}\.kubeconfig$")


class KubeconfigStore(Protocol):
    def put(self, cluster_id: str, text: str) -> str:
        """Store the kubeconfig of a cluster; returns the reference kept in the database."""
        ...

    def read(self, ref: str) -> str: ...

    def delete(self, cluster_id: str) -> None: ...


def ref_for(cluster_id: str) -> str:
    ref = f"{cluster_id}.kubeconfig"
    if not _REF.match(ref):
        raise ValueError(f"not a cluster id: {cluster_id!r}")
    return ref


@dataclass(frozen=True)
class FileKubeconfigStore:
    directory: Path

    def _path(self, ref: str) -> Path:
        if not _REF.match(ref):  # a reference is a bare file name: nothing outside the directory
            raise ValueError(f"not a kubeconfig reference: {ref!r}")
        return self.directory / ref

    def put(self, cluster_id: str, text: str) -> str:
        ref = ref_for(cluster_id)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # also when an older version left it readable by others
        path = self._path(ref)
        tmp = path.with_name(f".{ref}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # also when the file was left over by an earlier attempt
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return ref

    def read(self, ref: str) -> str:
        return self._path(ref).read_text()

    def delete(self, cluster_id: str) -> None:
        self._path(ref_for(cluster_id)).unlink(missing_ok=True)
