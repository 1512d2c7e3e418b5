"""`gpufleet agent`: the in-cluster telemetry agent (dcgm-exporter -> NATS)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from dataclasses import asdict
from pathlib import Path

import click

from adapters.kubernetes.serving_pods import in_cluster_pod_lister
from controlplane.agent import dcgm
from controlplane.agent.serving import ServingRound, ServingScraper, lister_targets


@click.command("agent")
@click.option("--cluster", required=True, help="this cluster's name in gpufleet (a NATS subject token)")
@click.option("--dcgm-url", required=True, help="dcgm-exporter's metrics endpoint, e.g. http://localhost:9400/metrics")
@click.option("--nats-url", envvar="GPUFLEET_NATS_URL", default="nats://127.0.0.1:4222", show_default=True)
@click.option(
    "--credential-file",
    envvar="GPUFLEET_NATS_CREDENTIAL_FILE",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="file holding this cluster's NATS credential (from POST /v1/clusters or .../credentials/rotate)",
)
@click.option("--prefix", envvar="GPUFLEET_SUBJECT_PREFIX", default="gpufleet", show_default=True)
@click.option("--interval", default=10.0, show_default=True, type=click.FloatRange(min=0.5), help="seconds")
@click.option(
    "--node",
    envvar="NODE_NAME",
    default=socket.gethostname(),
    show_default="$NODE_NAME or the host name",
    help="node name for series without a Hostname label",
)
@click.option(
    "--assignments",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help='JSON {"<hostname>/<gpu>[/<GPU_I_ID>]": "<run id>"}: the fallback when a pod names no run',
)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    envvar="GPUFLEET_AGENT_NAMESPACES",
    default=("gpufleet",),
    show_default=True,
    help="namespace gpufleet runs pods in on this cluster (repeatable; the env var takes a space-separated list); "
    "only pods there are attributed to runs",
)
@click.option(
    "--serving-pods",
    type=click.Choice(["off", "node", "cluster"]),
    envvar="GPUFLEET_AGENT_SERVING_PODS",
    default="off",
    show_default=True,
    help="scrape the serving metrics inference pods declare (their `serving` block): those on this node "
    "or in the whole cluster, listed through the Kubernetes API (needs `list` on pods in the namespaces)",
)
@click.option("--once", is_flag=True, help="scrape and publish one round, print what was sent, and exit")
@click.option("-v", "--verbose", is_flag=True)
def agent(
    cluster: str,
    dcgm_url: str,
    nats_url: str,
    credential_file: Path | None,
    prefix: str,
    interval: float,
    node: str,
    assignments: Path | None,
    namespaces: tuple[str, ...],
    serving_pods: str,
    once: bool,
    verbose: bool,
) -> None:
    """Scrape dcgm-exporter every INTERVAL seconds and publish GPU samples to <prefix>.telemetry.<cluster>.dcgm."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("nats").setLevel(logging.WARNING)
    try:
        config = dcgm.AgentConfig(
            cluster=cluster, dcgm_url=dcgm_url, prefix=prefix, interval=interval, node=node, namespaces=namespaces
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    resolver = dcgm.default_resolver(assignments, frozenset(config.namespaces))
    serving = None
    if serving_pods != "off":
        lister = in_cluster_pod_lister(config.node if serving_pods == "node" else None)
        serving = ServingRound(lister_targets(lister, config.namespaces), ServingScraper(config.scrape_timeout))

    async def run() -> dcgm.ScrapeReport | None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        credential = credential_file.read_text().strip() if credential_file else None
        return await dcgm.main(config, nats_url, stop, resolver, once=once, credential=credential, serving=serving)

    try:
        report = asyncio.run(run())
    except Exception as exc:
        if not once:
            raise
        raise click.ClickException(f"telemetry round failed: {type(exc).__name__}: {exc}") from None
    if once and report is not None:
        click.echo(json.dumps({"subject": config.subject, **asdict(report)}))


def register(group: click.Group) -> None:
    group.add_command(agent)
