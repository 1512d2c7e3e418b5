"""Commands that run gpufleet: `up` (everything on one machine) and each part on its own."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal

import click

try:
    import uvloop
except ImportError:  # optional: the standard event loop serves where uvloop has no wheel
    uvloop = None  # type: ignore[assignment]

from adapters.files import PRIVATE_UMASK, private_dir
from controlplane import bootstrap, logs
from controlplane.bootstrap.wiring import register_default_fleet
from controlplane.cli import client_env, demo, seed
from controlplane.config import Settings
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec
from controlplane.service.scheduling import expire_leases_of_dead_holders

log = logging.getLogger("gpufleet")


def _settings(config: Path | None, **overrides: Any) -> Settings:
    return Settings.load(config, **overrides)


def _logging(verbose: bool, log_format: str = "text", log_file: Path | None = None) -> None:
    logs.configure(log_format, verbose, log_file)


log_format_option = click.option(
    "--log-format",
    type=click.Choice(logs.LOG_FORMATS),
    default="text",
    show_default=True,
    envvar="GPUFLEET_LOG_FORMAT",
    help="text, or json: one JSON object per line (ts, level, logger, message and context fields)",
)
metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="serve Prometheus metrics on this port at /metrics, to a metrics or admin token "
    "(default GPUFLEET_METRICS_PORT, 0: off)",
)


def _port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port`. SO_REUSEADDR, as uvicorn and nats-server bind
    with: connections left in TIME-WAIT by a crashed run do not make the port "in use", so a
    restart right after a crash is not refused; a listening socket still does."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def _supervise_nats(nats: bootstrap.NatsServerProcess, stop: asyncio.Event) -> None:
    """Start the embedded nats-server again if it dies (its store survives; clients reconnect)."""
    while not stop.is_set():
        await bootstrap.loops.sleep_or_stop(stop, 0.5)
        if stop.is_set() or nats.process is None or nats.process.poll() is None:
            continue
        log.warning("embedded nats-server exited with %s; starting it again", nats.process.returncode)
        try:
            await asyncio.to_thread(nats.start)
        except Exception:
            log.exception("could not start nats-server again; retrying")


def _loop_factory(components: Sequence[str]) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop for a process that serves the API: its event loop in C carries the HTTP connections and the
    thread-pool hand-offs of every request (measured in README, "Live scheduler and the submit path").
    Without uvloop installed (it is optional on a platform without wheels) the standard loop runs."""
    if "api" not in components or uvloop is None:
        return None
    return uvloop.new_event_loop


def _run_until_signal(main: Coroutine[Any, Any, None], stop: asyncio.Event, components: Sequence[str] = ()) -> None:
    async def runner() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main

    with asyncio.Runner(loop_factory=_loop_factory(components)) as loop_runner:
        loop_runner.run(runner())


config_option = click.option(
    "--config",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    envvar="GPUFLEET_CONFIG",
    help="YAML file of settings (keys as in GPUFLEET_* without the prefix)",
)


def _component_command(name: str) -> click.Command:
    @click.command(name=name, help=f"Run the {name} against GPUFLEET_DATABASE_URL and GPUFLEET_NATS_URL.")
    @config_option
    @click.option("-v", "--verbose", is_flag=True)
    @log_format_option
    @metrics_port_option
    def command(config: Path | None, verbose: bool, log_format: str, metrics_port: int | None) -> None:
        _logging(verbose, log_format)
        settings = _settings(config, metrics_port=metrics_port)
        stop = asyncio.Event()
        _run_until_signal(bootstrap.run_components(settings, (name,), stop), stop, (name,))

    return command


@click.command(name="run")
@config_option
@click.argument("components", nargs=-1, required=True, type=click.Choice(bootstrap.COMPONENTS))
@click.option("-v", "--verbose", is_flag=True)
@log_format_option
@metrics_port_option
def run_many(
    config: Path | None, components: tuple[str, ...], verbose: bool, log_format: str, metrics_port: int | None
) -> None:
    """Run several components in one process, e.g. `gpufleet server run api ingest relay` (fewer processes
    than one per component; the scheduler and dispatcher still elect one leader each by lease)."""
    _logging(verbose, log_format)
    settings = _settings(config, metrics_port=metrics_port)
    stop = asyncio.Event()
    chosen = tuple(dict.fromkeys(components))
    _run_until_signal(bootstrap.run_components(settings, chosen, stop), stop, chosen)


@click.command()
@config_option
@click.option("--host", default=None, help="address to bind (default 127.0.0.1)")
@click.option("--port", type=int, default=None, help="port to bind (default 8080)")
@click.option("-v", "--verbose", is_flag=True)
@log_format_option
@metrics_port_option
def serve(
    config: Path | None, host: str | None, port: int | None, verbose: bool, log_format: str, metrics_port: int | None
) -> None:
    """Run the REST API (its metrics are also at /metrics on the API port)."""
    _logging(verbose, log_format)
    settings = _settings(config, api_host=host, api_port=port, metrics_port=metrics_port)
    stop = asyncio.Event()
    _run_until_signal(bootstrap.run_components(settings, ("api",), stop), stop, ("api",))


@click.command()
@config_option
def migrate(config: Path | None) -> None:
    """Bring the database to the newest schema (Alembic upgrade head)."""
    settings = _settings(config)
    bootstrap.migrate(settings)
    click.echo("database at head")


@click.command()
@config_option
@click.option(
    "--admin-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="issue an admin token into this file (mode 0600) unless it exists",
)
@click.option("--sim-fleet", is_flag=True, help="also register the four simulated clusters of `gpufleet up`")
def init(config: Path | None, admin_token_file: Path | None, sim_fleet: bool) -> None:
    """Prepare an installation: migrate, seed default priority classes, issue the first admin token."""
    settings = _settings(config)
    bootstrap.migrate(settings)
    wiring = bootstrap.Wiring(settings)
    try:
        seed.seed_defaults(wiring)
        if admin_token_file is not None:
            existed = admin_token_file.exists()
            seed.ensure_admin_token_file(wiring, admin_token_file)
            click.echo(f"admin token {'kept in' if existed else 'written to'} {admin_token_file}")
        if sim_fleet:
            click.echo(f"registered {register_default_fleet(wiring)} simulated clusters")
    finally:
        wiring.close()
    click.echo("database at head, default priority classes present")


@click.command(name="create-admin-token")
@config_option
@click.option("--name", default="admin", show_default=True)
@click.option(
    "--role",
    type=click.Choice(["admin", "metrics"]),
    default="admin",
    show_default=True,
    help="metrics: a token that reads /metrics and nothing else, for a Prometheus scrape config",
)
def create_admin_token(config: Path | None, name: str, role: Literal["admin", "metrics"]) -> None:
    """Issue an admin (or metrics) API token directly in the database and print it once."""
    wiring = bootstrap.Wiring(_settings(config))
    _, raw = issue_token(wiring.uow(), TokenSpec(name=name, role=role), "cli", bootstrap.utc_now())
    click.echo(raw)


@click.command(name="nats-topology")
@click.option("--prefix", default="gpufleet", show_default=True)
@click.option(
    "--replicas",
    type=click.IntRange(1, 5),
    default=1,
    show_default=True,
    help="copies of each stream and consumer (GPUFLEET_NATS_REPLICAS; 3 on a three-server JetStream cluster)",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="write streams.json into this directory instead of printing",
)
def nats_topology(prefix: str, replicas: int, out: Path | None) -> None:
    """Print the JetStream streams and consumers gpufleet declares."""
    text = json.dumps(bootstrap.topology_json(prefix, replicas), indent=2, sort_keys=True) + "\n"
    if out is None:
        click.echo(text, nl=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "jetstream.json").write_text(text)


@click.command(name="nats-auth-config")
@click.option(
    "--secrets-file",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="the control plane's NATS secrets (created, mode 0600, if missing); give it to every part as "
    "GPUFLEET_NATS_SECRETS_FILE",
)
@click.option(
    "--out", type=click.Path(path_type=Path, dir_okay=False), required=True, help="nats-server config to write"
)
@click.option("--host", default="0.0.0.0", show_default=True, help="address nats-server listens on")  # noqa: S104
@click.option("--port", type=int, default=4222, show_default=True)
@click.option("--store-dir", type=click.Path(path_type=Path), default=Path("/data"), show_default=True)
@click.option("--server-name", default=None, help="this server's unique name in a JetStream cluster")
@click.option("--cluster-name", default="gpufleet", show_default=True, help="the JetStream cluster's name")
@click.option("--cluster-port", type=int, default=6222, show_default=True, help="port for cluster routes")
@click.option(
    "--route",
    "routes",
    multiple=True,
    help="nats-route://host:port of a cluster member (repeat for each; with --server-name)",
)
def nats_auth_config(
    secrets_file: Path,
    out: Path,
    host: str,
    port: int,
    store_dir: Path,
    server_name: str | None,
    cluster_name: str,
    cluster_port: int,
    routes: tuple[str, ...],
) -> None:
    """Write a nats-server config with gpufleet's users and auth callout, for an external server
    (one of a JetStream cluster with --server-name and --route; the same secrets on every member)."""
    if bool(server_name) != bool(routes):
        raise click.UsageError("a cluster member needs both --server-name and its --route list")
    member = bootstrap.NatsClusterMember(server_name, cluster_port, routes, cluster_name, host) if server_name else None
    auth = bootstrap.nats_secrets.load_or_create(secrets_file).server_auth()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch(mode=0o600, exist_ok=True)
    out.chmod(0o600)  # it holds the fixed users' passwords
    out.write_text(auth.config(port, store_dir, host, member))
    click.echo(f"wrote {out} (auth callout issuer {auth.issuer}); secrets in {secrets_file}")


@click.command()
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="where the SQLite file, NATS data and tokens live (default ~/.gpufleet)",
)
@click.option("--port", type=int, default=8080, show_default=True, help="REST API port on 127.0.0.1")
@click.option("--nats-port", type=int, default=4333, show_default=True, help="port of the embedded nats-server")
@click.option("--demo", "demo_flag", is_flag=True, help="also run a workload generator so gangs flow at once")
@click.option("-v", "--verbose", is_flag=True)
@log_format_option
@metrics_port_option
def up(
    state_dir: Path | None,
    port: int,
    nats_port: int,
    demo_flag: bool,
    verbose: bool,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Run all of gpufleet on this machine: SQLite, nats-server, API, workers and a simulated fleet.
    Prometheus metrics of all of it are at http://127.0.0.1:<port>/metrics (send the admin token)."""
    _logging(verbose, log_format)
    settings = Settings.load(
        None,
        state_dir=state_dir,
        api_port=port,
        api_host="127.0.0.1",
        nats_url=f"nats://127.0.0.1:{nats_port}",
        database_url="",
        metrics_port=metrics_port,
    )
    state = settings.state_dir
    # Everything `up` creates (database, NATS store, tokens, logs, simulated cluster state) is
    # private to the user running it.
    os.umask(PRIVATE_UMASK)
    private_dir(state)
    # The components' INFO lines go to a file: the console keeps the banner, the fleet's progress,
    # the demo's story and warnings (-v shows everything there too).
    log_file = state / "gpufleet.log"
    _logging(verbose, log_format, log_file)
    lock = (state / "gpufleet.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise click.ClickException(f"another gpufleet up is running on {state} (SQLite has one writer)") from None
    for what, number in (("API", port), ("NATS", nats_port)):
        if not _port_free(number):
            lock.close()
            raise click.ClickException(
                f"{what} port {number} on 127.0.0.1 is in use; pick another with --port/--nats-port"
            )
    # NATS with authentication: the control plane's own secrets (0600, created once, never in SQL,
    # logs or streams); every other client connects with a gpufleet credential through auth callout.
    secrets_file = state / "nats-secrets.json"
    nats_auth = bootstrap.nats_secrets.load_or_create(secrets_file).server_auth()
    settings = settings.model_copy(update={"nats_secrets_file": secrets_file})
    nats = bootstrap.NatsServerProcess(nats_port, state / "nats", log_file=state / "nats-server.log", auth=nats_auth)
    nats.start()
    try:
        bootstrap.migrate(settings)
        wiring = bootstrap.Wiring(settings)
        # The lock proves no other process of this installation runs: leases left by a crashed
        # run have no live holder, so the restart takes over at once instead of after their TTL.
        expire_leases_of_dead_holders(wiring.uow)
        admin_token = seed.ensure_admin_token_file(wiring, state / "admin.token")
        (state / "nats.url").write_text(settings.nats_url + "\n")
        seed.seed_defaults(wiring)
        added = register_default_fleet(wiring)
        extra: list[Coroutine[Any, Any, None]] = []
        stop = asyncio.Event()
        extra.append(demo.report_progress(wiring, stop))
        extra.append(_supervise_nats(nats, stop))
        if demo_flag:
            # Short telemetry windows and idle stages, so the hoarder story plays in minutes.
            settings = demo.demo_settings(settings)
            demo.ensure_demo_policy(wiring)
            team_token = demo.ensure_demo_team(wiring, state / "demo.token")
            waiting_token = demo.ensure_waiting_team(wiring, state / "vision.token")
            extra.append(demo.generate(settings, team_token, stop, waiting_token))
        wiring.close()
        banner = [f"gpufleet is up: API http://127.0.0.1:{port}  (OpenAPI at /openapi.json)"]
        banner.append(
            f"  dashboard   http://127.0.0.1:{port}/ui   (log in with the admin token below, or a team's token)"
        )
        banner.append(f"  metrics     http://127.0.0.1:{port}/metrics   (Authorization: Bearer <the admin token>)")
        banner.append(f"  NATS        {settings.nats_url}   (written to {state / 'nats.url'}; connect with a token)")
        banner.append(f"  admin token {admin_token}   (written to {state / 'admin.token'})")
        banner.append(f"  database    {settings.effective_database_url}")
        banner.append(f"  logs        {log_file}   (every component's lines; warnings show here too)")
        if added:
            banner.append(f"  registered {added} simulated clusters: eks, aks, gke and oke flavours")
        exports = client_env.export_line(port, state)
        if exports:
            banner.append(
                "  the client (`gpufleet workload list`, `gpufleet status`, …) finds this API and its token after:"
            )
            banner.append(f"    {exports}")
            banner.append("  or, saved for every shell (a context, like kubectl's):")
            banner.append(f"    {client_env.login_line(port, state)}")
        banner.append("Ctrl-C stops everything; running `gpufleet up` again resumes where it stopped.")
        # Said once the API answers, so the export line it prints works at once.
        extra.append(_announce_when_listening(port, banner, stop))
        _run_until_signal(bootstrap.run_components(settings, bootstrap.COMPONENTS, stop, extra), stop)
    finally:
        nats.stop()
        lock.close()
        click.echo("gpufleet stopped")


async def _announce_when_listening(port: int, lines: list[str], stop: asyncio.Event) -> None:
    """Print the banner once the API on 127.0.0.1:`port` accepts connections (it starts with
    the other components, after the banner's facts are known)."""
    while not stop.is_set():
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        for line in lines:
            click.echo(line)
        return


# One command per component, importable by name (the lazy `gpufleet` group loads them one by one).
scheduler = _component_command("scheduler")
dispatcher = _component_command("dispatcher")
ingest = _component_command("ingest")
relay = _component_command("relay")


def register(group: click.Group) -> None:
    group.add_command(up)
    group.add_command(serve)
    group.add_command(migrate)
    group.add_command(init)
    group.add_command(create_admin_token)
    group.add_command(nats_topology)
    group.add_command(run_many)
    group.add_command(nats_auth_config)
    for command in (scheduler, dispatcher, ingest, relay):
        group.add_command(command)
